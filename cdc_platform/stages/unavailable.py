"""Debezium's unavailable-value placeholder (PostgreSQL TOAST): the lake keeps the previous value.

Why. PostgreSQL stores large values (text, bytea, json/jsonb, arrays, hstore, ...) out of line ("TOAST").
An UPDATE that leaves such a column unchanged does not write it to the WAL again, so logical decoding
cannot send it and Debezium puts a placeholder in the `after` image instead. Stored as is, the lake
would replace a real value with that text. The column did not change, so its value is the previous
one: within a batch from the key's earlier change, otherwise from the stored latest state.

The placeholder's shapes, from Debezium 3.5's `UnchangedToastedPlaceholder` (configured text P,
default `__debezium_unavailable_value`, and B its UTF-8 bytes), as the JSON converter writes them:
P (text, json, jsonb, xml, enums), base64(B) (bytea), `[P]` (text arrays), `[base64(B)]` (bytea arrays),
the bytes of B as a list of numbers (int and bigint arrays), `{P: P}` (hstore as a map) or its JSON text
(hstore as json), and the name-based UUID of B (uuid). Only updates carry them.

Resolution order for a placeholder in an update's `after` image:
1. the same event's `before` image, when it holds a real value (REPLICA IDENTITY FULL sends the old
   row whole);
2. the key's previous change in the same batch (in source order: position, transaction order, arrival);
3. the key's row in the stored latest state (base and delta layers folded, truncates applied).
A value found nowhere (the row never reached the lake, or its last state is a delete) is stored as
NULL and counted in the batch's figures as `latest_state.unavailable_unresolved`, never as the
placeholder: backfill the row or set REPLICA IDENTITY FULL on the table.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform import lake
from cdc_platform.stages import ordering
from cdc_platform.parse.json_codec import canonical_json
from cdc_platform.parse.envelope import loads_json as _loads

#: Debezium's default `unavailable.value.placeholder`.
PLACEHOLDER = "__debezium_unavailable_value"


def _uuid_from_bytes(data: bytes) -> str:
    """Java's `UUID.nameUUIDFromBytes`: an MD5 name-based (version 3) UUID of the bytes alone."""
    digest = bytearray(hashlib.md5(data).digest())  # noqa: S324 - Java's algorithm, not a security use
    digest[6] = (digest[6] & 0x0F) | 0x30
    digest[8] = (digest[8] & 0x3F) | 0x80
    return str(uuid.UUID(bytes=bytes(digest)))


def placeholder_forms(text: str = PLACEHOLDER) -> tuple[frozenset[str], frozenset[str]]:
    """(scalar texts, canonical JSON of the list/map shapes) that mean "unavailable" for placeholder `text`."""
    raw = text.encode("utf-8")
    b64 = base64.b64encode(raw).decode("ascii")
    scalars = frozenset({text, b64, _uuid_from_bytes(raw), canonical_json({text: text})})
    shaped = frozenset({canonical_json([text]), canonical_json([b64]), canonical_json(list(raw)), canonical_json({text: text})})
    return scalars, shaped


@dataclass(frozen=True)
class Placeholder:
    """Recognises the placeholder's shapes for one configured placeholder text."""

    text: str = PLACEHOLDER
    _scalars: frozenset[str] = field(init=False, repr=False)
    _shaped: frozenset[str] = field(init=False, repr=False)
    _first_int: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        scalars, shaped = placeholder_forms(self.text)
        object.__setattr__(self, "_scalars", scalars)
        object.__setattr__(self, "_shaped", shaped)
        object.__setattr__(self, "_first_int", self.text.encode("utf-8")[0])

    def matches(self, value: Any) -> bool:
        """Whether a JSON value of a row image is the placeholder (cheap for ordinary values)."""
        if isinstance(value, str):
            return value in self._scalars
        if isinstance(value, list):
            if len(value) == 1 or (value and value[0] == self._first_int):
                return canonical_json(value) in self._shaped
            return False
        if isinstance(value, dict) and len(value) == 1:
            return canonical_json(value) in self._shaped
        return False


