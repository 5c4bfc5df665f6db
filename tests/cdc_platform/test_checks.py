"""Checks as plain functions: stats from the Delta log, freshness, new dead letters, GX suites."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from cdc_platform import checks
from cdc_platform.checks import quality
from cdc_platform.config import load_config
from cdc_platform.errors import ConfigError
from cdc_platform.run.ingest import IngestJob
from tests.cdc_platform.test_spark_jobs import tagged_jobs


SMALL = {"payments.customers": {"key": ["id"]}}
SMALL_LINES = [json.dumps({"before": None, "after": {"id": 1, "email": "a@x"}, "op": "c", "ts_ms": 1767225601000, "transaction": None,
                           "source": {"connector": "mysql", "db": "payments", "table": "customers", "ts_ms": 1767225600000,
                                      "file": "b.000001", "pos": 5}}),
               "garbage"]


@pytest.fixture
def small_lake(make_config, land, run_pipeline) -> Any:
    """One customer and one dead letter, built for the test: for tests that run the pipeline on it again."""
    cfg = make_config(SMALL)
    land(None, SMALL_LINES)
    run_pipeline(cfg)
    return cfg


@pytest.fixture
def small_lake_copy(lake_templates, lake_at, tmp_path) -> Any:
    """The same lake as `small_lake`, each test's own copy of one build: for tests that only read it."""
    return load_config(lake_templates.copy("checks-small", lambda root: lake_at(root, SMALL, SMALL_LINES), tmp_path) / "cdc.yaml")


def test_table_stats_come_from_the_log(small_lake_copy) -> None:
    stats = checks.table_stats(small_lake_copy.lake / "raw_change_events")
    assert stats.rows == 1 and stats.files == 1 and stats.version >= 1 and stats.size_bytes > 0


def test_freshness_against_the_slo(small_lake_copy) -> None:
    newest = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    ok = checks.freshness(small_lake_copy.lake, slo_seconds=120, now=newest + dt.timedelta(seconds=60))
    assert ok.passed and ok.metadata["lag_seconds"] == 60.0
    late = checks.freshness(small_lake_copy.lake, slo_seconds=120, now=newest + dt.timedelta(hours=1))
    assert not late.passed and late.severity is checks.Severity.ERROR and "3,600 s old" in late.description


def test_heartbeats_of_an_idle_source_keep_it_fresh(small_lake, land, run_pipeline) -> None:
    """No change for an hour, but the connector's heartbeats say the source was read until 10 minutes ago."""
    newest = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    beat = newest + dt.timedelta(minutes=50)
    land(None, [json.dumps({"ts_ms": int(beat.timestamp() * 1000)}), json.dumps({"ts_ms": int(beat.timestamp() * 1000) - 5000})])
    run_pipeline(small_lake)
    now = newest + dt.timedelta(hours=1)
    ok = checks.freshness(small_lake.lake, slo_seconds=1200, now=now)
    assert ok.passed and ok.metadata["lag_seconds"] == 600.0, ok.description
    assert ok.metadata["newest_heartbeat_ts"] == beat.isoformat() and ok.metadata["newest_source_ts"] == newest.isoformat()
    assert "3,600 s old" in ok.description and "heartbeat, 600 s old" in ok.description
    assert not checks.freshness(small_lake.lake, slo_seconds=300, now=now).passed  # heartbeats stopped too: stale
    # the latest state is judged against the raw log's changes, which it holds: not behind
    table = checks.freshness(small_lake.lake, slo_seconds=1200, now=now, latest_state=small_lake.lake / "customers")
    assert table.passed and table.metadata["latest_state_behind_raw_seconds"] == 0.0
    # and Dagster's source time for the raw log is the same
    assert checks.table_source_time(small_lake.lake, "raw_change_events", "source_ts") == beat
    # the heartbeats' batch finished, so every latest-state table holds the source up to then as well
    assert checks.table_source_time(small_lake.lake, "customers", "_source_ts") == beat


