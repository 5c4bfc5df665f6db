"""The lake on delta-spark: exactly once by Delta's application transactions, identity dedup, reads."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.lake import insert_new, lake_spark

SCHEMA = "event_id STRING, event_date DATE, v BIGINT"
D1, D2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)


@pytest.fixture
def table(spark: Any, tmp_path: Path) -> Path:
    from pyspark.sql.types import StructType

    path = tmp_path / "raw"
    lake_spark.ensure_table(spark, path, StructType.fromDDL(SCHEMA), ["event_date"])
    return path


def rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in lake_spark.read(spark, path).collect())


def test_ensure_table_is_idempotent_and_partitions(spark: Any, table: Path) -> None:
    from pyspark.sql.types import StructType

    lake_spark.ensure_table(spark, table, StructType.fromDDL(SCHEMA), ["event_date"])
    assert lake_spark.version(spark, table) == 0
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").first()
    assert detail["partitionColumns"] == ["event_date"]


def _log_actions(path: Path, version: int = 0) -> dict[str, Any]:
    import json

    actions = [json.loads(line) for line in (path / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8").splitlines()]
    return {kind: body for action in actions for kind, body in action.items()}


def test_a_new_table_is_the_table_delta_spark_creates_with_its_checksum(spark: Any, tmp_path: Path) -> None:
    """`ensure_table` writes version 0 with delta-rs and its checksum with Delta Kernel: the protocol, schema,
    partition columns and properties delta-spark's own `createIfNotExists` writes, and a checksum listing no
    application transactions, so the first idempotent write is already `OnceWrite`'s (no state reconstruction)."""
    import json

    from pyspark.sql.types import StructType

    schema = StructType.fromDDL("event_id STRING NOT NULL, event_date DATE NOT NULL, v BIGINT, m MAP<STRING, BIGINT>, t TIMESTAMP")
    ours, theirs = tmp_path / "raw", tmp_path / "raw_by_spark"
    lake_spark.ensure_table(spark, ours, schema, ["event_date"])
    lake_spark._create_with_spark(spark, theirs, schema, ["event_date"], {"delta.checkpointInterval": str(lake_spark.checkpoint_interval("raw"))})
    a, b = _log_actions(ours), _log_actions(theirs)
    assert a["protocol"] == b["protocol"] == {"minReaderVersion": 1, "minWriterVersion": 2}
    assert json.loads(a["metaData"]["schemaString"]) == json.loads(b["metaData"]["schemaString"])
    assert a["metaData"]["partitionColumns"] == b["metaData"]["partitionColumns"] == ["event_date"]
    assert a["metaData"]["configuration"] == b["metaData"]["configuration"]
    checksum = json.loads((ours / "_delta_log" / f"{0:020d}.crc").read_text(encoding="utf-8"))
    assert checksum["setTransactions"] == [] and checksum["numFiles"] == 0 and checksum["protocol"] == a["protocol"]
    df = spark.createDataFrame([("a", D1, 1, {"k": 1}, dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc))], schema)
    assert lake_spark._once_write(df, ours, "append", "q:raw", 0, None, False) == 1, "the checksum answered: OnceWrite wrote"
    assert lake_spark._once_write(df, ours, "append", "q:raw", 0, None, False) is None, "and refuses the replay"
    assert spark.sql(f"DESCRIBE DETAIL delta.`{ours}`").first()["partitionColumns"] == ["event_date"]
    with pytest.raises(Exception, match="NOT NULL|DELTA_NOT_NULL"):
        lake_spark.save(spark.createDataFrame([(None, D1, 1, None, None)], "event_id STRING, event_date DATE, v BIGINT, m MAP<STRING, BIGINT>, t TIMESTAMP"), ours, "append")


