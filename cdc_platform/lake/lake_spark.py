"""The lake on delta-spark, the engine every table is written with, one table operation each.

The rules every writer keeps:

* Exactly once is Delta's own. Every micro-batch write carries an application transaction
  (`txnAppId` = `<query id>:<table>`, `txnVersion` = batch id) as writer options; Delta records it in
  the same commit and skips a later write whose version is not above the recorded one, atomically,
  (delta-rs, which wrote the lake before, only recorded it and the platform had to check it first).
  The check reads the table's version checksum, not its replayed state (`save`, `OnceWrite`).
* Identity dedup stays: the raw log and markers insert only ids they do not hold (an anti-join, then
  the idempotent append), so input redelivered under a new batch id, or after a lost checkpoint,
  inserts nothing. The lookup names the partitions and position range the batch touches as literals,
  so its cost follows the batch.
* Reads go through `spark.read.format("delta")`: the snapshot's own file list, never a directory
  listing (which would include files the log removed). A small table's scan takes that list from the
  version's checksum (the session's `ChecksumScan` rule, jvm/parser): no state replay, no file-skipping job.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_platform.errors import ONE_WRITER, retry_conflicts
from cdc_platform.lake import schemas
from cdc_platform.lake.table_properties import STATS_COLUMNS_PROPERTY, checkpoint_interval, stats_columns
from cdc_platform.spark.spark_jobs import side_by_side
from cdc_platform.storage import LakePath, is_remote, spark_location

if TYPE_CHECKING:
    import pyarrow as pa
    from delta.tables import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: VACUUM's settings: log `VACUUM START`/`END` commits (with the deleted-file count), and the 7-day check.
VACUUM_LOGGING = "spark.databricks.delta.vacuum.logging.enabled"
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
#: VACUUM's own lock: two vacuums must not interleave saving and restoring its settings (session-wide).
_VACUUM_LOCK = threading.Lock()


def location(path: LakePath | str) -> str:
    """The path as Spark takes it. A table on an object store first teaches the session its bucket's
    settings (storage.spark_location), so every Spark access to the lake goes through here."""
    return spark_location(session(), path) if is_remote(path) else str(path)


#: The session setting that turns the checksum listing of small tables' scans off (`false`), as a benchmark's
#: variant compares (`small_batches.py --variant deltareads=spark.cdc.read.fromChecksum=false`); read by
#: jvm/parser's `ChecksumScan` on every query, so it can be set at any time.
CHECKSUM_READ_CONF = "spark.cdc.read.fromChecksum"
#: The largest table, in bytes of data files, whose scans are listed from its checksum (default 16 MiB).
CHECKSUM_READ_MAX_BYTES_CONF = "spark.cdc.read.fromChecksum.maxBytes"


def read(spark: SparkSession, path: LakePath | str, version: int | None = None) -> DataFrame:
    """The table's current snapshot, or the one at `version` (time travel, `versionAsOf`).

    Without a version the DataFrame follows the table: every query over it (or over a temp view of it)
    reads the version current when that query is planned. A reader that decides something from one
    version (its history, its file statistics, another table read alongside) pins that version; a small
    table's pinned version is listed from its checksum by the session's `ChecksumScan` rule, without a state replay.
    """
    where = location(path)
    if version is None:
        return spark.read.format("delta").load(where)
    return spark.read.format("delta").option("versionAsOf", int(version)).load(where)


def pinned(spark: SparkSession, path: LakePath | str) -> tuple[int, DataFrame]:
    """(current version, a DataFrame of exactly that version): a snapshot that later commits do not move."""
    current = version(spark, path)
    return current, read(spark, path, current)


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of one of the platform's Arrow schemas (`schemas.py`), nullability included."""
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(schema)


