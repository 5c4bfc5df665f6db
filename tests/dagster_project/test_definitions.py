"""Dagster wiring: definitions load, `cdc_pipeline` materialises the sample workload with every check
passing, and a corrupted lake turns the matching check red with metadata that names the problem."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from dagster import DagsterInstance

from cdc_platform.workload.generate import generate_workload
from dagster_project.definitions import PIPELINE_JOB, build_defs

REPO = Path(__file__).resolve().parents[2]


def test_definitions_validate_from_the_workspace(tmp_path: Path) -> None:
    workload = generate_workload(tmp_path / "w", transactions=10)
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "CDC_CONFIG": str(workload.config_path),
           "DAGSTER_HOME": str(tmp_path / "home")}
    (tmp_path / "home").mkdir()
    done = subprocess.run([str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "All code locations passed validation" in done.stderr + done.stdout


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Any:
    import time

    from cdc_platform.workload.generate import recent_start_ms

    start = recent_start_ms(120, int(time.time() * 1000))  # a live-looking source, so freshness can pass
    workload = generate_workload(tmp_path_factory.mktemp("dagster") / "sample", transactions=120, seed=11, start_ms=start)
    defs = build_defs(workload.config_path)
    instance = DagsterInstance.ephemeral()
    result = defs.resolve_job_def(PIPELINE_JOB).execute_in_process(instance=instance)
    return workload, defs, result, instance


def evaluations(result: Any) -> dict[tuple[str, str], Any]:
    return {(e.asset_key.to_user_string(), e.check_name): e for e in result.get_asset_check_evaluations()}


def test_cdc_pipeline_materialises_everything_and_every_check_passes(pipeline_run: Any) -> None:
    workload, defs, result, _ = pipeline_run
    assert result.success
    materialised = {e.asset_key.to_user_string() for e in result.get_asset_materialization_events()}
    for name in ("raw_change_events", "transaction_markers", "dead_letter", "pipeline_metrics", "transactions",
                 "customers", "charges", "refunds", "customers__full_view", "customers__clean_view", "customers__consistent_view"):
        assert name in materialised, name
    evals = evaluations(result)
    failed = {k: e.description for k, e in evals.items() if not e.passed and e.severity.value == "ERROR"}
    assert failed == {}
    raw_meta = next(e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == "raw_change_events").materialization.metadata
    assert raw_meta["rows"].value == workload.change_events
    assert raw_meta["duplicates_skipped"].value >= workload.duplicate_events
    customers = next(e for e in result.get_asset_materialization_events() if e.asset_key.to_user_string() == "customers").materialization.metadata
    expected_live = sum(1 for row in workload.expected_state["payments.customers"].values() if row is not None)
    assert customers["rows"].value == expected_live and customers["stored_rows"].value >= expected_live
    # The sample has one malformed line: the dead-letter check warns, it does not fail the run.
    dead = evals[("dead_letter", "new_dead_letters")]
    assert not dead.passed and dead.severity.value == "WARN" and dead.metadata["new_dead_letters"].value == 1


def test_the_pipeline_runs_in_one_process_and_its_assets_carry_dagster_metadata(pipeline_run: Any) -> None:
    workload, defs, result, _ = pipeline_run
    assert defs.resolve_job_def(PIPELINE_JOB).executor_def.name == "in_process"  # one Spark for the whole run
    assert defs.resolve_job_def("coverage_and_completeness_checks").executor_def.name == "in_process"
    assert defs.resolve_implicit_global_asset_job_def().executor_def.name == "in_process"  # runs launched from the asset graph or a sensor
    meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    raw = meta["raw_change_events"]
    assert raw["dagster/row_count"].value == workload.change_events
    types = {c.name: c.type for c in raw["dagster/column_schema"].value.columns}
    assert types["event_id"] == "string" and types["source_ts"] == "timestamp[us, tz=UTC]" and "position" in types
    expected_live = sum(1 for row in workload.expected_state["payments.customers"].values() if row is not None)
    assert meta["customers"]["dagster/row_count"].value == expected_live  # live rows, not the stored layers
    full = meta["customers__full_view"]
    assert full["dagster/row_count"].value == expected_live
    assert "email" in {c.name for c in full["dagster/column_schema"].value.columns}
    assert full["sql"].value.startswith("```sql") and "`customers`" in full["sql"].value
    sample = meta["dead_letter"]["newest_dead_letters"].value
    assert "| dead_lettered_at | stage | reason_code |" in sample and "| ingest |" in sample  # the sample's one malformed line
    # Source time, not run time, is what Dagster's freshness checks read: the newest source commit landed.
    from cdc_platform import checks
    from cdc_platform.config import load_config

    newest = checks.column_max(load_config(workload.config_path).lake / "raw_change_events", "source_ts").timestamp()
    assert raw["dagster/last_updated_timestamp"].value == newest
    assert 0 < meta["customers"]["dagster/last_updated_timestamp"].value <= newest
    assert "dagster/last_updated_timestamp" not in meta["transactions"]


def test_the_stream_sensor_reports_each_micro_batch_once(pipeline_run: Any) -> None:
    from dagster import SensorResult, SkipReason, build_sensor_context

    from cdc_platform import lake
    from cdc_platform.config import load_config

    workload, defs, _, instance = pipeline_run
    sensor = defs.resolve_sensor_def("stream_batches")
    batches = lake.open_table(load_config(workload.config_path).lake / "pipeline_metrics").to_pyarrow_table(columns=["batch_id"]).num_rows
    config = load_config(workload.config_path)
    first = sensor(build_sensor_context(instance=instance))
    assert isinstance(first, SensorResult) and len(first.asset_events) == batches + len(config.tables) and batches >= 1
    raw = [e for e in first.asset_events if e.asset_key.to_user_string() == "raw_change_events"]
    assert len(raw) == batches
    observed = raw[-1]
    assert {"rows_read", "change_events", "rows_per_second", "batch_id", "query_id", "dagster/last_updated_timestamp"} <= set(observed.metadata)
    # every latest-state table once, as current as the newest finished batch (the stream keeps its freshness policy green)
    tables = {e.asset_key.to_user_string(): e.metadata for e in first.asset_events if e not in raw}
    assert set(tables) == {t.name for t in config.tables}
    newest = max(e.metadata["dagster/last_updated_timestamp"].value for e in raw)
    assert all(m["dagster/last_updated_timestamp"].value == newest and m["batch_id"] == observed.metadata["batch_id"] for m in tables.values())
    again = sensor(build_sensor_context(instance=instance, cursor=first.cursor))
    assert isinstance(again, SkipReason)


def test_the_onboarding_sensor_names_an_unconfigured_table_and_keeps_its_count_in_the_cursor(pipeline_run: Any) -> None:
    from dagster import SkipReason, build_sensor_context

    from cdc_platform import checks
    from cdc_platform.config import load_config

    workload, _, _, instance = pipeline_run
    doc = yaml.safe_load(workload.config_path.read_text(encoding="utf-8"))
    removed = doc["tables"].pop("payments.refunds")
    assert removed is not None
    narrower = workload.config_path.with_name("cdc-without-refunds.yaml")  # same folder: the same landing and lake
    narrower.write_text(yaml.safe_dump(doc), encoding="utf-8")
    sensor = build_defs(narrower).resolve_sensor_def("unconfigured_source_tables")
    first_context = build_sensor_context(instance=instance)
    first = sensor(first_context)
    census = checks.raw_census(load_config(workload.config_path).lake)
    assert census is not None
    events = census.counts["payments.refunds"]
    assert isinstance(first, SkipReason) and f"payments.refunds ({events:,} events)" in (first.skip_message or "")
    cursor = checks.TableCensus.from_cursor(first_context.cursor)
    assert cursor is not None and cursor.counts["payments.refunds"] == events
    again = sensor(build_sensor_context(instance=instance, cursor=first_context.cursor))
    assert isinstance(again, SkipReason) and again.skip_message == first.skip_message
    everything = build_defs(workload.config_path).resolve_sensor_def("unconfigured_source_tables")(build_sensor_context(instance=instance))
    assert isinstance(everything, SkipReason) and "every source table in the raw log is configured" in (everything.skip_message or "")


def test_the_demo_records_what_landed_as_materialisations(pipeline_run: Any, tmp_path: Path) -> None:
    from dagster import AssetKey

    from dagster_project.record import record_lake

    workload, _, _, _ = pipeline_run
    home = tmp_path / "home"
    recorded = record_lake(workload.config_path, home)
    assert {"raw_change_events", "transactions", "customers", "dead_letter"} <= set(recorded)
    with DagsterInstance.from_config(str(home)) as instance:
        event = instance.get_latest_materialization_event(AssetKey("raw_change_events"))
        assert event is not None and event.asset_materialization is not None
        assert event.asset_materialization.metadata["dagster/row_count"].value == workload.change_events
        assert "dagster/last_updated_timestamp" in event.asset_materialization.metadata


def test_the_freshness_policy_judges_source_time_not_run_time(tmp_path: Path) -> None:
    """Two tables materialised now, one holding a source commit older than the SLO: only that one fails."""
    import datetime as dt

    from dagster import AssetMaterialization, AssetSelection, AssetSpec, Definitions, define_asset_job

    from cdc_platform.config import load_config
    from dagster_project import metadata as md
    from dagster_project.assets import fresh_assets
    from dagster_project.checks import freshness_policy_checks

    config = load_config(generate_workload(tmp_path / "w", transactions=5).config_path)
    policy = freshness_policy_checks(config)
    assert {k.to_user_string() for c in policy for k in c.check_keys} == {f"{n}:freshness_check" for n in ("raw_change_events", "customers", "charges", "refunds")}
    now = dt.datetime.now(dt.timezone.utc)
    instance = DagsterInstance.ephemeral()
    ages = {"raw_change_events": 2 * config.freshness_slo, "customers": 5, "charges": 5, "refunds": 5}
    for name, age in ages.items():
        instance.report_runless_asset_event(AssetMaterialization(name, metadata=md.source_time(now - dt.timedelta(seconds=age))))
    defs = Definitions(assets=[AssetSpec(k) for k in fresh_assets(config)], asset_checks=policy,
                       jobs=[define_asset_job("policy", selection=AssetSelection.checks(*policy))])
    result = defs.resolve_job_def("policy").execute_in_process(instance=instance, raise_on_error=False)
    passed = {e.asset_key.to_user_string(): e.passed for e in result.get_asset_check_evaluations()}
    assert passed == {"raw_change_events": False, "customers": True, "charges": True, "refunds": True}


def test_markdown_samples_stay_one_line_per_row() -> None:
    from dagster_project.metadata import markdown_table

    text = markdown_table([{"a": "x|y", "b": "two\nlines"}, {"a": None, "b": "z" * 500}], ["a", "b"])
    lines = text.splitlines()
    assert lines[:2] == ["| a | b |", "|---|---|"] and len(lines) == 4
    assert "x\\|y" in lines[2] and "two lines" in lines[2] and lines[3].endswith("… |")


def test_a_corrupted_lake_turns_the_matching_checks_red(pipeline_run: Any, spark: Any) -> None:
    """A row removed from a latest-state table, and a transaction that lost an event."""
    import json
    import time

    from cdc_platform import lake
    from cdc_platform.config import load_config
    from cdc_platform.run.ingest import IngestJob

    workload, defs, _, instance = pipeline_run
    config = load_config(workload.config_path)
    ids = lake.open_table(config.lake / "customers").to_pyarrow_table(columns=["id", "_deleted"]).to_pylist()
    victim = min(r["id"] for r in ids if not r["_deleted"])
    lake.open_table(config.lake / "customers").delete(f"id = {victim}")

    now = int(time.time() * 1000)
    uuid = "00000000-0000-0000-0000-00000000dead"
    gtid, later_gtid, later = f"{uuid}:1", f"{uuid}:2", now + 600_000
    source = {"connector": "mysql", "name": "payments", "db": "payments", "file": "mysql-bin.000099", "row": 0}

    def begin(tx: str, ts: int) -> str:
        return json.dumps({"status": "BEGIN", "id": tx, "ts_ms": ts, "event_count": None, "data_collections": None})

    def end(tx: str, ts: int, counts: dict[str, int]) -> str:
        return json.dumps({"status": "END", "id": tx, "ts_ms": ts, "event_count": sum(counts.values()),
                           "data_collections": [{"data_collection": t, "event_count": n} for t, n in counts.items()]})

    def charge(tx: str, ts: int, charge_id: int, pos: int) -> str:
        row = {"id": charge_id, "customer_id": 1, "amount_cents": 5, "currency": "EUR", "status": "pending", "updated_at": ts}
        return json.dumps({"before": None, "after": row, "source": source | {"table": "charges", "ts_ms": ts, "pos": pos}, "op": "c",
                           "ts_ms": ts + 5, "transaction": {"id": tx, "total_order": 1, "data_collection_order": 1}})

    # `gtid` announces two charges but only one lands; `later_gtid` moves the charges stream past the timeout.
    lines = [begin(gtid, now), end(gtid, now, {"payments.charges": 2}), charge(gtid, now, 990001, 10),
             begin(later_gtid, later), end(later_gtid, later, {"payments.charges": 1}), charge(later_gtid, later, 990003, 20)]
    (config.landing / "late").mkdir()
    (config.landing / "late" / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    IngestJob(config).run_available_now(spark)

    checks_run = defs.resolve_job_def("coverage_and_completeness_checks").execute_in_process(instance=instance, raise_on_error=False)
    evals = evaluations(checks_run)
    coverage = evals[("customers", "coverage")]
    assert not coverage.passed and coverage.severity.value == "ERROR"
    assert coverage.metadata["missing"].value == 1
    assert coverage.metadata["mismatched_keys"].value == {"missing": [json.dumps({"id": victim}, separators=(",", ":"))]}
    assert evals[("charges", "coverage")].passed
    completeness = evals[("transactions", "completeness")]
    assert not completeness.passed
    assert gtid in completeness.metadata["mismatched_transactions"].value
    assert gtid in completeness.description


def test_a_check_that_crashes_fails_its_step_and_the_others_still_report(pipeline_run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks run side by side in one op: one raising (a code problem) must not cost the others
    their results, and the run says which check could not run."""
    from cdc_platform import checks

    _, defs, _, instance = pipeline_run

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise FileNotFoundError("the transactions table is gone")

    monkeypatch.setattr(checks, "completeness", broken)
    run = defs.resolve_job_def("coverage_and_completeness_checks").execute_in_process(instance=instance, raise_on_error=False)
    assert not run.success
    assert {k for k in evaluations(run)} == {("customers", "coverage"), ("charges", "coverage"), ("refunds", "coverage")}
    failure = next(e for e in run.all_events if e.is_step_failure)
    assert "the check transactions:completeness could not run: FileNotFoundError: the transactions table is gone" in failure.step_failure_data.error.to_string()