def test_a_table_delta_rs_cannot_create_is_created_by_delta_spark(spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any failure of the quick way (delta-rs refusing, the Kernel checksum failing) leaves the creation to delta-spark."""
    from deltalake import DeltaTable as RsTable
    from deltalake.exceptions import DeltaError
    from pyspark.sql.types import StructType

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise DeltaError("refused")

    monkeypatch.setattr(RsTable, "create", refuse)
    path = tmp_path / "raw"
    lake_spark.ensure_table(spark, path, StructType.fromDDL(SCHEMA), ["event_date"])
    assert _log_actions(path)["commitInfo"]["operation"] == "CREATE TABLE" and "engineInfo" in _log_actions(path)["commitInfo"]
    assert "Apache-Spark" in _log_actions(path)["commitInfo"]["engineInfo"], "delta-spark made it"
    assert lake_spark.version(spark, path) == 0


def test_ensure_tables_creates_each_table_once_side_by_side(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql.types import StructType

    specs = [(tmp_path / f"t{i}", StructType.fromDDL(SCHEMA), ["event_date"] if i % 2 else []) for i in range(5)]
    lake_spark.ensure_tables(spark, specs)
    lake_spark.ensure_tables(spark, specs)  # again: nothing to do
    for path, _, partition_by in specs:
        assert lake_spark.version(spark, path) == 0
        assert spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["partitionColumns"] == list(partition_by)


def test_a_new_table_checkpoints_at_its_drawn_interval_and_an_old_one_keeps_its_own(spark: Any, tmp_path: Path) -> None:
    """Delta checkpoints at a multiple of the table's interval: one that drew 11 has no checkpoint at
    Delta's default 10 and one at 11. A table made before (Delta's default) is left as it is."""
    from pyspark.sql.types import StructType

    name = next(n for n in (f"t{i}" for i in range(100)) if lake_spark.checkpoint_interval(n) == 11)
    path = tmp_path / name
    lake_spark.ensure_table(spark, path, StructType.fromDDL(SCHEMA), ["event_date"])
    for batch in range(9):  # versions 1-9 by delta-rs (fast), 10 and 11 by delta-spark, which checkpoints
        _rs_append(path, _rs_rows((f"e{batch}", batch)), "q:t", batch)
    for batch in (9, 10):
        assert lake_spark.append_once(spark.createDataFrame([(f"e{batch}", D1, batch)], SCHEMA), path, "q:t", batch)
    log = path / "_delta_log"
    assert not (log / f"{10:020d}.checkpoint.parquet").exists(), "not at Delta's default interval"
    assert (log / f"{11:020d}.checkpoint.parquet").is_file()

    old = tmp_path / name.upper()
    spark.sql(f"CREATE TABLE delta.`{old}` ({SCHEMA}) USING delta")
    lake_spark.ensure_table(spark, old, StructType.fromDDL(SCHEMA))
    assert "delta.checkpointInterval" not in spark.sql(f"DESCRIBE DETAIL delta.`{old}`").first()["properties"]
    assert lake_spark.version(spark, old) == 0, "no commit to an existing table"


def test_the_tables_a_batch_writes_checkpoint_in_different_batches() -> None:
    """Every table of the sample lake at one interval checkpointed in the same batch, every tenth; drawn
    intervals leave fewer than half of them checkpointing together in 99 batches of 100."""
    from cdc_platform.workload import generate
    from cdc_platform.stages.stage import DEAD_LETTER, MARKERS, METRICS, RAW
    from cdc_platform.stages.transactions.schemas import INCOMPLETE, LATE, OPEN_TRANSACTIONS, TRANSACTIONS, WATERMARK

    names = [RAW, MARKERS, METRICS, DEAD_LETTER, TRANSACTIONS, INCOMPLETE, LATE, OPEN_TRANSACTIONS, WATERMARK, *generate.TABLES]
    together = sorted(sum(1 for n in names if version % lake_spark.checkpoint_interval(n) == 0) for version in range(1, 3001))
    assert together[int(len(together) * 0.99)] < len(names) / 2
    assert sum(together) < len(together) * len(names) / 10, "fewer checkpoints than at Delta's default of 10"


@pytest.mark.parametrize("stub", ["empty log", "temp file and empty folder"])
def test_a_table_whose_creation_was_killed_is_created_on_the_next_start(spark: Any, tmp_path: Path, stub: str) -> None:
    """A SIGKILL between Delta making `_delta_log` and its first commit must not leave the lake stuck (CI crash trial)."""
    from pyspark.sql.types import StructType

    path = tmp_path / "raw"
    (path / "_delta_log").mkdir(parents=True)
    if stub != "empty log":
        (path / "_delta_log" / ".00000000000000000000.json.0f1e.tmp").write_text('{"protocol"', encoding="utf-8")
        (path / "_delta_log" / "_staged_commits").mkdir()
    lake_spark.ensure_table(spark, path, StructType.fromDDL(SCHEMA), ["event_date"])
    assert lake_spark.version(spark, path) == 0
    assert rows(spark, path) == []


def test_a_log_with_a_commit_trace_is_never_cleared(spark: Any, tmp_path: Path) -> None:
    """A checksum without its commit is a damaged table, not a half-made one: the error stands and nothing is deleted."""
    from pyspark.errors import AnalysisException
    from pyspark.sql.types import StructType

    path = tmp_path / "raw"
    (path / "_delta_log").mkdir(parents=True)
    crc = path / "_delta_log" / "00000000000000000000.crc"
    crc.write_text("{}", encoding="utf-8")
    with pytest.raises(AnalysisException, match="DELTA_TABLE_NOT_FOUND"):
        lake_spark.ensure_table(spark, path, StructType.fromDDL(SCHEMA), ["event_date"])
    assert crc.exists()


def test_an_arrow_table_with_empty_batches_becomes_every_one_of_its_rows(spark: Any) -> None:
    """pyspark 4.1's `createDataFrame` of an Arrow table drops the batches after an empty one; `from_arrow` does not."""
    import pyarrow as pa

    schema = pa.schema([("x", pa.int64())])
    parts = [pa.table({"x": pa.array(range(n, n + k), pa.int64())}) for n, k in ((0, 1), (1, 0), (1, 0), (1, 2), (3, 1))]
    data = pa.concat_tables(parts)
    assert [b.num_rows for b in data.to_batches()] == [1, 0, 0, 2, 1]
    assert sorted(r["x"] for r in lake_spark.from_arrow(spark, data, schema).collect()) == [0, 1, 2, 3]
    assert lake_spark.from_arrow(spark, data).count() == 4
    assert lake_spark.from_arrow(spark, schema.empty_table()).count() == 0