def from_arrow(spark: SparkSession, data: pa.Table, schema: pa.Schema | None = None) -> DataFrame:
    """A small driver-side Arrow table (dead letters, a metrics row, a state) as a DataFrame of `schema` (default
    its own).

    Only for rows the driver made itself; event data never comes this way (see `ingest`). Empty record batches
    are left out first: pyspark 4.1.4's `createDataFrame` of an Arrow table drops, without an error, every batch
    after an empty one (batches of 1, 0, 2 rows give 1 row; tests/cdc_platform/test_lake_spark.py), and a table
    concatenated from parts (the transaction state's open, finished, stream and source rows) has such batches.
    """
    import pyarrow as pa

    schema = data.schema if schema is None else schema
    data = data.select(schema.names).cast(schema)
    # An empty table stays one empty batch: pyspark cannot make a column of no chunks at all.
    batches = [b for b in data.to_batches() if b.num_rows] or [pa.RecordBatch.from_pylist([], schema=schema)]
    return spark.createDataFrame(pa.Table.from_batches(batches, schema=schema), schema=spark_schema(schema))


def ensure_table(spark: SparkSession, path: LakePath | str, schema: StructType, partition_by: Sequence[str] = ()) -> None:
    """Create the table if it does not exist; add the nullable columns `schema` has and an existing table lacks.

    The platform's own tables gain columns between versions (the raw log's Kafka origin, say); a lake
    made before gets them as one metadata commit, its rows reading null there. A missing column that
    must not be null cannot be added that way, and says so. A new table gets its checkpoint interval
    (`checkpoint_interval`); an existing one keeps whatever it has. A local table loses the stale Hadoop
    checksum an earlier version may have left beside its `_last_checkpoint`.

    A new local table's first commit (protocol and metadata, no data) is written by delta-rs, and its
    checksum by Delta Kernel (`_create_local`): milliseconds a table, where delta-spark's `createIfNotExists`
    runs Spark jobs (a fresh lake's set-up 2.2 s against 0.4 s in a warm session). Every later write is
    delta-spark's.
    """
    from cdc_platform.errors import LakeError

    name = Path(str(path)).name
    properties = {"delta.checkpointInterval": str(checkpoint_interval(name))}
    skipped = stats_columns(schema, partition_by, schemas.UNSKIPPED_COLUMNS.get(name, ()))
    if skipped is not None:
        properties[STATS_COLUMNS_PROPERTY] = ",".join(skipped)
    present = None
    if not is_remote(path):
        # Written by an earlier version through Hadoop's checksummed FileContext (see session.LOCAL_FILES_CONF):
        # the one file Delta overwrites would keep a stale checksum, which a read through FileSystem takes for corruption.
        (Path(str(path)) / "_delta_log" / "._last_checkpoint.crc").unlink(missing_ok=True)
        present = _create_local(spark, Path(str(path)), schema, partition_by, properties)
    if present is None:
        present = _create_with_spark(spark, path, schema, partition_by, properties)
    missing = [f for f in schema.fields if f.name not in present]
    if missing:
        required = [f.name for f in missing if not f.nullable]
        if required:
            raise LakeError(
                f"the table at {path} lacks the required column(s) {', '.join(required)}; it was made by another "
                "program or version: move it aside and rebuild it (`cdc rebuild`), or point the config at another lake"
            )
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in missing)
        spark.sql(f"ALTER TABLE delta.`{location(path)}` ADD COLUMNS ({columns})")
        from delta.tables import DeltaTable

        table = DeltaTable.forPath(spark, location(path))
        named = table_property(table, STATS_COLUMNS_PROPERTY) if skipped is not None else None
        if named is not None:  # a column added later gets statistics too, as it would without the list
            keep = set(named.split(",")) | {f.name for f in missing}
            widened = ",".join(c for c in skipped if c in keep)
            spark.sql(f"ALTER TABLE delta.`{location(path)}` SET TBLPROPERTIES ('{STATS_COLUMNS_PROPERTY}' = '{widened}')")