def test_snapshot_backfill_partition_dry_run_then_load(pipeline_run: Any, query: Any) -> None:
    import json

    from dagster import materialize

    from cdc_platform import lake
    from cdc_platform.config import load_config
    workload, defs, _, instance = pipeline_run
    config = load_config(workload.config_path)
    live = {r["id"]: r for r in query(config, "SELECT id, name FROM customers__full_view")}
    existing = min(live)
    snap = config.snapshots / "customers"
    snap.mkdir(parents=True)
    (snap / "rows.csv").write_text(f"id,name,email,country,created_at\n{existing},stale name,old@example.com,DE,1\n880001,backfilled,b@example.com,FR,1\n")
    (snap / "as_of.json").write_text(json.dumps({"connector": "mysql", "file": "mysql-bin.000003", "pos": 1}))
    asset = defs.resolve_assets_def("snapshot_load")  # bound to this lake's `cdc` resource
    versions = {n: lake.open_table(p).version() for n, p in lake.lake_tables(config.lake).items()}

    dry = materialize([asset], partition_key="customers", instance=instance,
                      run_config={"ops": {"snapshot_load": {"config": {"dry_run": True}}}})
    meta = dry.get_asset_materialization_events()[0].materialization.metadata
    assert meta["dry_run"].value is True and meta["inserted"].value == 1 and meta["skipped_stale"].value == 1
    assert {n: lake.open_table(p).version() for n, p in lake.lake_tables(config.lake).items()} == versions

    real = materialize([asset], partition_key="customers", instance=instance)
    assert real.success
    after = {r["id"]: r["name"] for r in query(config, "SELECT id, name FROM customers__full_view")}
    assert after[880001] == "backfilled"
    assert after[existing] == live[existing]["name"], "the streamed row is newer than the snapshot and stays"


