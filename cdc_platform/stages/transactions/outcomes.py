"""The rows a step writes for what it decided, and the finished records the state keeps.

`late_transaction_events` rows for arrivals after their transaction's fate, `transactions` rows for
the complete, `incomplete_transactions` rows for the expired, and the compact finished records (with
`_retain`, how long they are kept) that let a late arrival be reported with its transaction's fate.
Builders without decisions of their own, apart from the decisions in `judge` and `aggregation`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.lake.schemas import TS
from cdc_platform.stages.transactions.arrow_ops import _arr, _conform, _map_parts, _offsets_from_counts, _parents, _us
from cdc_platform.stages.transactions.schemas import (
    _FINISHED_COLUMNS,
    INCOMPLETE_SCHEMA,
    LATE_SCHEMA,
    MARKERS_STREAM,
    OPEN_TRANSACTIONS_SCHEMA,
    TRANSACTIONS_SCHEMA,
)


def _late_rows(
    items: pa.Table, mk: pa.Table, *, ev_fate: pa.Array, mk_fate: pa.Array, ev_mask: pa.Array, mk_mask: pa.Array,
    batch_id: int | None, now: dt.datetime,
) -> pa.Table:
    ev = items.filter(ev_mask)
    m = mk.filter(mk_mask)
    n_ev, n_mk = ev.num_rows, m.num_rows
    if n_ev + n_mk == 0:
        return LATE_SCHEMA.empty_table()

    def nulls(n: int, t: pa.DataType) -> pa.Array:
        return pa.nulls(n, t)

    ev_part = pa.table(
        {
            "transaction_id": ev.column("transaction_id"),
            "fate": _arr(ev_fate).filter(ev_mask),
            "kind": pa.array(["event"] * n_ev, pa.string()),
            "item_id": ev.column("event_id"),
            "table_id": ev.column("table_id"),
            "op": ev.column("op"),
            "key": ev.column("key"),
            "before": ev.column("before"),
            "after": ev.column("after"),
            "position": ev.column("position"),
            "status": nulls(n_ev, pa.string()),
            "item_ts": ev.column("source_ts"),
        }
    )
    mk_part = pa.table(
        {
            "transaction_id": m.column("transaction_id"),
            "fate": _arr(mk_fate).filter(mk_mask),
            "kind": pa.array(["marker"] * n_mk, pa.string()),
            "item_id": m.column("marker_id"),
            "table_id": nulls(n_mk, pa.string()),
            "op": nulls(n_mk, pa.string()),
            "key": nulls(n_mk, pa.string()),
            "before": nulls(n_mk, pa.string()),
            "after": nulls(n_mk, pa.string()),
            "position": nulls(n_mk, pa.string()),
            "status": m.column("status"),
            "item_ts": m.column("marker_ts"),
        }
    )
    both = pa.concat_tables([_conform(ev_part, LATE_SCHEMA), _conform(mk_part, LATE_SCHEMA)])
    n = both.num_rows
    both = both.set_column(both.schema.get_field_index("batch_id"), "batch_id", pa.array([batch_id] * n, pa.int64()))
    return both.set_column(both.schema.get_field_index("detected_at"), "detected_at", pa.array([now] * n, TS))


def _transactions_rows(rows: pa.Table, batch_id: int | None, now: dt.datetime) -> pa.Table:
    n = rows.num_rows
    out = {
        "transaction_id": rows.column("transaction_id"),
        "source": pc.fill_null(rows.column("source"), ""),
        "begin_ts": rows.column("begin_ts"),
        "end_ts": rows.column("end_ts"),
        "event_count": rows.column("seen_count"),
        "events_per_table": rows.column("seen_per_table"),
        "first_position": rows.column("first_position"),
        "last_position": rows.column("last_position"),
        "marker_shape": rows.column("marker_shape"),
        "events": rows.column("events"),
        "completed_batch": pa.array([batch_id] * n, pa.int64()),
        "completed_at": pa.array([now] * n, TS),
    }
    return _conform(pa.table(out), TRANSACTIONS_SCHEMA)


def _incomplete_rows(
    rows: pa.Table, norm_expected: pa.Array, reasons: list[str], *, expired_by: str, batch_id: int | None, now: dt.datetime
) -> pa.Table:
    n = rows.num_rows
    out = {c: rows.column(c) for c in (
        "transaction_id", "has_begin", "has_end", "begin_ts", "end_ts", "last_event_ts", "expected_count", "seen_count",
        "seen_per_table", "first_position", "last_position", "marker_shape", "events",
    )}
    out["source"] = pc.fill_null(rows.column("source"), "")
    out["reason"] = pa.array(reasons, pa.string())
    out["expected_per_table"] = norm_expected
    out["expired_by"] = pa.array([expired_by] * n, pa.string())
    out["expired_batch"] = pa.array([batch_id] * n, pa.int64())
    out["expired_at"] = pa.array([now] * n, TS)
    return _conform(pa.table(out), INCOMPLETE_SCHEMA)


def _finished_rows(rows: pa.Table, norm_expected: pa.Array, fate: str, batch_id: int | None) -> pa.Table:
    """Compact records of finished transactions: enough to recognise late arrivals and to place the watermark."""
    n = rows.num_rows
    if n == 0:
        return OPEN_TRANSACTIONS_SCHEMA.empty_table()
    s_off, s_keys, _ = _map_parts(rows.column("seen_per_table"))
    e_off, e_keys, _ = _map_parts(norm_expected)
    pairs = pa.table({
        "p": pa.array(np.concatenate([_parents(s_off), _parents(e_off)]), pa.int64()),
        "t": pa.concat_arrays([_arr(s_keys), _arr(e_keys)]),
    })
    pairs = pairs.group_by(["p", "t"], use_threads=False).aggregate([]).sort_by([("p", "ascending"), ("t", "ascending")])
    per_row = np.bincount(pairs.column("p").to_numpy(), minlength=n) if pairs.num_rows else np.zeros(n, np.int64)
    tables = pa.ListArray.from_arrays(_offsets_from_counts(per_row), _arr(pairs.column("t")))
    finished_at = pc.max_element_wise(
        _us(rows.column("begin_ts")), _us(rows.column("end_ts")), _us(rows.column("last_event_ts")), skip_nulls=True
    )
    out: dict[str, Any] = {c: rows.column(c) for c in _FINISHED_COLUMNS}
    out["entry"] = pa.array([fate] * n, pa.string())
    out["event_time"] = pc.cast(finished_at, TS)
    out["tables"] = tables
    out["updated_batch"] = pa.array([batch_id] * n, pa.int64())
    return _conform(pa.table(out), OPEN_TRANSACTIONS_SCHEMA)


def _retain(finished: pa.Table, progress: dict[str, int], retention_us: int) -> pa.Table:
    """Keep a finished record while any stream it touched (and the markers) is within `retention` of it."""
    n = finished.num_rows
    if n == 0:
        return finished
    lists = _arr(finished.column("tables"))
    lists = pc.fill_null(lists, pa.scalar([], pa.list_(pa.string()))) if lists.null_count else lists
    parents = np.concatenate([pc.list_parent_indices(lists).to_numpy(zero_copy_only=False).astype(np.int64), np.arange(n)])
    streams = pa.concat_arrays([_arr(pc.list_flatten(lists)), pa.array([MARKERS_STREAM] * n, pa.string())])
    names = pa.array(list(progress), pa.string())
    clock = pa.array(list(progress.values()), pa.int64()).take(pc.index_in(streams, value_set=names))
    limit = pc.add(_us(finished.column("event_time")), retention_us).take(pa.array(parents, pa.int64()))
    # A stream never seen cannot carry late arrivals we could judge; it does not hold a record back.
    waiting = pc.fill_null(pc.less(clock, limit), False).to_numpy(zero_copy_only=False)
    keep = np.bincount(parents[waiting], minlength=n) > 0
    return finished.filter(pa.array(keep))
