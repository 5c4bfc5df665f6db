"""The session's JVM side: the jars `make setup` resolved load, delta-spark works beside delta-rs, a missing jar
folder stops with one line, and the session's settings (code cache, jobs, local files) do what they are there for."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.errors import EnvironmentNotReadyError
from cdc_platform.spark.session import DELTA_CONF, JARS_DIR, JARS_MANIFEST, OBJECT_STORE_JARS_DIR, PARSER_JARS_DIR, platform_jars, session_jars


def test_session_loads_the_manifest_jars_and_enables_delta(spark: Any) -> None:
    conf = spark.sparkContext.getConf()
    loaded = conf.get("spark.jars").split(",")
    # The suite's session also loads Hadoop's S3A jars, after the platform's and the envelope parser's (a lake on an object store)
    assert loaded == [str(jar) for jar in session_jars(object_store=True)]
    assert loaded == [str(jar) for jar in platform_jars() + platform_jars(PARSER_JARS_DIR) + platform_jars(OBJECT_STORE_JARS_DIR)]
    assert any(Path(jar).name.startswith("cdc-platform-parser-") for jar in loaded)
    assert {Path(jar).name.rsplit("-", 1)[0] for jar in loaded} >= {
        "delta-spark_4.1_2.13", "delta-storage", "spark-sql-kafka-0-10_2.13", "spark-token-provider-kafka-0-10_2.13",
        "kafka-clients", "commons-pool2", "spark-avro_2.13"}
    assert conf.get("spark.jars.packages", None) is None
    for key, value in DELTA_CONF.items():
        assert spark.conf.get(key) == value
    # VACUUM's listing jobs get a task count that fits the machine, not Spark's 10,000 (minutes per `cdc maintain`)
    assert spark.conf.get("spark.sql.sources.parallelPartitionDiscovery.parallelism") == "8"


def test_a_second_batch_of_the_same_shape_compiles_almost_nothing(spark: Any, lake_at: Any, tmp_path: Path) -> None:
    """Spark's cache of generated classes holds 100 by default, fewer than one micro-batch generates (~185 for a
    one-table lake), so every batch compiled them all again. With the session's cache a repeat is a lookup."""
    from tests.cdc_platform.test_serve import CHANGES, PEOPLE

    codegen = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics
    compiled = []
    for run in ("first", "second"):
        before = codegen.METRIC_COMPILATION_TIME().getCount()
        lake_at(tmp_path / run, {"shop.people": {"key": ["id"]}}, PEOPLE + CHANGES)
        compiled.append(codegen.METRIC_COMPILATION_TIME().getCount() - before)
    assert compiled[1] <= 20, compiled  # with Spark's default cache: ~170 every time


def test_delta_table_write_merge_history(spark: Any, tmp_path: Path) -> None:
    from delta.tables import DeltaTable

    path = str(tmp_path / "accounts")
    spark.createDataFrame([(1, "a"), (2, "b")], "id BIGINT, name STRING").write.format("delta").save(path)
    table = DeltaTable.forPath(spark, path)
    changes = spark.createDataFrame([(2, "B"), (3, "c")], "id BIGINT, name STRING")
    (table.alias("t").merge(changes.alias("s"), "t.id = s.id")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())

    rows = {r["id"]: r["name"] for r in spark.read.format("delta").load(path).collect()}
    assert rows == {1: "a", 2: "B", 3: "c"}
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert [(h["version"], h["operation"]) for h in history] == [(0, "WRITE"), (1, "MERGE")]
    metrics = history[1]["operationMetrics"]
    assert (metrics["numTargetRowsUpdated"], metrics["numTargetRowsInserted"]) == ("1", "1")


def test_delta_catalog_works_with_the_in_memory_catalog(spark: Any, tmp_path: Path) -> None:
    # The session keeps spark.sql.catalogImplementation=in-memory (no Hive, no metastore_db/); DeltaCatalog
    # delegates to it, so named Delta tables live for the session and their data at LOCATION.
    assert spark.conf.get("spark.sql.catalogImplementation") == "in-memory"
    location = tmp_path / "named"
    spark.sql(f"CREATE TABLE delta_session_named USING delta LOCATION '{location}' AS SELECT 1 AS x")
    try:
        spark.sql("INSERT INTO delta_session_named VALUES (2)")
        assert sorted(r["x"] for r in spark.sql("SELECT x FROM delta_session_named").collect()) == [1, 2]
        assert (location / "_delta_log").is_dir()
    finally:
        spark.sql("DROP TABLE IF EXISTS delta_session_named")


