"""The aggregation split by transaction (`transactions.buckets`) decides exactly what the whole step decides.

The executors run one bucket of transactions per task against clocks the driver built, and the
watermark is put together from the buckets' parts. These tests run that split in one process
(`fold_locally`) next to `aggregate` over the same batches, for several bucket counts, and compare
every output row (order aside). No Spark: the Spark job is compared with the driver stage in
`test_transactions_spark.py`.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform.stages import transactions as T
from cdc_platform.parse.envelope import parse_line
from cdc_platform.parse.parsed_batches import rows_to_batch, split_parsed
from cdc_platform.stages.stage import StageFailure
from cdc_platform.stages.transactions import buckets as B
from tests.cdc_platform.test_transactions import COUNTS, KEYS, NOW, SETTINGS, begin, end, ev, whole

OUTPUTS = ("completed", "incomplete", "late", "watermark", "state")


def canonical(table: pa.Table) -> list[str]:
    return sorted(json.dumps(r, sort_keys=True, default=str) for r in table.to_pylist())


def parsed(lines: list[str], batch_id: int) -> tuple[pa.Table, pa.Table]:
    if not lines:
        return pa.table({}), pa.table({})
    batch = split_parsed(pa.Table.from_batches([rows_to_batch([parse_line(x, "f.jsonl", KEYS) for x in lines])]), batch_id)
    return batch.events, batch.markers


def random_batches(seed: int) -> list[tuple[list[str], float]]:
    """Transactions over three tables with lost, duplicated, late and out-of-order events and markers,
    events outside transactions, markers-only transactions, a stream that starts late, and idle ticks."""
    rng = random.Random(seed)
    timed: list[tuple[float, str]] = []
    for n in range(60):
        tx, t, pos = f"r:{n}", 7.0 * n, 1000 + 10 * n
        tables = rng.sample(["charges", "audits"] + (["accounts"] if n > 25 else []), k=rng.randint(1, 2))
        counts = {("public." if tb == "accounts" else "shop.") + tb: 1 for tb in tables}
        items = [begin(tx, t)] + [ev(tx, tb, pos + i, t, row=n, order=i + 1) for i, tb in enumerate(tables)] + [end(tx, t, counts)]
        if rng.random() < 0.1:
            items = [x for x in items if '"status"' in x]  # markers only
        for x in items:
            if rng.random() < 0.08:
                continue  # lost
            delay = rng.choice([0, 0, 0, 3, 40, 400])  # on time, a little or a lot late
            timed.append((t + delay, x))
            if rng.random() < 0.08:
                timed.append((t + delay + 1, x))  # redelivered
        if rng.random() < 0.2:
            timed.append((t, ev(None, "charges", pos + 5, t, row=500 + n)))  # outside any transaction
    timed.sort(key=lambda p: p[0])
    batches: list[tuple[list[str], float]] = []
    for start in range(0, 700, 35):
        batches.append(([x for at, x in timed if start <= at < start + 35], 0.0))
        if start in (315, 630):
            batches.append(([], 90.0))
    return batches


def run_both(batches: list[tuple[list[str], float]], buckets: int) -> set[str]:
    state = T.empty_state()
    reasons: set[str] = set()
    for i, (lines, idle) in enumerate(batches):
        events, markers = parsed(lines, i)
        kw: dict[str, Any] = {"batch_id": None if idle else i, "now": NOW, "idle_us": int(idle * 1_000_000)}
        whole_step = T.aggregate(state, events, markers, SETTINGS, **kw)
        split_step = B.fold_locally(state, events, markers, SETTINGS, buckets=buckets, **kw)
        for name in OUTPUTS:
            assert canonical(getattr(split_step, name)) == canonical(getattr(whole_step, name)), (i, name)
        assert split_step.figures == whole_step.figures, i
        state = whole_step.state
        reasons |= {r["reason"] for r in whole_step.incomplete.to_pylist()}
    return reasons


@pytest.mark.parametrize(("seed", "buckets"), [(1, 1), (2, 3), (3, 8)])
def test_the_split_decides_what_the_whole_step_decides(seed: int, buckets: int) -> None:
    reasons = run_both(random_batches(seed), buckets)
    assert reasons >= {T.MISSING_END, T.MISSING_EVENTS}, "the workload exercises expiry"


def test_the_split_holds_on_the_held_state_mix() -> None:
    batches: list[tuple[list[str], float]] = []
    for b in range(10):
        t = 40.0 * b
        lines = whole(f"w:{b}", 1000 + 10 * b, t, row=b)
        lines += [begin(f"m:{b}", t), ev(f"m:{b}", "charges", 2000 + 10 * b, t, row=b)]
        lines += [begin(f"s:{b}", t), ev(f"s:{b}", "charges", 3000 + 10 * b, t, row=b), end(f"s:{b}", t, COUNTS)]
        lines += [begin(f"g:{b}", t + 1)]  # markers only: holds the watermark by time
        if b >= 1:
            lines.append(ev(f"s:{b - 1}", "charges", 3000 + 10 * b + 5, t, row=b, order=3))
        if b == 6:
            lines += [begin("p:1", t), ev("p:1", "accounts", 5000, t), end("p:1", t, {"public.accounts": 1})]
        batches.append((lines, 0.0))
    batches.append(([], 120.0))
    assert run_both(batches, 5) >= {T.MISSING_END, T.MISSING_EVENTS, T.COUNT_MISMATCH}


def test_blocks_combine_to_the_minimum_of_each_entry() -> None:
    a = B.Blocks({"s": ("00005", "t:2")}, {"s": 1}, {"*": (50, "t:9")})
    b = B.Blocks({"s": ("00003", "t:7"), "u": ("00001", "t:1")}, {"s": 2, "u": 1}, {"*": (40, "t:8"), "u": (30, "t:3")})
    both = B.Blocks.combine([a, b])
    assert both.lowest == {"s": ("00003", "t:7"), "u": ("00001", "t:1")}
    assert both.open_count == {"s": 3, "u": 1}
    assert both.cap("s") == (40, "t:8") and both.cap("u") == (30, "t:3")
    assert B.Blocks.from_json(json.loads(json.dumps(both.to_json()))) == both


def state_and_batch() -> tuple[pa.Table, B.FoldContext, pa.Table, pa.Table]:
    events, markers = parsed(whole("g:1", 100, 1) + whole("g:2", 200, 2, row=2), 0)
    held = T.hold(T.empty_state())
    from cdc_platform.stages.transactions.aggregation import _conform_markers, _split_events, advance, batch_clock

    items, plain = _split_events(events)
    clocks = advance(held.progress, held.stream_source, batch_clock(items, plain, _conform_markers(markers)))
    ctx = B.FoldContext(clocks=clocks, settings=SETTINGS, batch_id=0, now=NOW)
    return T.empty_state(), ctx, B._conform(events, B.EVENT_INPUT), \
        B._conform(markers, B.MARKER_INPUT)


def test_an_event_a_bucket_cannot_take_is_set_aside_and_the_rest_settles() -> None:
    state, ctx, events, markers = state_and_batch()
    bad = events.column("event_id")[2].as_py()  # g:2's first event

    def probe(ev_part: pa.Table, mk_part: pa.Table) -> None:
        if bad in ev_part.column("event_id").to_pylist():
            raise KeyError("poison")

    from dataclasses import replace

    result = B.fold_bucket(replace(ctx, probe=probe), state, events, markers)
    assert result.poison == [{"kind": "event", "id": bad, "error": "KeyError: 'poison'"}]
    assert [r["transaction_id"] for r in result.settled.completed.to_pylist()] == ["g:1"], "the rest settled"
    assert [r["transaction_id"] for r in result.settled.still_open.to_pylist()] == ["g:2"], "g:2 waits for its lost event"


def test_a_failure_that_is_not_about_events_is_a_failure_part() -> None:
    state, ctx, events, markers = state_and_batch()

    def probe(ev_part: pa.Table, mk_part: pa.Table) -> None:
        raise OSError("disk gone")

    from dataclasses import replace

    with pytest.raises(StageFailure, match="disk gone"):
        B.fold_bucket(replace(ctx, probe=probe), state, events, markers)
    arrivals = pa.concat_tables([
        events.append_column(B.KIND, pa.array([B.EVENT] * events.num_rows)),
    ])
    parts = B.bucket_parts(replace(ctx, probe=probe), 3, state, arrivals).to_pylist()
    assert [(p["bucket"], p["part"]) for p in parts] == [(3, B.FAILURE)] and "disk gone" in json.loads(parts[0]["info"])["message"]
