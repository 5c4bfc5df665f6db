"""Snapshot backfills never overwrite newer data nor resurrect deleted keys (DBLog's rule); dry runs commit nothing."""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest

from cdc_platform import backfill, lake
from cdc_platform.config import load_config
from cdc_platform.errors import ConfigError, LakeError
from tests.cdc_platform.test_spark_jobs import tagged_jobs

CUSTOMERS = {"payments.customers": {"key": ["id"]}}


def event(op: str, row_id: int, pos: int, name: str) -> str:
    image = {"id": row_id, "name": name}
    return json.dumps({
        "before": image if op in ("u", "d") else None, "after": None if op == "d" else image, "op": op,
        "source": {"connector": "mysql", "name": "payments", "db": "payments", "table": "customers",
                   "ts_ms": 1767225600000 + pos, "file": "mysql-bin.000003", "pos": pos, "row": 0},
        "ts_ms": 1767225600500 + pos, "transaction": None,
    })


@pytest.fixture
def streamed(lake_templates, lake_at, tmp_path) -> Any:
    """A streamed lake (two customers, one deleted, one updated) and a snapshot as of position 200: each test's own copy."""

    def build(root) -> None:
        lake_at(root, CUSTOMERS, [event("c", 1, 100, "ann"), event("c", 2, 150, "bob"), event("d", 2, 250, "bob"), event("u", 1, 300, "ann v2")])
        snap = root / "snapshots" / "customers"
        snap.mkdir(parents=True)
        (snap / "rows.csv").write_text("id,name\n1,ann old\n2,bob\n3,cy\n4,dee\n")
        (snap / "as_of.json").write_text(json.dumps({"connector": "mysql", "file": "mysql-bin.000003", "pos": 200, "ts_ms": 1767225600200}))

    return load_config(lake_templates.copy("backfill-customers", build, tmp_path) / "cdc.yaml")


def versions(cfg) -> dict[str, int]:
    return {n: lake.open_table(p).version() for n, p in lake.lake_tables(cfg.lake).items()}


def full_view(query, cfg) -> dict[int, str]:
    return {r["id"]: r["name"] for r in query(cfg, "SELECT id, name FROM customers__full_view")}


def test_dry_run_reports_the_diff_and_commits_nothing(streamed, spark) -> None:
    before = versions(streamed)
    labelled = tagged_jobs(spark, "backfill")
    diff = backfill.load_snapshot(streamed, "customers", dry_run=True)
    assert tagged_jobs(spark, "backfill") - labelled, "its Spark jobs are named in the Spark UI"
    assert (diff.snapshot_rows, diff.inserted, diff.updated, diff.skipped_stale, diff.skipped_deleted) == (4, 2, 0, 1, 1)
    assert diff.samples["inserted"] == ['{"id":3}', '{"id":4}'] and diff.samples["skipped_deleted"] == ['{"id":2}']
    assert not diff.committed and "dry run" in diff.summary()
    assert versions(streamed) == before


def test_an_older_snapshot_leaves_newer_changes_intact(streamed, query) -> None:
    diff = backfill.load_snapshot(streamed, "customers")
    assert diff.committed and diff.inserted == 2
    assert full_view(query, streamed) == {1: "ann v2", 3: "cy", 4: "dee"}, "id 1 keeps its newer update, id 2 stays deleted"
    raw = query(streamed, "SELECT key, op, snapshot FROM raw_change_events WHERE snapshot ORDER BY key")
    assert raw == [{"key": '{"id":3}', "op": "r", "snapshot": True}, {"key": '{"id":4}', "op": "r", "snapshot": True}]
    before = versions(streamed)
    again = backfill.load_snapshot(streamed, "customers")
    assert again.unchanged == 2 and versions(streamed) == before, "the same snapshot twice commits nothing"


def test_no_resurrection_after_tombstones_are_purged(streamed, query) -> None:
    from cdc_platform.stages.latest_state import compact, purge_tombstones

    table = streamed.table("customers")
    path = lake.table_path(streamed.lake, "customers")
    compact(path, table)
    assert purge_tombstones(path, table, now=dt.datetime(2100, 1, 1, tzinfo=dt.timezone.utc)) == 1
    diff = backfill.load_snapshot(streamed, "customers")
    assert diff.skipped_deleted == 1
    assert 2 not in full_view(query, streamed), "the raw log still holds the delete"


def test_debezium_jsonl_snapshots_carry_their_own_positions(streamed, query) -> None:
    snap = backfill.snapshot_dir(streamed, streamed.table("customers"))
    for f in snap.iterdir():
        f.unlink()
    (snap / "snap.jsonl").write_text("\n".join([event("r", 1, 400, "ann v3"), event("r", 5, 400, "eve"), "not json"]) + "\n")
    diff = backfill.load_snapshot(streamed, "customers")
    assert (diff.updated, diff.inserted, diff.invalid) == (1, 1, 1)
    assert full_view(query, streamed) == {1: "ann v3", 5: "eve"}
    dead = query(streamed, "SELECT reason_code, stage FROM dead_letter")
    assert dead == [{"reason_code": "not_json", "stage": "backfill"}]


