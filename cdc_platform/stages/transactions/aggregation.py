"""The aggregation step, pure: Arrow in, Arrow out, no I/O.

`hold` splits a committed state table into the `Held` parts a step reads; `step` (or `aggregate`, on
a plain state table) merges one micro-batch or idle tick into them: it advances each stream's clock,
sorts arrivals into late, open and new, merges and judges the transactions it touches (`judge`),
builds the rows to write (`outcomes`) and the consistency watermark (`watermark`). Pure and
deterministic for a given (state, batch), which is what lets the stage replay a batch after a crash
and reach the same decisions.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.lake.schemas import TS
from cdc_platform.stages.transactions.arrow_ops import _arr, _conform, _table_matcher, _take, _ts, _us
from cdc_platform.stages.transactions.judge import _WAITS, _due, _expiry_plan, _is_complete, _merge, _normalise
from cdc_platform.stages.transactions.outcomes import _finished_rows, _incomplete_rows, _late_rows, _retain, _transactions_rows
from cdc_platform.stages.transactions.schemas import (
    _ITEM,
    COMPLETED,
    COUNTS,
    EVENT,
    EVENT_TIME,
    EVENTS,
    EXPIRED,
    MARKERS_STREAM,
    OPEN,
    OPEN_TRANSACTIONS_SCHEMA,
    PROCESSING_TIME,
    SOURCE,
    STREAM,
    Settings,
    Step,
)
from cdc_platform.stages.transactions.watermark import _read_sources, _source_rows, _SourceMark, _watermark


def empty_state() -> pa.Table:
    return OPEN_TRANSACTIONS_SCHEMA.empty_table()


def _split_events(events: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(transactional events as flat items, non-transactional (source, position, ts, table_id)).

    The non-transactional ones (snapshot reads, changes outside a transaction) feed the watermark and
    also move their table's stream clock: they are deliveries on that topic like any other.
    """
    if events.num_rows == 0:
        return _ITEM.empty_table(), pa.table(
            {"source": pa.array([], pa.string()), "position": pa.array([], pa.string()), "ts": pa.array([], pa.int64()), "table_id": pa.array([], pa.string())}
        )
    tx = events.column("transaction_id")
    has_tx = pc.is_valid(tx)
    source = pc.fill_null(events.column("source_name"), "")
    plain_mask = pc.invert(has_tx)
    plain = pa.table(
        {
            "source": _arr(source.filter(plain_mask)),
            "position": _arr(events.column("position").filter(plain_mask)),
            "ts": _us(events.column("source_ts").filter(plain_mask)),
            "table_id": _arr(pc.fill_null(events.column("table_id"), "").filter(plain_mask)),
        }
    )
    ev = events.filter(has_tx)
    cols: dict[str, Any] = {"transaction_id": ev.column("transaction_id"), "source": pc.fill_null(ev.column("source_name"), "")}
    for f in EVENT:
        col = ev.column(f.name)
        cols[f.name] = pc.fill_null(col, "") if f.name == "table_id" else col
    return _conform(pa.table(cols), _ITEM), plain


_MARKER_COLUMNS = pa.schema([
    ("marker_id", pa.string()), ("transaction_id", pa.string()), ("status", pa.string()), ("event_count", pa.int64()),
    ("data_collections", COUNTS), ("marker_shape", pa.string()), ("marker_ts", TS),
])


def _conform_markers(markers: pa.Table) -> pa.Table:
    if markers.num_rows == 0:
        return _MARKER_COLUMNS.empty_table()
    m = _conform(markers.select(_MARKER_COLUMNS.names), _MARKER_COLUMNS)
    return m.filter(pc.is_valid(m.column("transaction_id")))


