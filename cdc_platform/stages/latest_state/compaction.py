"""Compaction and tombstone purge of a stored latest-state table, on delta-spark.

`compact` folds the delta layer into the base with one delta-spark MERGE (applying truncate markers)
and drops the folded delta rows; `purge_tombstones` deletes tombstones older than the table's retention.
The stage compacts when the delta layer grows and `cdc maintain` does both; kept apart from the stage
because it works on the whole stored table, not on a batch.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.stages import ordering
from cdc_platform.config import TableConfig
from cdc_platform.stages.latest_state.layout import BASE, DELTA, LAYER, META_FIELDS
from cdc_platform.stages.latest_state.writing import layer_rows

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession


@dataclass
class CompactReport:
    folded: int = 0  # delta rows folded into the base
    base_rows: int = 0
    truncated: bool = False
    seconds: float = 0.0


fold_latest = ordering.fold_latest  # one row per key by (position, first arrival), on Arrow; see `ordering`

#: The metadata a truncate marker gives the rows it tombstones.
_MARKER_META = ("_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id")


def _col(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col(lake.quote_identifier(name))


def key_condition(key: Sequence[str], *, null: bool) -> Column:
    cond = None
    for k in key:
        part = _col(k).isNull() if null else _col(k).isNotNull()
        cond = part if cond is None else (cond & part)
    assert cond is not None
    return cond


def fold_frame(rows: DataFrame, key: Sequence[str]) -> DataFrame:
    """`ordering.fold_latest` in Spark: one row per key, the highest `_position`; on a tie the distinct
    event that arrived last (highest first arrival); copies of one event count as its first copy."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = [_col(k) for k in key]
    first = F.min("_seq").over(Window.partitionBy(*keys, F.col("_position"), F.col("_event_id")))
    rank = F.row_number().over(Window.partitionBy(*keys).orderBy(F.col("_position").desc(), F.col("__first").desc(), F.col("_seq").asc()))
    return rows.withColumn("__first", first).withColumn("__rank", rank).where(F.col("__rank") == 1).drop("__first", "__rank")


def compact(path: Path, table: TableConfig, spark: SparkSession | None = None) -> CompactReport:
    """Fold the delta layer into the base: MERGE by key where the change's position is higher, then
    drop the folded delta rows. Safe to repeat and to interrupt: until the DELETE commits, the view folds
    the same rows from both layers to the same answer.
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    spark = spark or lake_spark.session()
    t0 = time.perf_counter()
    report = CompactReport()
    if not lake_spark.is_table(spark, path):
        return report
    _, snap = lake_spark.pinned(spark, path)
    meta = {f.name for f in META_FIELDS}
    src_cols = [c for c in snap.columns if c not in meta]
    if not all(k in src_cols for k in table.key):
        return report
    delta = snap.where(F.col(LAYER) == DELTA)
    summary = delta.agg(F.count(F.lit(1)).alias("n"), F.max("_seq").alias("top")).first()
    if summary is None or not summary["n"]:
        return report
    top_seq = int(summary["top"])
    markers = [r.asDict() for r in snap.where(key_condition(table.key, null=True) & (F.col("_op") == "t"))
               .select(LAYER, *_MARKER_META).collect()]
    base_marker = _newest([m for m in markers if m[LAYER] == BASE])
    new_marker = _newest([m for m in markers if m[LAYER] == DELTA])
    truncate_now = new_marker is not None and (base_marker is None or new_marker["_position"] > base_marker["_position"])
    cut = new_marker if truncate_now else base_marker

    changes = fold_frame(delta.where(key_condition(table.key, null=False)), table.key)
    if cut is not None:
        changes = tombstone_below(changes, cut, table.key, src_cols)
    if truncate_now and new_marker is not None:
        _truncate_base(spark, path, new_marker, table.key, src_cols)  # every stored row below the new truncate
        report.truncated = True
        changes = changes.unionByName(marker_row(delta, table.key, new_marker))
    source = changes.withColumn(LAYER, F.lit(BASE))
    on = " AND ".join(f"t.{lake.quote_identifier(k)} = s.{lake.quote_identifier(k)}" for k in table.key)

    # Explicit, quoted assignments: delta-spark's updateAll/insertAll do not quote a column name with a backtick in it.
    assign = {lake.quote_identifier(c): F.col(f"s.{lake.quote_identifier(c)}") for c in source.columns}

    def merge() -> None:
        (DeltaTable.forPath(spark, lake_spark.location(path)).alias("t")
         .merge(source.alias("s"), f"t.`{LAYER}` = '{BASE}' AND {on}")
         .whenMatchedUpdate(condition=ordering.MERGE_NEWER, set=assign)
         .whenNotMatchedInsert(values=assign)
         .execute())

    lake_spark.with_retries(merge, what=f"compact {path.name}")
    lake_spark.with_retries(
        lambda: DeltaTable.forPath(spark, lake_spark.location(path)).delete((F.col(LAYER) == DELTA) & (F.col("_seq") <= top_seq)),
        what=f"drop folded changes of {path.name}",
    )
    report.folded = int(summary["n"])
    report.base_rows = layer_rows(spark, path)[BASE]
    report.seconds = time.perf_counter() - t0
    return report


def _newest(markers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The marker with the highest `_position`."""
    return max(markers, key=lambda m: m["_position"]) if markers else None