def _create_local(spark: SparkSession, path: Path, schema: StructType, partition_by: Sequence[str],
                  properties: dict[str, str]) -> set[str] | None:
    """The column names of the local table at `path`, created first if it is not there; None when this way
    cannot answer (a table using a feature delta-rs lacks, a creation racing another's, no JVM in this process):
    then delta-spark does (`_create_with_spark`).

    delta-rs writes version 0 as delta-spark would: reader 1 / writer 2, the schema (Spark's own Arrow mapping
    of it), partition columns and properties. Delta Kernel (delta-kernel-defaults, on the session's class path
    with delta-spark) then writes its checksum, `00000000000000000000.crc`, from that commit: every idempotent
    write reads the table's application transactions from the checksum (`OnceWrite`), and a table without
    one would take Delta's slow path (a state reconstruction job) on its first write. A log with no commit
    yet (a process killed while creating it) is no table to delta-rs, which writes version 0 into it.
    `tests/cdc_platform/test_lake_spark.py` compares the result with a table delta-spark created.
    """
    from deltalake import DeltaTable as RsTable
    from deltalake.exceptions import DeltaError
    from py4j.protocol import Py4JError
    from pyspark.sql.pandas.types import to_arrow_schema

    log = path / "_delta_log"
    try:
        if log.is_dir() and any(e.is_file() and not e.name.startswith(".") for e in os.scandir(log)):
            table = RsTable(str(path))  # a table, or a damaged log that only delta-spark's error may describe
        else:  # no log, or one with no commit yet
            table = RsTable.create(str(path), to_arrow_schema(schema), mode="ignore", partition_by=list(partition_by) or None,
                                   configuration=properties)
            if table.version() == 0 and not (log / f"{0:020d}.crc").exists():
                jvm = spark._jvm  # type: ignore[attr-defined]
                engine = jvm.io.delta.kernel.defaults.engine.DefaultEngine.create(spark.sparkContext._jsc.hadoopConfiguration())
                jvm.io.delta.kernel.Table.forPath(engine, str(path)).checksum(engine, 0)
        return {field.name for field in table.schema().fields}
    except (DeltaError, OSError, Py4JError, AttributeError):  # AttributeError: no JVM here (Spark Connect)
        return None


def _create_with_spark(spark: SparkSession, path: LakePath | str, schema: StructType, partition_by: Sequence[str],
                       properties: dict[str, str]) -> set[str]:
    """`ensure_table`'s creation through delta-spark (a lake on an object store, or one delta-rs cannot open):
    the existing table's column names after."""
    from delta.tables import DeltaTable

    from pyspark.errors import AnalysisException

    builder = DeltaTable.createIfNotExists(spark).location(location(path)).addColumns(schema)
    for key, value in properties.items():
        builder = builder.property(key, value)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    try:
        table = builder.execute()
    except AnalysisException as exc:
        # A process killed while creating the table leaves `_delta_log` without its first commit, which
        # Delta then takes for a table that is there and cannot be read: clear the stub and create it.
        if exc.getCondition() != "DELTA_TABLE_NOT_FOUND" or not _clear_uncommitted_log(spark, path):
            raise
        table = builder.execute()
    return set(table.toDF().columns)


def table_property(table: DeltaTable, key: str) -> str | None:
    """One of a Delta table's properties (`DESCRIBE DETAIL`), None when unset."""
    detail = table.detail().select("properties").first()
    return None if detail is None else (detail["properties"] or {}).get(key)


def ensure_tables(spark: SparkSession, tables: Sequence[tuple[LakePath | str, StructType, Sequence[str]]]) -> None:
    """`ensure_table` for several tables side by side: a lake's first start creates about a dozen, on an object
    store by delta-spark, each ~0.2-0.8 s of the driver waiting on its log (a local one's take milliseconds)."""
    side_by_side([lambda t=t: ensure_table(spark, *t) for t in tables], name="cdc-create")


