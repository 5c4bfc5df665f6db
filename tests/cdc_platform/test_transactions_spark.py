"""The transaction stage on Spark's executors (`SparkTransactionStage`) lands what the driver stage lands.

Same landing, two lakes: one run with the driver stage (`TransactionStage`, the pure step on the
driver), one with the Spark stage (buckets on the executors); every transaction table must hold the
same rows, order and wall-clock stamps aside. Then what only the Spark stage does: exactly once over a
crash before the state commit, poison set aside on the executors, idle expiry.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdc_platform import lake
from cdc_platform.stages import transactions as T
from cdc_platform.config import PlatformConfig
from cdc_platform.run.ingest import IngestJob
from cdc_platform.stages.stage import STAGE_ERROR, BatchContext, SparkBatch, StageFailure
from cdc_platform.stages.transactions import spark_stage as S
from tests.cdc_platform.test_transactions import COUNTS, begin, end, ev, whole
from tests.cdc_platform.test_transactions_buckets import random_batches

TABLES = {"shop.charges": {"key": ["id"]}, "shop.audits": {"key": ["id"]}, "public.accounts": {"key": ["id"]}}
#: Wall-clock stamps (`now` of each run): the only columns two runs may differ in.
WALL_CLOCK = {"completed_at", "detected_at", "expired_at", "updated_at"}


def on_executors(**options: Any) -> S.SparkTransactionStage:
    """The Spark stage with every batch on the executors: these tests' batches are small enough that it would
    run them on the driver stage (`driver_stage_for`), which is what they compare it with."""
    return S.SparkTransactionStage(small_batch_rows=0, **options)


def table_rows(cfg: PlatformConfig, name: str) -> list[str]:
    data = lake.open_table(lake.table_path(cfg.lake, name)).to_pyarrow_table().to_pylist()
    return sorted(json.dumps({k: v for k, v in r.items() if k not in WALL_CLOCK}, sort_keys=True, default=str) for r in data)


def land_batches(tmp_path: Path, batches: list[list[str]]) -> None:
    landing = tmp_path / "landing"
    for i, lines in enumerate(batches):
        target = landing / f"part-{i:05d}.jsonl"
        target.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.utime(target, (1_700_000_000 + i, 1_700_000_000 + i))  # one file per batch, in this order


def batch_by_batch(cfg: PlatformConfig, stage: Any, batches: list[list[str]]) -> list[Any]:
    """Each batch of lines committed by the ingest, then taken by the stage's query before the next one lands:
    one stage batch per ingest batch, as a `cdc stream` that keeps up sees them (`cdc run` drains its
    stage queries after the whole landing, so their batches are fewer and bigger)."""
    from cdc_platform.parse.envelope import KeySpec, parse_line
    from cdc_platform.parse.parsed_batches import rows_to_batch

    import pyarrow as pa

    job = IngestJob(cfg, stages=[stage])
    job.setup()
    keys = KeySpec(dict(cfg.keys_by_source))
    return [job.process_parsed(pa.Table.from_batches([rows_to_batch([parse_line(line, "f.jsonl", keys) for line in lines])]), i, "q")
            for i, lines in enumerate(batches)]


def test_the_spark_stage_lands_what_the_driver_stage_lands_on_random_batches(
    make_config: Callable[..., PlatformConfig], tmp_path: Path, spark: Any
) -> None:
    """Random arrivals (lost, redelivered, late, out of order), a few batches of several files each.

    The generator's 20 non-empty windows are landed two at a time: 10 batches, each a Spark job per stage
    (the test's cost), that make exactly the decisions the 20 make (the pure step over both: 14 completed,
    40 incomplete of all four reasons, 26 late of both fates) and still carry state across batches.

    Twice on Spark: every batch on the executors, and with the small-batch threshold at the batches' median
    size, so the stream switches between the driver stage and the executors (each taking the state the other
    committed); both lakes must equal the driver stage's."""
    from cdc_platform.stages.stage import PROGRESS

    cfg = make_config(TABLES)
    windows = [lines for lines, idle in random_batches(2) if lines and not idle]
    batches = [sum(windows[i:i + 2], []) for i in range(0, len(windows), 2)]
    sizes = sorted(len(lines) for lines in batches)
    on_spark = dataclasses.replace(cfg, lake=tmp_path / "lake-spark")
    mixed = dataclasses.replace(cfg, lake=tmp_path / "lake-mixed")
    batch_by_batch(cfg, T.TransactionStage(), batches)
    reports = batch_by_batch(on_spark, on_executors(buckets=3), batches)
    batch_by_batch(mixed, S.SparkTransactionStage(buckets=3, small_batch_rows=sizes[len(sizes) // 2]), batches)
    assert len(reports) >= 4
    for name in T.TABLE_SCHEMAS:
        assert table_rows(on_spark, name) == table_rows(cfg, name), name
        assert table_rows(mixed, name) == table_rows(cfg, name), name
    assert table_rows(cfg, T.TRANSACTIONS) and table_rows(cfg, T.INCOMPLETE) and table_rows(cfg, T.LATE), "every output is exercised"
    progress = lake.open_table(lake.table_path(mixed.lake, PROGRESS)).to_pyarrow_table().to_pylist()
    ran = [dict(r["stage_figures"]).get("transactions.driver_batches", 0.0) for r in progress if r["query"] == "transactions"]
    assert 0 < sum(ran) < len(ran), f"both ways were taken: {ran}"
    # A small batch over a state holding more transactions than `small_state_rows` stays on the executors.
    one = SparkBatch(99, spark.range(0), spark.range(0), frozenset(), dt.datetime.now(dt.timezone.utc), event_count=1, marker_count=0)
    ctx = BatchContext(mixed, "q", 99)
    assert isinstance(S.SparkTransactionStage().driver_stage_for(one, ctx), T.TransactionStage)
    assert S.SparkTransactionStage(small_state_rows=0).driver_stage_for(one, ctx) is None
    assert on_executors().driver_stage_for(one, ctx) is None


def test_the_driver_takes_larger_batches_in_local_mode_than_on_a_cluster(
    make_config: Callable[..., PlatformConfig], tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In local mode the executors are the driver's own cores: a batch up to `LOCAL_BATCH_ROWS` folds on the
    driver there, where on a cluster one over `SMALL_BATCH_ROWS` goes to the executors' buckets."""
    cfg = make_config(TABLES)
    IngestJob(cfg, stages=[S.SparkTransactionStage()]).setup(spark)
    ctx = BatchContext(cfg, "q", 0)

    def batch(rows: int) -> SparkBatch:
        return SparkBatch(0, spark.range(0), spark.range(0), frozenset(), dt.datetime.now(dt.timezone.utc), event_count=rows, marker_count=rows)

    assert S.local_mode(), "the suite's session runs in local mode"
    stage = S.SparkTransactionStage()
    assert isinstance(stage.driver_stage_for(batch(S.SMALL_BATCH_ROWS), ctx), T.TransactionStage)
    assert isinstance(stage.driver_stage_for(batch(S.LOCAL_BATCH_ROWS // 2), ctx), T.TransactionStage)
    assert stage.driver_stage_for(batch(S.LOCAL_BATCH_ROWS // 2 + 1), ctx) is None
    monkeypatch.setattr(S, "local_mode", lambda: False)
    assert isinstance(stage.driver_stage_for(batch(S.SMALL_BATCH_ROWS // 2), ctx), T.TransactionStage)
    assert stage.driver_stage_for(batch(S.SMALL_BATCH_ROWS // 2 + 1), ctx) is None
    assert isinstance(S.SparkTransactionStage(small_batch_rows=10_000).driver_stage_for(batch(5_000), ctx), T.TransactionStage)


def test_events_without_a_source_time_still_move_the_watermark(
    make_config: Callable[..., PlatformConfig], tmp_path: Path, spark: Any
) -> None:
    """A batch whose only events carry no `source.ts_ms` moves no clock, and nothing is open: its positions
    are still settled, as the driver stage settles them."""
    untimed = json.loads(ev(None, "charges", 700, 9, row=70))
    del untimed["source"]["ts_ms"]
    cfg = make_config(TABLES)
    land_batches(tmp_path, [[json.dumps(untimed)]])
    on_spark = dataclasses.replace(cfg, lake=tmp_path / "lake-spark")
    IngestJob(cfg, stages=[T.TransactionStage()]).run_available_now(spark)
    IngestJob(on_spark, stages=[on_executors()]).run_available_now(spark)
    assert table_rows(on_spark, T.WATERMARK) == table_rows(cfg, T.WATERMARK)
    assert [json.loads(r)["position"] for r in table_rows(cfg, T.WATERMARK)] == [f"{1:010d}{700:020d}{0:010d}"]


def test_a_batch_without_transactions_skips_the_fold_only_while_none_is_held(
    make_config: Callable[..., PlatformConfig], tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debezium's connectors send no transaction metadata unless asked: such batches carry no transaction, and
    with none held the cogroup would form no group, so the stage runs none. Once a transaction was seen, its
    finished record is held (for lateness) and every batch folds again, in a new process too (what is held
    then comes from the state table). The lake is the driver stage's either way."""
    folded: list[int | None] = []
    real = S._parts

    def parts(spark: Any, fold: Any, *args: Any) -> Any:
        folded.append(fold.batch_id)
        return real(spark, fold, *args)

    monkeypatch.setattr(S, "_parts", parts)
    cfg = make_config(TABLES)
    on_spark = dataclasses.replace(cfg, lake=tmp_path / "lake-spark")
    first = [[ev(None, "charges", 700, 1, row=70), ev(None, "audits", 701, 2, row=71)], whole("tx1", 710, 3)]
    batch_by_batch(cfg, T.TransactionStage(), first)
    batch_by_batch(on_spark, on_executors(), first)
    assert folded == [1], "the plain batch folded nothing; the transaction's batch folded"
    late = [ev(None, "charges", 720, 4, row=72)]
    IngestJob(cfg, stages=[T.TransactionStage()]).process_parsed(parsed(cfg, late), 2, "q")  # a new process
    IngestJob(on_spark, stages=[on_executors()]).process_parsed(parsed(cfg, late), 2, "q")
    assert folded == [1, 2], "tx1's finished record is held: the next plain batch folds"
    for name in T.TABLE_SCHEMAS:
        assert table_rows(on_spark, name) == table_rows(cfg, name), name
    assert ids(on_spark, T.TRANSACTIONS) == ["tx1"] and table_rows(on_spark, T.WATERMARK)


def parsed(cfg: PlatformConfig, lines: list[str]) -> Any:
    from cdc_platform.parse.envelope import KeySpec, parse_line
    from cdc_platform.parse.parsed_batches import rows_to_batch

    import pyarrow as pa

    keys = KeySpec(dict(cfg.keys_by_source))
    return pa.Table.from_batches([rows_to_batch([parse_line(line, "f.jsonl", keys) for line in lines])])


def versions(cfg: PlatformConfig) -> dict[str, int]:
    return {name: lake.open_table(path).version() for name, path in lake.lake_tables(cfg.lake).items()}


def ids(cfg: PlatformConfig, name: str, entry: str | None = None) -> list[str]:
    data = lake.open_table(lake.table_path(cfg.lake, name)).to_pyarrow_table().to_pylist()
    return sorted(r["transaction_id"] for r in data if entry is None or r["entry"] == entry)


def crash_before_the_state_commit(monkeypatch: pytest.MonkeyPatch) -> Callable[..., bool]:
    """Make the state commit raise, like a process killed after the outputs committed; return the real writer."""
    real = S._write

    def crash_on_state(data: Any, path: Path, *args: Any) -> bool:
        if path.name == T.OPEN_TRANSACTIONS:
            raise RuntimeError("killed before the state commit")
        return real(data, path, *args)

    monkeypatch.setattr(S, "_write", crash_on_state)
    return real


def test_a_crash_before_the_state_commit_replays_without_loss_or_repeat(
    make_config: Callable[..., PlatformConfig], land: Callable[..., Path], spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_config(TABLES)
    land(None, [begin("g:1", 1), ev("g:1", "charges", 101, 1), ev("g:1", "audits", 102, 1, order=2), end("g:1", 1, COUNTS), begin("g:2", 1)])
    real = crash_before_the_state_commit(monkeypatch)
    with pytest.raises(StageFailure, match="killed before the state commit"):
        IngestJob(cfg, stages=[on_executors()]).run_available_now(spark)
    assert ids(cfg, T.TRANSACTIONS) == ["g:1"], "the outputs committed"
    monkeypatch.setattr(S, "_write", real)

    restarted = IngestJob(cfg, stages=[on_executors()])  # a new process: nothing cached; Spark replays the batch
    restarted.run_available_now(spark)
    assert ids(cfg, T.TRANSACTIONS) == ["g:1"], "not twice"
    assert ids(cfg, T.OPEN_TRANSACTIONS, T.OPEN) == ["g:2"]
    before = versions(cfg)
    restarted.run_available_now(spark)
    assert versions(cfg) == before, "nothing new: nothing committed"
    land(None, [ev("g:2", "charges", 110, 1, row=2), end("g:2", 1, {"shop.charges": 1})])
    restarted.run_available_now(spark)
    assert ids(cfg, T.TRANSACTIONS) == ["g:1", "g:2"]


def poison_at_201(events: Any, markers: Any) -> None:
    if 201 in [json.loads(a)["pos"] for a in events.column("after").to_pylist() if a]:
        raise KeyError("poison")


def test_an_event_a_bucket_cannot_take_is_a_dead_letter_with_its_line_and_the_rest_lands(
    make_config: Callable[..., PlatformConfig], land: Callable[..., Path], spark: Any, query: Callable[..., Any]
) -> None:
    cfg = make_config(TABLES)
    bad = ev("g:2", "charges", 201, 2, row=2)
    land(None, [begin("g:1", 1), ev("g:1", "charges", 101, 1), ev("g:1", "audits", 102, 1, order=2), end("g:1", 1, COUNTS),
                ev(None, "charges", 150, 1.5, row=3), bad])
    report = IngestJob(cfg, stages=[on_executors(probe=poison_at_201)]).run_available_now(spark)
    (dead,) = query(cfg, "SELECT * FROM dead_letter")
    assert dead["reason_code"] == STAGE_ERROR and dead["stage"] == "transactions" and dead["line"] == bad
    assert "KeyError: 'poison'" in dead["reason"] and dead["table_id"] == "shop.charges" and dead["event_id"]
    assert report.landed().get("dead_letter") == 1
    assert ids(cfg, T.TRANSACTIONS) == ["g:1"], "the rest landed"


@pytest.mark.parametrize("where", ["executors", "driver"])
def test_a_quiet_stream_expires_open_transactions_by_idle_time_and_a_later_end_is_late(
    make_config: Callable[..., PlatformConfig], land: Callable[..., Path], spark: Any, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The same expiry whichever way it runs: on the executors (forced) or, the default in local mode with a state
    inside the driver's bound, by the driver stage (and then no Spark fold at all)."""
    monkeypatch.setattr(S, "IDLE_EVERY_SECONDS", 0.0)
    cfg = make_config(TABLES, transaction_timeout=1)
    land(None, [begin("g:1", 1), ev("g:1", "charges", 101, 1)])
    stage = on_executors() if where == "executors" else S.SparkTransactionStage()
    job = IngestJob(cfg, stages=[stage])
    job.run_available_now(spark)
    ctx = BatchContext(cfg, job.query_id(), 0)
    folds: list[str] = []
    parts = S._parts
    monkeypatch.setattr(S, "_parts", lambda *a, **k: folds.append("executors") or parts(*a, **k))
    driver_idle = stage._driver.on_idle
    monkeypatch.setattr(stage._driver, "on_idle", lambda *a: folds.append("driver") or driver_idle(*a))
    assert stage.on_idle(ctx, 0.5) is None, "not idle for the timeout yet"
    result = stage.on_idle(ctx, 5.0)
    assert folds == [where]
    assert result is not None and result.rows_landed == {T.INCOMPLETE: 1}
    rows = lake.open_table(lake.table_path(cfg.lake, T.INCOMPLETE)).to_pyarrow_table().to_pylist()
    assert [(r["transaction_id"], r["reason"], r["expired_by"]) for r in rows] == [("g:1", T.MISSING_END, T.PROCESSING_TIME)]
    assert stage.on_idle(ctx, 10.0) is None, "nothing open any more"
    land(None, [end("g:1", 1, {"shop.charges": 1})])
    job.run_available_now(spark)
    late = lake.open_table(lake.table_path(cfg.lake, T.LATE)).to_pyarrow_table().to_pylist()
    assert [(r["transaction_id"], r["fate"]) for r in late] == [("g:1", "expired")]


def test_an_interrupted_idle_expiry_is_honoured_after_a_restart(
    make_config: Callable[..., PlatformConfig], land: Callable[..., Path], spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(S, "IDLE_EVERY_SECONDS", 0.0)
    cfg = make_config(TABLES, transaction_timeout=1)
    read, incomplete_reads = S.lake_spark.read, []

    def spy(spark_: Any, path: Any, *args: Any) -> Any:
        incomplete_reads.extend([path] if Path(str(path)).name == T.INCOMPLETE else [])
        return read(spark_, path, *args)

    monkeypatch.setattr(S.lake_spark, "read", spy)
    land(None, [begin("g:1", 1), ev("g:1", "charges", 101, 1)])
    job = IngestJob(cfg, stages=[on_executors()])
    job.run_available_now(spark)
    assert incomplete_reads == [], "nothing was open before the batch: no orphan can exist, and no join looks for one"
    real = crash_before_the_state_commit(monkeypatch)
    with pytest.raises(RuntimeError):
        job.stages[0].on_idle(BatchContext(cfg, job.query_id(), 0), 5.0)  # type: ignore[attr-defined]
    monkeypatch.setattr(S, "_write", real)
    assert ids(cfg, T.OPEN_TRANSACTIONS, T.OPEN) == ["g:1"], "the state still holds it open"

    land(None, [end("g:1", 1, {"shop.charges": 1})])
    IngestJob(cfg, stages=[on_executors()]).run_available_now(spark)  # a new process
    assert len(incomplete_reads) == 1, "with g:1 open, the new process looks for orphans once"
    rows = lake.open_table(lake.table_path(cfg.lake, T.INCOMPLETE)).to_pyarrow_table().to_pylist()
    assert [(r["transaction_id"], r["expired_by"]) for r in rows] == [("g:1", T.PROCESSING_TIME)]
    assert ids(cfg, T.TRANSACTIONS) == [], "expired by idle time: its END arriving later does not complete it"
    assert ids(cfg, T.OPEN_TRANSACTIONS, T.OPEN) == []
