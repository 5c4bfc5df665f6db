"""Merging an active transaction's arrivals into one state row, and judging it: complete, or why not and when due.

`_merge` builds one `open` row per transaction a batch touches, `_is_complete` checks it against END,
`_expiry_plan` says why a row is incomplete and which streams it waits on, and `_due` whether it has
waited long enough. Apart from the step because the plan/due split is what keeps held rows cheap: a
row the batch does not touch keeps its plan and only the stream clocks move past it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.lake.schemas import TS
from cdc_platform.stages.transactions.arrow_ops import (
    _arr,
    _conform,
    _grouped_map,
    _map_parts,
    _offsets_from_counts,
    _parents,
    _signature,
    _take,
    _us,
)
from cdc_platform.stages.transactions.schemas import (
    COUNT_MISMATCH,
    COUNTS,
    EVENT,
    EVENTS,
    MARKERS_STREAM,
    MISSING_BEGIN,
    MISSING_END,
    MISSING_EVENTS,
    OPEN,
    OPEN_TRANSACTIONS_SCHEMA,
    Settings,
)


def _event_structs(items: pa.Table) -> pa.StructArray:
    return pa.StructArray.from_arrays([_arr(items.column(f.name)) for f in EVENT], fields=list(EVENT))


def _normalise(expected_map: pa.ChunkedArray | pa.Array, match: Any) -> pa.Array:
    """END's per-table counts with the table names matched to the streams' table ids (`_table_matcher`)."""
    expected_map = _arr(expected_map)
    if len(expected_map) == 0:
        return pa.array([], COUNTS)
    exp_offsets, exp_keys, exp_items = _map_parts(expected_map)
    distinct = pc.unique(exp_keys).to_pylist()
    mapping = pa.array([match(k) for k in distinct], pa.string())
    norm_keys = mapping.take(pc.index_in(exp_keys, value_set=pa.array(distinct, pa.string()))) if len(exp_keys) else exp_keys
    return pa.MapArray.from_arrays(
        pa.array(exp_offsets.astype(np.int32), pa.int32()), norm_keys, exp_items, mask=pc.is_null(expected_map)
    )


def _merge(
    open_rows: pa.Table, ids: pa.Array, active_items: pa.Table, active_mk: pa.Table, match: Any, batch_id: int | None
) -> tuple[pa.Table, pa.Array]:
    """One `open` state row per active transaction id, and its END counts matched to table ids."""
    n = len(ids)
    o = pc.index_in(ids, value_set=_arr(open_rows.column("transaction_id")))
    had_begin = pc.fill_null(_take(open_rows.column("has_begin"), o), False)
    had_end = pc.fill_null(_take(open_rows.column("has_end"), o), False)

    status = active_mk.column("status")
    begins = active_mk.filter(pc.equal(status, "BEGIN"))
    ends = active_mk.filter(pc.equal(status, "END"))
    b = pc.index_in(ids, value_set=_arr(begins.column("transaction_id")))
    e = pc.index_in(ids, value_set=_arr(ends.column("transaction_id")))

    def keep_old(old: str, new_table: pa.Table, new_col: str, idx: pa.Array, had: pa.Array) -> pa.Array:
        return pc.if_else(had, _take(open_rows.column(old), o), _take(new_table.column(new_col), idx))

    has_begin = pc.or_(had_begin, pc.is_valid(b))
    has_end = pc.or_(had_end, pc.is_valid(e))
    begin_ts = keep_old("begin_ts", begins, "marker_ts", b, had_begin)
    end_ts = keep_old("end_ts", ends, "marker_ts", e, had_end)
    expected_count = keep_old("expected_count", ends, "event_count", e, had_end)
    expected_map = keep_old("expected_per_table", ends, "data_collections", e, had_end)
    shape = pc.coalesce(
        keep_old("marker_shape", ends, "marker_shape", e, had_end),
        _take(begins.column("marker_shape"), b),
        _take(open_rows.column("marker_shape"), o),
    )

    # Events: sorted by transaction, then by their order within it.
    items = active_items.sort_by([
        ("transaction_id", "ascending"), ("tx_total_order", "ascending"), ("position", "ascending"), ("event_id", "ascending"),
    ])
    agg = items.group_by("transaction_id", use_threads=False).aggregate([
        ("event_id", "count"), ("position", "min"), ("position", "max"), ("source_ts", "max"), ("source", "min"),
    ])
    a = pc.index_in(ids, value_set=_arr(agg.column("transaction_id")))
    seen_count = pc.fill_null(_take(agg.column("event_id_count"), a), 0)
    counts = seen_count.to_numpy(zero_copy_only=False).astype(np.int64)
    events = pa.ListArray.from_arrays(_offsets_from_counts(counts), _event_structs(items)) if n else pa.array([], EVENTS)
    source = pc.coalesce(_take(agg.column("source_min"), a), _take(open_rows.column("source"), o))

    per_table = items.group_by(["transaction_id", "table_id"], use_threads=False).aggregate([("event_id", "count")])
    per_table = per_table.sort_by([("transaction_id", "ascending"), ("table_id", "ascending")])
    pt_parent = pc.index_in(per_table.column("transaction_id"), value_set=ids).to_numpy(zero_copy_only=False).astype(np.int64)
    seen_map = _grouped_map(pt_parent, per_table.column("table_id"), per_table.column("event_id_count"), n)

    # END counts, with table names matched to the streams' table ids.
    norm_expected = _normalise(expected_map, match) if n else pa.array([], COUNTS)

    cols = {
        "entry": pa.array([OPEN] * n, pa.string()),
        "transaction_id": ids,
        "source": source,
        "stream": pa.nulls(n, pa.string()),
        "has_begin": has_begin,
        "has_end": has_end,
        "begin_ts": begin_ts,
        "end_ts": end_ts,
        "marker_shape": shape,
        "expected_count": expected_count,
        "expected_per_table": expected_map,
        "seen_count": seen_count,
        "seen_per_table": seen_map,
        "first_position": _take(agg.column("position_min"), a),
        "last_position": _take(agg.column("position_max"), a),
        "last_event_ts": _take(agg.column("source_ts_max"), a),
        "event_time": pa.nulls(n, TS),
        "tables": pa.nulls(n, pa.list_(pa.string())),
        "watermark_position": pa.nulls(n, pa.string()),
        "watermark_ts": pa.nulls(n, TS),
        "settled_position": pa.nulls(n, pa.string()),
        "settled_ts": pa.nulls(n, TS),
        "events": events,
        "updated_batch": pa.array([batch_id] * n, pa.int64()),
    }
    merged = _conform(pa.table(cols), OPEN_TRANSACTIONS_SCHEMA)
    # Latest activity, for operators reading the state.
    activity = pc.max_element_wise(_us(merged.column("begin_ts")), _us(merged.column("end_ts")), _us(merged.column("last_event_ts")), skip_nulls=True)
    merged = merged.set_column(merged.schema.get_field_index("event_time"), "event_time", pc.cast(activity, TS))
    return merged, norm_expected


def _is_complete(merged: pa.Table, norm_expected: pa.Array) -> pa.Array:
    """BEGIN and END in, distinct events match END's total and (when given) its per-table counts."""
    n = merged.num_rows
    if n == 0:
        return pa.array([], pa.bool_())
    seen_off, seen_keys, seen_items = _map_parts(merged.column("seen_per_table"))
    seen_sig = _signature(_parents(seen_off), seen_keys, seen_items, n, None)
    exp_off, exp_keys, exp_items = _map_parts(norm_expected)
    exp_sig = _signature(_parents(exp_off), exp_keys, exp_items, n, pc.is_null(norm_expected))
    counts_ok = pc.fill_null(pc.equal(merged.column("seen_count"), merged.column("expected_count")), False)
    tables_ok = pc.or_(pc.is_null(exp_sig), pc.fill_null(pc.equal(exp_sig, seen_sig), False))
    return _arr(pc.and_(pc.and_(merged.column("has_begin"), merged.column("has_end")), pc.and_(counts_ok, tables_ok)))