def test_idempotent_write_is_skipped_the_second_time(spark: Any, tmp_path: Path) -> None:
    # What the pipeline's exactly-once guard does by hand with delta-rs, delta-spark does in the commit.
    path = str(tmp_path / "events")
    batch = spark.createDataFrame([(1,), (2,)], "id BIGINT")

    def write(version: int) -> None:
        (batch.write.format("delta").mode("append")
         .option("txnAppId", "query-1:events").option("txnVersion", version).save(path))

    write(0)
    write(0)  # replayed batch: skipped
    assert spark.read.format("delta").load(path).count() == 2
    write(1)
    write(0)  # older than the recorded version: skipped too
    assert spark.read.format("delta").load(path).count() == 4
    versions = [r["version"] for r in spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()]
    assert sorted(versions) == [0, 1]


def test_delta_spark_reads_a_delta_rs_table(spark: Any, tmp_path: Path) -> None:
    # Side by side: the lake's writer (delta-rs) and delta-spark agree on the table format.
    import pyarrow as pa
    from deltalake import write_deltalake

    path = str(tmp_path / "from_rs")
    write_deltalake(path, pa.table({"id": pa.array([1, 2, 3], pa.int64())}))
    assert sorted(r["id"] for r in spark.read.format("delta").load(path).collect()) == [1, 2, 3]


def test_kafka_source_provider_is_loadable(spark: Any) -> None:
    # No broker: `load()` only resolves the provider and validates options (nothing connects until a
    # query runs), so this proves the connector and its jars are on the classpath, not that Kafka answers.
    options = {"kafka.bootstrap.servers": "127.0.0.1:9", "subscribe": "cdc.no-such-topic"}
    batch = spark.read.format("kafka").options(**options).load()
    assert [f.name for f in batch.schema] == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    stream = spark.readStream.format("kafka").options(**options).load()
    assert stream.isStreaming


def test_missing_jar_folder_stops_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cdc_platform.spark.session as session

    missing = tmp_path / "jars"
    with pytest.raises(EnvironmentNotReadyError, match=r"run `make setup`$") as info:
        platform_jars(missing)
    assert "\n" not in str(info.value) and str(missing) in str(info.value)

    # get_spark refuses before starting a JVM (no session exists in this process yet, or it is reused).
    monkeypatch.setattr(session, "JARS_DIR", missing)
    monkeypatch.setattr(session, "_SESSION", None)
    with pytest.raises(EnvironmentNotReadyError, match="run `make setup`"):
        session.get_spark("never-started")


def test_manifest_naming_an_absent_jar_is_not_ready(tmp_path: Path) -> None:
    (tmp_path / JARS_MANIFEST).write_text(json.dumps({"jars": [{"coordinates": "g:a:1", "file": "a-1.jar"}]}))
    with pytest.raises(EnvironmentNotReadyError, match=r"lacks a-1\.jar .*run `make setup`"):
        platform_jars(tmp_path)


def test_setup_filled_the_default_folder() -> None:
    doc = json.loads((JARS_DIR / JARS_MANIFEST).read_text(encoding="utf-8"))
    assert any(j["coordinates"].startswith("io.delta:delta-spark_4.1_2.13:") for j in doc["jars"])


def test_the_suites_session_keeps_both_jit_tiers_and_its_children_start_with_the_quick_one(spark: Any) -> None:
    """tests/conftest.py: the children's Spark settings are PySpark's `PYSPARK_SUBMIT_ARGS`; the suite's own JVM
    started without them."""
    import os
    import shlex

    from cdc_platform.spark.session import SHORT_LIVED_JVM

    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    assert not [a for a in runtime.getInputArguments() if a.startswith("-XX:TieredStopAtLevel")]
    args = shlex.split(os.environ["PYSPARK_SUBMIT_ARGS"])
    assert args[-1] == "pyspark-shell" and args[:-1:2] == ["--conf", "--conf"]
    quick = SHORT_LIVED_JVM["spark.driver.extraJavaOptions"]
    assert "-XX:TieredStopAtLevel=1" in quick.split()
    assert dict(a.split("=", 1) for a in args[1:-1:2]) == {"spark.driver.extraJavaOptions": quick, "spark.executor.extraJavaOptions": quick}


def test_the_sessions_jvm_runs_with_the_platforms_c2_thresholds(spark: Any) -> None:
    """`session.JVM_DEFAULTS` reach the JVM PySpark launches (as `defaultJavaOptions`), and the VM runs with them
    unless `extraJavaOptions` give the flag again: those come after and win, as a user's do (this suite's own
    session raises the C2 thresholds so, `tests/conftest.py`)."""
    from cdc_platform.spark.session import COMPILE_HUGE_METHODS, JVM_DEFAULTS, LONG_LIVED_JIT

    jvm = spark.sparkContext._jvm
    arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    flags = LONG_LIVED_JIT.split()
    assert len(flags) == 4 and all(flag in arguments for flag in [*flags, COMPILE_HUGE_METHODS])
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean"))
    for flag in flags:
        name = flag.removeprefix("-XX:").split("=")[0]
        last = [a for a in arguments if a.startswith(f"-XX:{name}=")][-1]
        assert diagnostics.getVMOption(name).getValue() == last.split("=", 1)[1]
    assert diagnostics.getVMOption("DontCompileHugeMethods").getValue() == "false"  # methods over 8,000 bytes compile
    conf = spark.sparkContext.getConf()
    # executors (a cluster's) get them too; the driver's carry the class-data archive's options after them (`class_archive`)
    assert all(conf.get(key).startswith(value) for key, value in JVM_DEFAULTS.items())
    assert conf.get("spark.executor.defaultJavaOptions") == JVM_DEFAULTS["spark.executor.defaultJavaOptions"]