DEFAULT = Placeholder()
_UNREAD = object()


@dataclass
class Marks:
    """Where a batch's update images held the placeholder: (row index, column) pairs, set to None for typing."""

    cells: dict[int, list[str]] = field(default_factory=dict)
    from_before: int = 0  # placeholders replaced from the event's own before image

    def __bool__(self) -> bool:
        return bool(self.cells)


def take_placeholders(
    ops: Sequence[str], images: Sequence[dict[str, Any] | None], before_of: Callable[[int], Any],
    placeholder: Placeholder = DEFAULT,
) -> Marks:
    """Replace placeholders in update images: from the event's `before` image where it holds the real
    value, else with None, remembered in the returned marks for `fill` (after typing). Mutates `images`.

    None, not the placeholder, goes to typing because the placeholder is not a value of the column's type
    (a base64 text in an int-array column, a string in a numeric one) and would dead-letter the event.
    """
    marks = Marks()
    for i, (op, img) in enumerate(zip(ops, images)):
        if op != "u" or not img:
            continue
        before: Any = _UNREAD
        for col, value in img.items():
            if value is None or not placeholder.matches(value):
                continue
            if before is _UNREAD:
                before = before_of(i)  # parsed only for an image that holds a placeholder
            old = before.get(col) if isinstance(before, dict) else None
            if old is not None and not placeholder.matches(old):
                img[col] = old
                marks.from_before += 1
            else:
                img[col] = None
                marks.cells.setdefault(i, []).append(col)
    return marks


#: Reads the stored values of `columns` for the given typed keys: {key tuple: {column: value}}; a key
#: that is absent, deleted or truncated is left out.
StoredLookup = Callable[[list[tuple[Any, ...]], list[str]], dict[tuple[Any, ...], dict[str, Any]]]


def fill(
    marks: Marks,
    values: dict[str, list[Any]],
    row_keys: Sequence[str | None],
    deleted: Sequence[bool],
    order: Sequence[tuple[Any, ...]],
    key_columns: Sequence[str],
    lookup: StoredLookup | None,
    skip: Callable[[int], bool] = lambda _i: False,
) -> tuple[int, int]:
    """Fill each marked cell of the typed `values` with its key's previous value; returns (filled, unresolved).

    `order[i]` sorts row i in source order. Each key's rows are walked in that order carrying every
    marked column's last real value; a delete forgets them (a later update of a re-inserted row follows
    its insert, which carries every value). Keys whose first marked cell has nothing before it in the
    batch start from the stored state, read through `lookup` once for the whole batch. `skip(i)` marks
    rows that were dead-lettered: they neither give nor take values.
    """
    cells = {i: [c for c in cols if c in values] for i, cols in marks.cells.items() if row_keys[i] is not None and not skip(i)}
    cells = {i: cols for i, cols in cells.items() if cols}
    if not cells:
        return 0, 0
    columns = sorted({c for cols in cells.values() for c in cols})
    keys = {row_keys[i] for i in cells}
    by_key: dict[str | None, list[int]] = {}
    for i, k in enumerate(row_keys):
        if k in keys and not skip(i):
            by_key.setdefault(k, []).append(i)
    for idxs in by_key.values():
        idxs.sort(key=lambda i: order[i])
    resolved: set[tuple[int, str]] = set()

    def walk(idxs: list[int], start: dict[str, Any]) -> bool:
        """Carry values along one key's rows; True when a cell found nothing before it (not after a delete)."""
        carry, gone, missing = dict(start), False, False
        for i in idxs:
            if deleted[i]:
                carry, gone = {}, True
                continue
            mine = cells.get(i, ())
            for col in columns:
                if col in mine:
                    if col in carry:
                        values[col][i] = carry[col]
                        resolved.add((i, col))
                    elif not gone:
                        missing = True
                else:
                    carry[col] = values[col][i]
        return missing

    need = [k for k, idxs in by_key.items() if walk(idxs, {})]
    if need and lookup is not None:
        first_row = {k: next(i for i in by_key[k] if i in cells) for k in need}
        typed = {k: tuple(values[c][first_row[k]] for c in key_columns) for k in need}
        stored = lookup(sorted(set(typed.values()), key=repr), columns)
        for k in need:
            found = stored.get(typed[k])
            if found is not None:
                walk(by_key[k], found)
    total = sum(len(cols) for cols in cells.values())
    return len(resolved), total - len(resolved)


