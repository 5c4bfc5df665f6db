"""The stage queries (`run/stage_queries.py`, `run/queries.py`): each stage reads the raw log as a stream of its own.

What is theirs alone: arrivals ordered across the ingest batches a stage batch holds, the upgrade of a lake
whose stages ran inside the ingest batch, the progress rows the views read, and (in `cdc stream`) a failed
stage query started again while the ingest goes on.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform import lake
from cdc_platform.parse.envelope import KeySpec, parse_line
from cdc_platform.parse.parsed_batches import rows_to_batch
from cdc_platform.run import queries, stage_queries
from cdc_platform.run.ingest import IngestJob
from cdc_platform.stages.latest_state import LatestStateStage
from cdc_platform.stages.stage import BatchContext, StageResult
from tests.cdc_platform.test_latest_state import ORDERS, ev, state

KEYS = {ORDERS: {"key": ["id"]}}


def parsed(lines: list[str]) -> pa.Table:
    keys = KeySpec({ORDERS: ["id"]})
    return pa.Table.from_batches([rows_to_batch([parse_line(line, "f.jsonl", keys) for line in lines])])


def fallback(pos: int, id_: int, **cols: Any) -> str:
    """A change without a log position (no binlog file): ordered by `source.ts_ms` only, so two can tie."""
    envelope = json.loads(ev("u", pos=pos, after={"id": id_, **cols}))
    del envelope["source"]["file"], envelope["source"]["pos"], envelope["source"]["row"]
    envelope["source"]["connector"] = "other"
    envelope["source"]["ts_ms"] = 1_767_225_600_000
    return json.dumps(envelope)


@pytest.mark.parametrize("windowed", [False, True])
def test_a_tie_at_one_position_goes_to_the_later_ingest_batch_even_in_one_stage_batch(make_config, query, monkeypatch, windowed) -> None:
    """Three ingest batches, then one stage batch holding all three: two distinct events of one key at one
    position are ordered by their ingest batch (then their place in it), as the fold inside each batch did."""
    if windowed:  # the window that ranks a batch `_seq` cannot encode
        monkeypatch.setattr(stage_queries, "MAX_RANKED_BATCHES", 0)
    cfg = make_config(KEYS)
    job = IngestJob(cfg, stages=[LatestStateStage()])
    job.setup()
    job.process_parsed(parsed([fallback(1, 1, v="first")]), 0, "q", drain=False)
    job.process_parsed(parsed([fallback(1, 1, v="second"), fallback(1, 2, v="a")]), 1, "q", drain=False)
    job.process_parsed(parsed([fallback(1, 2, v="b"), fallback(1, 2, v="c")]), 2, "q", drain=False)
    reports = job.drain_stages(_spark())
    assert [r.change_events for r in reports] == [5], "one stage batch took all three ingest batches"
    assert [(r["id"], r["v"]) for r in state(query, cfg, cols="id, v")] == [(1, "second"), (2, "c")]


def _spark() -> Any:
    from cdc_platform.spark.session import get_spark

    return get_spark()


def test_a_lake_whose_stages_ran_in_the_ingest_batch_starts_its_stage_queries_after_its_raw_log(make_config, query) -> None:
    """An earlier version folded every raw-log version inside the ingest batch and kept no stage checkpoint
    or progress: its stage queries start after the raw log's version, not from its beginning."""
    cfg = make_config(KEYS)
    job = IngestJob(cfg, stages=[LatestStateStage()])
    job.setup()
    job.process_parsed(parsed([ev("c", pos=1, after={"id": 1, "v": "x"})]), 0, "q")
    # What an earlier version leaves: the stored state, no stage checkpoint, no progress table.
    shutil.rmtree(stage_queries.checkpoint_dir(cfg, "latest_state"))
    shutil.rmtree(lake.table_path(cfg.lake, "stage_progress"))
    job = IngestJob(cfg, stages=[LatestStateStage()])
    job.setup()
    assert json.loads((stage_queries.checkpoint_dir(cfg, "latest_state") / "start.json").read_text())["startingVersion"] >= 1
    job.process_parsed(parsed([ev("u", pos=2, after={"id": 1, "v": "y"}), ev("c", pos=3, after={"id": 2, "v": "z"})]), 1, "q")
    progress = lake.open_table(lake.table_path(cfg.lake, "stage_progress")).to_pyarrow_table().to_pylist()
    assert [(r["query"], r["events"]) for r in progress] == [("latest_state", 2)], "only what landed after the upgrade"
    assert [(r["id"], r["v"]) for r in state(query, cfg, cols="id, v")] == [(1, "y"), (2, "z")]
    # A new lake (no raw log yet) gets no start file: its queries read the raw log from its first version.
    fresh = make_config(KEYS)
    shutil.rmtree(fresh.lake)
    IngestJob(fresh, stages=[LatestStateStage()]).setup()
    assert not (stage_queries.checkpoint_dir(fresh, "latest_state") / "start.json").exists()


