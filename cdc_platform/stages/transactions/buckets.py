"""The aggregation split by transaction: what one executor task does with one bucket of transactions.

Why it splits. Given the stream clocks (`Clocks`, global, built by the driver from a per-stream
aggregate of the batch), a transaction settles from its own state row and its own arrivals only, so
the transactions are hashed into buckets (`hash(transaction_id)`), each bucket's state rows and
arrivals meet in one `applyInArrow` group, and every group runs the same `settle` the driver step
runs. Two things are global and are combined after the groups, both from small per-group parts:

* the consistency watermark: each group reports what blocks each source (`Blocks`: the lowest open
  position, the markers-only transactions' times, the open counts), the driver takes their minimum,
  and the candidates (settled positions, `CANDIDATES`) are reduced under those blocks by Spark;
* the figures: sums.

A group's output rows have one fixed shape (`PARTS`): each row is one part of the group's result,
its rows encoded as an Arrow IPC stream in `payload` (`arrow_parts`), or, for `summary` and
`poison`, a small JSON `info` that the driver collects. The rows themselves stay on the executors
and are decoded there straight into the Delta writes.

Poison: an event or marker `settle` raises on is found by the same bisection the driver-side stages
use (`stage.isolate`), reported as a `poison` part (kind, id, error), and the rest of the group
settles without it. The driver builds the dead letter from the batch (the line never enters the
shuffle). `fold_locally` runs the same groups in one process: the split's reference, and what the
tests compare with `step`.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.lake import schemas
from cdc_platform.lake.arrow_parts import BUCKET_PARTS, part_row, part_rows
from cdc_platform.stages.stage import ParsedBatch, StageFailure, describe_error, prepare_isolated, summed
from cdc_platform.stages.transactions.aggregation import (
    Clocks,
    Held,
    Settled,
    _conform_markers,
    _source_rows,
    _split_events,
    _stream_rows,
    advance,
    batch_clock,
    mark_expired,
    settle,
    settled_figures,
)
from cdc_platform.stages.transactions.arrow_ops import _conform
from cdc_platform.stages.transactions.schemas import (
    COMPLETED,
    EXPIRED,
    INCOMPLETE_SCHEMA,
    LATE_SCHEMA,
    OPEN,
    OPEN_TRANSACTIONS_SCHEMA,
    TRANSACTIONS_SCHEMA,
    Settings,
    Step,
)
from cdc_platform.stages.transactions.watermark import (
    CANDIDATES,
    Blocks,
    _SourceMark,
    blocks,
    candidates,
    finish_watermark,
    reduce_candidates,
)

PARTS = BUCKET_PARTS
STATE, COMPLETED_PART, INCOMPLETE_PART, LATE_PART, CANDIDATES_PART, SUMMARY, POISON, FAILURE = (
    "state", "completed", "incomplete", "late", "candidates", "summary", "poison", "failure")
#: What each encoded part holds.
PART_SCHEMAS = {
    STATE: OPEN_TRANSACTIONS_SCHEMA,
    COMPLETED_PART: TRANSACTIONS_SCHEMA,
    INCOMPLETE_PART: INCOMPLETE_SCHEMA,
    LATE_PART: LATE_SCHEMA,
    CANDIDATES_PART: CANDIDATES,
}

#: The event columns a group reads (of the batch's events in a transaction) and the marker columns.
EVENT_COLUMNS = ("event_id", "transaction_id", "source_name", "table_id", "op", "key", "before", "after", "position",
                 "source_ts", "tx_total_order", "tx_collection_order")
MARKER_COLUMNS = ("marker_id", "transaction_id", "status", "event_count", "data_collections", "marker_shape", "marker_ts")
#: Their shapes (as stored in the raw log and the markers), which a group conforms its input to.
EVENT_INPUT = pa.schema([schemas.RAW_CHANGE_EVENTS.field(n) for n in EVENT_COLUMNS])
MARKER_INPUT = pa.schema([schemas.TRANSACTION_MARKERS.field(n) for n in MARKER_COLUMNS])
#: Which input row of a group is an event and which a marker.
KIND = "_kind"
EVENT, MARKER = "event", "marker"


@dataclass(frozen=True)
class FoldContext:
    """What every group needs, decided by the driver before the job: small, pickled into it."""

    clocks: Clocks
    settings: Settings
    batch_id: int | None
    now: dt.datetime
    idle_us: int = 0
    #: Open transactions an idle expiry already wrote as expired but whose state commit it did not make.
    orphans: frozenset[str] = frozenset()
    stage: str = "transactions"
    #: Test hook: called with each probe's events and markers (raising there poisons them).
    probe: Callable[[pa.Table, pa.Table], None] | None = None


@dataclass
class BucketResult:
    settled: Settled
    blocks: Blocks
    candidates: pa.Table  # without the batch's events outside transactions (the driver adds those)
    poison: list[dict[str, str]] = field(default_factory=list)  # kind, id, error


def held_of(state_rows: pa.Table, ctx: FoldContext) -> Held:
    """A bucket's committed rows (open and finished transactions) as the `Held` a step reads."""
    state = _conform(state_rows, OPEN_TRANSACTIONS_SCHEMA)
    if ctx.orphans and state.num_rows:
        present = set(state.column("transaction_id").to_pylist()) & ctx.orphans
        if present:
            state = mark_expired(state, sorted(present))
    entry = state.column("entry")
    open_rows = state.filter(pc.equal(entry, OPEN))
    open_rows = open_rows.take(pc.sort_indices(open_rows.column("transaction_id")))  # as a whole step holds them
    return Held(open_rows=open_rows, finished=state.filter(pc.is_in(entry, value_set=pa.array([COMPLETED, EXPIRED]))),
                progress=ctx.clocks.before, stream_source=ctx.clocks.stream_source, sources={})


