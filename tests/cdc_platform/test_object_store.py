"""A lake on an object store: `cdc run` into `s3a://bucket/prefix` on an S3-compatible server builds the lake a
local run builds, every reader (Spark's views, delta-rs's statistics and checks, the registry, the CLI)
works on it, and so do the writers besides the stream (`cdc maintain`, `cdc rebuild`, a snapshot backfill).

The server is moto's (session fixture `s3_server`, a process of its own on a loopback port); the lake's
settings come from `object_store:` in the config and the credentials from the environment, as a user's would.
"""

from __future__ import annotations

import datetime as dt
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from upath import UPath

from cdc_platform import backfill, checks, lake
from cdc_platform import storage
from cdc_platform.lake import lake_spark
from cdc_platform.spark import session
from cdc_platform.cli import main
from cdc_platform.config import load_config
from cdc_platform.errors import EnvironmentNotReadyError
from cdc_platform.run.ingest import IngestJob
from cdc_platform.stages.stage import RAW
from tests.cdc_platform.test_cluster import build_input, in_tables, lake_contents


def s3_config(tmp_path: Path, peer: dict[str, Path], s3: Any) -> tuple[Path, str]:
    config_path = build_input(tmp_path, peer)
    doc = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    doc["object_store"] = s3.object_store()
    doc["max_files_per_trigger"] = 16  # two batches: enough for a second batch's commits on S3, fewer fixed costs than the cluster test's
    config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    bucket = f"lake-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(bucket)
    return config_path, f"s3a://{bucket}/warehouse/cdc"


