"""Scans of a small table listed from its checksum's file list (jvm/parser's `ChecksumScan` rule, every session's,
and `ChecksumRead`): the same rows and columns as Delta's own read of that version, without the state replay or
Delta's file-skipping job; and Delta's own read wherever the list cannot vouch for the files."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.lake import lake_spark
from cdc_platform.lake.lake_spark import CHECKSUM_READ_CONF, CHECKSUM_READ_MAX_BYTES_CONF

SCHEMA = "k STRING, day DATE, v BIGINT"
D1, D2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)


def _snapshot(spark: Any, path: Path) -> Any:
    """Delta's current snapshot object of the table: the one a read of the current version plans with."""
    jvm = spark._jvm
    return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path)).update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())


def _checksum(path: Path, version: int) -> Any:
    return json.loads((path / "_delta_log" / f"{version:020d}.crc").read_text(encoding="utf-8"))


def _sorted(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def _deltas_own(spark: Any, path: Path, version: int) -> Any:
    spark.conf.set(CHECKSUM_READ_CONF, "false")
    try:
        return lake_spark.read(spark, path, version)
    finally:
        spark.conf.unset(CHECKSUM_READ_CONF)


@pytest.fixture
def table(spark: Any, tmp_path: Path) -> Iterator[Path]:
    """A table partitioned by day with three versions of data: two appends, then an overwrite of one partition."""
    from pyspark.sql.types import StructType

    path = tmp_path / "t"
    lake_spark.ensure_table(spark, path, StructType.fromDDL(SCHEMA), ["day"])
    frame = lambda *items: spark.createDataFrame(list(items), SCHEMA)  # noqa: E731
    lake_spark.save(frame(("a", D1, 1), ("b", D2, 2)), path, "append", "t:w", 0)
    lake_spark.save(frame(("c", D1, 3)), path, "append", "t:w", 1)
    frame(("d", D2, 4)).write.format("delta").mode("overwrite").option("replaceWhere", f"day = '{D2}'").save(str(path))
    yield path


def test_every_version_read_from_its_list_equals_deltas_own_read_of_it(spark: Any, table: Path) -> None:
    for version in range(lake_spark.version(spark, table) + 1):
        assert _checksum(table, version).get("allFiles") is not None, "each commit's checksum lists the files"
        listed, own = lake_spark.read(spark, table, version), _deltas_own(spark, table, version)
        assert listed.schema == own.schema and _sorted(listed) == _sorted(own), version
    assert _sorted(lake_spark.read(spark, table, 3)) == [("a", D1, 1), ("c", D1, 3), ("d", D2, 4)]
    assert _sorted(lake_spark.read(spark, table, 3).where(f"day = '{D2}'")) == [("d", D2, 4)], "partition pruning stays"


@pytest.mark.parametrize("from_checksum", [True, False])
def test_a_read_from_the_list_replays_no_state(spark: Any, table: Path, from_checksum: bool) -> None:
    """The point: planning the scan of a version Delta has not scanned yet runs no state reconstruction (a Spark
    job); with the setting off it does, as Delta's own read always did."""
    snapshot = _snapshot(spark, table)
    assert not snapshot.stateReconstructionTriggered()
    if not from_checksum:
        spark.conf.set(CHECKSUM_READ_CONF, "false")
    try:
        assert len(lake_spark.read(spark, table, int(snapshot.version())).collect()) == 3
    finally:
        spark.conf.unset(CHECKSUM_READ_CONF)
    assert snapshot.stateReconstructionTriggered() is not from_checksum


def test_a_schema_changing_commits_files_are_replayed_from_the_version_before(spark: Any, table: Path) -> None:
    """Delta writes no list into the checksum of a commit that changes the schema (a latest-state table's first
    batch adds the source's columns); the read replays that one commit on the list before it."""
    wide = spark.createDataFrame([("e", D1, 5, "x")], SCHEMA + ", extra STRING")
    version = lake_spark.save(wide, table, "append", "t:w", 2, merge_schema=True)
    assert version is not None and "allFiles" not in _checksum(table, version), "Delta kept no list across the schema change"
    snapshot = _snapshot(spark, table)
    listed = lake_spark.read(spark, table, version)
    assert not snapshot.stateReconstructionTriggered() and listed.columns == ["k", "day", "v", "extra"]
    assert _sorted(listed) == _sorted(_deltas_own(spark, table, version))
    assert ("e", D1, 5, "x") in _sorted(listed) and len(_sorted(listed)) == 4


def test_a_table_over_the_size_or_with_deletion_vectors_is_read_by_delta(spark: Any, table: Path) -> None:
    """What the list cannot vouch for goes Delta's way: a table over the size limit (statistics skipping is worth
    its replay there), and files with deletion vectors (rows the file still holds but the table does not)."""
    spark.conf.set(CHECKSUM_READ_MAX_BYTES_CONF, "1")
    try:
        snapshot = _snapshot(spark, table)
        assert len(lake_spark.read(spark, table, int(snapshot.version())).collect()) == 3
        assert snapshot.stateReconstructionTriggered(), "over the size: Delta's own read"
    finally:
        spark.conf.unset(CHECKSUM_READ_MAX_BYTES_CONF)

    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.createDataFrame([("x", D1, 7), ("y", D1, 8)], SCHEMA).coalesce(1).write.format("delta").mode("append").save(str(table))
    spark.sql(f"DELETE FROM delta.`{table}` WHERE k = 'x'")
    version = lake_spark.version(spark, table)
    commit = [json.loads(line) for line in (table / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8").splitlines()]
    assert any(a.get("add", {}).get("deletionVector") for a in commit), "the delete wrote a deletion vector"
    assert _sorted(lake_spark.read(spark, table, version)) == [("a", D1, 1), ("c", D1, 3), ("d", D2, 4), ("y", D1, 8)], "x deleted"


def test_a_version_that_does_not_exist_fails_as_deltas_own_read_does(spark: Any, table: Path) -> None:
    with pytest.raises(Exception) as listed:
        lake_spark.read(spark, table, 99).collect()
    with pytest.raises(Exception) as own:
        _deltas_own(spark, table, 99).collect()
    assert type(listed.value) is type(own.value) and "99" in str(listed.value)


def test_the_frame_belongs_to_the_session_that_asked(spark: Any, table: Path) -> None:
    """Delta makes the frame in the thread's active session, which on a py4j thread can be another one (a
    streaming query's clone); a temp view of the frame must land in the session that read it."""
    other = spark.newSession()
    frame = lake_spark.read(other, table, 3)
    frame.createOrReplaceTempView("checksum_read_other")
    try:
        assert other.table("checksum_read_other").count() == 3
        assert not spark.catalog.tableExists("checksum_read_other"), "the view went to the session that read"
    finally:
        other.catalog.dropTempView("checksum_read_other")


# -- the optimizer rule (jvm/parser's `ChecksumScan`): every query's scan of a small table ------------------------


def _scan_indexes(df: Any) -> tuple[int, int]:
    """(scans Delta planned with its file-skipping job, scans listed from a checksum) in the query's plan."""
    plan = df._jdf.queryExecution().executedPlan().toString()
    return plan.count("PreparedDeltaFileIndex"), plan.count("TahoeBatchFileIndex")


def _current(spark: Any, table: Path) -> Any:
    return spark.read.format("delta").load(str(table))


def test_a_querys_scans_of_a_small_table_are_listed_from_its_checksum(spark: Any, table: Path) -> None:
    """A query over a table's latest version (a catalog view's, a full view's) lists its files from the checksum,
    the subquery's scan too, and reads the rows Delta's own planning reads; off, Delta plans each scan. (The
    subquery filters: Delta would answer a bare `max(v)` from the log's statistics, with no scan at all.)"""
    sql = f"SELECT k, v FROM delta.`{table}` WHERE day = '{D1}' AND v <= (SELECT max(v) FROM delta.`{table}` WHERE k <> 'z')"
    listed = spark.sql(sql)
    assert _scan_indexes(listed) == (0, 2)
    spark.conf.set(CHECKSUM_READ_CONF, "false")
    try:
        own = spark.sql(sql)
        assert _scan_indexes(own) == (2, 0)
        assert _sorted(own) == [("a", 1), ("c", 3)]
    finally:
        spark.conf.unset(CHECKSUM_READ_CONF)
    assert _sorted(listed) == [("a", 1), ("c", 3)]


def test_each_query_lists_the_version_current_when_it_is_planned(spark: Any, table: Path) -> None:
    """The files are pinned for one query only: the next query over the same DataFrame sees a later commit."""
    frame = _current(spark, table)
    assert frame.count() == 3
    spark.createDataFrame([("e", D1, 5)], SCHEMA).write.format("delta").mode("append").save(str(table))
    assert _scan_indexes(frame) == (0, 1) and frame.count() == 4
    assert ("e", D1, 5) in _sorted(frame)


def test_a_time_travel_query_is_listed_from_that_versions_checksum(spark: Any, table: Path) -> None:
    old = spark.read.format("delta").option("versionAsOf", 1).load(str(table))
    assert _scan_indexes(old) == (0, 1)
    assert _sorted(old) == [("a", D1, 1), ("b", D2, 2)]


def test_scans_the_list_cannot_vouch_for_or_inside_a_transaction_are_plannned_by_delta(spark: Any, table: Path) -> None:
    """Over the size, and within an active Delta transaction (whose reads Delta records for its conflict check),
    Delta plans the scan itself; a table with deletion vectors is read by Delta too (rows deleted stay hidden)."""
    spark.conf.set(CHECKSUM_READ_MAX_BYTES_CONF, "1")
    try:
        assert _scan_indexes(_current(spark, table)) == (1, 0)
    finally:
        spark.conf.unset(CHECKSUM_READ_MAX_BYTES_CONF)

    jvm = spark._jvm
    txn = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(table)).startTransaction()
    active = jvm.org.apache.spark.sql.delta.__getattr__("OptimisticTransaction$").__getattr__("MODULE$")
    active.setActive(txn)
    try:
        in_txn = _current(spark, table).where("k = 'a'")
        assert _scan_indexes(in_txn) == (1, 0)
        assert txn.readPredicates().size() > 0, "Delta recorded the read for its conflict check"
    finally:
        active.clearActive()

    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.createDataFrame([("x", D1, 7), ("y", D1, 8)], SCHEMA).coalesce(1).write.format("delta").mode("append").save(str(table))
    spark.sql(f"DELETE FROM delta.`{table}` WHERE k = 'x'")
    after = _current(spark, table)
    assert _scan_indexes(after) == (1, 0)
    assert _sorted(after) == [("a", D1, 1), ("c", D1, 3), ("d", D2, 4), ("y", D1, 8)]


def test_a_size_limit_that_is_no_number_fails_the_query_saying_what_to_set(spark: Any, table: Path) -> None:
    spark.conf.set(CHECKSUM_READ_MAX_BYTES_CONF, "16MiB")
    try:
        with pytest.raises(Exception, match="must be a whole number of bytes .* not '16MiB'"):
            _current(spark, table).collect()
    finally:
        spark.conf.unset(CHECKSUM_READ_MAX_BYTES_CONF)
    assert _current(spark, table).count() == 3