def test_descriptions_carry_no_angle_bracket_placeholders(tmp_path: Path) -> None:
    """The UI renders descriptions as Markdown with HTML: `snapshots/<table>/` showed as `snapshots//`."""
    import re

    workload = generate_workload(tmp_path / "w", transactions=5)
    defs = build_defs(workload.config_path)
    graph = defs.resolve_asset_graph()
    texts = {f"asset {s.key.to_user_string()}": s.description for s in defs.resolve_all_asset_specs()}
    texts |= {f"check {k.asset_key.to_user_string()}:{k.name}": graph.get_check_spec(k).description for k in graph.asset_check_keys}
    texts |= {f"job {j.name}": j.description for j in defs.resolve_all_job_defs()}
    assert any("coverage" in name for name in texts) and any("snapshot_load" in name for name in texts)
    markup = {name: text for name, text in texts.items() if text and re.search(r"<[A-Za-z/]", text)}
    assert markup == {}


def test_a_kafka_lake_has_no_landing_sensor(tmp_path: Path) -> None:
    config = tmp_path / "cdc.yaml"
    config.write_text("lake: lake\nsource:\n  kind: kafka\n  bootstrap_servers: 127.0.0.1:9092\n  topics: [payments.customers]\n"
                      "tables:\n  payments.customers: {key: [id]}\n", encoding="utf-8")
    names = {s.name for s in build_defs(config).sensors}
    assert "new_landing_files" not in names and {"stream_batches", "unconfigured_source_tables"} <= names