def stored_lookup(path: Path, key_columns: Sequence[str]) -> StoredLookup:
    """A `StoredLookup` over the latest-state table at `path`: base and delta folded by `ordering`, tombstones
    and rows below the newest truncate left out. It scans the key and asked-for columns of the whole table,
    so it is run only for a batch that has placeholders nothing in the batch resolves."""

    def look(keys: list[tuple[Any, ...]], columns: list[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
        if not keys or not (path / "_delta_log").is_dir():
            return {}
        table = lake.open_table(path)
        names = set(pa.schema(table.schema().to_arrow()).names)
        if not all(k in names for k in key_columns):
            return {}
        cols = [c for c in columns if c in names and c not in key_columns]
        meta = ["_position", "_seq", "_deleted", "_event_id", "_op"]
        rows = lake.scan(table, [*key_columns, *cols, *meta])
        present = None
        for k in key_columns:
            part = pc.is_valid(rows.column(k))
            present = part if present is None else pc.and_(present, part)
        marks = rows.filter(pc.and_(pc.invert(present), pc.equal(rows.column("_op"), "t")))
        cut = pc.max(marks.column("_position")).as_py() if marks.num_rows else None
        wanted = set(keys)
        out: dict[tuple[Any, ...], dict[str, Any]] = {}
        for r in ordering.fold_latest(rows.filter(present), key_columns).to_pylist():
            k = tuple(r[c] for c in key_columns)
            if k in wanted and not r["_deleted"] and (cut is None or r["_position"] >= cut):
                out[k] = {c: r[c] for c in cols}
        return out

    return look


def strip_placeholders(rows: Sequence[Any], events: Any, placeholder: Placeholder = DEFAULT) -> Marks:
    """`take_placeholders` over change rows (`latest_state.ChangeRow`, of `events`): their images as typing
    takes them. A rebuild's first pass (the types) needs only this; `resolve_batch` fills the marks after typing."""
    befores = events.col("before") if len(events) else []

    def before_of(i: int) -> Any:
        text = befores[rows[i].event]
        return None if text is None else _loads(text)

    ops = [r.op if r.key is not None and not r.deleted else "" for r in rows]
    return take_placeholders(ops, [r.image for r in rows], before_of, placeholder)


def resolve_batch(rows: Sequence[Any], events: Any, typed_of: Callable[[], Any], key_columns: Sequence[str],
                  lookup: StoredLookup | None, placeholder: Placeholder = DEFAULT) -> tuple[Any, int, int]:
    """The latest-state stage's entry point: take placeholders out of `rows`' images, type them with
    `typed_of()` (it reads the images), fill the typed values back; returns (typed, filled, unresolved).

    `rows` are `latest_state.ChangeRow`s and `events` its `Events` (duck-typed: this module sits below
    `latest_state`, which imports it). Filled counts placeholders resolved from the before image too.
    """
    marks = strip_placeholders(rows, events, placeholder)
    typed = typed_of()
    if not marks:
        return typed, marks.from_before, 0
    positions, tx = events.col("position"), events.col("tx_total_order")
    order = [(positions[r.event] or "", tx[r.event] if tx[r.event] is not None else -1, r.sub, r.event) for r in rows]
    filled, unresolved = fill(marks, typed.values, [r.key for r in rows], [r.deleted for r in rows], order, key_columns,
                              lookup, skip=lambda i: rows[i].event in typed.dead)
    return typed, filled + marks.from_before, unresolved