def test_a_query_with_a_shuffle_runs_as_one_spark_job(spark: Any) -> None:
    """With adaptive query execution each stage of a shuffled query is a job of its own, planned again after
    the one before: a third of a small batch's jobs. The session runs it as one (`session.py`)."""
    from pyspark.sql import functions as F

    from cdc_platform.spark import spark_jobs
    from tests.cdc_platform.test_spark_jobs import tagged_jobs

    with spark_jobs.labelled("test-one-job", "a grouped count"):
        rows = spark.range(100).groupBy((F.col("id") % 3).alias("k")).count().collect()
    assert sorted(r["count"] for r in rows) == [33, 33, 34]
    assert len(tagged_jobs(spark, "test-one-job")) == 1


def _hadoop_checksum_files(root: Path) -> list[str]:
    """Hadoop's checksummed local file system's side files (`.NAME.crc`), not Delta's own `_delta_log/N.crc`."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*.crc") if p.is_file())


def _of_file_context(names: list[str]) -> list[str]:
    """The side files of what goes through Hadoop's FileContext: Delta's log store (commits, checksums,
    `_last_checkpoint`; not its Parquet checkpoints) and the stream's checkpoint."""
    return [n for n in names if "_checkpoints" in Path(n).parts
            or ("_delta_log" in Path(n).parts and not n.endswith(".checkpoint.parquet.crc"))]


def test_a_local_lake_gets_no_hadoop_checksum_files_and_one_written_with_them_runs_on(
    spark: Any, lake_at: Any, run_pipeline: Any, query: Any, tmp_path: Path
) -> None:
    """The session's FileContext goes through Hadoop's raw local file system (`LOCAL_FILES_CONF`): no `.NAME.crc`
    beside each of Delta's log files or the stream's checkpoint files. `FileSystem.getLocal` stays Hadoop's
    `LocalFileSystem` (S3A's upload buffers, Hive, Spark cast to it). A lake written before, with those side
    files beside its own, keeps running."""
    from cdc_platform.spark.session import LOCAL_FILES_CONF
    from tests.cdc_platform.test_serve import CHANGES, PEOPLE

    jvm = spark.sparkContext._jvm
    hadoop_conf = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in LOCAL_FILES_CONF.items():
        assert hadoop_conf.get(key.removeprefix("spark.hadoop.")) == value
    local_fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), hadoop_conf)
    assert jvm.java.lang.Class.forName("org.apache.hadoop.fs.LocalFileSystem").isInstance(local_fs)  # what getLocal casts to
    config = lake_at(tmp_path, {"shop.people": {"key": ["id"]}}, PEOPLE)
    jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, str(config.lake / "people")).checkpoint()
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith(".")]
    last_checkpoint = config.lake / "people" / "_delta_log" / "_last_checkpoint"
    assert last_checkpoint in written
    assert any(p.parent.name == "_delta_log" and p.suffix == ".crc" for p in written)  # Delta's own checksums stay
    assert any("offsets" in p.parts for p in written)
    assert _of_file_context(_hadoop_checksum_files(tmp_path)) == []

    # The same lake as Hadoop's checksummed file system leaves it: every file rewritten through it, with its side file.
    checked = jvm.org.apache.hadoop.fs.LocalFileSystem()
    checked.initialize(jvm.java.net.URI("file:///"), jvm.org.apache.hadoop.conf.Configuration())
    for path in written:
        src, tmp = jvm.org.apache.hadoop.fs.Path(str(path)), jvm.org.apache.hadoop.fs.Path(f"{path}.rewrite")
        assert jvm.org.apache.hadoop.fs.FileUtil.copy(checked, src, checked, tmp, False, hadoop_conf)
        assert checked.rename(tmp, src)
    old = _hadoop_checksum_files(tmp_path)
    assert len(old) == len(written)

    (tmp_path / "landing" / "part-00002.jsonl").write_text("\n".join(CHANGES) + "\n", encoding="utf-8")
    run_pipeline(config)
    assert query(config, "SELECT id, name FROM people__full_view ORDER BY id") == [{"id": 0, "name": "ann"}, {"id": 1, "name": "bobby"}]
    # The second batch's log and checkpoint files got none, and the stale one beside `_last_checkpoint` (the file
    # Delta overwrites) is gone.
    stale = str((last_checkpoint.parent / "._last_checkpoint.crc").relative_to(tmp_path))
    now = _hadoop_checksum_files(tmp_path)
    assert stale in old and stale not in now
    assert _of_file_context([n for n in now if n not in old]) == []