def _explode_open(open_rows: pa.Table) -> pa.Table:
    """The events held in open state rows, as flat items."""
    if open_rows.num_rows == 0:
        return _ITEM.empty_table()
    lists = _arr(open_rows.column("events"))
    lists = pc.fill_null(lists, pa.scalar([], EVENTS)) if lists.null_count else lists
    parents = pc.list_parent_indices(lists)
    flat = pc.list_flatten(lists)
    cols: dict[str, Any] = {
        "transaction_id": _take(open_rows.column("transaction_id"), parents),
        "source": _take(pc.fill_null(open_rows.column("source"), ""), parents),
    }
    for f, child in zip(EVENT, flat.flatten()):  # flatten(), unlike field(), honours a sliced struct's offset
        cols[f.name] = child
    return _conform(pa.table(cols), _ITEM)


def _dedup(items: pa.Table, keys: list[str]) -> pa.Table:
    """First row per key (state rows come first, so what is already held wins)."""
    if items.num_rows == 0:
        return items
    idx = items.select(keys).append_column("__i", pa.array(np.arange(items.num_rows), pa.int64()))
    first = idx.group_by(keys, use_threads=False).aggregate([("__i", "min")]).column("__i_min")
    if len(first) == items.num_rows:
        return items
    first = _arr(first)
    return items.take(first.take(pc.sort_indices(first)))  # the first row of each key, in input order


@dataclass(frozen=True)
class Held:
    """The state split the way a step reads it, kept in memory between batches by the stage.

    Why: re-merging, re-judging and re-scanning every open transaction each batch made a batch cost
    as much as the open state (0.9 s per batch at 51k open transactions for ~1k events). A step now
    re-merges only the transactions its batch touches; the others keep their rows, and their expiry
    is a vectorised check of `waits` (why each would be incomplete and which streams it waits on)
    against the streams' clocks. `waits` depends on a row and on the table streams known
    (`_expiry_plan`), so it is rebuilt for every open row when that set changes. Immutable: a failed
    batch leaves the held state as it was.
    """

    open_rows: pa.Table  # entry == open
    finished: pa.Table  # entry in (completed, expired)
    progress: dict[str, int]
    stream_source: dict[str, str]
    sources: dict[str, _SourceMark]
    waits: pa.Table | None = None  # aligned with open_rows; None: not judged yet
    known: frozenset[str] | None = None  # the table streams `waits` was planned with

    @property
    def has_open(self) -> bool:
        return self.open_rows.num_rows > 0


def hold(state: pa.Table) -> Held:
    """Split a committed state table into the parts a step uses (nothing judged yet)."""
    state = _conform(state, OPEN_TRANSACTIONS_SCHEMA)
    entry = state.column("entry")
    progress, stream_source = _read_streams(state.filter(pc.equal(entry, STREAM)))
    return Held(
        open_rows=state.filter(pc.equal(entry, OPEN)),
        finished=state.filter(pc.is_in(entry, value_set=pa.array([COMPLETED, EXPIRED]))),
        progress=progress,
        stream_source=stream_source,
        sources=_read_sources(state.filter(pc.equal(entry, SOURCE))),
    )


def aggregate(
    state: pa.Table,
    events: pa.Table,
    markers: pa.Table,
    settings: Settings,
    *,
    batch_id: int | None,
    now: dt.datetime,
    idle_us: int = 0,
) -> Step:
    """One step of the aggregation: merge a batch (or an idle tick, `idle_us` > 0) into the state.

    `events` has `raw_change_events` columns, `markers` `transaction_markers` columns; both may be
    empty. Deterministic for a given (state, batch), which the exactly-once replay relies on. This
    form judges every open transaction afresh; `step` on a `Held` from an earlier step gives the same
    result while touching only what the batch touches.
    """
    return step(hold(state), events, markers, settings, batch_id=batch_id, now=now, idle_us=idle_us)[0]


@dataclass(frozen=True)
class Clocks:
    """Every stream's event time before and after a batch, and each table stream's source.

    The one part of a step that is global: every transaction is judged against the same clocks, so a
    step split by transaction (`transactions.buckets`, on the executors) takes them from the driver,
    which builds them from a per-stream aggregate of the batch (`batch_clock`).
    """

    before: dict[str, int]
    after: dict[str, int]
    stream_source: dict[str, str]

    @property
    def known(self) -> frozenset[str]:
        """The table streams (every stream but the markers')."""
        return frozenset(self.after) - {MARKERS_STREAM}