def _change(table: str, key: int, at: dt.datetime, pos: int) -> str:
    return json.dumps({"before": None, "after": {"id": key}, "op": "c", "ts_ms": int(at.timestamp() * 1000), "transaction": None,
                       "source": {"connector": "mysql", "db": "payments", "table": table, "ts_ms": int(at.timestamp() * 1000),
                                  "file": "b.000001", "pos": pos}})


def test_a_table_its_database_does_not_write_is_as_current_as_the_stream(make_config, land, run_pipeline) -> None:
    """customers changed at t0 only, orders an hour later: both tables hold the source up to t0 + 1 h."""
    cfg = make_config({"payments.customers": {"key": ["id"]}, "payments.orders": {"key": ["id"]}})
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    land(None, [_change("customers", 1, t0, 5), _change("orders", 1, t0, 6)])
    run_pipeline(cfg)
    later = t0 + dt.timedelta(hours=1)
    land(None, [_change("orders", 2, later, 7)])
    run_pipeline(cfg)
    now = later + dt.timedelta(minutes=2)
    assert checks.applied_source_time(cfg.lake) == later
    for name in ("customers", "orders"):
        assert checks.table_source_time(cfg.lake, name, "_source_ts") == later, name
        outcome = checks.freshness(cfg.lake, slo_seconds=300, now=now, latest_state=cfg.lake / name)
        assert outcome.passed and outcome.metadata["latest_state_behind_raw_seconds"] == 0.0, (name, outcome.description)


def test_a_latest_state_no_batch_finished_for_trails_the_raw_log(make_config, land, run_pipeline) -> None:
    """The raw log holds a change whose batch never finished (killed after the raw commit, say): the stages
    have not taken it, so the table is behind by the difference, and the check says so."""
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    cfg = make_config({"payments.customers": {"key": ["id"]}})
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    land(None, [_change("customers", 1, t0, 5)])
    run_pipeline(cfg)
    raw = DeltaTable(str(cfg.lake / "raw_change_events")).to_pyarrow_table()
    stuck = t0 + dt.timedelta(hours=1)
    raw = raw.set_column(raw.schema.get_field_index("event_id"), raw.schema.field("event_id"), pc.binary_join_element_wise(raw["event_id"], "-x", ""))
    raw = raw.set_column(raw.schema.get_field_index("source_ts"), raw.schema.field("source_ts"), pa_timestamps(raw, stuck))
    write_deltalake(str(cfg.lake / "raw_change_events"), raw, mode="append")
    assert checks.table_source_time(cfg.lake, "customers", "_source_ts") == t0
    outcome = checks.freshness(cfg.lake, slo_seconds=300, now=stuck, latest_state=cfg.lake / "customers")
    assert not outcome.passed and outcome.metadata["latest_state_behind_raw_seconds"] == 3600.0
    assert "latest state trails the raw log by 3,600 s" in outcome.description


def pa_timestamps(table: Any, at: dt.datetime) -> Any:
    import pyarrow as pa

    return pa.array([at] * table.num_rows, table.schema.field("source_ts").type)


def test_a_source_seen_only_through_heartbeats_is_fresh_not_unknown(make_config, land, run_pipeline) -> None:
    cfg = make_config({"payments.customers": {"key": ["id"]}})
    now = dt.datetime.now(dt.timezone.utc)
    land(None, [json.dumps({"ts_ms": int(now.timestamp() * 1000) - 30_000})])
    run_pipeline(cfg)
    outcome = checks.freshness(cfg.lake, 300, now=now)
    assert outcome.passed and "newest_source_ts" not in outcome.metadata and 29 <= outcome.metadata["lag_seconds"] <= 31
    assert "heartbeat" in outcome.description


def test_freshness_of_an_empty_lake_is_unknown(make_config) -> None:
    cfg = make_config()
    IngestJob(cfg, stages=[]).setup()
    outcome = checks.freshness(cfg.lake, 60)
    assert not outcome.passed and "empty" in outcome.description