@pytest.mark.parametrize("compacted", [False, True])
def test_a_new_stage_query_reads_a_young_raw_log_from_its_commits_and_a_compacted_one_from_its_snapshot(make_config, query, monkeypatch, compacted) -> None:
    """A stage query without offsets starts at the raw log's version 0 when every commit since is an append (no
    listing of the snapshot's files), else at the current snapshot (a compaction removed files whose rows the
    commits name); both land every event once."""
    from delta.tables import DeltaTable

    cfg = make_config(KEYS)
    job = IngestJob(cfg, stages=[LatestStateStage()])
    job.setup()
    job.process_parsed(parsed([ev("c", pos=1, after={"id": 1, "v": "x"})]), 0, "q", drain=False)
    job.process_parsed(parsed([ev("u", pos=2, after={"id": 1, "v": "y"}), ev("c", pos=3, after={"id": 2, "v": "z"})]), 1, "q", drain=False)
    raw = lake.table_path(cfg.lake, "raw_change_events")
    if compacted:
        DeltaTable.forPath(_spark(), str(raw)).optimize().executeCompaction()
    assert lake.appends_from_version_zero(raw) is not compacted
    starts: list[int | None] = []
    chosen = stage_queries.StageQuery._starting_version
    monkeypatch.setattr(stage_queries.StageQuery, "_starting_version", lambda self, table: starts.append(chosen(self, table)) or starts[-1])
    reports = job.drain_stages(_spark())
    assert starts == [None if compacted else 0]
    assert sum(r.change_events for r in reports) == 3
    assert [(r["id"], r["v"]) for r in state(query, cfg, cols="id, v")] == [(1, "y"), (2, "z")]


def test_the_views_mark_is_the_newest_ingest_time_the_fold_took(make_config) -> None:
    cfg = make_config(KEYS)
    job = IngestJob(cfg, stages=[LatestStateStage()])
    job.setup()
    assert lake.applied_through(cfg.lake, "latest_state") is None
    job.process_parsed(parsed([ev("c", pos=1, after={"id": 1})]), 0, "q", drain=False)
    job.process_parsed(parsed([ev("c", pos=2, after={"id": 2})]), 1, "q")
    raw = lake.open_table(lake.table_path(cfg.lake, "raw_change_events")).to_pyarrow_table()
    newest = max(raw.column("ingested_at").to_pylist())
    assert lake.applied_through(cfg.lake, "latest_state") == newest
    assert lake.applied_through(cfg.lake, "transactions") is None, "each query's mark is its own"


class Flaky:
    """A stage whose first `fail` batches raise (a defect, a lake error): the others land."""

    name = "flaky"

    def __init__(self, fail: int) -> None:
        self.fail, self.calls, self.events = fail, 0, 0

    def setup(self, config: Any) -> None:
        pass

    def run(self, batch: Any, ctx: BatchContext) -> StageResult:
        self.calls += 1
        if self.calls <= self.fail:
            raise OSError("the lake's disk is full")
        self.events += batch.event_count
        return StageResult(figures={"events": float(batch.event_count)})