#: One row per stream a batch moved: the newest event time on it (microseconds) and, for a table
#: stream, the smallest source name of its events ('' when absent).
CLOCK = pa.schema([("stream", pa.string()), ("ts", pa.int64()), ("source", pa.string())])


def batch_clock(items: pa.Table, plain: pa.Table, markers: pa.Table) -> pa.Table:
    """What a batch tells the stream clocks (`CLOCK`): small, the same whether computed here or by Spark.

    A table stream moves with what it carried, in or outside a transaction: a topic still delivering
    its snapshot (reads carry no transaction) is alive and behind, not silent, so transactions waiting
    on it wait for it instead of being judged by the fastest stream. Plain events without a timestamp
    say nothing about time and are left out; transactional ones still name their stream's source.
    """
    arrivals = pa.concat_tables([
        pa.table({"table_id": _arr(items.column("table_id")), "ts": _us(items.column("source_ts")), "source": _arr(items.column("source"))}),
        plain.select(["table_id", "ts", "source"]).filter(pc.is_valid(plain.column("ts"))),
    ])
    rows = [CLOCK.empty_table()]
    if arrivals.num_rows:
        per_table = arrivals.group_by("table_id", use_threads=False).aggregate([("ts", "max"), ("source", "min")])
        rows.append(pa.table({"stream": per_table.column("table_id"), "ts": per_table.column("ts_max"),
                              "source": per_table.column("source_min")}, schema=CLOCK))
    if markers.num_rows:
        top = pc.max(_us(markers.column("marker_ts"))).as_py()
        rows.append(pa.table({"stream": [MARKERS_STREAM], "ts": [top], "source": [None]}, schema=CLOCK))
    return pa.concat_tables(rows)


def advance(progress: dict[str, int], stream_source: dict[str, str], clock: pa.Table) -> Clocks:
    """The clocks after a batch: each stream at the newest event time it has carried (never back)."""
    after, sources = dict(progress), dict(stream_source)
    rows = sorted(zip(clock.column("stream").to_pylist(), clock.column("ts").to_pylist(), clock.column("source").to_pylist()),
                  key=lambda r: r[0])  # the same clocks whatever order an aggregate returned them in
    for stream, ts, source in rows:
        if ts is not None:
            after[stream] = max(after.get(stream, ts), ts)
        if stream != MARKERS_STREAM:
            sources.setdefault(stream, source or "")
    return Clocks(before=dict(progress), after=after, stream_source=sources)


@dataclass(frozen=True)
class Settled:
    """What a step decided about the transactions it was given, before the (global) watermark."""

    still_open: pa.Table
    still_waits: pa.Table
    kept_finished: pa.Table
    new_finished: pa.Table
    completed: pa.Table  # `transactions` rows
    incomplete: pa.Table  # `incomplete_transactions` rows
    late: pa.Table  # `late_transaction_events` rows
    merged: int


def step(
    held: Held,
    events: pa.Table,
    markers: pa.Table,
    settings: Settings,
    *,
    batch_id: int | None,
    now: dt.datetime,
    idle_us: int = 0,
) -> tuple[Step, Held]:
    """`aggregate` on a held state: the step's decisions, and the held state after it.

    An open transaction that this batch brings nothing for is not re-merged: merging its own events
    again gives back its row (events are held sorted and deduplicated), so only `updated_batch`
    changes. Whether it is complete depends on its row and on how END's table names match the
    streams, so it stays not complete unless the set of table streams changed; then every open row
    is re-judged, as on the first step after a load.
    """
    items, plain = _split_events(events)
    mk = _conform_markers(markers)
    clocks = advance(held.progress, held.stream_source, batch_clock(items, plain, mk))
    settled = settle(held, items, mk, clocks, settings, batch_id=batch_id, now=now, idle_us=idle_us)

    # The consistency watermark per source.
    new_sources, watermark = _watermark(
        held.sources, plain, settled.new_finished, settled.kept_finished, settled.still_open, clocks.stream_source, batch_id, now
    )
    new_state = pa.concat_tables([
        settled.still_open,
        settled.kept_finished,
        _stream_rows(clocks.after, clocks.stream_source, batch_id),
        _source_rows(new_sources, batch_id),
    ])
    figures = settled_figures(settled) | {"state_rows": float(new_state.num_rows)}
    after = Held(
        open_rows=settled.still_open, finished=settled.kept_finished, progress=clocks.after, stream_source=clocks.stream_source,
        sources=new_sources, waits=settled.still_waits, known=clocks.known,
    )
    return Step(state=new_state, completed=settled.completed, incomplete=settled.incomplete, late=settled.late,
                watermark=watermark, figures=figures), after


