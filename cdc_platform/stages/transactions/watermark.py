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

from cdc_platform.stages.transactions.arrow_ops import _conform, _table_matcher, _ts, _us
from cdc_platform.stages.transactions.schemas import OPEN_TRANSACTIONS_SCHEMA, SOURCE, WATERMARK_SCHEMA


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


#: Where a watermark may be: settled positions, per source, with their event time (microseconds).
#: `fresh`: settled in this step (it raises the settled maximum); the others are remembered records.
CANDIDATES = pa.schema([("source", pa.string()), ("position", pa.string()), ("ts", pa.int64()), ("fresh", pa.bool_())])

Mark = tuple[str, "int | None"]  # (position, event time)


def _better(a: Mark | None, b: Mark | None) -> Mark | None:
    """The higher of two marks; equal positions by the later time (none lowest), so no order decides."""
    if a is None:
        return b
    if b is None:
        return a
    return a if (a[0], a[1] is not None, a[1] or 0) >= (b[0], b[1] is not None, b[1] or 0) else b


@dataclass(frozen=True)
class Blocks:
    """What holds each source's watermark back, from the open transactions.

    Small (a few entries per source) and combinable over any split of the transactions, so the
    executors compute it per bucket and the driver takes the minimum of each entry (`combine`).
    """

    lowest: dict[str, tuple[str, str]]  # source -> (lowest first position of an open transaction, its id)
    open_count: dict[str, int]  # source -> open transactions with events
    ghosts: dict[str, tuple[int, str]]  # source ('*': every source) -> (earliest BEGIN/END time of a markers-only one, its id)

    def cap(self, source: str) -> tuple[int, str] | None:
        """The earliest time at or after which nothing of `source` counts, and the transaction that sets it."""
        found = [g for g in (self.ghosts.get(EVERY_SOURCE), self.ghosts.get(source)) if g is not None]
        return min(found) if found else None

    @staticmethod
    def combine(parts: list[Blocks]) -> Blocks:
        lowest: dict[str, tuple[str, str]] = {}
        counts: dict[str, int] = {}
        ghosts: dict[str, tuple[int, str]] = {}
        for part in parts:
            for src, low in part.lowest.items():
                lowest[src] = min(lowest.get(src, low), low)
            for src, n in part.open_count.items():
                counts[src] = counts.get(src, 0) + n
            for src, g in part.ghosts.items():
                ghosts[src] = min(ghosts.get(src, g), g)
        return Blocks(lowest, counts, ghosts)

    def to_json(self) -> dict[str, Any]:
        return {"lowest": self.lowest, "open_count": self.open_count, "ghosts": self.ghosts}

    @staticmethod
    def from_json(data: dict[str, Any]) -> Blocks:
        return Blocks({k: (v[0], v[1]) for k, v in data["lowest"].items()}, dict(data["open_count"]),
                      {k: (int(v[0]), v[1]) for k, v in data["ghosts"].items()})


#: The `Blocks.ghosts` key of a markers-only transaction whose END names no known stream: it holds every source.
EVERY_SOURCE = "*"


def blocks(still_open: pa.Table, stream_source: dict[str, str]) -> Blocks:
    """An open transaction blocks its source from its lowest position seen; one whose events have not
    arrived at all (markers only) has no position, so it blocks by time the sources its END names
    (every source when it names none we know): nothing at or after its BEGIN/END time counts."""
    lowest: dict[str, tuple[str, str]] = {}
    open_count: dict[str, int] = {}
    ghosts: dict[str, tuple[int, str]] = {}
    match = _table_matcher(stream_source)
    for tx, src, first, seen, begin, end, exp in zip(
        still_open.column("transaction_id").to_pylist(), still_open.column("source").to_pylist(),
        still_open.column("first_position").to_pylist(), still_open.column("seen_count").to_pylist(),
        _us(still_open.column("begin_ts")).to_pylist(), _us(still_open.column("end_ts")).to_pylist(),
        still_open.column("expected_per_table").to_pylist(),
    ):
        if seen:
            key = src or ""
            open_count[key] = open_count.get(key, 0) + 1
            if first is not None:
                lowest[key] = min(lowest.get(key, (first, tx)), (first, tx))
            continue
        when = min((t for t in (begin, end) if t is not None), default=None)
        if when is None:
            continue
        affected = {stream_source[m] for t, _ in (exp or []) if (m := match(t)) in stream_source} or {EVERY_SOURCE}
        for key in affected:
            ghosts[key] = min(ghosts.get(key, (when, tx)), (when, tx))
    return Blocks(lowest, open_count, ghosts)