def test_cdc_run_into_an_s3_lake_builds_the_local_lake_and_every_reader_works_on_it(
    tmp_path: Path, spark: Any, s3_server: Any, peer_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config_path, url = s3_config(tmp_path, peer_files, s3_server)
    remote = load_config(config_path, lake=url, environ=s3_server.environ())
    local = load_config(config_path, lake=tmp_path / "lake-local", environ={})
    assert isinstance(remote.lake, UPath) and remote.lake_is_remote

    first = IngestJob(remote).run_available_now(spark)
    IngestJob(local).run_available_now(spark)
    assert len(first.batches) > 1 and first.landed().get(RAW, 0) > 0

    # The stream's checkpoint is in the bucket too: a second run reads nothing new and lands nothing.
    again = IngestJob(remote).run_available_now(spark)
    assert again.total("rows_read") == 0 and sum(again.landed().values()) == 0
    assert (remote.lake / "_checkpoints" / "ingest" / "metadata").is_file()

    local_rows, local_totals = lake_contents(spark, local.lake)
    remote_rows, remote_totals = lake_contents(spark, remote.lake)
    assert sorted(remote_rows) == sorted(local_rows)
    assert {"customers__full_view", "products__full_view", "raw_change_events", "dead_letter"} <= set(local_rows)
    differences = {name: (sum((rows - remote_rows[name]).values()), sum((remote_rows[name] - rows).values()))
                   for name, rows in local_rows.items() if remote_rows[name] != rows}
    assert differences == {}
    assert remote_totals == local_totals

    # The driver's own reads (delta-rs and fsspec) on the bucket.
    assert sorted(lake.lake_tables(remote.lake)) == sorted(lake.lake_tables(local.lake))
    assert lake.registered_tables(remote.lake) == lake.registered_tables(local.lake)
    raw_stats = checks.table_stats(lake.table_path(remote.lake, RAW))
    assert raw_stats.rows == checks.table_stats(lake.table_path(local.lake, RAW)).rows > 0
    assert lake.exists(lake.table_path(remote.lake, RAW)) and not lake.exists(lake.table_path(remote.lake, "nothing_here"))
    now = dt.datetime.now(dt.timezone.utc)
    for check in (lambda d: checks.completeness(spark, d, remote.transaction_timeout),
                  lambda d: checks.freshness(d, slo_seconds=10**9, now=now),  # one clock: the message says how old, to the second
                  lambda d: checks.new_dead_letters(d, advance=False)):
        on_s3, on_disk = check(remote.lake), check(local.lake)
        assert (on_s3.passed, on_s3.description) == (on_disk.passed, on_disk.description)

    # `cdc sql --lake s3a://...`: the object store's settings from CDC_CONFIG's file, credentials from the environment.
    monkeypatch.setenv("CDC_CONFIG", str(config_path))
    for name, value in s3_server.environ().items():
        monkeypatch.setenv(name, value)
    capsys.readouterr()
    assert main(["sql", "--lake", url, "--local", "--format", "csv", "SELECT count(*) AS n FROM customers__full_view"]) == 0
    assert capsys.readouterr().out.split() == ["n", str(sum(local_rows["customers__full_view"].values()))]

    # `cdc maintain --lake s3a://...`: folds, OPTIMIZE and VACUUM through S3A; fewer files, the same rows. Two tables,
    # a latest-state one (its fold) and the raw log: the whole lake's fifteen took 75 s here, every table the same steps.
    raw = lake.table_path(remote.lake, RAW)
    files = lake_spark.file_count(spark, raw)
    assert main(["maintain", "--lake", url, "--vacuum-hours", "0", "--table", RAW, "--table", "customers"]) == 0
    assert lake_spark.file_count(spark, raw) < files
    assert [h["operation"] for h in lake_spark.history(spark, raw, 3)] == ["VACUUM END", "VACUUM START", "OPTIMIZE"]
    assert lake_spark.history(spark, lake.table_path(remote.lake, "customers"), 1)[0]["operation"] == "VACUUM END"
    # Each later step wrote one or two tables: those are read again (a whole lake's read is ~20 s on this server).
    written = {RAW, "customers"}
    assert lake_contents(spark, remote.lake, written)[0] == of_tables(remote_rows, written)

    # `cdc rebuild --lake s3a://...`: the table and its history rewritten from the raw log in the bucket, the same rows.
    assert main(["rebuild", "--lake", url, "--table", "customers"]) == 0
    customers = {"customers", "customers_history"}
    assert lake_contents(spark, remote.lake, customers)[0] == of_tables(remote_rows, customers)

    # A snapshot backfill (Dagster's partitioned load) into the bucket does what it does to the local lake: an old
    # position's row of a streamed key is stale, a key the stream never saw lands.
    snapshot = config_path.parent / "snapshots" / "customers"
    snapshot.mkdir(parents=True)
    (snapshot / "rows.csv").write_text("id,name,email,country\n1,Old Name,old@example.com,NL\n987654,New Row,new@example.com,DE\n")
    (snapshot / "as_of.json").write_text('{"connector": "mysql", "file": "mysql-bin.000001", "pos": 4}')
    on_s3, on_disk = backfill.load_snapshot(remote, "customers"), backfill.load_snapshot(local, "customers")
    assert (on_s3.inserted, on_s3.skipped_stale + on_s3.skipped_deleted, on_s3.committed) == (1, 1, True)
    assert on_s3.as_metadata() == on_disk.as_metadata()
    remote_rows, _ = lake_contents(spark, remote.lake, customers)
    assert remote_rows == lake_contents(spark, local.lake, customers)[0]
    assert any(987654 in row and "New Row" in row for row in remote_rows["customers__full_view"])

    # `cdc serve`'s catalog over the bucket, as a fresh session meets it: no S3A options or filesystem for the bucket yet.
    from cdc_platform.views.catalog import register_catalog

    forget_bucket(spark, remote.lake)
    for temp in [t.name for t in spark.catalog.listTables() if t.isTemporary]:  # other tests' session views, which `cdc serve` has not
        spark.catalog.dropTempView(temp)
    try:
        assert "customers__full_view" in register_catalog(spark, remote.lake, "s3lake")
        n = spark.sql("SELECT count(*) AS n FROM s3lake.customers__full_view").first()["n"]
        assert n == sum(remote_rows["customers__full_view"].values())  # the backfill's row included
    finally:
        spark.sql("USE default")


def of_tables(rows: dict[str, Any], tables: set[str]) -> dict[str, Any]:
    """`lake_contents`' rows of these tables and their full views (at least one of each: never an empty comparison)."""
    found = {name: r for name, r in rows.items() if in_tables(name, tables)}
    assert {name for name in found if "__" not in name} and {name for name in found if "__" in name}, sorted(rows)
    return found


def forget_bucket(spark: Any, lake_dir: Any) -> None:
    """Undo what the session learned about the lake's bucket: its S3A options and its cached filesystem."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    spark._jvm.org.apache.hadoop.fs.Path(str(lake_dir)).getFileSystem(conf).close()  # close() also drops it from Hadoop's cache
    for name in storage.hadoop_options(lake_dir):
        conf.unset(name)
    storage._CONFIGURED.clear()


def test_an_object_store_path_in_a_session_without_the_s3a_jars_says_what_to_do(
    spark: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    table = storage.lake_location("s3a://some-bucket/lake", storage.ObjectStoreConfig(), "lake") / "raw_change_events"
    monkeypatch.setattr(session, "_OBJECT_STORE", False)
    with pytest.raises(EnvironmentNotReadyError, match="started without Hadoop's S3A jars.*make setup-object-store"):
        lake_spark.location(table)
    with pytest.raises(EnvironmentNotReadyError, match="run `make setup-object-store`"):
        session.platform_jars(tmp_path / "object-store" / "jars", "make setup-object-store")


def test_a_server_for_a_lake_in_s3_keeps_its_state_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cdc serve`'s state file names a process here; in a shared bucket another machine would find it (and the
    Hive scratch folders would be objects). Local lakes keep theirs in the lake, as before."""
    from cdc_platform.serve.server import WORK_DIR
    from cdc_platform.serve.sql_client import STATE_FILE, state_path

    monkeypatch.setenv("HOME", str(tmp_path))
    lake_a = storage.lake_location("s3a://lakes-a/x", storage.ObjectStoreConfig(), "lake")
    lake_b = storage.lake_location("s3a://lakes-a/y", storage.ObjectStoreConfig(), "lake")
    assert state_path(lake_a).parent == storage.machine_dir(lake_a)
    assert str(storage.machine_dir(lake_a)).startswith(str(tmp_path / ".cache" / "cdc-platform" / "lakes" / "lakes-a-"))
    assert storage.machine_dir(lake_a) != storage.machine_dir(lake_b)  # one folder per lake, not per bucket
    local = tmp_path / "lake"
    assert state_path(local) == local / STATE_FILE and storage.machine_dir(local) / WORK_DIR == local / WORK_DIR