def test_new_dead_letters_warn_once(spark, small_lake, land, run_pipeline, monkeypatch) -> None:
    from cdc_platform import lake
    from cdc_platform.lake import lake_spark

    floors: list[Any] = []
    newest_floor = checks.newest_floor
    monkeypatch.setattr(checks, "newest_floor", lambda *a: floors.append(newest_floor(*a)) or floors[-1])
    first = checks.new_dead_letters(small_lake.lake)
    assert not first.passed and first.severity is checks.Severity.WARN
    assert first.metadata["new_dead_letters"] == 1 and first.metadata["new_by_reason"] == {"not_json": 1}
    assert checks.new_dead_letters(small_lake.lake).passed, "the cursor advanced"
    land(None, ["[1]", "[2]"])
    run_pipeline(small_lake)
    third = checks.new_dead_letters(small_lake.lake)
    assert third.metadata["new_dead_letters"] == 2 and third.metadata["new_by_reason"] == {"not_object": 2}
    assert len(floors) == 2 and floors[-1] is not None, "the reasons came from the newest files, by their statistics"
    land(None, ["not json"])
    run_pipeline(small_lake)
    lake_spark.optimize(spark, lake.table_path(small_lake.lake, "dead_letter"))  # files rewritten: still the newest rows
    fourth = checks.new_dead_letters(small_lake.lake)
    assert fourth.metadata["new_dead_letters"] == 1 and fourth.metadata["new_by_reason"] == {"not_json": 1}
    assert floors[-1] is not None


def test_suite_templates_expand_key_columns(tmp_path: Path) -> None:
    (tmp_path / "latest_state.json").write_text(json.dumps({"name": "latest_state", "expectations": [
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "$key"}},
        {"type": "expect_compound_columns_to_be_unique", "kwargs": {"column_list": "$keys"}},
    ]}))
    (suite,) = quality.suites_for("orders", ("id", "region"), latest_state=True, directory=tmp_path)
    assert [e["kwargs"] for e in suite["expectations"]] == [{"column": "id"}, {"column": "region"}, {"column_list": ["id", "region"]}]
    (single,) = quality.suites_for("orders", ("id",), latest_state=True, directory=tmp_path)
    assert single["expectations"][1] == {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}}
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match="cannot be read as JSON"):
        quality.suites_for("broken", directory=tmp_path)


def test_gx_suite_on_the_raw_log_passes_and_a_bad_frame_fails(spark, small_lake_copy) -> None:
    from cdc_platform.lake.lake_spark import read

    (suite,) = quality.suites_for("raw_change_events")
    good = quality.validate(read(spark, small_lake_copy.lake / "raw_change_events"), suite)
    assert good.passed, good.description
    bad = spark.createDataFrame([("e1", "t", "x", "p", dt.datetime(2026, 1, 1), "l"), ("e1", "t", "c", None, dt.datetime(2026, 1, 1), "l")],
                                "event_id string, table_id string, op string, position string, ingested_at timestamp, line string")
    outcome = quality.validate(bad, suite)
    assert not outcome.passed
    assert outcome.metadata["unexpected.expect_column_values_to_be_unique(event_id)"] == 2
    assert outcome.metadata["unexpected.expect_column_values_to_be_in_set(op)"] == 1
    assert "expect_column_values_to_not_be_null(position)" in outcome.description


def test_unconfigured_tables_are_reported(small_lake, land, run_pipeline) -> None:
    assert checks.unconfigured(checks.raw_census(small_lake.lake), {"payments.customers"}) == {}
    event = {"before": None, "after": {"id": 9}, "op": "c", "ts_ms": 1, "transaction": None,
             "source": {"connector": "mysql", "db": "payments", "table": "audits", "ts_ms": 1, "file": "b.000001", "pos": 9}}
    land(None, [json.dumps(event)])
    run_pipeline(small_lake)
    assert checks.unconfigured(checks.raw_census(small_lake.lake), {"payments.customers"}) == {"payments.audits": 1}
    # counted batch by batch over the log's files: a second run's file adds to the same table's count
    land(None, [json.dumps(event | {"after": {"id": i}, "source": event["source"] | {"pos": 9 + i}}) for i in (10, 11)])
    run_pipeline(small_lake)
    assert checks.unconfigured(checks.raw_census(small_lake.lake), {"payments.customers"}) == {"payments.audits": 3}
    assert checks.unconfigured(checks.raw_census(small_lake.lake), set())["payments.audits"] == 3