def test_in_a_stream_a_failed_stage_query_is_started_again_while_the_ingest_goes_on(make_config, land, spark, monkeypatch) -> None:
    monkeypatch.setattr(queries, "RESTART_PAUSES", (0.5,))
    cfg = make_config(KEYS)
    stage = Flaky(fail=1)
    said: list[str] = []
    job = IngestJob(cfg, stages=[stage], progress=said.append)
    land(None, [ev("c", pos=1, after={"id": 1})])
    stop = threading.Event()
    done: list[Any] = []
    runner = threading.Thread(target=lambda: done.append(job.run_continuously(spark, interval="1 second", stop=stop)))
    runner.start()
    try:
        deadline = time.monotonic() + 180
        while stage.events < 1 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert stage.events == 1, said
        land(None, [ev("c", pos=2, after={"id": 2})])  # the ingest kept going: a later file lands and is taken
        while stage.events < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert stage.events == 2, said
    finally:
        stop.set()
        runner.join(120)
    assert any("the flaky query stopped (" in line and "disk is full" in line and "starting it again" in line for line in said), said
    assert len(done[0].batches) >= 2 and stage.calls >= 3


class _FakeQuery:
    """A stage query with no data waiting, as Spark reports it between triggers."""

    isActive = True
    status = {"isTriggerActive": False, "isDataAvailable": False}


class _IdleStage:
    """A `Watched` stage that records the idle times it is given."""

    name = "transactions"
    failure = None
    last_activity = 0.0

    def __init__(self) -> None:
        self.gate = queries.BatchGate()
        self.idle_calls: list[float] = []

    def start(self, spark: Any, *, available_now: bool, interval: str | None = None) -> _FakeQuery:
        return _FakeQuery()

    def on_idle(self, idle_seconds: float) -> None:
        self.idle_calls.append(idle_seconds)


def test_a_stage_is_idle_only_while_the_ingest_is_quiet_too() -> None:
    """A stage with nothing to read while the ingest still works through a backlog (after a restart) is not
    idle: its transaction timeouts would close transactions whose rest is in that backlog."""
    stage = _IdleStage()
    source: dict[str, float | None] = {"idle": None}
    runner = queries.StageRunner(None, [stage], "1 second", lambda _msg: None, source_idle=lambda: source["idle"])  # type: ignore[arg-type]
    stage.last_activity = time.monotonic() - 100.0
    runner._tend(stage)
    assert stage.idle_calls == [], "the ingest is busy: no idle tick"
    source["idle"] = 3.0
    runner._tend(stage)
    assert stage.idle_calls == [3.0], "idle for as long as the ingest has been quiet, not since the stage's last batch"


def test_a_batch_refused_by_a_stop_is_not_a_failed_stage(make_config) -> None:
    """Stopping a stream refuses the stage batch Spark starts after the stop (it replays on restart): an
    orderly stop, so the stage reports no failure (`cdc stream` would say a stage failed; CI found it)."""
    cfg = make_config(KEYS)
    stage = stage_queries.StageQuery(LatestStateStage(), cfg)
    stage.gate.refuse_after = 1
    with pytest.raises(queries.StopRequested):
        stage.foreach_batch(None, 2)  # type: ignore[arg-type]  # refused before the batch is read
    assert stage.failure is None and stage.reports == []


def test_a_batch_refused_by_a_stop_leaves_no_traceback_in_the_log_and_other_errors_do(make_config, caplog) -> None:
    """Through Spark and py4j for real: py4j logs an exception a `foreachBatch` raises, with its stack, before Spark
    sees it. A refused batch is an orderly stop, not an error: nothing in the log (an operator saw a traceback at
    every such stop). A batch that fails for any other reason still is."""
    import logging

    cfg = make_config(KEYS)
    job = IngestJob(cfg, stages=[LatestStateStage()])
    job.setup()
    job.process_parsed(parsed([ev("c", pos=1, after={"id": 1, "v": "x"})]), 0, "q", drain=False)
    stage = job.stage_queries[0]
    stage.gate.refuse_after = -1  # the stop was asked for before the first batch
    with caplog.at_level(logging.INFO, logger="py4j.clientserver"):
        query = stage.start(_spark(), available_now=True)
        with pytest.raises(Exception, match="StopRequested"):
            query.awaitTermination()
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]
    assert stage.failure is None and stage.reports == []
    # The filter keeps every other exception's record.
    with caplog.at_level(logging.INFO, logger="py4j.clientserver"):
        for raised in (queries.StopRequested("refused"), ValueError("a real failure")):
            try:
                raise raised
            except Exception:
                logging.getLogger("py4j.clientserver").exception("There was an exception while executing the Python Proxy")
    assert [type(r.exc_info[1]).__name__ for r in caplog.records if r.exc_info] == ["ValueError"]