def test_a_source_connection_adds_a_scheduled_live_coverage_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`source_connection` in the config: every table gets `source_coverage`, the hourly check job runs it,
    and the check hands the platform's outcome to Dagster (the live compare itself: test_source_coverage)."""
    from dagster import AssetCheckKey, AssetKey

    from cdc_platform.checks import source_coverage
    from cdc_platform.checks import CheckOutcome, Severity
    from cdc_platform.config import load_config
    from dagster_project.checks import platform_checks, to_result
    from dagster_project.resources import CdcResource

    workload = generate_workload(tmp_path / "w", transactions=5)
    plain = build_defs(workload.config_path)
    assert not any(k.name == "source_coverage" for k in plain.resolve_asset_graph().asset_check_keys)

    monkeypatch.setenv("CDC_TEST_SOURCE_USER", "reader")
    monkeypatch.setenv("CDC_TEST_SOURCE_PASSWORD", "pw")
    config = workload.config_path
    config.write_text(config.read_text(encoding="utf-8") + "source_connection: {kind: postgresql, host: 127.0.0.1, database: app, "
                      "user: '${CDC_TEST_SOURCE_USER}', password: '${CDC_TEST_SOURCE_PASSWORD}'}\n", encoding="utf-8")
    defs = build_defs(config)
    live = {k for k in defs.resolve_asset_graph().asset_check_keys if k.name == "source_coverage"}
    names = [t.name for t in load_config(config).tables]
    assert live == {AssetCheckKey(AssetKey(n), "source_coverage") for n in names} and names
    scheduled = defs.resolve_job_def("coverage_and_completeness_checks").asset_layer.asset_graph.asset_check_keys
    assert live <= set(scheduled)

    seen: list[tuple[str, str]] = []

    def fake(spark: Any, lake: Path, table: Any, connection: Any) -> CheckOutcome:
        seen.append((table.name, connection.describe()))
        return CheckOutcome(False, Severity.ERROR, f"{table.name}: 1 missing in lake", {"missing_in_lake": 1, "live_mismatched_keys": {"missing_in_lake": ['{"id": 3}']}})

    monkeypatch.setattr(source_coverage, "source_coverage", fake)
    check = next(c for c in platform_checks(load_config(config)) if c.key == AssetCheckKey(AssetKey(names[0]), "source_coverage"))
    result = to_result(check.evaluate(CdcResource(config_path=str(config))), check.key)
    assert not result.passed and result.description == f"{names[0]}: 1 missing in lake"
    assert result.metadata["missing_in_lake"].value == 1
    assert seen == [(names[0], "postgresql://reader@127.0.0.1:5432/app")]