def test_the_census_of_the_raw_log_counts_on_from_the_last_one(spark, small_lake, land, run_pipeline) -> None:
    """What the onboarding sensor keeps in its cursor: a later census reads only the files added since, and
    counts what a census from scratch counts; rewritten files, a lake made anew or a foreign cursor count afresh."""
    from cdc_platform import lake
    from cdc_platform.lake import lake_spark

    event = {"before": None, "after": {"id": 9}, "op": "c", "ts_ms": 1, "transaction": None,
             "source": {"connector": "mysql", "db": "payments", "table": "audits", "ts_ms": 1, "file": "b.000001", "pos": 9}}
    land(None, [json.dumps(event)])
    run_pipeline(small_lake)
    first = checks.raw_census(small_lake.lake)
    assert first is not None and first.afresh and first.counts["payments.audits"] == 1
    assert checks.TableCensus.from_cursor(first.to_cursor()) == checks.TableCensus(first.version, first.counts, afresh=False)
    for foreign in (None, "", "2026-11-28T10:00:00", '{"version": "x"}', "[1]"):
        assert checks.TableCensus.from_cursor(foreign) is None

    land(None, [json.dumps(event | {"after": {"id": i}, "source": event["source"] | {"pos": 9 + i}}) for i in (10, 11)])
    run_pipeline(small_lake)
    later = checks.raw_census(small_lake.lake, checks.TableCensus.from_cursor(first.to_cursor()))
    whole = checks.raw_census(small_lake.lake)
    assert later is not None and whole is not None
    assert not later.afresh and later.counts == whole.counts and later.counts["payments.audits"] == 3
    assert 1 <= later.files_read < whole.files_read  # only the second run's files
    unchanged = checks.raw_census(small_lake.lake, later)
    assert unchanged is not None and unchanged.files_read == 0 and unchanged.counts == whole.counts

    raw = lake.table_path(small_lake.lake, "raw_change_events")
    lake_spark.optimize(spark, raw)  # files rewritten (and the old ones removed): counted afresh, nothing twice
    rewritten = checks.raw_census(small_lake.lake, later)
    assert rewritten is not None and rewritten.afresh and rewritten.counts == whole.counts
    ahead = checks.raw_census(small_lake.lake, checks.TableCensus(rewritten.version + 5, {"payments.audits": 99}, afresh=False))
    assert ahead is not None and ahead.afresh and ahead.counts == whole.counts  # a cursor of a lake since made anew


def test_a_census_that_cannot_find_the_new_files_counts_afresh(spark, small_lake, run_pipeline, monkeypatch) -> None:
    """Should the table's dataset name its files otherwise than its log (an object store's URL form, say),
    counting on would silently miss events: the census counts the whole log instead."""
    run_pipeline(small_lake)
    first = checks.raw_census(small_lake.lake)
    assert first is not None and first.counts
    monkeypatch.setattr(checks, "files_added_since", lambda *a: {"s3a://elsewhere/part-0.parquet"})
    again = checks.raw_census(small_lake.lake, checks.TableCensus(first.version, {"payments.customers": 10**6}, afresh=False))
    assert again is not None and again.afresh and again.counts == first.counts


def test_coverage_passes_on_peer_data_and_names_a_removed_row(spark, make_config, land, run_pipeline, peer_files) -> None:
    from cdc_platform import lake

    cfg = make_config({"inventory.products": {"key": ["id"]}})
    land(None, peer_files["schema_exclude"])
    run_pipeline(cfg)
    table = cfg.table("products")
    ok = checks.coverage(spark, cfg.lake, table)
    assert ok.passed, ok.description
    assert ok.metadata["expected_live_keys"] == 10 and ok.metadata["coverage_percent"] == 100.0
    lake.open_table(cfg.lake / "products").delete("id = 104")
    bad = checks.coverage(spark, cfg.lake, table)
    assert not bad.passed and bad.severity is checks.Severity.ERROR
    assert bad.metadata["missing"] == 1 and bad.metadata["mismatched_keys"] == {"missing": ['{"id":104}']}
    assert bad.metadata["coverage_percent"] == 90.0 and "cdc rebuild --table products" in bad.description