def fold_bucket(ctx: FoldContext, state_rows: pa.Table, events: pa.Table, markers: pa.Table) -> BucketResult:
    """One bucket's step: its transactions settled against the global clocks, poison events set aside.

    `events` are the bucket's change events in a transaction (`EVENT_COLUMNS`), `markers` its
    markers (`MARKER_COLUMNS`). Raises `StageFailure` when the failure is not about one event.
    """
    held = held_of(state_rows, ctx)

    def probe(part: ParsedBatch) -> Settled:
        if ctx.probe is not None:
            ctx.probe(part.events, part.markers)
        items, _ = _split_events(part.events)
        return settle(held, items, _conform_markers(part.markers), ctx.clocks, ctx.settings,
                      batch_id=ctx.batch_id, now=ctx.now, idle_us=ctx.idle_us)

    batch = ParsedBatch(batch_id=ctx.batch_id if ctx.batch_id is not None else -1, events=events, markers=markers,
                        dead_letters=schemas.DEAD_LETTER.empty_table(), tombstones=0, rows_read=events.num_rows + markers.num_rows,
                        in_batch_duplicates=0, ingested_at=ctx.now)
    settled, found = prepare_isolated(probe, batch, stage=ctx.stage)
    poison = [{"kind": kind, "id": (events.column("event_id") if kind == EVENT else markers.column("marker_id"))[i].as_py(),
               "error": describe_error(exc)} for (kind, i), exc in sorted(found.failed.items())]
    empty_plain = pa.table({"source": pa.array([], pa.string()), "position": pa.array([], pa.string()), "ts": pa.array([], pa.int64())})
    return BucketResult(
        settled=settled,
        blocks=blocks(settled.still_open, ctx.clocks.stream_source),
        candidates=candidates(empty_plain, settled.new_finished, settled.kept_finished),
        poison=poison,
    )


# --- on the executors ----------------------------------------------------------------------------------

def bucket_parts(ctx: FoldContext, bucket: int, state_rows: pa.Table, arrivals: pa.Table) -> pa.Table:
    """One group -> its `PARTS` rows (see the module doc). `arrivals` holds events and markers (`KIND`)."""
    try:
        kind = arrivals.column(KIND) if arrivals.num_rows else pa.array([], pa.string())
        events = _conform(arrivals.filter(pc.equal(kind, EVENT)), EVENT_INPUT)
        markers = _conform(arrivals.filter(pc.equal(kind, MARKER)), MARKER_INPUT)
        result = fold_bucket(ctx, state_rows, events, markers)
    except StageFailure as failure:
        return pa.Table.from_pylist([part_row(bucket, FAILURE, info={"message": str(failure)})], schema=PARTS)
    s = result.settled
    summary = {"blocks": result.blocks.to_json(), "figures": settled_figures(s), "state_rows": s.still_open.num_rows + s.kept_finished.num_rows}
    out = [part_row(bucket, SUMMARY, info=summary)]
    out += [part_row(bucket, POISON, info=p) for p in result.poison]
    for part, rows in ((STATE, pa.concat_tables([s.still_open, s.kept_finished])), (COMPLETED_PART, s.completed),
                       (INCOMPLETE_PART, s.incomplete), (LATE_PART, s.late), (CANDIDATES_PART, result.candidates)):
        out += part_rows(bucket, part, rows)
    return pa.Table.from_pylist(out, schema=PARTS)