def test_a_failed_source_coverage_offers_its_repair_and_the_hourly_job_runs_it_with_auto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`source_repair` has a partition per table; a failed `source_coverage` names it; with `repair.auto` the hourly
    check job (only that job) judges the check by `coverage_with_repair` (the repair itself: tests/testbed/test_repair.py)."""
    from dagster import AssetCheckKey, AssetKey, DagsterInstance

    from cdc_platform import checks
    from cdc_platform.backfill import repair
    from cdc_platform.checks import CheckOutcome, Severity, source_coverage
    from cdc_platform.config import load_config
    from dagster_project.checks import CHECK_JOB

    monkeypatch.setenv("CDC_TEST_SOURCE_USER", "reader")
    monkeypatch.setenv("CDC_TEST_SOURCE_PASSWORD", "pw")
    workload = generate_workload(tmp_path / "w", transactions=5)
    config = workload.config_path
    config.write_text(config.read_text(encoding="utf-8") + "source_connection: {kind: postgresql, host: 127.0.0.1, database: app, "
                      "user: '${CDC_TEST_SOURCE_USER}', password: '${CDC_TEST_SOURCE_PASSWORD}'}\n"
                      "repair: {signal_table: public.debezium_signal, auto: true}\n", encoding="utf-8")
    names = [t.name for t in load_config(config).tables]
    defs = build_defs(config)
    repair_asset = defs.resolve_assets_def("source_repair")
    assert repair_asset.partitions_def.get_partition_keys() == names and repair_asset.group_names_by_key[AssetKey("source_repair")] == "backfill"

    seen: list[str] = []

    def failed(spark: Any, lake: Path, table: Any, connection: Any) -> CheckOutcome:
        seen.append(f"check {table.name}")
        return CheckOutcome(False, Severity.ERROR, f"{table.name}: 1 missing in lake", {"missing_in_lake": 1})

    def repaired(spark: Any, config: Any, table: Any, **_: Any) -> CheckOutcome:
        seen.append(f"repair {table.name}")
        return CheckOutcome(True, Severity.ERROR, f"{table.name}: 100.00% covered; repaired", {"repair": {"outcome": "repaired"}})

    monkeypatch.setattr(source_coverage, "source_coverage", failed)
    monkeypatch.setattr(repair, "coverage_with_repair", repaired)
    for passing in ("coverage", "completeness"):
        monkeypatch.setattr(checks, passing, lambda *a, **k: CheckOutcome(True, Severity.ERROR, "fine", {}))
    instance = DagsterInstance.ephemeral()
    hourly = defs.resolve_job_def(CHECK_JOB).execute_in_process(instance=instance)
    live = {k: e for k, e in evaluations(hourly).items() if k[1] == "source_coverage"}
    assert {k[0] for k in live} == set(names) and all(e.passed for e in live.values())
    assert sorted(seen) == sorted(f"repair {n}" for n in names), "the hourly job repairs; it does not run the plain check"
    assert live[(names[0], "source_coverage")].metadata["repair"].value == {"outcome": "repaired"}

    seen.clear()
    from dagster_project.checks import platform_checks, to_result
    from dagster_project.resources import CdcResource

    check = next(c for c in platform_checks(load_config(config)) if c.key == AssetCheckKey(AssetKey(names[0]), "source_coverage"))
    result = to_result(check.evaluate(CdcResource(config_path=str(config))), check.key)  # any other run: the plain check
    assert not result.passed and seen == [f"check {names[0]}"]
    assert result.metadata["repair_with"].value == f"materialise source_repair, partition {names[0]} (or run `cdc repair --table {names[0]}`)"


def test_a_run_starts_its_jvm_as_a_short_lived_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run is one process whose JVM ends with it: the resource asks for the quick JIT tier (session.SHORT_LIVED_JVM)."""
    from cdc_platform.spark import session
    from dagster_project.resources import CdcResource

    asked: dict[str, Any] = {}
    monkeypatch.setattr(session, "get_spark", lambda app_name, master=None, conf=None, object_store=False:
                        asked.update(app=app_name, conf=conf, object_store=object_store))
    CdcResource(config_path=str(generate_workload(tmp_path / "w", transactions=5).config_path)).spark()
    assert asked["conf"] == session.SHORT_LIVED_JVM
    assert asked["object_store"] is False  # a local lake: no S3A jars
    options = session.SHORT_LIVED_JVM["spark.driver.extraJavaOptions"].split()
    assert "-XX:TieredStopAtLevel=1" in options
    assert "-XX:ReservedCodeCacheSize=240m" in options  # C1 alone reserves 48 MB, which a run filled (compiler off)


