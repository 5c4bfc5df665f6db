"""The stage protocol's poison-pill isolation: one event a stage cannot take is a dead letter, while a
failure that is not about events stops the run with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.stages import latest_state
from cdc_platform.stages import transactions as T
from cdc_platform.config import PlatformConfig
from cdc_platform.parse.envelope import KeySpec, parse_line
from cdc_platform.run.ingest import IngestJob
from cdc_platform.stages.latest_state import apply as latest_state_apply
from cdc_platform.parse.parsed_batches import rows_to_batch, split_parsed
from cdc_platform.stages.stage import STAGE_ERROR, BatchContext, ParsedBatch, StageFailure, StageResult, isolate

T0 = 1_767_225_600_000


def event(id_: int, pos: int, table: str = "orders", **cols: Any) -> str:
    return json.dumps({
        "before": None, "after": {"id": id_, **cols}, "op": "c", "ts_ms": T0 + pos,
        "source": {"connector": "mysql", "name": "shop", "db": "shop", "table": table, "ts_ms": T0 + pos,
                   "snapshot": "false", "file": "mysql-bin.000001", "pos": pos, "row": 0},
    })


def batch_of(lines: list[str], batch_id: int = 0) -> ParsedBatch:
    keys = KeySpec({"shop.orders": ["id"], "shop.items": ["id"]})
    parsed = pa.Table.from_batches([rows_to_batch([parse_line(line, "f.jsonl", keys) for line in lines])])
    return split_parsed(parsed, batch_id)


# --- isolate, on its own ----------------------------------------------------------------------------

def test_bisection_finds_exactly_the_events_that_raise_in_few_probes() -> None:
    batch = batch_of([event(i, pos=i) for i in range(64)])
    bad = {5, 40}

    def probe(part: ParsedBatch) -> None:
        ids = {json.loads(a)["id"] for a in part.events.column("after").to_pylist()}
        if ids & bad:
            raise ValueError("cannot take it")

    found = isolate(probe, batch, stage="s")
    assert sorted(i for _, i in found.failed) == [5, 40]
    assert all(isinstance(e, ValueError) for e in found.failed.values())
    assert found.probes <= 2 * len(bad) * 6 + 1  # ~2k log2(n), far below one probe per event


def test_most_events_failing_one_by_one_is_a_defect_not_bad_data() -> None:
    batch = batch_of([event(i, pos=i) for i in range(8)])

    def probe(part: ParsedBatch) -> None:
        if part.events.num_rows:
            raise ZeroDivisionError("division by zero")

    with pytest.raises(StageFailure, match=r"fails on most events of batch 0 one by one \(ZeroDivisionError"):
        isolate(probe, batch, stage="s")


def test_an_error_of_the_machine_or_the_lake_stops_at_once_without_bisecting() -> None:
    batch = batch_of([event(i, pos=i) for i in range(8)])
    calls = []

    def probe(part: ParsedBatch) -> None:
        calls.append(part.events.num_rows)
        raise PermissionError(13, "Permission denied", "/lake/orders/_delta_log")

    with pytest.raises(StageFailure, match="Permission denied"):
        isolate(probe, batch, stage="s")
    assert calls == [8]


# --- in the job, with the real stages -----------------------------------------------------------------

def poisoned_stage() -> latest_state.LatestStateStage:
    """A latest-state stage that raises on any event whose row carries `poison`, deep inside its prepare
    (an error no rule foresaw, as the decimal one was). The stage's prepare runs on the executors, so the
    failure is injected through the stage (a nested function, which Spark ships by value), not patched
    into this process."""
    real = latest_state_apply.prepare_table

    def prepare(table: Any, current: Any, hcurrent: Any, events: latest_state.Events, lookup: Any) -> Any:
        if any(a and '"poison"' in a for a in events.col("after")):
            raise KeyError("poison")
        return real(table, current, hcurrent, events, lookup)

    return latest_state.LatestStateStage(prepare=prepare)


def test_an_event_a_stage_cannot_take_is_dead_lettered_and_the_rest_lands(make_config, land, spark, query) -> None:
    cfg = make_config({"shop.orders": {"key": ["id"]}, "shop.items": {"key": ["id"]}})
    bad = event(2, pos=20, poison=True)
    land("a.jsonl", [event(1, pos=10), bad, event(3, pos=30)])
    first = IngestJob(cfg, stages=[poisoned_stage()]).run_available_now(spark)
    assert [(r["id"]) for r in query(cfg, "SELECT id FROM orders__full_view ORDER BY id")] == [1, 3]
    assert query(cfg, "SELECT count(*) AS n FROM raw_change_events")[0]["n"] == 3  # the raw log keeps it
    (dead,) = query(cfg, "SELECT * FROM dead_letter")
    assert dead["reason_code"] == STAGE_ERROR and dead["stage"] == "latest_state" and dead["line"] == bad
    assert "KeyError: 'poison'" in dead["reason"] and dead["table_id"] == "shop.orders" and dead["event_id"]
    assert first.total("dead_letters") == 1
    # the stream goes on: a later file, of another table too, lands
    land("b.jsonl", [event(7, pos=40, table="items"), event(4, pos=50)])
    IngestJob(cfg, stages=[poisoned_stage()]).run_available_now(spark)
    assert [r["id"] for r in query(cfg, "SELECT id FROM orders__full_view ORDER BY id")] == [1, 3, 4]
    assert [r["id"] for r in query(cfg, "SELECT id FROM items__full_view")] == [7]
    assert query(cfg, "SELECT count(*) AS n FROM dead_letter")[0]["n"] == 1


@pytest.mark.parametrize("killed_at", ["orders", "dead_letter"])
def test_isolated_dead_letters_land_once_when_a_crash_replays_the_batch(killed_at, make_config, monkeypatch) -> None:
    """Killed before the stage's commit or after it (before the batch's dead letters): the replay lands the
    poison event's dead letter exactly once and the rest of the batch once."""
    cfg = make_config({"shop.orders": {"key": ["id"]}})
    stage = poisoned_stage()
    job = IngestJob(cfg, stages=[stage])
    job.setup()
    lines = [event(1, pos=10), event(2, pos=20, poison=True)]
    keys = KeySpec(dict(cfg.keys_by_source))
    parsed = pa.Table.from_batches([rows_to_batch([parse_line(x, "f", keys) for x in lines])])
    def killing(real: Any) -> Any:
        def write(df: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
            if Path(path).name == killed_at:
                raise KeyboardInterrupt  # SIGKILL stand-in
            return real(df, path, *args, **kwargs)
        return write

    with monkeypatch.context() as patched:
        for name in ("append_once", "append_version"):  # the dead letters' write, the stage's own
            patched.setattr(lake_spark, name, killing(getattr(lake_spark, name)))
        with pytest.raises(KeyboardInterrupt):
            job.process_parsed(parsed, 0, "q")
    job.process_parsed(parsed, 0, "q")
    dead = lake.open_table(job.path("dead_letter")).to_pyarrow_table()
    assert dead.column("reason_code").to_pylist() == [STAGE_ERROR]
    assert lake.open_table(job.path("orders")).to_pyarrow_table().column("id").to_pylist() == [1]


class FailsEverything:
    """A stage with a defect that fails every event."""

    name = "broken"

    def setup(self, config: PlatformConfig) -> None:
        pass

    def prepare(self, batch: ParsedBatch, ctx: BatchContext) -> None:
        if batch.events.num_rows:
            raise AttributeError("'NoneType' object has no attribute 'column'")

    def commit(self, prepared: None, ctx: BatchContext) -> StageResult:
        return StageResult()


def test_a_stage_that_fails_every_event_stops_the_run_with_one_line(tmp_path, make_config, land) -> None:
    """Through the real CLI in its own process: the JVM's stream logs must not add a stack either."""
    cfg = make_config({"shop.orders": {"key": ["id"]}})
    land("a.jsonl", [event(i, pos=i) for i in range(1, 5)])
    driver = tmp_path / "run.py"
    driver.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "import cdc_platform.run.ingest as ingest\n"
        "from test_stage import FailsEverything\n"
        "ingest.default_stages = lambda config: [FailsEverything()]\n"
        "from cdc_platform.cli import main\n"
        f"sys.exit(main(['run', '--config', {str(tmp_path / 'cdc.yaml')!r}]))\n",
        encoding="utf-8",
    )
    done = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, timeout=300)
    errors = [line for line in done.stderr.splitlines() if not line.startswith(("[cdc]", "WARNING: Using incubator"))]
    assert done.returncode == 2, done.stderr
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith("error: the broken stage fails on most events of batch 0 one by one (AttributeError")
    assert lake.open_table(lake.table_path(cfg.lake, "dead_letter")).to_pyarrow_table().num_rows == 0