def test_append_once_writes_a_batch_once_and_refuses_older_ones(spark: Any, table: Path) -> None:
    df = spark.createDataFrame([("a", D1, 1)], SCHEMA)
    assert lake_spark.append_once(df, table, "q:raw", 5) is True
    assert lake_spark.append_once(df, table, "q:raw", 5) is False  # the replay of batch 5
    assert lake_spark.append_once(df, table, "q:raw", 4) is False  # an older batch
    assert lake_spark.append_once(df, table, "other-query:raw", 5) is True  # another application
    assert rows(spark, table) == [("a", D1, 1), ("a", D1, 1)]


def test_the_raw_log_keeps_no_file_statistics_on_its_text_and_a_column_added_later_gets_them(spark: Any, tmp_path: Path) -> None:
    """A new raw log names its statistics columns (`schemas.UNSKIPPED_COLUMNS`): a file's statistics hold the
    position and ids a lookup prunes by, not the images or the line; a column added later is named too, and
    the lookup by identity still finds a redelivery. A table of another name keeps Delta's default."""
    import json

    from pyspark.sql.types import StructType

    from cdc_platform.lake import schemas

    ddl = "event_id STRING, event_date DATE, position STRING, `before` STRING, line STRING, snapshot BOOLEAN"
    path = tmp_path / "raw_change_events"
    lake_spark.ensure_table(spark, path, StructType.fromDDL(ddl), ["event_date"])
    named = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["properties"][lake_spark.STATS_COLUMNS_PROPERTY]
    assert named.split(",") == ["event_id", "position"]
    assert set(schemas.UNSKIPPED_COLUMNS["raw_change_events"]) >= {"before", "after", "line"}

    lake_spark.ensure_table(spark, path, StructType.fromDDL(ddl + ", arrival BIGINT"), ["event_date"])
    named = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()["properties"][lake_spark.STATS_COLUMNS_PROPERTY]
    assert named.split(",") == ["event_id", "position", "arrival"]

    cols = "event_id STRING, event_date DATE, position STRING, `before` STRING, line STRING, snapshot BOOLEAN, arrival BIGINT"
    batch = spark.createDataFrame([("e1", D1, "p1", "{}", "x" * 100, False, 1), ("e2", D1, "p2", "{}", "y", False, 2)], cols)
    assert insert_new.insert_new_once(batch, path, "event_id", "event_date", "q:raw", 0, range_column="position") == 2
    adds = [a["add"] for a in _last_commit(path) if "add" in a]
    stats = json.loads(adds[0]["stats"])
    assert set(stats["minValues"]) == {"event_id", "position", "arrival"}, stats
    assert insert_new.insert_new_once(batch, path, "event_id", "event_date", "q:raw", 1, range_column="position") == 0

    other = tmp_path / "customers"
    lake_spark.ensure_table(spark, other, StructType.fromDDL(ddl), ["event_date"])
    assert lake_spark.STATS_COLUMNS_PROPERTY not in spark.sql(f"DESCRIBE DETAIL delta.`{other}`").first()["properties"]