def candidates(plain: pa.Table, new_finished: pa.Table, kept_finished: pa.Table) -> pa.Table:
    """`CANDIDATES`: this batch's events outside transactions and the commit positions (last event) of
    the transactions that finished in it (fresh), and the finished records still held."""

    def finished(rows: pa.Table, fresh: bool) -> pa.Table:
        return pa.table({
            "source": pc.fill_null(rows.column("source"), ""),
            "position": rows.column("last_position"),
            "ts": pc.coalesce(_us(rows.column("end_ts")), _us(rows.column("last_event_ts"))),
            "fresh": pa.array([fresh] * rows.num_rows, pa.bool_()),
        }, schema=CANDIDATES)

    plain = pa.table({"source": plain.column("source"), "position": plain.column("position"), "ts": plain.column("ts"),
                      "fresh": pa.array([True] * plain.num_rows, pa.bool_())}, schema=CANDIDATES)
    out = pa.concat_tables([plain, finished(new_finished, True), finished(kept_finished, False)])
    return out.filter(pc.is_valid(out.column("position")))


#: Per source: the highest fresh mark (None: nothing fresh), and the highest mark below its blocks.
Tops = dict[str, tuple["Mark | None", "Mark | None"]]


def reduce_candidates(cands: pa.Table, held_back: Blocks) -> Tops:
    """`Tops` of the candidates (in Arrow; `transactions.buckets` has the same in Spark)."""
    out: Tops = {}
    for src, p, t, fresh in zip(*(cands.column(c).to_pylist() for c in CANDIDATES.names)):
        top, best = out.get(src, (None, None))
        if fresh:
            top = _better(top, (p, t))
        if _allowed(p, t, held_back.lowest.get(src), held_back.cap(src)):
            best = _better(best, (p, t))
        out[src] = (top, best)
    return out


def _allowed(position: str, ts: int | None, bound: tuple[str, str] | None, cap: tuple[int, str] | None) -> bool:
    if bound is not None and position >= bound[0]:
        return False
    return cap is None or (ts is not None and ts < cap[0])


def finish_watermark(
    sources: dict[str, _SourceMark], held_back: Blocks, tops: Tops, batch_id: int | None, now: dt.datetime
) -> tuple[dict[str, _SourceMark], pa.Table]:
    """Per source: the settled maximum, then the highest settled position below every block."""
    new_sources: dict[str, _SourceMark] = {}
    rows: list[dict[str, Any]] = []
    for src in sorted(set(sources) | set(tops) | set(held_back.lowest)):
        old = sources.get(src, _SourceMark())
        top, best = tops.get(src, (None, None))
        settled, settled_ts = old.settled, old.settled_ts
        if top is not None and (settled is None or top[0] > settled):
            settled, settled_ts = top
        bound, cap = held_back.lowest.get(src), held_back.cap(src)
        for p, t in ((old.watermark, old.watermark_ts), (settled, settled_ts)):
            if p is not None and _allowed(p, t, bound, cap):
                best = _better(best, (p, t))
        blocker = bound[1] if bound is not None else (cap[1] if cap is not None else None)
        wm, wm_ts = best if best is not None else (None, None)
        new_sources[src] = _SourceMark(wm, wm_ts, settled, settled_ts)
        rows.append({
            "source": src,
            "position": wm,
            "position_ts": None if wm_ts is None else dt.datetime.fromtimestamp(wm_ts / 1e6, dt.timezone.utc),
            "open_transactions": held_back.open_count.get(src, 0),
            "blocking_transaction_id": blocker,
            "batch_id": batch_id,
            "updated_at": now,
        })
    return new_sources, pa.Table.from_pylist(rows, schema=WATERMARK_SCHEMA)


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

    In three parts so that the executors can compute the first two over buckets of transactions:
    what blocks (`blocks`), the candidates' tops under those blocks (`reduce_candidates`), and the
    marks per source (`finish_watermark`).
    """
    held_back = blocks(still_open, stream_source)
    return finish_watermark(sources, held_back, reduce_candidates(candidates(plain, new_finished, kept_finished), held_back), batch_id, now)


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