def test_a_batch_observation_carries_how_far_the_source_was_read() -> None:
    """An idle source's batches have no changes, only heartbeats: their time is the source time Dagster judges."""
    from dagster_project.definitions import stream_batch_metadata

    change, beat = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), dt.datetime(2026, 1, 1, 0, 50, tzinfo=dt.timezone.utc)
    base = {"rows_read": 2, "change_events": 0, "query_id": "q", "batch_id": 3, "finished_at": beat}
    idle = stream_batch_metadata(base | {"newest_source_ts": None, "newest_heartbeat_ts": beat})
    assert idle["dagster/last_updated_timestamp"].value == beat.timestamp() and idle["newest_heartbeat_ts"] == str(beat)
    busy = stream_batch_metadata(base | {"newest_source_ts": change, "newest_heartbeat_ts": None})
    assert busy["dagster/last_updated_timestamp"].value == change.timestamp() and "newest_heartbeat_ts" not in busy
    assert "dagster/last_updated_timestamp" not in stream_batch_metadata(base)  # a lake from before the column


def test_cdc_pipeline_on_a_lake_in_s3_materialises_and_every_check_passes(
    tmp_path: Path, spark: Any, s3_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same job with `lake: s3a://...` (moto's S3 server): the resource's session, the asset metadata
    (delta-rs on the bucket) and every check work on an object store as on a local lake."""
    import time

    import yaml

    from cdc_platform.workload.generate import recent_start_ms

    for name, value in s3_server.environ().items():  # the credentials, as a user's environment gives them
        monkeypatch.setenv(name, value)
    s3_server.create_bucket("dagster-lake")
    workload = generate_workload(tmp_path / "sample", transactions=120, seed=11, start_ms=recent_start_ms(120, int(time.time() * 1000)))
    doc = yaml.safe_load(workload.config_path.read_text(encoding="utf-8"))
    doc |= {"lake": "s3a://dagster-lake/cdc", "object_store": s3_server.object_store()}
    workload.config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    result = build_defs(workload.config_path).resolve_job_def(PIPELINE_JOB).execute_in_process(instance=DagsterInstance.ephemeral())
    assert result.success
    evals = evaluations(result)
    assert len(evals) > 10
    assert {k: e.description for k, e in evals.items() if not e.passed and e.severity.value == "ERROR"} == {}
    meta = {e.asset_key.to_user_string(): e.materialization.metadata for e in result.get_asset_materialization_events()}
    assert meta["raw_change_events"]["rows"].value == workload.change_events
    assert meta["customers"]["rows"].value == sum(1 for row in workload.expected_state["payments.customers"].values() if row is not None)


def test_the_maintenance_job_maintains_the_configured_lake_and_logs_each_table(tmp_path: Path, spark: Any,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Wiring only (`cdc_platform.maintenance` is tested on its own): the op hands `maintain` the resource's session,
    lake and tables, and each table's outcome reaches the run's log."""
    from cdc_platform import maintenance

    workload = generate_workload(tmp_path / "w", transactions=5)
    defs = build_defs(workload.config_path)
    asked: dict[str, Any] = {}

    def fake(session: Any, lake_dir: Path, *, tables: Any, progress: Any, **_: Any) -> list[Any]:
        asked.update(session=session, lake=lake_dir, tables=[t.name for t in tables])
        progress("orders: compacted 3 files into 1 (0.1 s)")
        return []

    monkeypatch.setattr(maintenance, "maintain", fake)
    instance = DagsterInstance.ephemeral()
    run = defs.resolve_job_def("lake_maintenance").execute_in_process(instance=instance)
    assert run.success
    from cdc_platform.config import load_config

    config = load_config(workload.config_path)
    assert asked == {"session": spark, "lake": config.lake, "tables": [t.name for t in config.tables]}
    assert any("orders: compacted 3 files into 1" in (e.user_message or "") for e in instance.all_logs(run.run_id))