def _last_commit(path: Path) -> list[dict[str, Any]]:
    import json

    last = sorted((path / "_delta_log").glob("*.json"))[-1]
    return [json.loads(line) for line in last.read_text(encoding="utf-8").splitlines()]


def test_the_checksum_answers_whether_a_batch_is_committed_and_the_commit_is_deltas_own(spark: Any, table: Path) -> None:
    """`OnceWrite` (jvm/parser) answers "already committed?" from the table's checksum: the commit it makes carries
    the application transaction and the write's metrics as Delta's own write does, and Delta's own writer refuses
    a replay of it, and the other way round."""
    df = spark.createDataFrame([("a", D1, 1), ("b", D2, 2)], SCHEMA)
    committed = lake_spark._once_write(df, table, "append", "q:raw", 3, None, False)
    assert committed == lake_spark.version(spark, table), "OnceWrite is in the session's jars, and says which version it committed"
    commit = _last_commit(table)
    assert {"txn": {"appId": "q:raw", "version": 3, "lastUpdated": commit[1]["txn"]["lastUpdated"]}} in commit
    info = next(a["commitInfo"] for a in commit if "commitInfo" in a)
    assert info["operation"] == "WRITE" and info["operationMetrics"]["numOutputRows"] == "2" and info["isBlindAppend"]
    assert lake_spark.rows_written(spark, table, lake_spark.version(spark, table), "q:raw", 3) == 2
    assert lake_spark._once_write(df, table, "append", "q:raw", 3, None, False) is None, "the replay"
    assert lake_spark._once_write(df, table, "append", "q:raw", 2, None, False) is None, "an older batch"
    before = lake_spark.version(spark, table)
    lake_spark.writer(df, "append", "q:raw", 3).save(str(table))
    assert lake_spark.version(spark, table) == before, "Delta's own check agrees"
    lake_spark.writer(df, "append", "other:raw", 0).save(str(table))
    assert lake_spark._once_write(df, table, "append", "other:raw", 0, None, False) is None, "and it reads what Delta's writer recorded"
    assert lake_spark.save(df, table, "append", "q:raw", 4) == lake_spark.version(spark, table)
    assert len(rows(spark, table)) == 6


def test_without_a_checksum_the_write_takes_deltas_own_check(spark: Any, table: Path) -> None:
    """A version whose `.crc` is missing (a crash between the commit and its checksum, or another writer that
    writes none): `OnceWrite` writes nothing and says so, and `save` goes through Delta's own check instead."""
    df = spark.createDataFrame([("a", D1, 1)], SCHEMA)
    at = lake_spark.save(df, table, "append", "q:raw", 0)
    assert at == lake_spark.version(spark, table)
    (table / "_delta_log" / f"{at:020d}.crc").unlink()
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()  # the checksum is held with the cached snapshot, as a new process would not
    assert lake_spark._once_write(df, table, "append", "q:raw", 0, None, False) is lake_spark._UNSETTLED
    assert lake_spark.version(spark, table) == at, "it wrote nothing"
    assert lake_spark.save(df, table, "append", "q:raw", 0) is None, "Delta's own check refuses the replay"
    assert lake_spark.save(df, table, "append", "q:raw", 1) == at + 1
    assert len(rows(spark, table)) == 2