def marker_row(rows: DataFrame, key: Sequence[str], marker: Mapping[str, Any]) -> DataFrame:
    """The row of truncate `marker` (by its position and event id) among `rows`, once."""
    from pyspark.sql import functions as F

    return rows.where(key_condition(key, null=True) & (F.col("_op") == "t") & (F.col("_position") == marker["_position"])
                      & (F.col("_event_id") == marker["_event_id"])).limit(1)


def tombstone_below(rows: DataFrame, cut: Mapping[str, Any], key: Sequence[str], src_cols: Sequence[str]) -> DataFrame:
    """Rows below a truncate become the truncate's tombstones: key kept, values gone, its metadata."""
    from pyspark.sql import functions as F

    below = F.col("_position") < F.lit(cut["_position"])
    columns = []
    for name in rows.columns:
        if name in src_cols and name not in key:
            columns.append(F.when(below, F.lit(None)).otherwise(_col(name)).alias(name))
        elif name == "_op":
            columns.append(F.when(below, F.lit("t")).otherwise(F.col(name)).alias(name))
        elif name == "_deleted":
            columns.append(F.when(below, F.lit(True)).otherwise(F.col(name)).alias(name))
        elif name in _MARKER_META:
            columns.append(F.when(below, F.lit(cut[name])).otherwise(F.col(name)).alias(name))
        else:
            columns.append(_col(name).alias(name))
    typed = rows.select(*columns)
    return typed.select(*[F.col(lake.quote_identifier(f.name)).cast(f.dataType).alias(f.name) for f in rows.schema.fields])


def _truncate_base(spark: SparkSession, path: Path, cut: Mapping[str, Any], key: Sequence[str], src_cols: Sequence[str]) -> None:
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    types = {f.name: f.dataType for f in lake_spark.read(spark, path).schema.fields}
    updates: dict[str, Column] = {lake.quote_identifier(c): F.lit(None).cast(types[c]) for c in src_cols if c not in key}
    updates |= {"_op": F.lit("t"), "_deleted": F.lit(True)}
    updates |= {c: F.lit(cut[c]).cast(types[c]) for c in _MARKER_META}
    condition = (F.col(LAYER) == BASE) & key_condition(key, null=False) & (F.col("_position") < F.lit(cut["_position"]))
    lake_spark.with_retries(lambda: DeltaTable.forPath(spark, lake_spark.location(path)).update(condition, updates),
                            what=f"truncate {path.name}")


def purge_tombstones(path: Path, table: TableConfig, now: dt.datetime | None = None, spark: SparkSession | None = None) -> int:
    """Delete base tombstones (and truncate markers) landed more than `tombstone_retention` ago.

    After this, a change older than a purged tombstone that still arrives would bring its row back:
    the retention is the promise of how late a stale change may be.
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    spark = spark or lake_spark.session()
    if not lake_spark.is_table(spark, path):
        return 0
    now = now or dt.datetime.now(dt.timezone.utc)
    cutoff = now - dt.timedelta(seconds=table.tombstone_retention)
    condition = (F.col(LAYER) == BASE) & F.col("_deleted") & (F.col("_ingested_at") < F.lit(cutoff))
    before = lake_spark.version(spark, path)
    lake_spark.with_retries(lambda: DeltaTable.forPath(spark, lake_spark.location(path)).delete(condition),
                            what=f"purge tombstones of {path.name}")
    after = lake_spark.version(spark, path)
    if after == before:
        return 0
    return int(lake_spark.commit_metrics(spark, path, after).get("numDeletedRows", 0))