def hadoop_file(spark: SparkSession, where: str) -> tuple[Any, Any]:
    """Hadoop's file system and path for a location as Spark takes it (`location`): a local folder or an object
    store, with the session's settings for its bucket."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(where)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def _clear_uncommitted_log(spark: SparkSession, path: LakePath | str) -> bool:
    """Delete the table's `_delta_log` if it holds no commit at all (only folders and hidden temp files).

    Anything named like a commit, checksum or checkpoint (a name starting with the 20-digit version, or
    `_last_checkpoint`) means a table was there: that is left alone and the caller's error stands.
    Goes through Hadoop's file system, so a lake on an object store is treated the same.
    """
    fs, log = hadoop_file(spark, location(path).rstrip("/") + "/_delta_log")
    if not fs.exists(log):
        return False
    files = fs.listFiles(log, True)
    while files.hasNext():
        name = files.next().getPath().getName()
        if not name.startswith("."):
            return False
    return bool(fs.delete(log, True))


def version(spark: SparkSession, path: LakePath | str) -> int:
    """The table's current version, from Delta's own log handle (`DeltaLog.update()`, through the JVM).

    Every registration pins each table by its version, so this is on the path of every `cdc sql` and
    check: the log handle lists the log and reuses the cached snapshot (about 40 ms a table here), where
    `DESCRIBE HISTORY ... LIMIT 1` plans and runs a Spark job (about 0.5 s). `DeltaLog` is Delta's
    internal Scala API: should an upgrade change it, `DESCRIBE HISTORY` answers, slower but the same
    (`tests/cdc_platform/test_lake_spark.py` holds the fast path to the jar `make setup` resolves).
    """
    current = _log_version(spark, path)
    if current is None:
        from delta.tables import DeltaTable

        current = int(DeltaTable.forPath(spark, location(path)).history(1).first()["version"])
    if current < 0:
        from cdc_platform.errors import LakeError

        raise LakeError(f"{path} is not a Delta table; run `cdc run` first to create the lake")
    return current


def _log_version(spark: SparkSession, path: LakePath | str) -> int | None:
    from py4j.protocol import Py4JError

    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location(path))  # type: ignore[attr-defined]
        return int(log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty()).version())
    except (Py4JError, AttributeError):  # AttributeError: no JVM in this process (Spark Connect)
        return None


def append_once(df: DataFrame, path: LakePath | str, application: str, batch: int, *, merge_schema: bool = False) -> bool:
    """Append `df` unless this application already committed `batch` (or a later one); True if it wrote.

    `merge_schema` adds the columns `df` has and the table lacks in the same commit (a latest-state
    table's new source columns); the types of columns both have must agree (a widening rewrites first).
    """
    return with_retries(lambda: append_version(df, path, application, batch, merge_schema=merge_schema),
                        what=f"append to {Path(str(path)).name}") is not None


def writer(df: DataFrame, mode: str, application: str | None = None, batch: int | None = None, *,
           metadata: str | None = None, merge_schema: bool = False) -> Any:
    """A Delta writer of `df`, carrying the batch's application transaction (`txnAppId`/`txnVersion`)
    when given one, so that Delta itself skips a batch it already holds; `metadata` goes into the
    commit's `userMetadata`."""
    w = df.write.format("delta").mode(mode)
    if application is not None and batch is not None:
        w = w.option("txnAppId", application).option("txnVersion", batch)
    if merge_schema:
        w = w.option("mergeSchema", "true")
    return w.option("userMetadata", metadata) if metadata else w


#: Delta's idempotent write with its "already committed?" answered from the table's checksum (jvm/parser's
#: `OnceWrite`, loaded with the parser's jar): the same check, commit and conflicts as `writer(...).save`, without
#: the state reconstruction (a Spark job, ~0.5 s) Delta's own check runs before every write.
ONCE_WRITE = "cdc.platform.lake.OnceWrite"
#: The session setting that turns it off (`false`): every idempotent write then takes Delta's own check, as a
#: benchmark's variant compares (`small_batches.py --variant deltacheck=spark.cdc.onceWrite=false`).
ONCE_WRITE_CONF = "spark.cdc.onceWrite"
#: The session setting that turns off `OnceWrite`'s whole-table overwrite from the checksum's file list (`false`):
#: such an overwrite then lists the files it replaces by Delta's state reconstruction, two Spark jobs more
#: (`small_batches.py --variant crclist=spark.cdc.onceWrite.overwriteFromChecksum=false`).
ONCE_WRITE_OVERWRITE_CONF = "spark.cdc.onceWrite.overwriteFromChecksum"


def save(df: DataFrame, path: LakePath | str, mode: str, application: str | None = None, batch: int | None = None, *,
         metadata: str | None = None, merge_schema: bool = False) -> int | None:
    """Write `df` to the existing table at `path` (`mode` append or overwrite) as `writer` would, once per
    (application, batch) when given them. Returns a table version at or after the write's own commit (its
    commit exactly when `OnceWrite` wrote it), or None if that application had committed the batch already.

    The idempotent write goes through `OnceWrite` when this session has it (not over Spark Connect, nor
    with a parser jar older than it); when the table's checksum cannot tell whether the batch is committed
    (no `.crc` for its version, or one without the application transactions), through Delta's own check,
    and whether it wrote is then told by the table's version before and after.
    """
    spark = df.sparkSession
    if application is None or batch is None:
        writer(df, mode, metadata=metadata, merge_schema=merge_schema).save(location(path))
        return version(spark, path)
    settled = _once_write(df, path, mode, application, batch, metadata, merge_schema)
    if settled is not _UNSETTLED:
        return settled
    before = version(spark, path)
    writer(df, mode, application, batch, metadata=metadata, merge_schema=merge_schema).save(location(path))
    after = version(spark, path)
    return None if after == before else after


def _once_write(df: DataFrame, path: LakePath | str, mode: str, application: str, batch: int, metadata: str | None,
                merge_schema: bool) -> Any:
    """The version `OnceWrite` committed, None if the batch was committed already, or `_UNSETTLED` when it
    could not tell (and wrote nothing)."""
    from cdc_platform.spark.session import jvm_class

    spark = df.sparkSession
    entry = jvm_class(spark, ONCE_WRITE)
    if entry is None or spark.conf.get(ONCE_WRITE_CONF, "true").lower() == "false":  # Spark Connect, no such jar, or turned off
        return _UNSETTLED
    options = spark._jvm.java.util.HashMap()  # type: ignore[attr-defined]
    options.put("txnAppId", application)
    options.put("txnVersion", str(int(batch)))
    if merge_schema:
        options.put("mergeSchema", "true")
    if metadata:
        options.put("userMetadata", metadata)
    outcome = int(entry.write(spark._jsparkSession, df._jdf, location(path), mode, options))  # type: ignore[attr-defined]
    return _UNSETTLED if outcome == _UNKNOWN else None if outcome == _ALREADY else outcome


#: `OnceWrite`'s answers other than a committed version, and `_once_write`'s "could not tell".
_ALREADY, _UNKNOWN = -1, -2
_UNSETTLED: Any = object()


def append_version(df: DataFrame, path: LakePath | str, application: str, batch: int, *, merge_schema: bool = False) -> int | None:
    """`append_once`, returning a table version at or after the append's commit, or None when the batch was
    already committed (`save`)."""
    return save(df, path, "append", application, batch, merge_schema=merge_schema)


#: Characters Delta refuses in a column name unless the table maps names to physical ones (column mapping).
_NEEDS_MAPPING = frozenset(" ,;{}()\n\t=")


def needs_column_mapping(names: Sequence[str]) -> bool:
    """Whether Delta takes these column names only with column mapping (a space, a comma, ... in a name)."""
    return any(ch in _NEEDS_MAPPING for name in names for ch in name)


def allow_any_column_names(spark: SparkSession, path: LakePath | str) -> None:
    """Turn on Delta's column mapping by name for the table, once: source tables may name a column
    `my col` or `x") --`, which Delta refuses in a table without it. An in-place protocol upgrade
    (reader 2, writer 5) of one metadata commit; only tables that meet such a name pay it."""
    from delta.tables import DeltaTable

    if table_property(DeltaTable.forPath(spark, location(path)), "delta.columnMapping.mode") == "name":
        return
    spark.sql(
        f"ALTER TABLE delta.`{_path_identifier(path)}` SET TBLPROPERTIES "
        "('delta.columnMapping.mode' = 'name', 'delta.minReaderVersion' = '2', 'delta.minWriterVersion' = '5')"
    )


def is_table(spark: SparkSession, path: LakePath | str) -> bool:
    """Whether `path` holds a Delta table (a committed log), without reading it.

    `DeltaTable.isDeltaTable` answers from the cached snapshot of Delta's log handle, which can be behind
    the log: while another thread's first commit of the table was still in its post-commit steps, it said
    "no table" with the commit on disk (a backfill beside the stream's first start). Only that answer is
    checked against the log itself (`_log_version`: the handle updated); a "yes" costs no listing, as on the
    latest-state stage's path, whose next step reads the table anyway.
    """
    from delta.tables import DeltaTable

    if DeltaTable.isDeltaTable(spark, location(path)):
        return True
    current = _log_version(spark, path)  # None: no handle to update here (Spark Connect)
    return current is not None and current >= 0


def partition_rows(spark: SparkSession, path: LakePath | str, column: str) -> dict[Any, int]:
    """Rows per value of partition column `column` in the current snapshot, from its files' statistics
    (`numRecords` in each add action): no data file is opened. A file without statistics counts as
    unknown and is read with a count instead."""
    from pyspark.sql import DataFrame as _DataFrame
    from pyspark.sql import functions as F

    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location(path))  # type: ignore[attr-defined]
        files = _DataFrame(log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty()).allFiles().toDF(), spark)
        rows = files.select(F.col("partitionValues")[column].alias("part"),
                            F.get_json_object("stats", "$.numRecords").cast("long").alias("n")).groupBy("part").agg(
            F.sum("n").alias("n"), F.count(F.when(F.col("n").isNull(), 1)).alias("unknown")).collect()
    except Exception:  # noqa: BLE001 - an internal API that moved: count instead
        rows = None
    if rows is None or any(r["unknown"] for r in rows):
        counted = read(spark, path).groupBy(column).count().collect()
        return {r[column]: int(r["count"]) for r in counted}
    return {r["part"]: int(r["n"] or 0) for r in rows}