def test_the_checksum_path_can_be_turned_off(spark: Any, table: Path) -> None:
    df = spark.createDataFrame([("a", D1, 1)], SCHEMA)
    spark.conf.set(lake_spark.ONCE_WRITE_CONF, "false")
    try:
        assert lake_spark._once_write(df, table, "append", "q:raw", 0, None, False) is lake_spark._UNSETTLED
        assert lake_spark.save(df, table, "append", "q:raw", 0) is not None
        assert lake_spark.save(df, table, "append", "q:raw", 0) is None
    finally:
        spark.conf.unset(lake_spark.ONCE_WRITE_CONF)
    assert lake_spark._once_write(df, table, "append", "q:raw", 0, None, False) is None


def test_the_checksum_path_merges_a_new_column_and_overwrites(spark: Any, table: Path) -> None:
    wide = spark.createDataFrame([("a", D1, 1, "x")], SCHEMA + ", extra STRING")
    assert lake_spark.save(wide, table, "append", "q:raw", 0, merge_schema=True) is not None
    assert lake_spark.read(spark, table).columns == ["event_id", "event_date", "v", "extra"]
    again = spark.createDataFrame([("b", D2, 2, "y")], SCHEMA + ", extra STRING")
    assert lake_spark.save(again, table, "overwrite", "q:state", 0, metadata="token-1") is not None
    assert rows(spark, table) == [("b", D2, 2, "y")]
    assert next(a["commitInfo"] for a in _last_commit(table) if "commitInfo" in a)["userMetadata"] == "token-1"
    assert lake_spark.save(again, table, "overwrite", "q:state", 0) is None


def _snapshot_of(spark: Any, path: Path) -> Any:
    jvm = spark._jvm
    return jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(path)).update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())


@pytest.mark.parametrize("from_checksum", [True, False])
def test_an_overwrite_replaces_the_files_its_checksum_lists_without_reading_the_table_state(
    spark: Any, tmp_path: Path, from_checksum: bool
) -> None:
    """A whole-table overwrite (the transaction stage's state, every batch) takes the files it replaces from the
    snapshot's checksum instead of a state reconstruction: the same rows, the same commit (an overwrite removing
    every file, the application transaction, the user metadata), a replay refused; turned off, Delta's own."""
    from pyspark.sql.types import StructType

    path = tmp_path / "state"
    lake_spark.ensure_table(spark, path, StructType.fromDDL("k STRING, v INT"), [])
    state = lambda *items: spark.createDataFrame(list(items), "k STRING, v INT")  # noqa: E731
    assert lake_spark.save(state(("a", 1), ("b", 2)), path, "overwrite", "q:state", 0) is not None
    assert lake_spark.save(state(("c", 3)), path, "append", "other:state", 0) is not None  # two files now
    spark.conf.set(lake_spark.ONCE_WRITE_OVERWRITE_CONF, str(from_checksum).lower())
    try:
        before = _snapshot_of(spark, path)
        listed = before.checksumOpt().get().allFiles()
        assert listed.isDefined() and listed.get().size() == before.checksumOpt().get().numFiles() > 1, "the checksum lists the table's files"
        version = lake_spark.save(state(("d", 4)), path, "overwrite", "q:state", 1, metadata="token-2")
        assert before.stateReconstructionTriggered() is not from_checksum, "the files came from the checksum, not a replay of the log"
    finally:
        spark.conf.unset(lake_spark.ONCE_WRITE_OVERWRITE_CONF)
    assert version == lake_spark.version(spark, path)
    assert rows(spark, path) == [("d", 4)]
    commit = _last_commit(path)
    info = next(a["commitInfo"] for a in commit if "commitInfo" in a)
    assert (info["operation"], info["operationParameters"]["mode"], info["userMetadata"], info["isBlindAppend"]) == ("WRITE", "Overwrite", "token-2", False)
    removed = sorted(a["remove"]["path"] for a in commit if "remove" in a)
    assert removed == sorted(f.path() for f in spark._jvm.scala.jdk.javaapi.CollectionConverters.asJava(listed.get()))
    assert all(a["remove"]["dataChange"] and a["remove"]["size"] > 0 for a in commit if "remove" in a)
    assert {"appId": "q:state", "version": 1} == {k: v for k, v in next(a["txn"] for a in commit if "txn" in a).items() if k != "lastUpdated"}
    assert lake_spark.save(state(("e", 5)), path, "overwrite", "q:state", 1) is None, "the replay"
    assert _snapshot_of(spark, path).checksumOpt().get().numFiles() == 1, "the next checksum counts what is left"


