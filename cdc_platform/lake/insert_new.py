"""Identity dedup: append the rows whose id a table does not hold yet, once per micro-batch.

The raw log and markers insert only the ids they do not hold (a connector restart redelivers events the
lake already has), and the lookup of held ids reads only the files a batch's footprint can fall in
(`footprints.Footprint`: its partition values, and its range of a column the id determines, the source
position or the transaction id). Asked through delta-spark, that lookup first rebuilds the table's
snapshot state for file skipping: a Spark job of two stages replaying the log from its checkpoint, once
per new version, so once per micro-batch and per table, growing with the table. delta-rs keeps a handle
on each table (`lake.open_table`) that reads only the commits after it and gives every file's partition
values and column statistics in milliseconds; the pruning Delta does is done here on them
(`candidate_files`), and Spark reads the candidate files' id column as plain Parquet. When no file can
hold the batch's ids (new positions: a stream's usual batch) nothing is read or joined at all.

That holds only where the files are exactly the table's rows: a local table without deletion vectors
(a file's rows would include deleted ones) or column mapping (physical names differ from logical ones),
its paths relative and plain. Anywhere else `candidate_files` says None and Delta's own read prunes by
the same footprint. The pruning follows Delta's statistics: a string's `max` is truncated with a
tie-breaker that keeps it at or above every value of the file, its `min` is a prefix at or below them,
and a file without statistics for the column is a candidate.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltalake.exceptions import DeltaError

from cdc_platform.lake import add_actions, open_table
from cdc_platform.lake.footprints import Footprint, footprint_columns, footprint_of
from cdc_platform.lake.lake_spark import commit_actions, read, rows_written, save, version, with_retries
from cdc_platform.storage import LakePath, is_remote

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def insert_new_once(
    df: DataFrame,
    path: LakePath | str,
    id_column: str,
    partition_column: str,
    application: str,
    batch: int,
    range_column: str | None = None,
    footprint: Footprint | None = None,
    row_column: str | None = None,
) -> int | None:
    """Append the rows of `df` whose id the table lacks, once per (application, batch).

    Returns the rows inserted, or None when Delta skipped the batch as already committed. The ids are
    looked up only where they can be: the partitions the batch carries, and (with `range_column`, a
    column the id determines, such as the source position) the batch's min/max of it, all as literals
    from one small aggregate (`footprint`, computed here unless the caller folded it into one of its
    own), which the files are pruned by (partition values, then column statistics: `candidate_files`);
    a batch of new positions reads no file, or only recent ones. Bounds are left out when the batch has
    nulls in that column; the lookup is then exact but reads the whole partitions.

    Why an anti-join and an idempotent append rather than `MERGE ... WHEN NOT MATCHED INSERT`: it is
    what Delta runs for an insert-only MERGE anyway, but an append carries `txnAppId`/`txnVersion` as
    writer options (no session settings to guard) and the inserted count is the rows written, not a
    `DESCRIBE HISTORY` job afterwards. One stream writes a lake, so nothing inserts between the lookup
    and the append. The inserted count is the append's own commit metric (`rows_written`).

    With `row_column` (a narrow column unique per row, such as the input order, dropped before the
    write) the lookup joins only (id, row) and removes the known rows by that column from a broadcast
    list, so the wide rows are written straight from where they are and never shuffled; without it
    the rows themselves are joined.
    """
    from pyspark.sql import functions as F

    spark = df.sparkSession
    if footprint is None:
        ranged = None if range_column is None else F.col(range_column)
        summary = df.agg(*footprint_columns("", F.col(partition_column), ranged)).first()
        assert summary is not None  # a global aggregate has one row
        footprint = footprint_of([summary.asDict()], "", ranged=range_column is not None)
    if footprint.rows == 0:
        return 0  # nothing to record: a replay of an empty batch writes nothing either

    def write() -> tuple[int, int | None]:  # again after a conflict: the lookup then reads the newer snapshot
        before = version(spark, path)
        fresh = _without_known(df, path, id_column, partition_column, range_column, footprint, row_column)
        return before, save(fresh, path, "append", application, batch)

    before, after = with_retries(write, what=f"insert into {Path(str(path)).name}")
    if after is None:
        return None
    # Another writer (a backfill, `cdc maintain`) may have committed right after this append: the append's
    # commit is the one in (before, after] that carries its application transaction.
    for at in range(after, before, -1):
        if _carries(spark, path, at, application, batch):
            return rows_written(spark, path, at, application, batch)
    return rows_written(spark, path, after, application, batch)  # says which commit it could not find


def _without_known(
    df: DataFrame, path: LakePath | str, id_column: str, partition_column: str, range_column: str | None, footprint: Footprint,
    row_column: str | None,
) -> DataFrame:
    """`df`'s rows whose id the table does not hold, looked up only in the files the footprint can fall in.

    The candidate files come from the log through delta-rs (`candidate_files`: no snapshot job per version)
    and their ids are read as Parquet; where the log alone cannot say (deletion vectors, column mapping, an
    object store) Delta's own read prunes by the same footprint. No candidate file: nothing to look up."""
    from pyspark.sql import functions as F

    spark = df.sparkSession
    files = candidate_files(path, footprint, partition_column, range_column)
    if files == []:
        return df.drop(row_column) if row_column is not None else df
    if files is None:
        known = read(spark, path).where(footprint.condition(partition_column, range_column)).select(id_column)
    else:
        known = read_ids(spark, files, id_column)
    if row_column is None:
        return df.join(known, on=id_column, how="left_anti").select(*df.columns)
    redelivered = df.select(id_column, row_column).join(known, on=id_column, how="left_semi").select(row_column)
    return df.join(F.broadcast(redelivered), on=row_column, how="left_anti").select(*(c for c in df.columns if c != row_column))