def test_the_driver_gets_the_lakes_rows_of_the_snapshots_keys_only(streamed, spark) -> None:
    """The log and state lookups run on the executors: the driver holds an entry per snapshot key, however long the history."""
    table = streamed.table("customers")
    keys = backfill._key_frame(spark, ['{"id":2}', '{"id":9}', None])
    newest = backfill._newest_raw_positions(streamed, table, keys)
    assert list(newest) == ['{"id":2}'] and newest['{"id":2}'][1] == "d"  # id 1's two events stay on the executors
    state = backfill._state_rows(backfill._state_frame(streamed, table), keys)
    assert list(state) == ['{"id":2}'] and state['{"id":2}']["_deleted"] is True and backfill.KEY not in state['{"id":2}']


def test_a_key_changes_old_key_is_the_raw_logs_text_for_that_key_every_digit_kept() -> None:
    """The old key of a key change is matched with keys the parser wrote; read as a float, a key past a float's
    digits (a DECIMAL id) became another text, matched nothing, and let a snapshot row resurrect the old key."""
    import pyarrow as pa

    from cdc_platform.config import TableConfig
    from cdc_platform.parse.envelope import KeySpec, parse_line

    big = "12345678901234567.25"
    doc = json.loads(event("c", 1, 100, "ann"))
    written = parse_line(json.dumps(doc).replace('"id": 1,', f'"id": {big},'), "f", KeySpec({"payments.customers": ["id"]}))["key"]
    assert written == '{"id":%s}' % big
    table = TableConfig(source="payments.customers", name="customers", key=("id",))
    batch = pa.RecordBatch.from_pylist([{"key": '{"id":2}', "before": '{"id":%s,"name":"ann"}' % big, "position": "p"}])
    (moved,) = list(backfill._moved_keys(iter([batch]), table))
    assert moved.to_pylist() == [{"key": written, "position": "p", "op": "d"}]


def test_missing_inputs_are_clear_errors(streamed) -> None:
    snap = backfill.snapshot_dir(streamed, streamed.table("customers"))
    (snap / "as_of.json").unlink()
    with pytest.raises(ConfigError, match="no as_of.json"):
        backfill.load_snapshot(streamed, "customers", dry_run=True)
    for f in snap.iterdir():
        f.unlink()
    snap.rmdir()
    with pytest.raises(ConfigError, match="no snapshot for customers"):
        backfill.load_snapshot(streamed, "customers", dry_run=True)
    with pytest.raises(ConfigError, match="no configured table is named 'nope'"):
        backfill.load_snapshot(streamed, "nope")


def test_snapshot_coverage_names_missing_extra_and_different_rows(streamed) -> None:
    snap = backfill.snapshot_dir(streamed, streamed.table("customers"))
    (snap / "rows.csv").write_text("id,name\n1,ann old\n")  # as of pos 200: id 1 (later updated), id 2 was deleted at 250
    ok = backfill.compare_snapshot(streamed, "customers")
    assert ok.passed, ok.description
    assert ok.metadata["newer_in_lake"] == 1 and ok.metadata["snapshot_coverage_percent"] == 100.0
    (snap / "as_of.json").write_text(json.dumps({"connector": "mysql", "file": "mysql-bin.000003", "pos": 400}))
    (snap / "rows.csv").write_text("id,name\n1,ann v3\n7,gus\n")  # as of pos 400: id 1 differs, id 7 never landed
    bad = backfill.compare_snapshot(streamed, "customers")
    assert not bad.passed and bad.metadata["snapshot_coverage_percent"] == 0.0
    assert bad.metadata["snapshot_mismatched_keys"] == {"missing_in_lake": ['{"id":7}'], "different_values": ['{"id":1}']}
    (snap / "rows.csv").write_text("id,name\n7,gus\n")
    extra = backfill.compare_snapshot(streamed, "customers")
    assert extra.metadata["snapshot_mismatched_keys"]["extra_in_lake"] == ['{"id":1}'], "id 1 was live at pos 300, before the snapshot"


def test_a_backfill_before_the_first_run_says_to_run_first(make_config) -> None:
    cfg = make_config(CUSTOMERS)
    with pytest.raises(LakeError, match=r"has no raw_change_events yet; run `cdc run` once before a backfill"):
        backfill.load_snapshot(cfg, "customers")