#: delta-spark's commit-conflict errors. In its Python API they are siblings, not subclasses of
#: `DeltaConcurrentModificationException` (a concurrent append, a metadata or protocol change, ...), so
#: every one is named; the captured (classic) and Spark Connect forms both derive from these.
CONFLICT_NAMES = (
    "DeltaConcurrentModificationException", "ConcurrentWriteException", "MetadataChangedException", "ProtocolChangedException",
    "ConcurrentAppendException", "ConcurrentDeleteReadException", "ConcurrentDeleteDeleteException", "ConcurrentTransactionException",
)


def conflict_errors() -> tuple[type[BaseException], ...]:
    from delta.exceptions import base

    return tuple(getattr(base, name) for name in CONFLICT_NAMES)


def with_retries(action: Callable[[], Any], *, what: str, attempts: int = 8, advice: str = ONE_WRITER) -> Any:
    """`errors.retry_conflicts` for delta-spark's conflicts (`conflict_errors`)."""
    return retry_conflicts(action, conflict_errors(), what=what, attempts=attempts, advice=advice)


def session() -> SparkSession:
    """The active Spark session, or the process's own (`session.get_spark`) when none is active."""
    from pyspark.sql import SparkSession as _SparkSession

    active = _SparkSession.getActiveSession()
    if active is not None:
        return active
    from cdc_platform.spark.session import get_spark

    return get_spark()