def _carries(spark: SparkSession, path: LakePath | str, at_version: int, application: str, batch: int) -> bool:
    actions = commit_actions(spark, path, at_version)
    return actions is not None and any(a.get("txn", {}).get("appId") == application and a["txn"].get("version") == batch for a in actions)


def candidate_files(path: LakePath | str, footprint: Footprint, partition_column: str, range_column: str | None) -> list[str] | None:
    """Absolute paths of the table's current files that can hold rows of `footprint` ([] when none can), or
    None when the log alone cannot say which (the caller then reads through Delta)."""
    if is_remote(path):
        return None
    try:
        table = open_table(Path(path) if isinstance(path, str) else path)
        if table.protocol().reader_features or table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none":
            return None  # deletion vectors, column mapping, ...: the files alone are not the table's rows
        files = add_actions(table)
    except DeltaError:
        return None
    # Only the four columns the pruning reads become Python values (a file has ~60 statistics columns).
    wanted_columns = ["path", f"partition.{partition_column}", *(f"{b}.{range_column}" for b in ("min", "max") if range_column is not None)]
    actions = files.select([c for c in wanted_columns if c in files.column_names]).to_pydict()
    paths = actions.get("path", [])
    if any("%" in p or ":" in p or p.startswith("/") for p in paths):
        return None  # an escaped, absolute or URI path (a clone's): Delta resolves those
    partitions = actions.get(f"partition.{partition_column}")
    if partitions is None and paths:
        return None  # not partitioned by that column (an older layout): Delta's read
    lows = actions.get(f"min.{range_column}") if range_column is not None and footprint.complete_range else None
    highs = actions.get(f"max.{range_column}") if lows is not None else None
    wanted = {_key(p) for p in footprint.parts}
    root = str(path).rstrip("/")
    found = []
    for i, relative in enumerate(paths):
        part = partitions[i]  # type: ignore[index]
        if not (footprint.null_part if part is None else _key(part) in wanted):
            continue
        if highs is not None and not _may_overlap(lows[i], highs[i], footprint.lo, footprint.hi):  # type: ignore[index]
            continue
        found.append(f"{root}/{relative}")
    return found


def _key(value: Any) -> str:
    """A partition value as text: Spark gives a date partition as `datetime.date`, delta-rs as the same or a string."""
    return value.isoformat() if isinstance(value, (dt.date, dt.datetime)) else str(value)


def _may_overlap(low: Any, high: Any, lo: Any, hi: Any) -> bool:
    """Whether a file whose column lies in [low, high] (None: unknown) can hold a value in [lo, hi]."""
    if low is None or high is None:
        return True
    try:
        return not (high < lo or low > hi)
    except TypeError:  # statistics of another type than the batch's values: nothing to prune by
        return True


def read_ids(spark: SparkSession, files: Sequence[str], id_column: str) -> DataFrame:
    """The (string) id column of these Parquet files as a DataFrame; their other columns are never read."""
    from pyspark.sql.types import StringType, StructField, StructType

    return spark.read.schema(StructType([StructField(id_column, StringType())])).parquet(*files)