def group_function(ctx: FoldContext) -> Callable[[tuple[pa.Scalar, ...], pa.Table, pa.Table], pa.Table]:
    """The function a cogrouped `applyInArrow` runs per bucket: (key, state rows, arrivals)."""

    def run(key: tuple[pa.Scalar, ...], state_rows: pa.Table, arrivals: pa.Table) -> pa.Table:
        return bucket_parts(ctx, int(key[0].as_py()), state_rows, arrivals)

    return run


# --- the whole step from the groups' parts ---------------------------------------------------------------

def plain_candidates(plain: pa.Table) -> pa.Table:
    """The batch's events outside transactions as watermark candidates (fresh)."""
    empty = OPEN_TRANSACTIONS_SCHEMA.empty_table()
    return candidates(plain, empty, empty)


def finish(
    sources: dict[str, _SourceMark], clocks: Clocks, held_back: Blocks, tops: Any, batch_id: int | None, now: dt.datetime
) -> tuple[dict[str, _SourceMark], pa.Table, pa.Table]:
    """The global rows of the state (streams, sources) and the watermark, from the combined parts."""
    new_sources, watermark = finish_watermark(sources, held_back, tops, batch_id, now)
    global_rows = pa.concat_tables([_stream_rows(clocks.after, clocks.stream_source, batch_id), _source_rows(new_sources, batch_id)])
    return new_sources, watermark, global_rows


def bucket_of(transaction_id: str, buckets: int) -> int:
    """A transaction's bucket in `fold_locally` (Spark's job hashes with its own function: any split will do)."""
    return zlib.crc32(transaction_id.encode("utf-8")) % buckets


def fold_locally(
    state: pa.Table, events: pa.Table, markers: pa.Table, settings: Settings, *, batch_id: int | None, now: dt.datetime,
    idle_us: int = 0, buckets: int = 4,
) -> Step:
    """`aggregate` computed the executors' way, in one process: clocks first, then each bucket, then the
    watermark from the buckets' parts. Gives the same `Step` as `aggregate` (rows in another order)."""
    from cdc_platform.stages.transactions.aggregation import hold

    held = hold(state)
    items, plain = _split_events(events)
    mk = _conform_markers(markers)
    clocks = advance(held.progress, held.stream_source, batch_clock(items, plain, mk))
    ctx = FoldContext(clocks=clocks, settings=settings, batch_id=batch_id, now=now, idle_us=idle_us)
    state_rows = pa.concat_tables([held.open_rows, held.finished])
    tx_events = events.filter(pc.is_valid(events.column("transaction_id"))) if events.num_rows else events
    mk_rows = mk

    def split(table: pa.Table) -> list[pa.Table]:
        ids = table.column("transaction_id").to_pylist() if table.num_rows else []
        which = pa.array([bucket_of(i, buckets) for i in ids], pa.int64())
        return [table.filter(pc.equal(which, b)) if table.num_rows else table for b in range(buckets)]

    results = [
        fold_bucket(ctx, s, _conform(e, EVENT_INPUT), _conform(m, MARKER_INPUT))
        for s, e, m in zip(split(state_rows), split(tx_events), split(mk_rows))
    ]
    held_back = Blocks.combine([r.blocks for r in results])
    cands = pa.concat_tables([plain_candidates(plain)] + [r.candidates for r in results])
    _, watermark, global_rows = finish(held.sources, clocks, held_back, reduce_candidates(cands, held_back), batch_id, now)
    parts = [r.settled for r in results]
    new_state = pa.concat_tables([p.still_open for p in parts] + [p.kept_finished for p in parts] + [global_rows])
    figures: dict[str, float] = summed(settled_figures(p) for p in parts)
    figures["state_rows"] = float(new_state.num_rows)
    return Step(
        state=new_state,
        completed=pa.concat_tables([p.completed for p in parts]),
        incomplete=pa.concat_tables([p.incomplete for p in parts]),
        late=pa.concat_tables([p.late for p in parts]),
        watermark=watermark,
        figures=figures,
    )