def rows_written(spark: SparkSession, path: LakePath | str, at_version: int, application: str | None = None, batch: int | None = None) -> int:
    """The rows the write committed as `at_version` added, from that commit's own metrics.

    Reading the count back from the commit saves counting the rows in a job of their own before the
    write, which would compute the batch's anti-join twice or hold it in memory. The commit is read as
    the one log file it is (`commit_actions`, ~0.1 s), not through `DESCRIBE HISTORY` (a Spark job,
    0.7-1.1 s warm and 4 s cold here, twice in every batch). With `application` and `batch`, the commit
    must carry that application transaction (Delta writes it into the same commit), so a count is never
    taken from another writer's commit. Delta records `numOutputRows` for every write unless
    `spark.databricks.delta.history.metricsEnabled` is off; then this refuses rather than guess.
    """
    from cdc_platform.errors import LakeError

    actions = commit_actions(spark, path, at_version)
    if actions is None:  # not a plain log file (a log store that stages commits elsewhere): ask Delta
        from delta.tables import DeltaTable

        row = DeltaTable.forPath(spark, location(path)).history().where(f"version = {int(at_version)}").select("operationMetrics").first()
        actions = [] if row is None else [{"commitInfo": {"operationMetrics": row["operationMetrics"]}}]
    if application is not None and not any(
        a.get("txn", {}).get("appId") == application and a["txn"].get("version") == batch for a in actions
    ):
        raise LakeError(
            f"version {at_version} of {path} is not the commit of {application} batch {batch}: another writer committed in between; "
            "one stream writes a lake"
        )
    metrics = next((a["commitInfo"].get("operationMetrics") or {} for a in actions if "commitInfo" in a), {})
    if "numOutputRows" not in metrics:
        raise LakeError(
            f"cannot read how many rows version {at_version} of {path} added: its commit has no numOutputRows; "
            "spark.databricks.delta.history.metricsEnabled is false: one stream writes a lake, with metrics on"
        )
    return int(metrics["numOutputRows"])