def tx_event(tx: str, table: str, row_id: int, pos: int, ts: int) -> str:
    return json.dumps({"before": None, "after": {"id": row_id}, "op": "c", "ts_ms": ts + 5,
                       "source": {"connector": "mysql", "db": "shop", "table": table, "ts_ms": ts, "file": "b.000001", "pos": pos},
                       "transaction": {"id": tx, "total_order": 1, "data_collection_order": 1}})


def marker(status: str, tx: str, ts: int, counts: dict[str, int] | None = None) -> str:
    return json.dumps({"status": status, "id": tx, "ts_ms": ts, "event_count": sum(counts.values()) if counts else None,
                       "data_collections": [{"data_collection": t, "event_count": n} for t, n in counts.items()] if counts else None})


def test_completeness_counts_end_against_landed_events(spark, make_config, land, run_pipeline) -> None:
    cfg = make_config({}, transaction_timeout=60)
    t0 = 1767225600000
    later = t0 + 600_000  # g:3 moves every stream on, so g:2's loss is judged on each stream's own clock
    land("tx/markers.jsonl", [marker("BEGIN", "g:1", t0), marker("END", "g:1", t0, {"shop.orders": 1, "shop.items": 1}),
                              marker("BEGIN", "g:2", t0 + 10), marker("END", "g:2", t0 + 10, {"shop.orders": 1, "shop.items": 2}),
                              marker("BEGIN", "g:3", later), marker("END", "g:3", later, {"shop.orders": 1, "shop.items": 1})])
    land("orders/a.jsonl", [tx_event("g:1", "orders", 1, 10, t0), tx_event("g:2", "orders", 2, 20, t0 + 10), tx_event("g:3", "orders", 3, 98, later)])
    # g:2 lost one item
    land("items/a.jsonl", [tx_event("g:1", "items", 1, 11, t0), tx_event("g:2", "items", 2, 21, t0 + 10), tx_event("g:3", "items", 3, 99, later)])
    run_pipeline(cfg)
    outcome = checks.completeness(spark, cfg.lake, 60)
    assert not outcome.passed
    assert outcome.metadata["transactions_checked"] == 2 and outcome.metadata["count_mismatches"] == 1  # g:3 is not past any clock yet
    assert outcome.metadata["mismatched_transactions"] == ["g:2"]
    assert outcome.metadata["expected_vs_landed_per_table"]["shop.items"] == {"expected": 3, "landed": 2}
    assert "g:2" in outcome.description
    assert outcome.metadata["incomplete_transaction_ids"] == ["g:2"], "the transaction stage expired it too"


def test_completeness_does_not_blame_a_lagging_topic(spark, make_config, land, run_pipeline) -> None:
    cfg = make_config({}, transaction_timeout=60)
    t0 = 1767225600000
    both = {"shop.orders": 1, "shop.items": 1}
    land("tx/markers.jsonl", [marker("BEGIN", "g:0", t0 - 1000), marker("END", "g:0", t0 - 1000, both),
                              marker("BEGIN", "g:1", t0), marker("END", "g:1", t0, both),
                              marker("BEGIN", "g:9", t0 + 200_000), marker("END", "g:9", t0 + 200_000, {"shop.orders": 1})])
    land("orders/a.jsonl", [tx_event("g:0", "orders", 1, 5, t0 - 1000), tx_event("g:1", "orders", 2, 10, t0), tx_event("g:9", "orders", 9, 90, t0 + 200_000)])
    # the items topic is read late: it delivered g:0, but g:1's item has not arrived yet, 200 s of orders later
    land("items/a.jsonl", [tx_event("g:0", "items", 1, 6, t0 - 1000)])
    run_pipeline(cfg)
    outcome = checks.completeness(spark, cfg.lake, 60)
    assert outcome.passed, outcome.description
    # g:0 and g:1 are judged on the orders stream only; the lagging items stream has not passed g:1 yet
    assert outcome.metadata["transactions_checked"] == 2 and outcome.metadata["open_past_timeout"] == 0