class LakeGone:
    name = "lakegone"

    def setup(self, config: PlatformConfig) -> None:
        pass

    def prepare(self, batch: ParsedBatch, ctx: BatchContext) -> None:
        return None

    def commit(self, prepared: None, ctx: BatchContext) -> StageResult:
        raise FileNotFoundError(2, "No such file or directory", str(ctx.config.lake / "orders" / "_delta_log"))


def test_a_failing_commit_is_not_about_an_event_and_stops_the_run(make_config, land, spark) -> None:
    cfg = make_config({"shop.orders": {"key": ["id"]}})
    land("a.jsonl", [event(1, pos=1)])
    with pytest.raises(StageFailure, match=r"the lakegone stage could not commit batch 0: FileNotFoundError: .*No such file"):
        IngestJob(cfg, stages=[LakeGone()]).run_available_now(spark)


class PoisonedTransactions(T.TransactionStage):
    """The transaction stage raising on the charge at binlog position 201 (in its prepare, on the driver's
    copy of the batch), and recording what that copy held."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[ParsedBatch] = []

    def prepare(self, batch: ParsedBatch, ctx: BatchContext) -> Any:
        self.seen.append(batch)
        if 201 in [json.loads(a)["pos"] for a in batch.events.column("after").to_pylist() if a]:
            raise KeyError("poison")
        return super().prepare(batch, ctx)


def test_an_event_the_driver_side_stage_cannot_take_is_dead_lettered_with_its_line(make_config, land, spark, query) -> None:
    """The transaction stage's copy of the batch leaves the original line (and plain events' images) on
    the executors; the dead letter still carries the line, taken back by event id."""
    from tests.cdc_platform.test_transactions import COUNTS, begin, end, ev

    cfg = make_config({"shop.charges": {"key": ["id"]}, "shop.audits": {"key": ["id"]}})
    bad = ev("g:2", "charges", 201, 2, row=2)
    land("a.jsonl", [begin("g:1", 1), ev("g:1", "charges", 101, 1), ev("g:1", "audits", 102, 1, order=2), end("g:1", 1, COUNTS),
                     ev(None, "charges", 150, 1.5, row=3), bad])
    stage = PoisonedTransactions()
    report = IngestJob(cfg, stages=[stage]).run_available_now(spark)
    (dead,) = query(cfg, "SELECT * FROM dead_letter")
    assert dead["reason_code"] == STAGE_ERROR and dead["stage"] == "transactions" and dead["line"] == bad
    assert "KeyError: 'poison'" in dead["reason"] and dead["table_id"] == "shop.charges" and dead["event_id"]
    assert report.total("dead_letters") == 1
    assert [r["transaction_id"] for r in query(cfg, "SELECT transaction_id FROM transactions")] == ["g:1"], "the rest landed"
    first = stage.seen[0].events
    assert first.num_rows == 4 and first.column("line").null_count == 4, "the line stayed on the executors"
    plain = first.filter(pc.is_null(first.column("transaction_id")))
    assert plain.num_rows == 1 and plain.column("after").to_pylist() == [None] and plain.column("position").to_pylist()[0]