#: Per open row: why it would be incomplete, the event time it is judged from, and the streams it waits on.
_WAITS = pa.schema([("reason", pa.string()), ("base", pa.int64()), ("waiting", pa.list_(pa.string()))])


def _expiry_plan(rows: pa.Table, norm_expected: pa.Array, table_streams: Sequence[str]) -> pa.Table:
    """Why each not-complete transaction is incomplete and what it waits on (`_WAITS`, aligned with `rows`).

    It waits on specific streams: the tables whose events are short, or the markers when BEGIN or END
    is missing; an over-count waits on nothing (it can never heal). It is judged from END when END is
    in, else from its last event or BEGIN (`base`). Split from `_due` because this part depends only on
    the row and the table streams known, so a held open row keeps its plan while the clocks move.
    """
    if rows.num_rows == 0:
        return _WAITS.empty_table()
    reasons: list[str] = []
    bases: list[int | None] = []
    waits: list[list[str]] = []
    cols = {c: rows.column(c).to_pylist() for c in ("has_begin", "has_end", "expected_count", "seen_count", "seen_per_table")}
    ts = {c: _us(rows.column(c)).to_pylist() for c in ("begin_ts", "end_ts", "last_event_ts")}
    expected = _arr(norm_expected).to_pylist()
    for i in range(rows.num_rows):
        seen = dict(cols["seen_per_table"][i] or [])
        begin, end, last = ts["begin_ts"][i], ts["end_ts"][i], ts["last_event_ts"][i]
        waiting: list[str]
        if not cols["has_end"][i]:
            reason, waiting = MISSING_END, [MARKERS_STREAM]
            base = max((t for t in (begin, last) if t is not None), default=None)
        else:
            base = end if end is not None else max((t for t in (begin, last) if t is not None), default=None)
            total, seen_total = cols["expected_count"][i], cols["seen_count"][i] or 0
            exp = dict(expected[i]) if expected[i] is not None else None
            if exp is not None:
                short = sorted(t for t, k in exp.items() if seen.get(t, 0) < k)
                over = (
                    any(seen.get(t, 0) > k for t, k in exp.items())
                    or any(t not in exp for t in seen)
                    or (total is not None and sum(exp.values()) != total)
                )
            else:
                short = (sorted(seen) or list(table_streams)) if (total is not None and seen_total < total) else []
                over = total is not None and seen_total > total
            if over:
                reason, waiting = COUNT_MISMATCH, []
            elif short:
                reason, waiting = MISSING_EVENTS, short
            else:
                reason, waiting = MISSING_BEGIN, [MARKERS_STREAM]
        reasons.append(reason)
        bases.append(base)
        waits.append(waiting)
    return pa.table({"reason": pa.array(reasons, pa.string()), "base": pa.array(bases, pa.int64()),
                     "waiting": pa.array(waits, pa.list_(pa.string()))}, schema=_WAITS)