def test_completeness_passes_on_the_sample_workload(spark, tmp_path, run_pipeline) -> None:
    from cdc_platform.config import load_config
    from cdc_platform.workload.generate import generate_workload

    workload = generate_workload(tmp_path / "w", transactions=80, seed=4)
    cfg = load_config(workload.config_path)
    run_pipeline(cfg)
    outcome = checks.completeness(spark, cfg.lake, 5)  # the 80 transactions span ~26 s of event time
    assert outcome.passed, outcome.description
    assert outcome.metadata["transactions_checked"] > 50
    for table in cfg.tables:
        cov = checks.coverage(spark, cfg.lake, table)
        assert cov.passed, cov.description


def test_a_lake_from_before_heartbeat_times_reads_without_them(tmp_path: Path) -> None:
    """`pipeline_metrics` gains `newest_heartbeat_ts` at the next ingest; until then the sensor and the checks
    read the table as it is."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from cdc_platform.lake import schemas

    old = pa.schema([f for f in schemas.PIPELINE_METRICS if f.name != "newest_heartbeat_ts"])
    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    row = {"query_id": "q", "batch_id": 0, "started_at": at, "finished_at": at + dt.timedelta(seconds=2), "rows_read": 4,
           "change_events": 4, "newest_source_ts": at}
    write_deltalake(str(tmp_path / "pipeline_metrics"), pa.Table.from_pylist([row], schema=old))
    [batch] = checks.batches_since(tmp_path, None)
    assert batch["batch_id"] == 0 and "newest_heartbeat_ts" not in batch
    assert checks.newest_heartbeat(tmp_path) is None


def test_the_stream_sensor_reads_the_batches_after_its_cursor_in_order(tmp_path: Path) -> None:
    """Its cursor is the newest batch's end: the batches after it come oldest first, at most `limit` of them,
    whichever files they are in (read with a filter, so old files are left out by their statistics)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    from cdc_platform.lake import schemas

    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def batch(n: int) -> dict[str, object]:
        return {"query_id": "q", "batch_id": n, "started_at": at + dt.timedelta(minutes=n), "finished_at": at + dt.timedelta(minutes=n, seconds=2),
                "rows_read": 4, "change_events": 4, "newest_source_ts": at}

    for first in (0, 3, 6):  # three commits, three files
        write_deltalake(str(tmp_path / "pipeline_metrics"), pa.Table.from_pylist([batch(n) for n in (first + 2, first, first + 1)],
                                                                                 schema=schemas.PIPELINE_METRICS), mode="append")
    assert [b["batch_id"] for b in checks.batches_since(tmp_path, None, limit=4)] == [5, 6, 7, 8]
    cursor = batch(4)["finished_at"]
    assert [b["batch_id"] for b in checks.batches_since(tmp_path, cursor)] == [5, 6, 7, 8]  # type: ignore[arg-type]
    assert [b["batch_id"] for b in checks.batches_since(tmp_path, cursor, limit=2)] == [5, 6]  # type: ignore[arg-type]
    assert checks.batches_since(tmp_path, batch(8)["finished_at"]) == []  # type: ignore[arg-type]


def _passing(name: str) -> checks.CheckOutcome:
    return checks.CheckOutcome(True, checks.Severity.ERROR, f"{name} passed")


def test_checks_evaluate_side_by_side_and_each_outcome_comes_back() -> None:
    """Two checks that can only finish together (each waits for the other at a barrier): one after
    another, the first would time out."""
    import threading

    meeting = threading.Barrier(2, timeout=30)

    def meets(name: str) -> checks.CheckOutcome:
        meeting.wait()
        return _passing(name)

    outcomes = dict(checks.side_by_side({"a": lambda: meets("a"), "b": lambda: meets("b"), "c": lambda: _passing("c")}, threads=2))
    assert {k: o.description for k, o in outcomes.items()} == {"a": "a passed", "b": "b passed", "c": "c passed"}


