"""The lake on delta-spark: the engine the pipeline is moving onto (issue 10), one table operation each.

Today's stages still commit through delta-rs (`lake.py`); this module is what they move to, table by
table, and it already holds the rules that move must keep:

* Exactly once is Delta's own. Every micro-batch write carries an application transaction
  (`txnAppId` = `<query id>:<table>`, `txnVersion` = batch id); Delta records it in the same commit
  and skips a later write whose version is not above the recorded one, atomically, where delta-rs
  only records it and the platform had to check it first. For appends the writer options carry it;
  for MERGE, Delta reads the same pair from two session settings, which this module sets and clears
  around the one command under a lock (settings are per session, shared by the stream's threads).
* Identity dedup stays: the raw log and markers insert only ids they do not hold (MERGE ... WHEN NOT
  MATCHED), so input redelivered under a new batch id, or after a lost checkpoint, inserts nothing.
  The MERGE names the partitions the batch touches as literals, so its cost follows the batch.
* Reads go through `spark.read.format("delta")`: the snapshot's own file list, never a directory
  listing (which would include files the log removed).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from delta.tables import DeltaTable
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

#: Delta's session settings for idempotent DML (MERGE, UPDATE, DELETE); writer options win over them.
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
#: VACUUM's settings: log `VACUUM START`/`END` commits (with the deleted-file count), and the 7-day check.
VACUUM_LOGGING = "spark.databricks.delta.vacuum.logging.enabled"
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
_TXN_LOCK = threading.Lock()
#: VACUUM's own lock: two vacuums must not interleave saving and restoring its settings, and a long
#: vacuum must not hold up the stream's MERGEs, which take `_TXN_LOCK`.
_VACUUM_LOCK = threading.Lock()


def location(path: Path | str) -> str:
    return str(path)


def read(spark: SparkSession, path: Path | str, version: int | None = None) -> DataFrame:
    """The table's current snapshot, or the one at `version` (time travel, `versionAsOf`).

    Without a version the DataFrame follows the table: every query over it (or over a temp view of it)
    reads the version current when that query is planned. A reader that decides something from one
    version (its history, its file statistics, another table read alongside) pins that version.
    """
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", int(version))
    return reader.load(location(path))


def pinned(spark: SparkSession, path: Path | str) -> tuple[int, DataFrame]:
    """(current version, a DataFrame of exactly that version): a snapshot that later commits do not move."""
    current = version(spark, path)
    return current, read(spark, path, current)


def ensure_table(spark: SparkSession, path: Path | str, schema: StructType, partition_by: Sequence[str] = ()) -> DeltaTable:
    """Create the table if it does not exist (an existing one is left as it is)."""
    from delta.tables import DeltaTable

    builder = DeltaTable.createIfNotExists(spark).location(location(path)).addColumns(schema)
    if partition_by:
        builder = builder.partitionedBy(*partition_by)
    return builder.execute()


def version(spark: SparkSession, path: Path | str) -> int:
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


def _log_version(spark: SparkSession, path: Path | str) -> int | None:
    from py4j.protocol import Py4JError

    try:
        jvm = spark._jvm  # type: ignore[attr-defined]
        log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, location(path))  # type: ignore[attr-defined]
        return int(log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty()).version())
    except (Py4JError, AttributeError):  # AttributeError: no JVM in this process (Spark Connect)
        return None


def last_commit(spark: SparkSession, path: Path | str) -> dict[str, Any]:
    """The newest entry of `DESCRIBE HISTORY`, as a dict (operation, operationMetrics, ...)."""
    from delta.tables import DeltaTable

    return DeltaTable.forPath(spark, location(path)).history(1).first().asDict(recursive=True)


def append_once(df: DataFrame, path: Path | str, application: str, batch: int) -> bool:
    """Append `df` unless this application already committed `batch` (or a later one); True if it wrote."""
    spark = df.sparkSession
    before = version(spark, path)
    (df.write.format("delta").mode("append")
     .option("txnAppId", application).option("txnVersion", batch).save(location(path)))
    return version(spark, path) != before


def insert_new_once(
    df: DataFrame, path: Path | str, id_column: str, partition_column: str, application: str, batch: int
) -> int | None:
    """Insert the rows of `df` whose id the table lacks, once per (application, batch).

    Returns the rows inserted, or None when Delta skipped the batch as already committed. Only the
    partitions the batch carries are searched for its ids: their values (a small aggregate) become
    literals of the MERGE condition, which Delta prunes files by.
    """
    from delta.tables import DeltaTable

    spark = df.sparkSession
    parts = [row[0] for row in df.select(partition_column).distinct().collect()]
    if not parts:
        return 0
    named = ", ".join(_sql_literal(p) for p in parts if p is not None)
    within = [f"t.`{partition_column}` IN ({named})"] if named else []
    if None in parts:
        within.append(f"t.`{partition_column}` IS NULL")
    condition = f"t.`{id_column}` = s.`{id_column}` AND ({' OR '.join(within)})"
    before = version(spark, path)
    with _TXN_LOCK:
        spark.conf.set(TXN_APP_ID, application)
        spark.conf.set(TXN_VERSION, str(batch))
        try:
            (DeltaTable.forPath(spark, location(path)).alias("t")
             .merge(df.alias("s"), condition).whenNotMatchedInsertAll().execute())
        finally:
            spark.conf.unset(TXN_APP_ID)
            spark.conf.unset(TXN_VERSION)
    if version(spark, path) == before:
        return None
    metrics = last_commit(spark, path).get("operationMetrics") or {}
    return int(metrics.get("numTargetRowsInserted", 0))


def optimize(spark: SparkSession, path: Path | str) -> dict[str, Any]:
    """Compact small files (`OPTIMIZE`); returns Delta's metrics."""
    from delta.tables import DeltaTable

    result = DeltaTable.forPath(spark, location(path)).optimize().executeCompaction().first()
    return result.asDict(recursive=True) if result is not None else {}


def vacuum(spark: SparkSession, path: Path | str, retain_hours: float, *, enforce_retention: bool = True) -> int:
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


def _vacuumed_files(spark: SparkSession, path: Path | str, since: int) -> int:
    from delta.tables import DeltaTable

    entries = DeltaTable.forPath(spark, location(path)).history().where(f"version > {int(since)} AND operation = 'VACUUM END'").collect()
    return sum(int((e["operationMetrics"] or {}).get("numDeletedFiles", 0)) for e in entries)


def history(spark: SparkSession, path: Path | str, limit: int | None = None) -> list[dict[str, Any]]:
    """`DESCRIBE HISTORY`, newest first, each entry a dict (version, operation, operationMetrics, ...)."""
    from delta.tables import DeltaTable

    table = DeltaTable.forPath(spark, location(path))
    rows = (table.history(limit) if limit else table.history()).collect()
    return [r.asDict(recursive=True) for r in rows]


def file_count(spark: SparkSession, path: Path | str) -> int:
    """Files in the current snapshot (`DESCRIBE DETAIL`), from the log alone."""
    return int(spark.sql(f"DESCRIBE DETAIL delta.`{_path_identifier(path)}`").first()["numFiles"])


def _path_identifier(path: Path | str) -> str:
    return location(path).replace("`", "``")


def _sql_literal(value: Any) -> str:
    import datetime as dt

    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return f"DATE'{value.isoformat()}'"
    return sql_string(str(value))


def sql_string(value: str) -> str:
    """A Spark SQL string literal (backslash escapes; not delta-rs's dialect, see `lake.delta_string`)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