def commit_metrics(spark: SparkSession, path: LakePath | str, at_version: int) -> dict[str, str]:
    """The `operationMetrics` of the table's commit `at_version` (numDeletedRows, numOutputRows, ...)."""
    actions = commit_actions(spark, path, at_version)
    if actions is None:
        from delta.tables import DeltaTable

        row = DeltaTable.forPath(spark, location(path)).history().where(f"version = {int(at_version)}").select("operationMetrics").first()
        return dict(row["operationMetrics"] or {}) if row is not None else {}
    return next((dict(a["commitInfo"].get("operationMetrics") or {}) for a in actions if "commitInfo" in a), {})


def commit_actions(spark: SparkSession, path: LakePath | str, at_version: int) -> list[dict[str, Any]] | None:
    """The actions of the table's commit `at_version` (commitInfo, txn, add, ...), read from its log file
    through Hadoop's file system (so an object-store lake reads the same); None when there is no such file
    (cleaned up after the log retention, or a log store that keeps commits elsewhere)."""
    import json

    fs, log_file = hadoop_file(spark, f"{location(path).rstrip('/')}/_delta_log/{int(at_version):020d}.json")
    if not fs.exists(log_file):
        return None
    stream = fs.open(log_file)
    try:
        text = bytes(stream.readAllBytes()).decode("utf-8")
    finally:
        stream.close()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def optimize(spark: SparkSession, path: LakePath | str) -> dict[str, Any]:
    """Compact small files (`OPTIMIZE`); returns Delta's metrics."""
    from delta.tables import DeltaTable

    result = DeltaTable.forPath(spark, location(path)).optimize().executeCompaction().first()
    return result.asDict(recursive=True) if result is not None else {}


def vacuum(spark: SparkSession, path: LakePath | str, retain_hours: float, *, enforce_retention: bool = True) -> int:
    """Remove files the log no longer references and that are older than `retain_hours` (`VACUUM`).

    Returns the files deleted, from the `VACUUM END` commit Delta logs (vacuum logging is switched on
    for the command: on a local file system Delta leaves it off by default, and `cdc maintain` reports
    the count). `enforce_retention=False` lets a retention below Delta's 7-day safety check through, as
    `cdc maintain --vacuum-hours` promises; both settings are set and restored around the one command
    (settings are per session; these two touch no other command).
    """
    from delta.tables import DeltaTable

    settings = {VACUUM_LOGGING: "true"}
    if not enforce_retention:
        settings[RETENTION_CHECK] = "false"
    with _VACUUM_LOCK:
        saved = {key: spark.conf.get(key, None) for key in settings}
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            before = version(spark, path)
            DeltaTable.forPath(spark, location(path)).vacuum(retain_hours)
        finally:
            for key, value in saved.items():
                if value is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, value)
    return _vacuumed_files(spark, path, before)


def _vacuumed_files(spark: SparkSession, path: LakePath | str, since: int) -> int:
    from delta.tables import DeltaTable

    entries = DeltaTable.forPath(spark, location(path)).history().where(f"version > {int(since)} AND operation = 'VACUUM END'").collect()
    return sum(int((e["operationMetrics"] or {}).get("numDeletedFiles", 0)) for e in entries)


def history(spark: SparkSession, path: LakePath | str, limit: int | None = None) -> list[dict[str, Any]]:
    """`DESCRIBE HISTORY`, newest first, each entry a dict (version, operation, operationMetrics, ...)."""
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, location(path))
    rows = (table.history(limit) if limit else table.history()).collect()
    return [r.asDict(recursive=True) for r in rows]


def file_count(spark: SparkSession, path: LakePath | str) -> int:
    """Files in the current snapshot (`DESCRIBE DETAIL`), from the log alone."""
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{_path_identifier(path)}`").first()["numFiles"])


def _path_identifier(path: LakePath | str) -> str:
    return location(path).replace("`", "``")


def sql_string(value: str) -> str:
    """A Spark SQL string literal (backslash escapes; not delta-rs's dialect, see `lake.delta_string`)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
