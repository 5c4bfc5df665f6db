"""The consistency watermark: per source, the highest position at or below which every transaction is settled.

`_watermark` computes it each step; `_SourceMark` is what the state carries per source between steps
to do so (read back by `_read_sources`, written by `_source_rows`). Its own module because the
consistent views rest on it, and its blocking rules (an open transaction by its lowest position, a
markers-only one by time) are subtle enough to be read on their own.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.transactions.arrow_ops import _conform, _table_matcher, _ts, _us
from cdc_platform.transactions.schemas import OPEN_TRANSACTIONS_SCHEMA, SOURCE, WATERMARK_SCHEMA


@dataclass
class _SourceMark:
    watermark: str | None = None
    watermark_ts: int | None = None
    settled: str | None = None
    settled_ts: int | None = None


def _read_sources(rows: pa.Table) -> dict[str, _SourceMark]:
    out: dict[str, _SourceMark] = {}
    cols = [rows.column(c).to_pylist() if not c.endswith("_ts") else _us(rows.column(c)).to_pylist()
            for c in ("source", "watermark_position", "watermark_ts", "settled_position", "settled_ts")]
    for source, wm, wm_ts, settled, settled_ts in zip(*cols):
        out[source or ""] = _SourceMark(wm, wm_ts, settled, settled_ts)
    return out


def _watermark(
    sources: dict[str, _SourceMark],
    plain: pa.Table,
    new_finished: pa.Table,
    kept_finished: pa.Table,
    still_open: pa.Table,
    stream_source: dict[str, str],
    batch_id: int | None,
    now: dt.datetime,
) -> tuple[dict[str, _SourceMark], pa.Table]:
    """Per source: the highest settled position below every open transaction.

    Settled means: an event without transaction metadata, or the commit position (last event) of a
    transaction that completed or expired. An open transaction blocks from its lowest position seen; one
    whose events have not arrived at all (markers only) has no position, so it blocks by time: nothing
    at or after its BEGIN/END time counts. Candidates are what this step can see (this batch, finished
    records still held, the previous watermark), so while blocked the watermark may lag the truth,
    never pass it; once nothing blocks it is the highest settled position seen.
    """
    schema = pa.schema([("source", pa.string()), ("position", pa.string()), ("ts", pa.int64())])

    def candidates(rows: pa.Table) -> pa.Table:
        return pa.table({
            "source": pc.fill_null(rows.column("source"), ""),
            "position": rows.column("last_position"),
            "ts": pc.coalesce(_us(rows.column("end_ts")), _us(rows.column("last_event_ts"))),
        }, schema=schema)

    plain = pa.table({"source": plain.column("source"), "position": plain.column("position"), "ts": plain.column("ts")}, schema=schema)
    # `fresh`: settled in this step (raises the settled maximum); `cands`: also what is remembered.
    fresh = pa.concat_tables([plain, candidates(new_finished)])
    fresh = fresh.filter(pc.is_valid(fresh.column("position")))
    cands = pa.concat_tables([fresh, candidates(kept_finished)])
    cands = cands.filter(pc.is_valid(cands.column("position")))

    # Blocks from open transactions.
    lowest: dict[str, tuple[str, str]] = {}
    open_count: dict[str, int] = {}
    ghost_limits: list[tuple[int, str, set[str] | None]] = []
    o_ids = still_open.column("transaction_id").to_pylist()
    o_src = still_open.column("source").to_pylist()
    o_first = still_open.column("first_position").to_pylist()
    o_seen = still_open.column("seen_count").to_pylist()
    o_begin = _us(still_open.column("begin_ts")).to_pylist()
    o_end = _us(still_open.column("end_ts")).to_pylist()
    o_exp = still_open.column("expected_per_table").to_pylist()
    match = _table_matcher(stream_source)
    for tx, src, first, seen, begin, end, exp in zip(o_ids, o_src, o_first, o_seen, o_begin, o_end, o_exp):
        if seen:
            key = src or ""
            open_count[key] = open_count.get(key, 0) + 1
            if first is not None and (key not in lowest or first < lowest[key][0]):
                lowest[key] = (first, tx)
            continue
        when = min((t for t in (begin, end) if t is not None), default=None)
        if when is None:
            continue
        affected = {stream_source[m] for t, _ in (exp or []) if (m := match(t)) in stream_source} or None
        ghost_limits.append((when, tx, affected))

    all_sources = set(sources) | set(pc.unique(cands.column("source")).to_pylist()) | set(lowest)
    new_sources: dict[str, _SourceMark] = {}
    rows: list[dict[str, Any]] = []
    for src in sorted(all_sources):
        old = sources.get(src, _SourceMark())
        # settled maximum
        settled, settled_ts = old.settled, old.settled_ts
        f = fresh.filter(pc.equal(fresh.column("source"), src)) if fresh.num_rows else fresh
        if f.num_rows:
            i = pc.index(f.column("position"), pc.max(f.column("position"))).as_py()
            top, top_ts = f.column("position")[i].as_py(), f.column("ts")[i].as_py()
            if settled is None or top > settled:
                settled, settled_ts = top, top_ts
        c = cands.filter(pc.equal(cands.column("source"), src)) if cands.num_rows else cands
        extra = [(p, t) for p, t in ((old.watermark, old.watermark_ts), (settled, settled_ts)) if p is not None]
        positions = c.column("position").to_pylist() + [p for p, _ in extra]
        times = c.column("ts").to_pylist() + [t for _, t in extra]
        bound = lowest.get(src)
        time_cap = min((w for w, _, aff in ghost_limits if aff is None or src in aff), default=None)
        best: tuple[str, int | None] | None = None
        for p, t in zip(positions, times):
            if bound is not None and p >= bound[0]:
                continue
            if time_cap is not None and (t is None or t >= time_cap):
                continue
            if best is None or p > best[0]:
                best = (p, t)
        blocker = bound[1] if bound is not None else None
        if blocker is None and time_cap is not None:
            blocker = next(tx for w, tx, aff in ghost_limits if w == time_cap and (aff is None or src in aff))
        wm, wm_ts = best if best is not None else (None, None)
        new_sources[src] = _SourceMark(wm, wm_ts, settled, settled_ts)
        rows.append({
            "source": src,
            "position": wm,
            "position_ts": None if wm_ts is None else dt.datetime.fromtimestamp(wm_ts / 1e6, dt.timezone.utc),
            "open_transactions": open_count.get(src, 0),
            "blocking_transaction_id": blocker,
            "batch_id": batch_id,
            "updated_at": now,
        })
    return new_sources, pa.Table.from_pylist(rows, schema=WATERMARK_SCHEMA)


def _source_rows(marks: dict[str, _SourceMark], batch_id: int | None) -> pa.Table:
    names = sorted(marks)
    n = len(names)
    cols = {
        "entry": pa.array([SOURCE] * n, pa.string()),
        "source": pa.array(names, pa.string()),
        "watermark_position": pa.array([marks[s].watermark for s in names], pa.string()),
        "watermark_ts": _ts([marks[s].watermark_ts for s in names]),
        "settled_position": pa.array([marks[s].settled for s in names], pa.string()),
        "settled_ts": _ts([marks[s].settled_ts for s in names]),
        "updated_batch": pa.array([batch_id] * n, pa.int64()),
    }
    return _conform(pa.table(cols), OPEN_TRANSACTIONS_SCHEMA)