def test_an_overwrite_of_a_table_whose_checksum_lists_no_files_is_deltas_own(spark: Any, tmp_path: Path) -> None:
    """Past `allFilesInCrc.thresholdNumFiles` files (or a checksum another writer made without the list), the
    overwrite lists the files the way Delta does; the outcome is the same."""
    from pyspark.sql.types import StructType

    path = tmp_path / "state"
    lake_spark.ensure_table(spark, path, StructType.fromDDL("k STRING, v INT"), [])
    spark.conf.set("spark.databricks.delta.allFilesInCrc.thresholdNumFiles", "1")
    try:
        for i in range(3):
            lake_spark.save(spark.createDataFrame([(f"k{i}", i)], "k STRING, v INT"), path, "append", "q:rows", i)
        before = _snapshot_of(spark, path)
        assert before.checksumOpt().get().allFiles().isEmpty()
        assert lake_spark.save(spark.createDataFrame([("z", 9)], "k STRING, v INT"), path, "overwrite", "q:state", 0) is not None
        assert before.stateReconstructionTriggered(), "Delta listed the files itself"
    finally:
        spark.conf.unset("spark.databricks.delta.allFilesInCrc.thresholdNumFiles")
    assert rows(spark, path) == [("z", 9)]
    assert len([a for a in _last_commit(path) if "remove" in a]) == 3


def test_rows_written_refuses_a_commit_it_cannot_vouch_for(spark: Any, table: Path) -> None:
    from cdc_platform.errors import LakeError

    df = spark.createDataFrame([("a", D1, 1)], SCHEMA)
    lake_spark.append_once(df, table, "q:raw", 0)
    lake_spark.append_once(df, table, "other:raw", 0)  # another writer committed after version 1
    assert lake_spark.rows_written(spark, table, 2) == 1
    assert lake_spark.rows_written(spark, table, 1, "q:raw", 0) == 1  # its own commit, by the application transaction in it
    with pytest.raises(LakeError, match="not the commit of q:raw batch 0: another writer committed in between"):
        lake_spark.rows_written(spark, table, 2, "q:raw", 0)
    spark.conf.set("spark.databricks.delta.history.metricsEnabled", "false")
    try:
        lake_spark.append_once(df, table, "q:raw", 1)
        with pytest.raises(LakeError, match="metricsEnabled"):
            lake_spark.rows_written(spark, table, 3)
    finally:
        spark.conf.unset("spark.databricks.delta.history.metricsEnabled")


def test_commit_actions_read_one_commit_of_the_log(spark: Any, table: Path) -> None:
    """The log file of one version, as Delta wrote it; none for a version the log does not hold."""
    df = spark.createDataFrame([("a", D1, 1), ("b", D2, 2)], SCHEMA)
    lake_spark.append_once(df, table, "q:raw", 7)
    actions = lake_spark.commit_actions(spark, table, 1)
    assert actions is not None
    assert {"appId": "q:raw", "version": 7} == {k: v for k, v in next(a["txn"] for a in actions if "txn" in a).items() if k != "lastUpdated"}
    assert sum(1 for a in actions if "add" in a) >= 1
    assert next(a["commitInfo"] for a in actions if "commitInfo" in a)["operationMetrics"]["numOutputRows"] == "2"
    assert lake_spark.commit_actions(spark, table, 5) is None


def test_a_delta_spark_table_reads_in_delta_rs(spark: Any, table: Path) -> None:
    from deltalake import DeltaTable

    lake_spark.append_once(spark.createDataFrame([("a", D1, 1)], SCHEMA), table, "q:raw", 0)
    assert DeltaTable(str(table)).to_pyarrow_table().column("event_id").to_pylist() == ["a"]
    assert DeltaTable(str(table)).transaction_version("q:raw") == 0