def test_backfills_racing_the_stream_lose_no_update(spark, make_config, land, query, tmp_path) -> None:
    """Snapshot loads commit while `cdc stream` commits: conflicts are retried and no update is lost.

    Whatever the interleaving, the end state is fixed: keys 1-40 carry the stream's last update (newer
    positions than any snapshot), keys 41-80 exist only in the snapshots and take the newest snapshot.
    """
    import threading

    from cdc_platform.run.ingest import IngestJob

    cfg = make_config(CUSTOMERS)
    land("seed.jsonl", [event("c", k, 1000 + k, f"v0-{k}") for k in range(1, 41)])
    snap = backfill.snapshot_dir(cfg, cfg.table("customers"))
    snap.mkdir(parents=True)
    job = IngestJob(cfg)
    errors: list[BaseException] = []

    def feed() -> None:
        for round_ in range(1, 6):
            land(f"round-{round_}.jsonl", [event("u", k, 1000 + round_ * 100 + k, f"v{round_}-{k}") for k in range(1, 41)])
            threading.Event().wait(1.0)

    def backfills() -> None:
        try:
            # a backfill needs the raw log the stream creates first (a clear error otherwise, tested apart);
            # under load the stream's start can take longer than any fixed wait
            raw = lake.table_path(cfg.lake, "raw_change_events")
            deadline = time.monotonic() + 120
            while not lake.exists(raw) and time.monotonic() < deadline:
                threading.Event().wait(0.2)
            threading.Event().wait(1.0)
            for i in range(1, 5):
                rows = "\n".join(f"{k},snap{i}-{k}" for k in range(1, 81))
                (snap / "rows.csv").write_text(f"id,name\n{rows}\n")
                (snap / "as_of.json").write_text(json.dumps({"connector": "mysql", "file": "mysql-bin.000003", "pos": 100 + i}))
                backfill.load_snapshot(cfg, "customers")
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=feed), threading.Thread(target=backfills)]
    for t in threads:
        t.start()
    job.run_continuously(spark, interval="500 milliseconds", timeout=25)
    for t in threads:
        t.join()
    assert errors == []
    IngestJob(cfg).run_available_now(spark)  # drain anything that landed after the timeout
    view = full_view(query, cfg)
    assert view == {**{k: f"v5-{k}" for k in range(1, 41)}, **{k: f"snap4-{k}" for k in range(41, 81)}}
    streamed = query(cfg, "SELECT count(*) AS n FROM raw_change_events WHERE NOT snapshot")[0]["n"]
    assert streamed == 40 * 6, "every streamed change is in the raw log exactly once"


def test_backfill_into_a_table_nothing_has_streamed_to_yet(make_config, query) -> None:
    from cdc_platform.run.ingest import IngestJob

    cfg = make_config(CUSTOMERS)
    IngestJob(cfg).setup()  # tables exist, with only their metadata columns
    snap = backfill.snapshot_dir(cfg, cfg.table("customers"))
    snap.mkdir(parents=True)
    (snap / "rows.csv").write_text("id,name\n1,ann\n2,bob\n")
    (snap / "as_of.json").write_text(json.dumps({"connector": "mysql", "file": "mysql-bin.000003", "pos": 10}))
    diff = backfill.load_snapshot(cfg, "customers")
    assert diff.inserted == 2 and full_view(query, cfg) == {1: "ann", 2: "bob"}


def key_change(old_id: int, new_id: int, pos: int, name: str) -> str:
    doc = json.loads(event("u", new_id, pos, name))
    doc["before"] = {"id": old_id, "name": name}
    return json.dumps(doc)


def truncate(pos: int) -> str:
    doc = json.loads(event("c", 0, pos, ""))
    doc.update(op="t", before=None, after=None)
    return json.dumps(doc)


def test_a_key_change_and_a_truncate_in_the_log_keep_older_snapshot_rows_out(lake_templates, lake_at, tmp_path, spark, query) -> None:
    """DBLog's rule for the two log events that delete without naming the snapshot's key as theirs: an update that
    moves a row to a new key deletes the old key at its position, and a truncate deletes every key below its own."""
    from cdc_platform.run.ingest import IngestJob

    def build(root) -> None:
        lake_at(root, CUSTOMERS, [event("c", 5, 100, "eve"), key_change(5, 6, 200, "eve"), event("c", 7, 300, "gil")])

    cfg = load_config(lake_templates.copy("backfill-key-change", build, tmp_path) / "cdc.yaml")
    snap = backfill.snapshot_dir(cfg, cfg.table("customers"))
    snap.mkdir(parents=True)
    (snap / "rows.csv").write_text("id,name\n5,eve\n6,eve old\n7,gil old\n11,kim\n")
    (snap / "as_of.json").write_text(json.dumps({"connector": "mysql", "file": "mysql-bin.000003", "pos": 150}))
    diff = backfill.load_snapshot(cfg, "customers")
    assert diff.samples == {"skipped_deleted": ['{"id":5}'], "skipped_stale": ['{"id":6}', '{"id":7}'], "inserted": ['{"id":11}']}
    assert full_view(query, cfg) == {6: "eve", 7: "gil", 11: "kim"}

    (cfg.landing / "part-00002.jsonl").write_text(truncate(400) + "\n" + event("c", 8, 500, "hal") + "\n")
    IngestJob(cfg).run_available_now(spark)
    (snap / "rows.csv").write_text("id,name\n7,gil\n12,lou\n")
    (snap / "as_of.json").write_text(json.dumps({"connector": "mysql", "file": "mysql-bin.000003", "pos": 350}))
    diff = backfill.load_snapshot(cfg, "customers")
    assert (diff.skipped_deleted, diff.applied) == (2, 0), diff.summary()
    assert full_view(query, cfg) == {8: "hal"}
