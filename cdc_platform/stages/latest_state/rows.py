"""From raw events to typed Arrow rows, in memory, for one table.

Change rows per event (key changes and truncates included, `change_rows`), the last change per key
(`last_per_key`), typing a batch against the stored source columns (`type_rows`: widening, dead
letters for incompatible values) and the Arrow tables of the latest-state and history schemas
(`build_rows`; `schemas.conform` shapes them to a table's stored schema). It reads a stored schema
but writes nothing, so the stage, a rebuild and the type property tests share it without touching Delta.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.parse import envelope
from cdc_platform import lake
from cdc_platform.config import TableConfig
from cdc_platform.parse.json_codec import canonical_json  # the one definition of the `key` text
from cdc_platform.parse.json_codec import quote_value as _show
from cdc_platform.stages.latest_state.connect_types import (
    _INFERRED,
    BadValue,
    FieldType,
    _normalise,
    connect_type,
    infer_type,
    join_types,
    type_name,
)
from cdc_platform.stages.latest_state.layout import DELTA, HISTORY_META, LAYER, META_FIELDS, RESERVED
from cdc_platform.stages.latest_state.type_votes import ColumnVotes, FirstSeen, Newness, TableVotes, Vote, decide_type, decide_types, fits

#: Row images are read with every number exact (orjson where it reads them as the stdlib would, Decimal
#: for a number no float holds), so a decimal column gets the digits the source committed.
_loads = envelope.loads_json


# --- Change rows ------------------------------------------------------------------------------------

@dataclass
class ChangeRow:
    """One row to land: a change to one key (or a truncate marker), not yet typed."""

    event: int  # index of the raw event it came from
    key: str | None  # canonical key JSON; None for a truncate marker
    op: str
    deleted: bool
    image: dict[str, Any] | None  # the after image, or the key columns for a tombstone
    sub: int  # 0 = tombstone of an old key (key change), 1 = the change itself


class Events:
    """The raw events of one table: Arrow columns, turned into Python lists only where a loop needs them."""

    def __init__(self, table: pa.Table) -> None:
        self.table = table
        self._lists: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return self.table.num_rows

    def col(self, name: str) -> list[Any]:
        found = self._lists.get(name)
        if found is None:
            found = self._lists[name] = self.table.column(name).to_pylist()
        return found

    def take(self, name: str, indexes: Sequence[int]) -> pa.Array:
        return pc.take(self.table.column(name), pa.array(indexes, pa.int64())).combine_chunks()


def fill_keys(raw: pa.Table, key_columns: Sequence[str]) -> pa.Table:
    """Raw events with `key` filled where the parser left it empty because the table was not configured
    when they landed (the parser fills it only for configured tables): the same canonical text, from the
    same image (`after`, or `before` of a delete, which holds the record key when there was no before).
    An image without every key column keeps no key, and the event is dead-lettered as `missing_key`."""
    if raw.column("key").null_count == 0:
        return raw
    keys = raw.column("key").to_pylist()
    ops, befores, afters = (raw.column(c).to_pylist() for c in ("op", "before", "after"))
    filled = list(keys)
    for i, key in enumerate(keys):
        if key is not None or ops[i] not in ("c", "u", "d", "r"):
            continue
        text = befores[i] if ops[i] == "d" else afters[i]
        try:
            image = _loads(text) if text is not None else None
        except ValueError:
            continue
        filled[i] = image_key(image, key_columns)
    return raw.set_column(raw.schema.get_field_index("key"), raw.schema.field("key"), pa.array(filled, pa.string()))


def image_key(image: Any, key_columns: Sequence[str]) -> str | None:
    """The `key` text of a row image (read with the parser's exact numbers, `envelope.loads_json`), or None
    when it is no object or lacks a key column: the one rule the stage, `cdc rebuild` and backfills share."""
    if isinstance(image, dict) and all(image.get(k) is not None for k in key_columns):
        return canonical_json({k: image[k] for k in key_columns})
    return None


def moved_from(before: Any, key: str, key_columns: Sequence[str]) -> str | None:
    """The key an update moved its row away from: its `before` image's key when that differs from the event's
    own `key`, else None. The stage tombstones it (`change_rows`); a rebuild also buckets the event by it."""
    old = image_key(before, key_columns)
    return old if old is not None and old != key else None


def change_rows(events: Events, key_columns: Sequence[str]) -> tuple[list[ChangeRow], list[tuple[int, str, str]]]:
    """Turn raw events into change rows; also return (event, reason_code, reason) for unusable ones."""
    ops, keys, befores, afters = events.col("op"), events.col("key"), events.col("before"), events.col("after")
    rows: list[ChangeRow] = []
    bad: list[tuple[int, str, str]] = []
    for i in range(len(events)):
        op = ops[i]
        if op == "m":  # a logical-decoding message: kept in the raw log, never applied (control_records)
            continue
        if op == "t":
            rows.append(ChangeRow(i, None, "t", True, None, 1))
            continue
        key = keys[i]
        if key is None:  # the parser fills `key` for every configured table's c/u/d/r
            bad.append((i, "missing_key", "event has no key although its table is configured; rerun `cdc run` with the config"))
            continue
        if op == "d":
            rows.append(ChangeRow(i, key, "d", True, _loads(key), 1))
            continue
        try:
            after = _loads(afters[i])
        except (TypeError, ValueError):
            bad.append((i, "missing_after", f"op {op!r} without a usable `after` row image"))
            continue
        if op == "u" and befores[i] is not None:
            old = moved_from(_loads(befores[i]), key, key_columns)
            if old is not None:
                rows.append(ChangeRow(i, old, "u", True, _loads(old), 0))
        rows.append(ChangeRow(i, key, op, False, after, 1))
    return rows, bad


def last_per_key(rows: Sequence[ChangeRow], events: Events) -> list[int]:
    """Indexes (into `rows`) of the last change per key, by (position, tx order, key-change step, arrival)."""
    keyed = [i for i, r in enumerate(rows) if r.key is not None]
    if not keyed:
        return []
    source = [rows[i].event for i in keyed]
    table = pa.table(
        {
            "k": pa.array([rows[i].key for i in keyed], pa.string()),
            "p": events.take("position", source),
            "t": events.take("tx_total_order", source),
            "s": pa.array([rows[i].sub for i in keyed], pa.int8()),
            "i": pa.array(keyed, pa.int64()),
        }
    )
    order = pc.sort_indices(
        table, sort_keys=[("k", "ascending"), ("p", "ascending"), ("t", "ascending", "at_start"), ("s", "ascending"), ("i", "ascending")]
    )
    sorted_t = table.take(order)
    k = sorted_t.column("k").combine_chunks()
    n = sorted_t.num_rows
    last = pa.array([True]) if n == 1 else pa.concat_arrays([pc.not_equal(k.slice(0, n - 1), k.slice(1)), pa.array([True])])
    return sorted(sorted_t.column("i").filter(last).to_pylist())


def dead_rows(events: Events, dead: Mapping[int, tuple[str, str]]) -> list[dict[str, Any]]:
    """Dead-letter fields of the events in `dead` (event -> (reason_code, reason)), in event order."""
    if not dead:
        return []
    order = sorted(dead)
    cols = {c: events.take(c, order).to_pylist() for c in ("table_id", "event_id", "line", "source_file")}
    return [
        {"reason_code": dead[e][0], "reason": dead[e][1], **{c: cols[c][i] for c in cols}}
        for i, e in enumerate(order)
    ]


# --- Typing a batch -----------------------------------------------------------------------------------

@dataclass
class TypedRows:
    """Change rows with typed source columns, ready to become Arrow, plus what had to be dead-lettered."""

    columns: dict[str, pa.DataType]  # resolved schema of source columns, in table order
    values: dict[str, list[Any]]  # per column, per row in `rows` (None where absent)
    rows: list[ChangeRow]
    dead: dict[int, tuple[str, str]] = field(default_factory=dict)  # event -> (reason_code, reason)
    widened: dict[str, tuple[pa.DataType, pa.DataType]] = field(default_factory=dict)  # column -> (old, new)
    added: list[str] = field(default_factory=list)


_PLAIN = frozenset({bool, int, float, str})


def _column_types(
    col: str, vals: list[Any], declared: list[dict[str, FieldType] | None] | None, table: TableConfig, dead: dict[int, tuple[str, str]], events_of: list[int]
) -> tuple[dict[pa.DataType, list[int]], dict[pa.DataType, list[int]], list[Any]]:
    """Group the rows of one column by type and convert their values; bad values dead-letter their event.

    Returns (declared groups, inferred groups, values). A declared type is exact; an inferred one only
    says "an integer", "a number", "a string": it may land in a narrower declared column when it fits.
    The common case, no schema wrapper and plain JSON scalars, needs no per-value work beyond `type()`.
    """
    if declared is None:
        kinds = set(map(type, vals))
        kinds.discard(type(None))
        wide = int in kinds and any(type(v) is int and not -(2**63) <= v < 2**63 for v in vals)
        if kinds <= _PLAIN and not wide:  # else typed value by value below (wide integers are decimals)
            if len(kinds) == 1:
                (kind,) = kinds
                return {}, {_INFERRED[kind].dtype: [i for i, v in enumerate(vals) if v is not None]}, vals
            groups: dict[pa.DataType, list[int]] = {}
            for i, v in enumerate(vals):
                if v is not None:
                    groups.setdefault(_INFERRED[type(v)].dtype, []).append(i)
            return {}, groups, vals
    hard: dict[pa.DataType, list[int]] = {}
    soft: dict[pa.DataType, list[int]] = {}
    out: list[Any] = list(vals)
    for i, v in enumerate(vals):
        decl = declared[i] if declared is not None else None
        ftype = decl.get(col.lower()) if decl else None
        groups = hard
        if ftype is None:
            ftype, groups = infer_type(v), soft
            if ftype is None:
                continue
        if v is not None:
            try:
                out[i] = ftype.convert(v)
            except BadValue as exc:
                declares = "declares" if groups is hard else "is inferred as"
                dead.setdefault(events_of[i], (exc.code, f"column `{col}` of {table.source}: {exc}, but the column {declares} {type_name(ftype.dtype)}"))
                continue
        groups.setdefault(ftype.dtype, []).append(i)  # a declared type counts even for a null
    return hard, soft, out


def _fold_case(order: dict[str, None], images: list[dict[str, Any] | None], events_of: list[int], dead: dict[int, tuple[str, str]], table: TableConfig) -> None:
    """Make column identity case-insensitive, as Spark and Delta resolve names.

    A name that differs only in case from a stored (or earlier) column is that column; a row image that
    carries two such names cannot be stored and is dead-lettered. Rewrites `order` and `images` in place.
    """
    canonical: dict[str, str] = {}
    for name in order:
        canonical.setdefault(name.lower(), name)
    renames = {name: canonical[name.lower()] for name in order if canonical[name.lower()] != name}
    if not renames:
        return
    for idx, img in enumerate(images):
        if not img or not any(k in renames for k in img):
            continue
        fixed: dict[str, Any] = {}
        for k, v in img.items():
            name = renames.get(k, k)
            if name in fixed:
                clash = sorted(k2 for k2 in img if k2.lower() == name.lower())
                dead.setdefault(events_of[idx], (
                    "ambiguous_columns",
                    f"the row image of {table.source} has columns {', '.join(f'`{c}`' for c in clash)}, which differ only in case; "
                    "Spark and Delta resolve column names case-insensitively, so they cannot both be columns of "
                    f"{table.name}. Rename one at the source or with a column-renaming SMT, then run `cdc rebuild --table {table.name}`",
                ))
                break
            fixed[name] = v
        images[idx] = fixed
    for name in renames:
        del order[name]


def _declared_of(events: Events, events_of: Sequence[int]) -> list[dict[str, FieldType] | None] | None:
    """Each row's declared types (its event's Connect schema), or None when no event carries one."""
    texts = events.col("row_schema")
    if not any(t is not None for t in texts):
        return None
    cache: dict[str, dict[str, FieldType]] = {}
    return [_declared(texts[e], cache) for e in events_of]


def _drop_reserved(order: dict[str, None], images: list[dict[str, Any] | None], events_of: list[int], dead: dict[int, tuple[str, str]],
                   table: TableConfig) -> None:
    """A source column named like a platform metadata column cannot be stored: its rows are dead-lettered."""
    for col in [c for c in order if c.lower() in RESERVED]:
        for idx, img in enumerate(images):
            if img and col in img:
                dead.setdefault(events_of[idx], (
                    "reserved_column",
                    f"source column `{col}` of {table.source} has the name of a platform metadata column; rename it at "
                    f"the source or with a column-renaming SMT, then run `cdc rebuild --table {table.name}`",
                ))
        del order[col]


def _newness(events: Events, arrival: Sequence[Any] | None) -> Any:
    """Source order of an event by its index: position, then transaction order, then arrival (`arrival[e]`,
    else the index itself: a batch's events are in arrival order). The columns become Python lists only
    when a first event is asked about: a batch whose columns each come in one type never asks."""

    def newness(e: int) -> Newness:
        pos, tx = events.col("position"), events.col("tx_total_order")  # cached by `Events` after the first call
        return (pos[e] or "", tx[e] if tx[e] is not None else -1, arrival[e] if arrival is not None else e)

    return newness


_UNORDERED: Newness = ("", -1, -1)


def _votes(groups: Mapping[pa.DataType, list[int]], newness: Any, events_of: list[int], first: Any, converted: list[Any] | None,
           *, ordered: bool = True) -> dict[pa.DataType, Vote]:
    """The rows of each type as a `Vote`; `converted` given for inferred types (integers keep their range).
    Without `ordered` the newest event is not looked for (a stored type needs it only to rank declared types)."""
    out: dict[pa.DataType, Vote] = {}
    for dtype, idxs in groups.items():
        lo = hi = None
        if converted is not None and dtype == pa.int64():
            lo, hi = min(converted[i] for i in idxs), max(converted[i] for i in idxs)
        out[dtype] = Vote(max(newness(events_of[i]) for i in idxs) if ordered else _UNORDERED, first(idxs[0]), lo, hi)
    return out


def type_votes(rows: list[ChangeRow], events: Events, table: TableConfig, arrival: Sequence[Any] | None = None) -> TableVotes:
    """What the rows' values say about each column's type (`type_votes.decide_types` decides), over the rows
    of one part of a table's history; `arrival[e]` orders event `e` among all the parts' events (any
    comparable value; by default its index).

    Events with a value that is bad by itself (not what its declared type says, two names equal but for
    case, a reserved name) vote for no column: they are dead letters whatever the types turn out to be.
    The row images are taken as `type_rows` takes them: with unavailable-value placeholders taken out."""
    images: list[dict[str, Any] | None] = [r.image for r in rows]
    events_of = [r.event for r in rows]
    declared = _declared_of(events, events_of)
    where = (lambda e: arrival[e]) if arrival is not None else (lambda e: e)
    seen: dict[str, FirstSeen] = {}
    for idx, img in enumerate(images):
        if img:
            for j, col in enumerate(img):
                if col not in seen:
                    seen[col] = (where(events_of[idx]), rows[idx].sub, j)
    order: dict[str, None] = dict.fromkeys(seen)
    dead: dict[int, tuple[str, str]] = {}
    _fold_case(order, images, events_of, dead, table)
    _drop_reserved(order, images, events_of, dead, table)
    groups: dict[str, tuple[dict[pa.DataType, list[int]], dict[pa.DataType, list[int]], list[Any]]] = {}
    for col in order:
        groups[col] = _column_types(col, [img.get(col) if img is not None else None for img in images], declared, table, dead, events_of)
    # A declared type counts for a row whose image lacks the column (`type_rows` meets it there when another
    # image of the batch has the column): voted under no spelling, it counts once some part's image names it.
    for col in sorted({n for d in declared or () if d for n in d} - {c.lower() for c in seen}):
        groups[col] = _column_types(col, [None] * len(images), declared, table, dead, events_of)
    newness = _newness(events, arrival)

    def first(idx: int) -> FirstSeen:
        return (where(events_of[idx]), rows[idx].sub, 0)

    out: TableVotes = {}
    for col, (hard, soft, converted) in groups.items():
        if dead:
            hard, soft = ({t: kept for t, ix in g.items() if (kept := [i for i in ix if events_of[i] not in dead])} for g in (hard, soft))
        spellings = {name: at for name, at in seen.items() if name.lower() == col.lower()}
        out[col.lower()] = ColumnVotes(spellings, _votes(hard, newness, events_of, first, None), _votes(soft, newness, events_of, first, converted))
    return out


def type_rows(
    rows: list[ChangeRow],
    events: Events,
    stored: Mapping[str, pa.DataType],
    table: TableConfig,
    *,
    coerce: bool = False,
    decided: Mapping[str, pa.DataType] | None = None,
) -> TypedRows:
    """Type every change row against the stored source columns, column by column.

    Without `coerce` (the stream) a value whose type cannot widen to the stored one dead-letters its
    event. With `decided` (a rebuild, which decided the types over the whole history: `type_votes`) each
    column has that type, older values are cast to it, and only values that cannot be cast are
    dead-lettered; `coerce` decides them over these rows alone first, the same way.
    """
    if coerce and decided is None:
        decided = decide_types(type_votes(rows, events, table))
    dead: dict[int, tuple[str, str]] = {}
    images = [r.image for r in rows]
    events_of = [r.event for r in rows]
    declared = _declared_of(events, events_of)
    order: dict[str, None] = dict.fromkeys(decided if decided is not None else stored)
    for img in images:
        if img:
            for col in img:
                if col not in order:
                    order[col] = None
    _fold_case(order, images, events_of, dead, table)
    _drop_reserved(order, images, events_of, dead, table)
    newness = _newness(events, None)

    def first(idx: int) -> FirstSeen:
        return (events_of[idx], rows[idx].sub, 0)

    columns: dict[str, pa.DataType] = {}
    values: dict[str, list[Any]] = {}
    widened: dict[str, tuple[pa.DataType, pa.DataType]] = {}
    added: list[str] = []
    for col in order:
        vals = [img.get(col) if img is not None else None for img in images]
        hard, soft, converted = _column_types(col, vals, declared, table, dead, events_of)
        if dead:
            hard = {t: idxs for t, idxs in ((t, [i for i in ix if events_of[i] not in dead]) for t, ix in hard.items()) if idxs}
            soft = {t: idxs for t, idxs in ((t, [i for i in ix if events_of[i] not in dead]) for t, ix in soft.items()) if idxs}
        old = stored.get(col)
        fitting: set[pa.DataType] = set()
        if decided is not None:
            if col not in decided:
                continue  # its values were all null or all in dead-lettered events: it has no type yet
            target = decided[col]
        elif old is None and not hard and not soft:
            continue  # only nulls so far and no declared type: wait for a value to say what it is
        else:
            start = _normalise(old) if old is not None else None
            groups = hard or soft
            if len(hard) + len(soft) == 1 and (start is None or next(iter(groups)) == start):
                target = next(iter(groups))  # the common case: one type, nothing to decide
            else:
                ordered = start is None or len(hard) > 1
                target, fitting = decide_type(start, _votes(hard, newness, events_of, first, None, ordered=ordered),
                                              _votes(soft, newness, events_of, first, converted, ordered=ordered))
        if len(hard) + len(soft) > 1 or ((hard or soft) and next(iter(hard or soft)) != target):
            groups_in = [(dtype, idxs, False) for dtype, idxs in hard.items()] + [(dtype, idxs, True) for dtype, idxs in soft.items()]
            for dtype, idxs, inferred in groups_in:
                fit = dtype in fitting if decided is None else inferred
                if join_types(dtype, target) == target or (fit and fits(dtype, target, (converted[i] for i in idxs))):
                    if pa.types.is_decimal(target) and not pa.types.is_decimal(dtype):
                        for i in idxs:
                            if converted[i] is not None:  # a declared type counts a null too
                                converted[i] = decimal.Decimal(converted[i])
                    continue
                for i in idxs:
                    if decided is not None:
                        try:
                            converted[i] = pa.array([converted[i]], dtype).cast(target).to_pylist()[0]
                            continue
                        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                            reason = (f"column `{col}` of {table.name}: {_sample(converted[i])} ({type_name(dtype)}) cannot be converted to "
                                      f"{type_name(target)}, the type the newest events carry; the event was left out of the rebuilt table")
                    else:
                        reason = (f"column `{col}` of {table.name} is {type_name(target)} but this event carries {type_name(dtype)} "
                                  f"({_sample(converted[i])}); the event was not applied. If the source column changed type, "
                                  f"run `cdc rebuild --table {table.name}` to rebuild the table from the raw log with the newest type")
                    dead.setdefault(events_of[i], ("incompatible_type", reason))
        if old is None:
            added.append(col)
        elif decided is None and target != _normalise(old):
            widened[col] = (_normalise(old), target)
        columns[col] = target
        values[col] = converted
    return TypedRows(columns=columns, values=values, rows=rows, dead=dead, widened=widened, added=added)


def _declared(text: str | None, cache: dict[str, dict[str, FieldType]]) -> dict[str, FieldType]:
    """The types an event's Connect schema declares, by lower-cased field name: a column is one whatever the
    case of its name (`_fold_case`), and its declared type is its own under any of its spellings."""
    if text is None:
        return {}
    found = cache.get(text)
    if found is None:
        try:
            fields = json.loads(text).get("fields") or []
        except (ValueError, AttributeError):
            fields = []
        found = {}
        for f in fields:
            ftype = connect_type(f) if isinstance(f, dict) and "field" in f else None
            if ftype is not None:
                found[str(f["field"]).lower()] = ftype
        cache[text] = found
    return found


def _sample(value: Any) -> str:
    text = _show(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


# --- Building Arrow ---------------------------------------------------------------------------------

def state_schema(columns: Mapping[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(c, t) for c, t in columns.items()] + list(META_FIELDS))


def history_schema(columns: Mapping[str, pa.DataType]) -> pa.Schema:
    return pa.schema([pa.field(c, t) for c, t in columns.items()] + list(HISTORY_META))


def build_rows(typed: TypedRows, events: Events, which: Sequence[int], key_columns: Sequence[str], *, seq: int, history: bool = False) -> pa.Table:
    """Arrow rows (latest-state or history schema) for the change rows at indexes `which`.

    Tombstones keep only their key columns: a deleted row's values are not state.
    """
    rows = [typed.rows[i] for i in which]
    source = [r.event for r in rows]
    n = len(rows)
    deleted = [r.deleted for r in rows]
    any_deleted = any(deleted)
    data: dict[str, pa.Array] = {}
    for col, dtype in typed.columns.items():
        vals = typed.values[col]
        if any_deleted and col not in key_columns:
            data[col] = pa.array([None if typed.rows[i].deleted else vals[i] for i in which], dtype)
        else:
            data[col] = pa.array([vals[i] for i in which], dtype)
    data["_op"] = pa.array([r.op for r in rows], pa.string())
    data["_deleted"] = pa.array(deleted, pa.bool_())
    data["_position"] = events.take("position", source)
    data["_source_ts"] = events.take("source_ts", source)
    data["_transaction_id"] = events.take("transaction_id", source)
    data["_ingested_at"] = events.take("ingested_at", source)
    data["_event_id"] = events.take("event_id", source)
    data["_seq"] = pa.array([seq] * n, pa.int64())
    if history:
        data["_tx_order"] = events.take("tx_total_order", source)
        data["_batch_order"] = pa.array(list(which), pa.int64())
        schema = history_schema(typed.columns)
    else:
        data[LAYER] = pa.array([DELTA] * n, pa.string())
        schema = state_schema(typed.columns)
    return pa.Table.from_arrays([data[f.name].cast(f.type) for f in schema], schema=schema)


def source_columns(schema: pa.Schema, meta: Iterable[pa.Field] = META_FIELDS) -> dict[str, pa.DataType]:
    names = {f.name for f in meta}
    return {f.name: _normalise(f.type) for f in schema if f.name not in names}


def table_schema(path: Path) -> pa.Schema:
    return pa.schema(lake.open_table(path).schema().to_arrow())
