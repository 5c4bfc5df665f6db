"""Transaction aggregation inside the pipeline: Delta tables, exactly once, idle time, views and `cdc sql`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform import lake
from cdc_platform.stages import transactions as T
from cdc_platform.cli import main as cdc
from cdc_platform.config import PlatformConfig
from cdc_platform.parse.envelope import parse_line
from cdc_platform.run.ingest import IngestJob
from cdc_platform.parse.parsed_batches import rows_to_batch
from cdc_platform.stages.stage import BatchContext, StageFailure
from cdc_platform.stages.transactions import schemas as S
from cdc_platform.stages.transactions import stage as tx_stage
from tests.cdc_platform.test_transactions import COUNTS, KEYS, begin, end, ev

TABLES = {"shop.charges": {"key": ["id"]}, "shop.audits": {"key": ["id"], "mask": ["pos"]}}


def rows(cfg: PlatformConfig, table: str) -> list[dict[str, Any]]:
    return lake.open_table(lake.table_path(cfg.lake, table)).to_pyarrow_table().to_pylist()


def sql_json(capsys: pytest.CaptureFixture[str], cfg: PlatformConfig, query: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert cdc(["sql", "--lake", str(cfg.lake), "--format", "json", query]) == 0
    return json.loads(capsys.readouterr().out)



def crash_before_the_state_commit(monkeypatch: pytest.MonkeyPatch) -> Callable[..., bool]:
    """Make the state commit raise, like a process killed after the outputs committed; return the real writer."""
    real = tx_stage._write

    def crash_on_state(spark: Any, path: Path, *args: Any, **kwargs: Any) -> bool:
        if path.name == T.OPEN_TRANSACTIONS:
            raise RuntimeError("killed before the state commit")
        return real(spark, path, *args, **kwargs)

    monkeypatch.setattr(tx_stage, "_write", crash_on_state)
    return real

def test_a_half_landed_transaction_is_hidden_from_consistent_views_until_complete(
    make_config: Callable[..., PlatformConfig], land: Callable[..., Path], run_pipeline: Callable[..., Any],
    spark: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    def query(_cfg: PlatformConfig, text: str) -> list[dict[str, Any]]:  # the views `cdc sql` just registered
        return [r.asDict(recursive=True) for r in spark.sql(text).collect()]

    monkeypatch.setenv("CDC_MASK_SALT", "pepper")
    cfg = make_config(TABLES, transaction_timeout=1)
    land("payments.charges/part-1.jsonl", [ev(None, "charges", 50, 0.5, row=7), ev("g:1", "charges", 101, 1), ev("g:2", "charges", 201, 2, op="u")])
    land("payments.audits/part-1.jsonl", [ev("g:1", "audits", 102, 1, order=2)])
    land("payments.transaction/part-1.jsonl", [begin("g:1", 1), end("g:1", 1, COUNTS), begin("g:2", 2), end("g:2", 2, COUNTS)])
    run_pipeline(cfg)

    # g:2's charge update has landed, its audit has not: the consistent view still shows g:1's row.
    view = "SELECT id, pos, _transaction_id FROM charges__consistent_view ORDER BY id"
    assert sql_json(capsys, cfg, view) == [{"id": 1, "pos": 101, "_transaction_id": "g:1"}, {"id": 7, "pos": 50, "_transaction_id": None}]
    (wm,) = query(cfg, "SELECT source, position, open_transactions, blocking_transaction_id FROM consistency_watermark")
    assert wm == {"source": "shop", "position": f"{1:010d}{102:020d}{0:010d}", "open_transactions": 1, "blocking_transaction_id": "g:2"}
    assert query(cfg, "SELECT count(*) AS n FROM raw_change_events WHERE table_id = 'shop.charges'") == [{"n": 3}]

    time.sleep(1.5)  # longer than the timeout: the gap between two runs is not idleness
    land("payments.audits/part-2.jsonl", [ev("g:2", "audits", 202, 2, order=2)])
    land("payments.charges/part-2.jsonl", [ev("g:1", "charges", 101, 1)])  # a redelivery after completion
    run_pipeline(cfg)

    counts = sql_json(capsys, cfg, (
        "SELECT (SELECT count(*) FROM transactions) AS complete, (SELECT count(*) FROM incomplete_transactions) AS incomplete, "
        "(SELECT count(*) FROM late_transaction_events) AS late, (SELECT count(*) FROM consistency_watermark) AS sources, "
        "(SELECT count(*) FROM open_transactions WHERE entry = 'open') AS open, "
        "(SELECT count(*) FROM charges__consistent_view) AS charges, (SELECT count(*) FROM audits__consistent_view) AS audits"
    ))
    # The redelivered g:1 charge is dropped by the raw log's identity dedup: the stage query, which reads the raw log,
    # never sees it, so it is no late event.
    assert counts == [{"complete": 2, "incomplete": 0, "late": 0, "sources": 1, "open": 0, "charges": 2, "audits": 1}]
    assert query(cfg, view)[0] == {"id": 1, "pos": 201, "_transaction_id": "g:2"}
    (audit,) = query(cfg, "SELECT * FROM audits__consistent_view")
    (clean,) = query(cfg, "SELECT * FROM audits__clean_view")
    assert audit["_transaction_id"] == "g:2" and len(audit["pos"]) == 64, "masked: a salted SHA-256"
    assert audit == clean, "all complete: the consistent view is the clean view, column for column"
    done = query(cfg, "SELECT transaction_id, event_count, events_per_table, events[0].table_id AS first FROM transactions ORDER BY 1")
    assert done == [
        {"transaction_id": "g:1", "event_count": 2, "events_per_table": COUNTS, "first": "shop.charges"},
        {"transaction_id": "g:2", "event_count": 2, "events_per_table": COUNTS, "first": "shop.charges"},
    ]
    assert query(cfg, "SELECT transaction_id, fate, kind FROM late_transaction_events") == [], "the redelivery never reached the stage"
    (wm,) = query(cfg, "SELECT position, open_transactions FROM consistency_watermark")
    assert wm == {"position": f"{1:010d}{202:020d}{0:010d}", "open_transactions": 0}
    metrics = query(cfg, "SELECT stage_figures['transactions.state_rows'] AS state_rows FROM stage_progress WHERE query = 'transactions'")
    assert metrics and all(m["state_rows"] > 0 for m in metrics)


def parsed_table(lines: list[str]) -> pa.Table:
    return pa.Table.from_batches([rows_to_batch([parse_line(line, "f.jsonl", KEYS) for line in lines])])


def versions(cfg: PlatformConfig) -> dict[str, int]:
    return {name: lake.open_table(path).version() for name, path in lake.lake_tables(cfg.lake).items()}


def test_a_crash_between_outputs_and_state_neither_loses_nor_repeats(make_config: Callable[..., PlatformConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(TABLES)
    stage = T.TransactionStage()
    job = IngestJob(cfg, stages=[stage])
    job.setup()
    first = parsed_table([begin("g:1", 1), ev("g:1", "charges", 101, 1), ev("g:1", "audits", 102, 1, order=2), end("g:1", 1, COUNTS), begin("g:2", 1)])

    real = crash_before_the_state_commit(monkeypatch)
    with pytest.raises(StageFailure, match="killed before the state commit"):
        job.process_parsed(first, 0, "query-a")
    assert [r["transaction_id"] for r in rows(cfg, T.TRANSACTIONS)] == ["g:1"]
    monkeypatch.setattr(tx_stage, "_write", real)

    restarted = IngestJob(cfg, stages=[T.TransactionStage()])  # a new process: nothing cached
    restarted.process_parsed(first, 0, "query-a")  # Spark replays the unfinished batch
    assert [r["transaction_id"] for r in rows(cfg, T.TRANSACTIONS)] == ["g:1"]
    assert [r["transaction_id"] for r in rows(cfg, T.OPEN_TRANSACTIONS) if r["entry"] == T.OPEN] == ["g:2"]
    before = versions(cfg)
    restarted.process_parsed(first, 0, "query-a")
    assert versions(cfg) == before, "a batch whose state is committed commits nothing again"
    restarted.process_parsed(parsed_table([ev("g:2", "charges", 110, 1, row=2), end("g:2", 1, {"shop.charges": 1})]), 1, "query-a")
    assert sorted(r["transaction_id"] for r in rows(cfg, T.TRANSACTIONS)) == ["g:1", "g:2"]


def test_the_state_table_keeps_each_streams_clock_for_the_next_process(make_config: Callable[..., PlatformConfig], spark: Any) -> None:
    """The state's stream and source rows follow its open rows, and any part can be empty: all of them land, so a
    new process (or the Spark stage after a batch on the driver) reads the clocks it judges expiry by."""
    cfg = make_config(TABLES)
    job = IngestJob(cfg, stages=[T.TransactionStage()])
    job.setup()
    job.process_parsed(parsed_table([begin("g:1", 1), ev("g:1", "charges", 101, 1)]), 0, "query-a")
    state = rows(cfg, T.OPEN_TRANSACTIONS)
    assert sorted((r["entry"], r["stream"] or r["transaction_id"]) for r in state if r["entry"] != S.SOURCE) == [
        (T.OPEN, "g:1"), (S.STREAM, S.MARKERS_STREAM), (S.STREAM, "shop.charges")]
    held = T.TransactionStage()._load(cfg)
    assert set(held.progress) == {S.MARKERS_STREAM, "shop.charges"}


def test_an_interrupted_idle_expiry_is_honoured_after_a_restart(make_config: Callable[..., PlatformConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_config(TABLES, transaction_timeout=1)
    job = IngestJob(cfg, stages=[T.TransactionStage()])
    job.setup()
    job.process_parsed(parsed_table([begin("g:1", 1), ev("g:1", "charges", 101, 1)]), 0, "query-a")
    real = crash_before_the_state_commit(monkeypatch)
    with pytest.raises(RuntimeError):
        job.stages[0].on_idle(BatchContext(cfg, "query-a", 0), 5.0)  # type: ignore[attr-defined]
    monkeypatch.setattr(tx_stage, "_write", real)

    stage = T.TransactionStage()
    IngestJob(cfg, stages=[stage]).process_parsed(parsed_table([end("g:1", 1, {"shop.charges": 1})]), 1, "query-a")
    assert [(r["transaction_id"], r["expired_by"]) for r in rows(cfg, T.INCOMPLETE)] == [("g:1", T.PROCESSING_TIME)]
    assert rows(cfg, T.TRANSACTIONS) == [], "expired by idle time: its END arriving later does not complete it"
    assert [(r["transaction_id"], r["fate"]) for r in rows(cfg, T.LATE)] == [("g:1", "expired")]
    assert stage.on_idle(BatchContext(cfg, "query-a", 1), 5.0) is None


def test_an_idle_stream_times_out_open_transactions(
    make_config: Callable[..., PlatformConfig], land: Callable[..., Path], spark: Any
) -> None:
    cfg = make_config(TABLES, transaction_timeout=1)
    land("payments.transaction/part-1.jsonl", [begin("g:1", 1)])
    land("payments.charges/part-1.jsonl", [ev("g:1", "charges", 101, 1)])
    job = IngestJob(cfg)
    done = threading.Event()  # stops the job after the batch in flight (a bare query.stop() would interrupt it)
    runner = threading.Thread(
        target=job.run_continuously, kwargs={"spark": spark, "interval": "200 milliseconds", "timeout": 120, "stop": done}
    )
    runner.start()
    try:
        deadline = time.monotonic() + 100
        found: list[dict[str, Any]] = []
        while time.monotonic() < deadline and not found:
            time.sleep(0.5)
            if lake.exists(lake.table_path(cfg.lake, T.INCOMPLETE)):
                found = rows(cfg, T.INCOMPLETE)
    finally:
        done.set()
        runner.join(timeout=60)
    assert not runner.is_alive(), "the job did not stop within 60 s of being asked"
    assert [(r["transaction_id"], r["reason"], r["expired_by"]) for r in found] == [("g:1", T.MISSING_END, T.PROCESSING_TIME)]
    assert job.reports and job._failure is None


def test_the_held_state_is_dropped_when_the_state_table_moved_on_under_it(make_config: Callable[..., PlatformConfig], spark: Any) -> None:
    """Another writer (a second process, an operator's repair) commits the state: the next batch reads it."""
    cfg = make_config(TABLES)
    stage = T.TransactionStage()
    job = IngestJob(cfg, stages=[stage])
    job.setup()
    job.process_parsed(parsed_table([begin("g:1", 1), ev("g:1", "charges", 101, 1)]), 0, "query-a")
    state_path = lake.table_path(cfg.lake, T.OPEN_TRANSACTIONS)
    assert stage._cache is not None and stage._cache[1] == lake.open_table(state_path).version(), "its own commit is held"

    # Someone else rewrites the state: g:1 is forgotten there (its BEGIN and charge with it).
    tx_stage._write(spark, state_path, T.empty_state(), tx_stage.OPEN_TRANSACTIONS_SCHEMA, None, None, mode="overwrite")
    job.process_parsed(parsed_table([ev("g:1", "audits", 102, 1, order=2), end("g:1", 1, COUNTS)]), 1, "query-a")
    assert rows(cfg, T.TRANSACTIONS) == [], "decided on the table as committed, not on the held copy"
    (open_row,) = [r for r in rows(cfg, T.OPEN_TRANSACTIONS) if r["entry"] == T.OPEN]
    assert (open_row["transaction_id"], open_row["has_begin"], open_row["seen_count"]) == ("g:1", False, 1)


def test_a_state_commit_that_is_not_recognisably_ours_is_not_held(make_config: Callable[..., PlatformConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that slips in between our state commit and the version check must not get our held state stamped on it."""
    cfg = make_config(TABLES)
    stage = T.TransactionStage()
    job = IngestJob(cfg, stages=[stage])
    job.setup()
    real = tx_stage._write

    def and_someone_else(spark: Any, path: Path, *args: Any, **kwargs: Any) -> bool:
        wrote = real(spark, path, *args, **kwargs)
        if path.name == T.OPEN_TRANSACTIONS:
            real(spark, path, T.empty_state(), tx_stage.OPEN_TRANSACTIONS_SCHEMA, None, None, mode="overwrite")
        return wrote

    monkeypatch.setattr(tx_stage, "_write", and_someone_else)
    job.process_parsed(parsed_table([begin("g:1", 1), ev("g:1", "charges", 101, 1)]), 0, "query-a")
    monkeypatch.setattr(tx_stage, "_write", real)
    assert stage._cache is None, "the latest commit is not ours: nothing is held"
    assert [r for r in rows(cfg, T.OPEN_TRANSACTIONS) if r["entry"] == T.OPEN] == []
    job.process_parsed(parsed_table([ev("g:1", "audits", 102, 1, order=2), end("g:1", 1, COUNTS)]), 1, "query-a")
    assert rows(cfg, T.TRANSACTIONS) == []


def test_vacuum_commits_keep_the_held_state_and_the_results_right(make_config: Callable[..., PlatformConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tx_stage, "MAINTENANCE_EVERY", 2)
    monkeypatch.setattr(tx_stage, "MAINTENANCE_RETENTION_HOURS", 0)  # so vacuum removes files and commits
    cfg = make_config(TABLES)
    stage = T.TransactionStage()
    job = IngestJob(cfg, stages=[stage])
    job.setup()
    state_path = lake.table_path(cfg.lake, T.OPEN_TRANSACTIONS)
    loads = 0
    real_hold = tx_stage.hold  # the name the stage calls

    def counting_hold(state: pa.Table) -> T.Held:
        nonlocal loads
        loads += 1
        return real_hold(state)

    monkeypatch.setattr(tx_stage, "hold", counting_hold)
    for b in range(2):  # four batches, each transaction across two; the state is vacuumed between them
        job.process_parsed(parsed_table([begin(f"g:{b}", b), ev(f"g:{b}", "charges", 100 + 10 * b, b, row=b)]), 2 * b, "query-a")
        job.process_parsed(parsed_table([ev(f"g:{b}", "audits", 101 + 10 * b, b, row=b, order=2), end(f"g:{b}", b, COUNTS)]), 2 * b + 1, "query-a")
    ops = [c.get("operation") for c in lake.open_table(state_path).history()]
    assert any(str(op).startswith("VACUUM") for op in ops), ops
    assert loads == 1, "only the first batch read the state table"
    assert stage._cache is not None and stage._cache[1] == lake.open_table(state_path).version()
    assert sorted(r["transaction_id"] for r in rows(cfg, T.TRANSACTIONS)) == [f"g:{b}" for b in range(2)]