def test_optimize_and_vacuum(spark: Any, table: Path) -> None:
    for batch in range(3):
        lake_spark.append_once(spark.createDataFrame([(f"e{batch}", D1, batch)], SCHEMA), table, "q:raw", batch)
    metrics = lake_spark.optimize(spark, table)
    assert metrics["metrics"]["numFilesRemoved"] == 3 and metrics["metrics"]["numFilesAdded"] == 1
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        lake_spark.vacuum(spark, table, 0)
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert len(list(table.glob("event_date=*/*.parquet"))) == 1
    assert rows(spark, table) == [("e0", D1, 0), ("e1", D1, 1), ("e2", D1, 2)]


# --- A lake an earlier version wrote with delta-rs: delta-spark reads, maintains and keeps writing it --------

def _rs_rows(*items: tuple[str, int]) -> Any:
    import pyarrow as pa

    return pa.table({"event_id": [i for i, _ in items], "event_date": [D1] * len(items), "v": [v for _, v in items]}, schema=_RS_SCHEMA)


def _rs_table(tmp_path: Path) -> Path:
    from deltalake import DeltaTable

    path = tmp_path / "rs"
    DeltaTable.create(str(path), _RS_SCHEMA, partition_by=["event_date"])
    return path


def _rs_append(path: Path, data: Any, application: str, version: int) -> None:
    """A micro-batch as the platform committed it before the write path moved: delta-rs, with the application transaction."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    write_deltalake(str(path), data, mode="append", commit_properties=CommitProperties(app_transactions=[Transaction(app_id=application, version=version)]))


def _protocol(spark: Any, path: Path) -> tuple[Any, ...]:
    from deltalake import DeltaTable

    p = DeltaTable(str(path)).protocol()
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").first()
    return (p.min_reader_version, p.min_writer_version, p.reader_features, p.writer_features,
            detail["minReaderVersion"], detail["minWriterVersion"], sorted(detail["tableFeatures"] or []))


def _import_schema() -> Any:
    import pyarrow as pa

    return pa.schema([pa.field("event_id", pa.string(), nullable=False), pa.field("event_date", pa.date32(), nullable=False), pa.field("v", pa.int64())])


_RS_SCHEMA = _import_schema()


def test_delta_spark_reads_a_delta_rs_table_by_its_log_and_pins_versions(spark: Any, tmp_path: Path) -> None:
    from deltalake import DeltaTable

    from cdc_platform import lake

    path = _rs_table(tmp_path)
    empty = lake_spark.read(spark, path)
    assert empty.count() == 0 and empty.columns == ["event_id", "event_date", "v"], "an empty table reads with its schema"
    _rs_append(path, _rs_rows(("a", 1), ("b", 2)), "q:t", 0)
    DeltaTable(str(path)).delete("event_id = 'a'")  # rewrites the file; the old one stays on disk
    assert [r["event_id"] for r in lake_spark.read(spark, path).collect()] == ["b"], "the log's files, not the directory's"
    version, pinned = lake_spark.pinned(spark, path)
    assert version == lake.open_table(path).version() == lake_spark._log_version(spark, path), "the fast version path works"
    _rs_append(path, _rs_rows(("c", 3)), "q:t", 1)
    assert pinned.count() == 1, "a pinned snapshot does not follow later commits"
    assert lake_spark.read(spark, path).count() == 2, "an unpinned read does"
    assert lake_spark.read(spark, path, 1).count() == 2, "time travel to the version before the delete"


def test_a_delta_rs_lake_keeps_its_exactly_once_state_under_delta_spark(spark: Any, tmp_path: Path) -> None:
    """A lake written by an earlier version (delta-rs): OPTIMIZE and VACUUM leave protocol, features and
    application transactions as they were, and delta-spark's writes honour the batches delta-rs recorded."""
    from deltalake import CommitProperties, DeltaTable, Transaction

    path = _rs_table(tmp_path)
    for batch in range(8):
        _rs_append(path, _rs_rows((f"e{batch}", batch)), "q:t", batch)
    DeltaTable(str(path)).merge(  # a delta-rs MERGE (string_view files), as the raw log's insert was
        source=_rs_rows(("e0", 0), ("m", 9)), predicate="t.event_id = s.event_id", source_alias="s", target_alias="t",
        commit_properties=CommitProperties(app_transactions=[Transaction(app_id="q:m", version=0)]),
    ).when_not_matched_insert_all().execute()
    before = _protocol(spark, path)
    assert lake_spark.version(spark, path) == 9
    metrics = lake_spark.optimize(spark, path)
    assert metrics["metrics"]["numFilesRemoved"] == 9 and metrics["metrics"]["numFilesAdded"] == 1
    assert (path / "_delta_log" / f"{10:020d}.checkpoint.parquet").is_file(), "delta-spark checkpointed at version 10"
    assert lake_spark.vacuum(spark, path, 0, enforce_retention=False) == 9, "the 9 files OPTIMIZE compacted (an insert-only MERGE rewrites none)"
    assert spark.conf.get(lake_spark.RETENTION_CHECK, None) is None, "the retention check is restored"
    assert [h["operation"] for h in lake_spark.history(spark, path, 3)] == ["VACUUM END", "VACUUM START", "OPTIMIZE"]
    assert _protocol(spark, path) == before, "protocol and table features unchanged"

    fresh = DeltaTable(str(path))  # opened from delta-spark's checkpoint
    assert fresh.transaction_version("q:t") == 7 and fresh.transaction_version("q:m") == 0, "exactly-once state survives"
    frame = spark.createDataFrame([("e7", D1, 7)], SCHEMA)
    assert not lake_spark.append_once(frame, path, "q:t", 7), "delta-spark refuses a batch delta-rs recorded"
    assert lake_spark.append_once(spark.createDataFrame([("e8", D1, 8)], SCHEMA), path, "q:t", 8)
    new = spark.createDataFrame([("m", D1, 9), ("n", D1, 10)], SCHEMA)
    assert insert_new.insert_new_once(new, path, "event_id", "event_date", "q:m", 0) is None, "the MERGE's batch too"
    assert insert_new.insert_new_once(new, path, "event_id", "event_date", "q:m", 1) == 1
    expected = sorted([f"e{i}" for i in range(9)] + ["m", "n"])
    assert sorted(DeltaTable(str(path)).to_pyarrow_table().column("event_id").to_pylist()) == expected
    assert sorted(r["event_id"] for r in lake_spark.read(spark, path).collect()) == expected
    assert lake_spark.file_count(spark, path) == 3