def settled_figures(settled: Settled) -> dict[str, float]:
    return {
        "completed": float(settled.completed.num_rows),
        "expired": float(settled.incomplete.num_rows),
        "late": float(settled.late.num_rows),
        "open": float(settled.still_open.num_rows),
        "finished_kept": float(settled.kept_finished.num_rows),
        "merged": float(settled.merged),
    }


def settle(
    held: Held,
    items: pa.Table,
    mk: pa.Table,
    clocks: Clocks,
    settings: Settings,
    *,
    batch_id: int | None,
    now: dt.datetime,
    idle_us: int = 0,
) -> Settled:
    """Merge a batch's transactional items and markers into the open transactions and judge them.

    Per transaction given the clocks: any subset of transactions (all events and markers of each)
    settles the same as it does among all the others, which is what lets the executors run this on
    the transactions of one bucket each.
    """
    open_rows, finished = held.open_rows, held.finished
    progress, prev_progress = clocks.after, clocks.before

    # 1. Sort arrivals: for a finished transaction (late), for an open one, for a new one, or for one
    #    too old to be anything but late (its transaction may have finished and been forgotten).
    finished_ids = _arr(finished.column("transaction_id"))
    open_ids = _arr(open_rows.column("transaction_id"))
    ev_tx, mk_tx = _arr(items.column("transaction_id")), _arr(mk.column("transaction_id"))
    ev_fin = pc.index_in(ev_tx, value_set=finished_ids)
    mk_fin = pc.index_in(mk_tx, value_set=finished_ids)
    ev_open = pc.is_in(ev_tx, value_set=open_ids)
    mk_open = pc.is_in(mk_tx, value_set=open_ids)
    ev_unknown = pc.and_(pc.invert(pc.is_valid(ev_fin)), pc.invert(ev_open))
    mk_unknown = pc.and_(pc.invert(pc.is_valid(mk_fin)), pc.invert(mk_open))
    ev_too_old = _too_old(_arr(items.column("table_id")), _us(items.column("source_ts")), prev_progress, settings.retention_us)
    mk_too_old = _too_old(pa.array([MARKERS_STREAM] * mk.num_rows, pa.string()), _us(mk.column("marker_ts")), prev_progress, settings.retention_us)
    fresh_ids = pc.unique(
        pa.concat_arrays([
            ev_tx.filter(pc.and_(ev_unknown, pc.invert(ev_too_old))),
            mk_tx.filter(pc.and_(mk_unknown, pc.invert(mk_too_old))),
        ])
    )
    ev_new = pc.and_(ev_unknown, pc.is_in(ev_tx, value_set=fresh_ids))
    mk_new = pc.and_(mk_unknown, pc.is_in(mk_tx, value_set=fresh_ids))
    ev_forgotten = pc.and_(ev_unknown, pc.invert(ev_new))
    mk_forgotten = pc.and_(mk_unknown, pc.invert(mk_new))

    fin_fates = _arr(finished.column("entry"))
    late = _late_rows(
        items, mk,
        ev_fate=pc.if_else(ev_forgotten, pa.scalar("unknown"), _take(fin_fates, ev_fin)),
        mk_fate=pc.if_else(mk_forgotten, pa.scalar("unknown"), _take(fin_fates, mk_fin)),
        ev_mask=pc.or_(pc.is_valid(ev_fin), ev_forgotten),
        mk_mask=pc.or_(pc.is_valid(mk_fin), mk_forgotten),
        batch_id=batch_id, now=now,
    )

    # 2. Merge this batch's arrivals into the open transactions they touch, one row per active
    #    transaction; every other open transaction keeps its row (see the docstring).
    known = clocks.known
    n_open = open_rows.num_rows
    if held.waits is not None and held.known == known:
        arrived = pc.unique(pa.concat_arrays([ev_tx.filter(ev_open), mk_tx.filter(mk_open)]))
        touched = _arr(pc.is_in(open_ids, value_set=arrived)) if n_open else pa.array([], pa.bool_())
        kept_waits = held.waits
    else:
        touched = pa.array(np.ones(n_open, dtype=bool))
        kept_waits = _WAITS.empty_table() if n_open == 0 else None
    touched_np = touched.to_numpy(zero_copy_only=False).astype(bool) if n_open else np.zeros(0, dtype=bool)
    touched_rows = open_rows.filter(touched)
    active_items = pa.concat_tables([_explode_open(touched_rows), items.filter(pc.or_(ev_open, ev_new))])
    active_items = _dedup(active_items, ["transaction_id", "event_id"])  # duplicates count once
    active_mk = mk.filter(pc.or_(mk_open, mk_new))
    ids = pc.unique(pa.concat_arrays([_arr(touched_rows.column("transaction_id")), fresh_ids]))
    ids = ids.take(pc.sort_indices(ids))
    match = _table_matcher(known)
    merged, norm_expected = _merge(touched_rows, ids, active_items, active_mk, match, batch_id)

    # 3. Decide: complete, expired, or still open. Only merged rows can complete; any open row can expire.
    table_streams = [s for s in progress if s != MARKERS_STREAM]
    complete = _is_complete(merged, norm_expected)
    complete_np = complete.to_numpy(zero_copy_only=False).astype(bool) if merged.num_rows else np.zeros(0, dtype=bool)
    residual_idx = np.flatnonzero(~complete_np)
    residual = merged.take(pa.array(residual_idx, pa.int64()))
    residual_waits = _expiry_plan(residual, norm_expected.take(pa.array(residual_idx, pa.int64())), table_streams)
    residual_due = _due(residual_waits, progress, settings, idle_us, prev_progress)
    if kept_waits is not None:  # untouched open rows, judged by their plans
        untouched_idx = np.flatnonzero(~touched_np)
        untouched_waits = kept_waits.take(pa.array(untouched_idx, pa.int64()))
        untouched_due = _due(untouched_waits, progress, settings, idle_us, prev_progress)
    else:
        untouched_idx = np.zeros(0, dtype=np.int64)
        untouched_waits = _WAITS.empty_table()
        untouched_due = np.zeros(0, dtype=bool)

    # Expired rows, in transaction id order (as one merge over every open row would give them).
    exp_res = residual_idx[residual_due]
    exp_old = untouched_idx[untouched_due]
    old_expired = _with_batch(open_rows.take(pa.array(exp_old, pa.int64())), batch_id)
    expired_rows = pa.concat_tables([merged.take(pa.array(exp_res, pa.int64())), old_expired])
    expired_norm = pa.concat_arrays([
        _arr(norm_expected.take(pa.array(exp_res, pa.int64()))),
        _arr(_normalise(old_expired.column("expected_per_table"), match)),
    ])
    expired_reasons = pa.concat_arrays([
        _arr(residual_waits.column("reason")).filter(pa.array(residual_due)),
        _arr(untouched_waits.column("reason")).filter(pa.array(untouched_due)),
    ])
    order = pc.sort_indices(expired_rows.column("transaction_id"))
    expired_rows, expired_norm, expired_reasons = expired_rows.take(order), expired_norm.take(order), expired_reasons.take(order)

    # Still open: untouched rows not due, and merged rows neither complete nor due, in id order.
    keep_old = untouched_idx[~untouched_due]
    keep_new = np.flatnonzero(~residual_due)
    both = pa.concat_tables([open_rows.take(pa.array(keep_old, pa.int64())), residual.take(pa.array(keep_new, pa.int64()))])
    both_waits = pa.concat_tables([untouched_waits.filter(pa.array(~untouched_due)), residual_waits.take(pa.array(keep_new, pa.int64()))])
    order = pc.sort_indices(both.column("transaction_id"))
    still_open = _with_batch(both.take(order), batch_id)
    still_waits = both_waits.take(order)

    completed_rows = merged.filter(complete)
    completed_out = _transactions_rows(completed_rows, batch_id, now)
    incomplete_out = _incomplete_rows(
        expired_rows, expired_norm, expired_reasons.to_pylist(),
        expired_by=PROCESSING_TIME if idle_us else EVENT_TIME, batch_id=batch_id, now=now,
    )

    # 4. Finished records: remembered until every stream they touch has moved `retention` past them.
    new_finished = pa.concat_tables([
        _finished_rows(completed_rows, norm_expected.filter(complete), COMPLETED, batch_id),
        _finished_rows(expired_rows, expired_norm, EXPIRED, batch_id),
    ])
    all_finished = pa.concat_tables([finished, new_finished])
    kept_finished = _retain(all_finished, progress, settings.retention_us)

    return Settled(still_open=still_open, still_waits=still_waits, kept_finished=kept_finished, new_finished=new_finished,
                   completed=completed_out, incomplete=incomplete_out, late=late, merged=merged.num_rows)