def test_a_checks_spark_jobs_carry_its_name(spark) -> None:
    labelled = tagged_jobs(spark, "check")

    def counts() -> checks.CheckOutcome:
        spark.range(3).count()
        return _passing("counts")

    assert [k for k, _ in checks.side_by_side({"counts": counts, "nothing": lambda: _passing("nothing")})] != []
    assert tagged_jobs(spark, "check") - labelled


def test_a_check_that_raises_leaves_the_others_their_outcomes_then_is_raised() -> None:
    from cdc_platform.errors import CheckCrashed

    def broken() -> checks.CheckOutcome:
        raise FileNotFoundError("no such table: transactions")

    got: list[str] = []
    with pytest.raises(CheckCrashed, match=r"the check completeness could not run: FileNotFoundError: no such table: transactions"):
        for key, outcome in checks.side_by_side({"completeness": broken, "coverage": lambda: _passing("coverage"),
                                                 "freshness": lambda: _passing("freshness")}):
            got.append(key)
    assert sorted(got) == ["coverage", "freshness"]


def test_gx_validations_side_by_side_each_judge_their_own_frame(spark) -> None:
    """Checks share one session in threads: GX's contexts must not mix up the frames they validate."""
    from concurrent.futures import ThreadPoolExecutor

    good = spark.range(0, 50).selectExpr("id", "id % 7 AS v")
    bad = spark.range(0, 50).selectExpr("id % 10 AS id", "CAST(NULL AS BIGINT) AS v")
    suite = {"name": "s", "expectations": [{"type": "expect_column_values_to_be_unique", "kwargs": {"column": "id"}},
                                           {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "v"}}]}
    frames = [good if i % 2 else bad for i in range(8)]
    with ThreadPoolExecutor(4) as pool:
        passed = list(pool.map(lambda df: quality.validate(df, suite).passed, frames))
    assert passed == [bool(i % 2) for i in range(8)]


def test_the_newest_dead_letters_are_read_from_the_newest_files(tmp_path: Path) -> None:
    """The dead-letter sample and the fallback of the reasons read the newest files only, by their statistics,
    and still find exactly the newest rows, whichever files they are in and in whatever order they were written."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable, write_deltalake

    from cdc_platform.lake import schemas

    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    path = tmp_path / "dead_letter"

    def rows(*minutes: int) -> pa.Table:
        return pa.Table.from_pylist([{"reason_code": f"r{m}", "reason": "x", "stage": "ingest", "dead_lettered_at": at + dt.timedelta(minutes=m)}
                                     for m in minutes], schema=schemas.DEAD_LETTER)

    for minutes in ((1, 2, 3), (30, 4, 5), (6, 7, 8), (9, 40, 10), (11, 12, 13)):  # the newest two are in older files
        write_deltalake(str(path), rows(*minutes), mode="append")
    newest = checks.newest_dead_letters(tmp_path, n=3)
    assert [r["reason_code"] for r in newest] == ["r40", "r30", "r13"]
    actions = pa.table(DeltaTable(str(path)).get_add_actions(flatten=True))
    floor = checks.newest_floor(actions, "dead_lettered_at", 3)
    assert floor is not None and floor <= at + dt.timedelta(minutes=13)
    dataset = DeltaTable(str(path)).to_pyarrow_dataset()
    kept = list(dataset.get_fragments(filter=pc.field("dead_lettered_at") >= pa.scalar(floor, dataset.schema.field("dead_lettered_at").type)))
    assert len(kept) < 5, "files whose newest row is older than the floor are left out"
    assert checks.newest_floor(actions, "dead_lettered_at", 16) is None  # fewer rows than asked for: read everything
    assert checks.newest_floor(actions, "no_such_column", 1) is None
    assert len(checks.newest_dead_letters(tmp_path, n=20)) == 15