def _due(plan: pa.Table, progress: dict[str, int], settings: Settings, idle_us: int,
         before: dict[str, int] | None = None) -> np.ndarray:
    """Whether each planned transaction is due to expire now (vectorised, so held rows cost little).

    Due when a stream it waits on has moved `transaction_timeout` past `base`; an over-count (waits on
    nothing) at once. A stream that has never delivered anything is judged by the fastest stream,
    `retention` past `base`, so it cannot hold a transaction forever; the markers by the fastest stream as
    it stood before this batch (`before`): the stage queries read the raw log and the markers as two
    streams and the ingest commits a batch's events before its markers, so a stage batch can hold events
    whose markers it has not been shown yet (a lake's first batch, or a crash between the two commits);
    judged by those events' own clocks, all of their transactions timed out as missing END (the crash
    trials: 573 of 1,500). Idle time moves every clock to at
    least the fastest stream plus the idle time; without a base only idle time expires it.
    """
    n = plan.num_rows
    if n == 0:
        return np.zeros(0, dtype=bool)
    high = max(progress.values()) if progress else None
    idle_clock = high + idle_us if (idle_us and high is not None) else None
    lists = _arr(plan.column("waiting"))
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    base_arr = _arr(plan.column("base"))
    has_base = base_arr.is_valid().to_numpy(zero_copy_only=False).astype(bool)
    base = pc.fill_null(base_arr, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    parents = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64)
    streams = _arr(pc.list_flatten(lists))
    names = list(progress)
    clocks = [v if idle_clock is None else max(v, idle_clock) for v in progress.values()]
    pos = pc.index_in(streams, value_set=pa.array(names, pa.string())).to_numpy(zero_copy_only=False)
    pos = np.asarray(pos, dtype=float) if len(streams) else np.zeros(0)
    known = ~np.isnan(pos) if len(pos) else np.zeros(0, dtype=bool)
    clock = np.zeros(len(streams), dtype=np.int64)
    if known.any():
        clock[known] = np.asarray(clocks, dtype=np.int64)[pos[known].astype(np.int64)]
    if idle_clock is not None:  # an unknown stream reads the idle clock
        clock[~known] = idle_clock
        known = np.ones(len(streams), dtype=bool)
    pair_base = base[parents]
    pair_due = known & (clock >= pair_base + settings.timeout_us)
    if high is not None:
        unseen_high = np.full(len(streams), high, dtype=np.int64)
        if before is not None and len(streams):
            markers = pc.fill_null(pc.equal(streams, MARKERS_STREAM), False).to_numpy(zero_copy_only=False).astype(bool)
            high_before = max(before.values()) if before else None
            unseen_high[markers] = np.iinfo(np.int64).min if high_before is None else high_before
        pair_due |= ~known & (unseen_high >= pair_base + settings.retention_us)
    pair_due &= has_base[parents]
    due = np.bincount(parents[pair_due], minlength=n) > 0
    due |= lengths == 0
    if idle_clock is not None:
        due |= ~has_base & (lengths > 0)
    return due