def mark_expired(state: pa.Table, transaction_ids: Sequence[str]) -> pa.Table:
    """Turn open rows into `expired` finished records (recovery after an interrupted idle expiry)."""
    state = _conform(state, OPEN_TRANSACTIONS_SCHEMA)
    hit = pc.and_(pc.equal(state.column("entry"), OPEN), pc.is_in(state.column("transaction_id"), value_set=pa.array(list(transaction_ids), pa.string())))
    rows = state.filter(hit)
    if rows.num_rows == 0:
        return state
    return pa.concat_tables([state.filter(pc.invert(hit)), _finished_rows(rows, rows.column("expected_per_table"), EXPIRED, None)])


def _with_batch(rows: pa.Table, batch_id: int | None) -> pa.Table:
    """Stamp `updated_batch`: every open row is judged again each step, as before."""
    n = rows.num_rows
    col = pa.nulls(n, pa.int64()) if batch_id is None else pa.array(np.full(n, batch_id, dtype=np.int64))
    return rows.set_column(rows.schema.get_field_index("updated_batch"), "updated_batch", col)


def _read_streams(rows: pa.Table) -> tuple[dict[str, int], dict[str, str]]:
    progress: dict[str, int] = {}
    sources: dict[str, str] = {}
    for name, ts, source in zip(rows.column("stream").to_pylist(), _us(rows.column("event_time")).to_pylist(), rows.column("source").to_pylist()):
        if name is None:
            continue
        if ts is not None:
            progress[name] = ts
        if name != MARKERS_STREAM:
            sources[name] = source or ""
    return progress, sources


def _too_old(streams: pa.Array, ts: pa.Array, prev_progress: dict[str, int], retention_us: int) -> pa.Array:
    """True where an arrival is more than `retention` behind its own stream's event time before this batch."""
    if len(streams) == 0 or not prev_progress:
        return pa.array(np.zeros(len(streams), dtype=bool))
    names = pa.array(list(prev_progress), pa.string())
    limits = pa.array([v - retention_us for v in prev_progress.values()], pa.int64())
    limit = limits.take(pc.index_in(streams, value_set=names))
    return pc.fill_null(pc.less_equal(ts, limit), False)


def _stream_rows(progress: dict[str, int], stream_source: dict[str, str], batch_id: int | None) -> pa.Table:
    names = sorted(set(progress) | set(stream_source))
    n = len(names)
    cols = {
        "entry": pa.array([STREAM] * n, pa.string()),
        "stream": pa.array(names, pa.string()),
        "source": pa.array([stream_source.get(s) for s in names], pa.string()),
        "event_time": _ts([progress.get(s) for s in names]),
        "updated_batch": pa.array([batch_id] * n, pa.int64()),
    }
    return _conform(pa.table(cols), OPEN_TRANSACTIONS_SCHEMA)