@pytest.mark.parametrize("name", lake_spark.CONFLICT_NAMES)
def test_every_delta_spark_conflict_is_retried(name: str) -> None:
    """delta-spark's conflict errors are siblings in its Python API (a backfill's schema change raises
    `MetadataChangedException`, which is no `DeltaConcurrentModificationException`): each one is retried."""
    from delta.exceptions import base

    error = getattr(base, name)
    calls: list[int] = []

    def commit() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise error(message="a concurrent update changed the table")
        return "committed"

    assert lake_spark.with_retries(commit, what="append to customers") == "committed"
    assert len(calls) == 3


def test_a_conflict_that_never_clears_is_one_clear_error() -> None:
    from delta.exceptions import base

    from cdc_platform.errors import CommitConflictError

    def commit() -> None:
        raise base.MetadataChangedException(message="The metadata of the Delta table has been changed")

    with pytest.raises(CommitConflictError, match="append to customers: the commit kept conflicting .* after 2 attempts"):
        lake_spark.with_retries(commit, what="append to customers", attempts=2)


def test_is_table_sees_a_table_committed_after_a_check_said_it_was_not_there(spark: Any, tmp_path: Path) -> None:
    """`is_table` answers from the log, not from Delta's cached handle of the path: a check before the table existed
    does not make it say "no table" once another writer has committed it, and asking about a path creates nothing
    there. (The race that made it read the log: `test_backfill`'s backfills racing the stream's first start.)"""
    import pyarrow as pa
    from deltalake import write_deltalake

    path = tmp_path / "later"
    assert not lake_spark.is_table(spark, path)
    write_deltalake(str(path), pa.table({"id": [1]}))  # committed by another writer than this JVM's handle
    assert lake_spark.is_table(spark, path)
    assert not lake_spark.is_table(spark, tmp_path / "never") and not (tmp_path / "never").exists()
    (tmp_path / "plain").mkdir()
    assert not lake_spark.is_table(spark, tmp_path / "plain"), "a folder without a Delta log is no table"
