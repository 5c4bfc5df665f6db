"""Which type a column gets, decided from small summaries of its values: the rule `type_rows` applies to
one batch, in a form that merges across partitions.

Why summaries. A rebuild decides every column's type over the table's whole history (the newest type
wins, `cdc rebuild`), and that history is spread over Spark's executors, never held in one process. The
decision needs, for each type a column's values come in, only: whether the type was declared (a Connect
schema) or inferred from JSON, the newest event carrying it (source order: position, transaction order,
arrival), where the column was first seen (the table's column order) and, for inferred integers, the
smallest and largest value (whether they fit a narrower declared column). Those merge by max/min, so each
executor summarises its part (`rows.type_votes`) and the driver merges and decides (`decide_types`).
The stream's typing of a batch (`rows.type_rows`) decides with the same function (`decide_type`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from cdc_platform.stages.latest_state.connect_types import join_types

#: Source order of an event: (position or "", transaction order or -1, arrival). Arrival is the event's
#: index within a batch, or a rebuild's tuple of first-arrival columns (`rebuild_parts.arrival_keys`).
Newness = tuple[str, int, Any]
#: Where a name was first seen: (arrival of its event, key-change step, place in the row image).
FirstSeen = tuple[Any, int, int]

_INT_RANGES = {pa.int8(): 2**7, pa.int16(): 2**15, pa.int32(): 2**31, pa.int64(): 2**63}


def fits(inferred: pa.DataType, target: pa.DataType, values: Iterable[Any]) -> bool:
    """Whether values whose type was only inferred from JSON can be stored as `target` exactly.

    Each condition is a range check, so the smallest and the largest value answer for all (`Vote.bounds`)."""
    if inferred == pa.int64():
        if target in _INT_RANGES:
            bound = _INT_RANGES[target]
            return all(-bound <= v < bound for v in values)
        if target == pa.float32():
            return all(abs(v) <= 2**24 for v in values)
        if pa.types.is_decimal(target):
            return all(len(str(abs(v))) <= target.precision - target.scale for v in values)
    return inferred == pa.float64() and target == pa.float32()


@dataclass(frozen=True)
class Vote:
    """The values of one column that came in one type."""

    newest: Newness  # the newest event carrying the type
    first: FirstSeen  # the first row carrying it (the order the types were met in)
    lo: Any = None  # inferred integers: the smallest value
    hi: Any = None  # ... and the largest

    def bounds(self) -> tuple[Any, ...]:
        return () if self.lo is None else (self.lo, self.hi)

    def merge(self, other: Vote) -> Vote:
        lo = other.lo if self.lo is None else self.lo if other.lo is None else min(self.lo, other.lo)
        hi = other.hi if self.hi is None else self.hi if other.hi is None else max(self.hi, other.hi)
        return Vote(max(self.newest, other.newest), min(self.first, other.first), lo, hi)


@dataclass
class ColumnVotes:
    """One column (names equal but for case are one column, as Spark resolves them)."""

    spellings: dict[str, FirstSeen] = field(default_factory=dict)  # each spelling met, where first
    hard: dict[pa.DataType, Vote] = field(default_factory=dict)  # declared types
    soft: dict[pa.DataType, Vote] = field(default_factory=dict)  # inferred types

    def merge(self, other: ColumnVotes) -> ColumnVotes:
        def joined(a: Mapping[Any, Any], b: Mapping[Any, Any], pick: Any) -> dict[Any, Any]:
            out = dict(a)
            for k, v in b.items():
                out[k] = v if k not in out else pick(out[k], v)
            return out

        return ColumnVotes(joined(self.spellings, other.spellings, min), joined(self.hard, other.hard, Vote.merge),
                           joined(self.soft, other.soft, Vote.merge))


#: A table's columns by lower-cased name.
TableVotes = dict[str, ColumnVotes]


def merge_votes(parts: Iterable[TableVotes]) -> TableVotes:
    out: TableVotes = {}
    for part in parts:
        for name, votes in part.items():
            out[name] = votes if name not in out else out[name].merge(votes)
    return out


def _in_order(votes: Mapping[pa.DataType, Vote]) -> dict[pa.DataType, Vote]:
    """Types in the order their first values came (the order a batch meets them in)."""
    return dict(sorted(votes.items(), key=lambda kv: kv[1].first))


def decide_type(start: pa.DataType | None, hard: Mapping[pa.DataType, Vote], soft: Mapping[pa.DataType, Vote]) -> tuple[pa.DataType, set[pa.DataType]]:
    """A column's type: `start` (the stored type) or else the newest declared type, else the newest
    inferred one; widened with every compatible declared type, newest first, and with the inferred types
    that do not fit it. Returns it with the inferred types that fit it as they are (`fits`).
    `hard` and `soft` are in the order their types were met (a batch's order, `_in_order`)."""
    groups = hard or soft
    if start is not None:
        target = start
    else:
        target = max(groups, key=lambda t: groups[t].newest)
    fitting: set[pa.DataType] = set()
    if len(hard) + len(soft) > 1 or (groups and next(iter(groups)) != target):
        for dtype in sorted(hard, key=lambda t: hard[t].newest, reverse=True):
            joined = join_types(target, dtype)
            if joined is not None:
                target = joined
        for dtype, vote in soft.items():
            if dtype == target:
                continue
            if fits(dtype, target, vote.bounds()):
                fitting.add(dtype)
                continue
            joined = join_types(target, dtype)
            if joined is not None:
                target = joined
    return target, fitting


def decide_types(votes: TableVotes) -> dict[str, pa.DataType]:
    """Every column's type over all the votes, in the order the columns were first seen, each under the
    spelling first seen; a column that only ever held nulls (and declared no type) gets none yet."""
    found: list[tuple[FirstSeen, str, pa.DataType]] = []
    for column in votes.values():
        if not column.spellings or (not column.hard and not column.soft):
            continue  # only declared, in no row image; or only nulls
        name = min(column.spellings, key=lambda s: (column.spellings[s], s))
        target, _ = decide_type(None, _in_order(column.hard), _in_order(column.soft))
        found.append((column.spellings[name], name, target))
    return {name: dtype for _, name, dtype in sorted(found, key=lambda f: (f[0], f[1]))}
