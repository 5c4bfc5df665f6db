"""Latest state: every configured source table as it is now, kept merge-on-read from the raw change events.

Layout, and why. delta-rs MERGE is copy-on-write: a batch of changes rewrites every file holding one of
its keys, so with keys spread over the table a 10k-change batch rewrites (nearly) the whole table and the
cost grows with the table. Instead each table `<name>` is one Delta table partitioned by `_layer`:

* `_layer=delta`: every micro-batch *appends* its changes, folded to the last change per key (by source
  position, then `transaction.total_order`, then arrival). An append costs the batch, not the table.
* `_layer=base`: one row per key (live rows and tombstones) plus truncate markers, written by compaction:
  a delta-rs MERGE of the folded delta layer into the base (`_position` decides), then a DELETE of the
  folded delta files. Compaction runs from `cdc maintain`, and from the stream when the delta layer grows
  past `max(COMPACT_MIN_CHANGES, COMPACT_RATIO x base rows)`, so its amortised cost per change is constant
  and the delta layer a view has to fold stays small.

The SQL view `<name>` (see `views.latest_state_sql`) folds base and delta by max position per key with
broadcast joins against the small delta side, so reading it costs one scan of the base. The physical
table is registered for SQL as `<name>__stored`; `<name>__full_view` is the canonical current state.

Ordering is by source position, never `ts_ms`: the higher position wins; two distinct events at an equal
position are ordered by arrival, an identical redelivery changes nothing (see `ordering`). Debezium's
unavailable-value placeholder (PostgreSQL TOAST) never lands: see `unavailable`. Deletes
leave tombstones (`_deleted`), so a stale change can never resurrect a row until maintenance purges
tombstones older than the table's `tombstone_retention`. A truncate is a marker row (key columns null,
`_op` t) that makes every row with a lower position a tombstone. An update whose before key differs from
its after key tombstones the old key at the same position.

Types: with the JSON converter's schema wrapper the Connect schema gives exact types (see
`connect_type`); without it JSON values are inferred (integer -> bigint, other numbers -> double, string,
boolean, objects and arrays -> JSON text). An inferred type only says "an integer" or "a number", so
it lands in a narrower declared column when the values fit (a topic that mixes wrapped and plain lines
keeps the exact types). New columns are added; numeric widening (int8 < int16 < int32 < int64 < double,
float < double, decimals to a wider decimal) rewrites the table once with the wider type; any other
type change dead-letters the event (`incompatible_type`), and `cdc rebuild --table NAME` rebuilds the
table from the raw log, letting the newest type win.

History (`history: true`): `<name>_history` receives every applied change, appended; the SQL view of the
same name derives validity (`_valid_from/_valid_to` position and time) and `_is_current` from the order
of positions, so late events slot into the middle of a history without rewriting it.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

from cdc_platform import envelope, lake, ordering, schemas, unavailable
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.envelope import canonical_json  # the one definition of the `key` text
from cdc_platform.envelope import json_text as _json_dump
from cdc_platform.envelope import quote_value as _show
from cdc_platform.errors import LakeError
from cdc_platform.stage import RAW, BatchContext, ParsedBatch, StageResult, dead_letter_rows

#: Row images are read with every number exact (orjson where it reads them as the stdlib would, Decimal
#: for a number no float holds), so a decimal column gets the digits the source committed.
_loads = envelope.loads_json

STAGE = "latest_state"
TS = schemas.TS

LAYER = "_layer"
BASE = "base"
DELTA = "delta"

#: Compaction threshold: fold the delta layer into the base once it holds this many rows, or this
#: fraction of the base, whichever is larger (a fixed fraction keeps the amortised cost per change flat).
COMPACT_MIN_CHANGES = 100_000
COMPACT_RATIO = 0.1

#: Metadata columns of the latest-state table, after the source columns.
META_FIELDS: tuple[pa.Field, ...] = (
    pa.field("_op", pa.string()),
    pa.field("_deleted", pa.bool_()),
    pa.field("_position", pa.string()),
    pa.field("_source_ts", TS),
    pa.field("_transaction_id", pa.string()),
    pa.field("_ingested_at", TS),
    pa.field("_event_id", pa.string()),
    pa.field("_seq", pa.int64()),  # order of application: the Delta version that appended the row
    pa.field(LAYER, pa.string()),
)
#: Extra ordering columns of `<name>_history` (which has no `_layer`).
HISTORY_EXTRA: tuple[pa.Field, ...] = (pa.field("_tx_order", pa.int64()), pa.field("_batch_order", pa.int64()))
HISTORY_META: tuple[pa.Field, ...] = tuple(f for f in META_FIELDS if f.name != LAYER) + HISTORY_EXTRA
RESERVED = frozenset(f.name for f in META_FIELDS + HISTORY_EXTRA)


# --- Types -------------------------------------------------------------------------------------------

_CONNECT_BASE: dict[str, pa.DataType] = {
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "boolean": pa.bool_(),
    "string": pa.string(),
    "bytes": pa.binary(),
}
#: Connect/Debezium timestamp logical types and their unit in nanoseconds (stored to the microsecond).
_EPOCH_TIMESTAMPS: dict[str, int] = {
    "org.apache.kafka.connect.data.Timestamp": 1_000_000,
    "io.debezium.time.Timestamp": 1_000_000,
    "io.debezium.time.MicroTimestamp": 1_000,
    "io.debezium.time.NanoTimestamp": 1,
}
_DATES = frozenset({"org.apache.kafka.connect.data.Date", "io.debezium.time.Date"})
_DECIMAL = "org.apache.kafka.connect.data.Decimal"
_VARIABLE_SCALE_DECIMAL = "io.debezium.data.VariableScaleDecimal"
#: Spark and Delta decimals hold at most 38 digits; a wider Connect Decimal is kept as exact text.
MAX_DECIMAL_DIGITS = 38
#: Decimal arithmetic that never rounds: a result that would lose a digit raises instead.
_EXACT = decimal.Context(prec=4000, Emax=decimal.MAX_EMAX, Emin=decimal.MIN_EMIN, traps=[decimal.Inexact, decimal.InvalidOperation, decimal.Overflow])
_ZONED_TIMESTAMP = "io.debezium.time.ZonedTimestamp"
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64())


class BadValue(ValueError):
    """A JSON value that does not fit the type its column declares; `code` is its dead-letter reason."""

    def __init__(self, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class FieldType:
    """An Arrow type plus how to turn a JSON value into a Python value of that type."""

    dtype: pa.DataType
    convert: Callable[[Any], Any]


def _strict_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadValue(f"{_show(v)[:40]} is not an integer")
    return v


def _bounded_int(bits: int) -> Callable[[Any], int]:
    bound = 2 ** (bits - 1)

    def convert(v: Any) -> int:
        value = _strict_int(v)
        if not -bound <= value < bound:
            raise BadValue(f"{value} does not fit a {bits}-bit integer", "out_of_range")
        return value

    return convert


#: Kafka's JsonConverter (Jackson) writes a non-finite float or double as one of these strings.
_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _number(v: Any) -> float:
    if isinstance(v, str) and v in _NON_FINITE:
        return _NON_FINITE[v]
    if isinstance(v, bool) or not isinstance(v, (int, float, decimal.Decimal)):
        raise BadValue(f"{_show(v)[:40]} is not a number")
    return float(v)


def _boolean(v: Any) -> bool:
    if not isinstance(v, bool):
        raise BadValue(f"{_show(v)[:40]} is not a boolean")
    return v


def _string(v: Any) -> str:
    if not isinstance(v, str):
        raise BadValue(f"{_show(v)[:40]} is not a string")
    return v


def _json_text(v: Any) -> str:
    return v if isinstance(v, str) else _json_dump(v)


def _base64_bytes(v: Any) -> bytes:
    if not isinstance(v, str):
        raise BadValue(f"{_show(v)[:40]} is not base64 text")
    try:
        return base64.b64decode(v, validate=True)
    except (ValueError, TypeError) as exc:
        raise BadValue(f"{v[:40]!r} is not valid base64") from exc


def connect_type(fld: Mapping[str, Any]) -> FieldType | None:
    """Arrow type for one field of a Debezium/Kafka Connect schema.

    Mapped: int8/16/32/64, float32/64 (with the converter's "NaN"/"Infinity" strings), boolean, string,
    bytes (base64 -> binary); logical types Decimal (-> decimal(precision, scale) exactly, from base64
    bytes or a JSON number; wider than 38 digits -> exact decimal text, since Spark and Delta stop at
    38; precision 38 when not given), VariableScaleDecimal (-> exact decimal text: its scale varies per
    value), Date / io.debezium.time.Date (-> date), Timestamp / io.debezium.time.{Timestamp,
    MicroTimestamp, NanoTimestamp} and ZonedTimestamp (-> timestamp in UTC, to the microsecond; the
    zone-less ones are wall-clock values stored as if UTC). Everything else keeps its base type:
    Time/MicroTime/NanoTime stay integers in their unit, Json, Uuid, Enum, Xml stay strings; structs,
    arrays and maps become JSON text. None for a type Connect does not have: the value is then typed
    as if there were no schema.
    """
    base = str(fld.get("type") or "")
    name = fld.get("name")
    params = fld.get("parameters") or {}
    if name == _DECIMAL and base == "bytes":
        return _decimal_type(params)
    if name == _VARIABLE_SCALE_DECIMAL and base == "struct":
        return FieldType(pa.string(), _variable_scale_decimal)
    if name in _EPOCH_TIMESTAMPS and base == "int64":
        return FieldType(TS, _epoch_timestamp(_EPOCH_TIMESTAMPS[name]))
    if name in _DATES and base == "int32":
        return FieldType(pa.date32(), _epoch_date)
    if name == _ZONED_TIMESTAMP and base == "string":
        return FieldType(TS, _zoned_timestamp)
    if base in ("int8", "int16", "int32", "int64"):
        return FieldType(_CONNECT_BASE[base], _bounded_int(int(base[3:])))
    if base in ("float32", "float64"):
        return FieldType(_CONNECT_BASE[base], _number)
    if base == "boolean":
        return FieldType(pa.bool_(), _boolean)
    if base == "string":
        return FieldType(pa.string(), _string)
    if base == "bytes":
        return FieldType(pa.binary(), _base64_bytes)
    if base in ("struct", "array", "map"):
        return FieldType(pa.string(), _json_text)
    return None  # not a Connect type: infer from the value as if there were no schema


def _epoch_timestamp(unit_ns: int) -> Callable[[Any], dt.datetime]:
    """Integer arithmetic only: a float would move a nanosecond timestamp by up to 256 ns."""

    def convert(v: Any) -> dt.datetime:
        micros = _strict_int(v) * unit_ns // 1000  # floor, as Spark truncates to the microsecond
        try:
            return _EPOCH + dt.timedelta(microseconds=micros)
        except OverflowError:
            raise BadValue(f"{v} is outside the years 1 to 9999", "out_of_range") from None

    return convert


def _epoch_date(v: Any) -> dt.date:
    try:
        return dt.date(1970, 1, 1) + dt.timedelta(days=_strict_int(v))
    except OverflowError:
        raise BadValue(f"{v} days from 1970 is outside the years 1 to 9999", "out_of_range") from None


def _unscaled(v: Any, scale: int) -> decimal.Decimal:
    """Connect's Decimal bytes (big-endian two's complement of the unscaled value) at `scale`, exactly."""
    unscaled = int.from_bytes(_base64_bytes(v), "big", signed=True)
    return decimal.Decimal(unscaled).scaleb(-scale, _EXACT)


def _decimal_type(params: Mapping[str, Any]) -> FieldType:
    """A Connect Decimal column: decimal(p, s) up to 38 digits, exact text beyond.

    A negative scale (Oracle `NUMBER(p, -s)`) is stored at scale 0 with the extra digits, since
    Spark refuses negative scales; precision 38 when the schema gives none (Debezium always does).
    """
    try:
        scale = int(params.get("scale", 0))
        precision = int(params.get("connect.decimal.precision", MAX_DECIMAL_DIGITS))
    except (TypeError, ValueError):
        return FieldType(pa.string(), _bad_decimal_schema)
    store_scale = max(scale, 0)
    digits = max(precision - min(scale, 0), store_scale, 1)
    if digits > MAX_DECIMAL_DIGITS:
        return FieldType(pa.string(), _decimal_converter(digits, scale, store_scale, as_text=True))
    return FieldType(pa.decimal128(digits, store_scale), _decimal_converter(digits, scale, store_scale, as_text=False))


def _bad_decimal_schema(v: Any) -> Any:
    raise BadValue("the column's Decimal schema has a scale or precision that is not an integer")


def _decimal_converter(precision: int, scale: int, store_scale: int, *, as_text: bool) -> Callable[[Any], Any]:
    quantum = decimal.Decimal(1).scaleb(-store_scale)
    whole_digits = precision - store_scale

    def convert(v: Any) -> decimal.Decimal | str:
        if isinstance(v, str):
            value = _unscaled(v, scale)  # the converter's default, decimal.format=BASE64
        elif isinstance(v, (int, decimal.Decimal)) and not isinstance(v, bool):
            value = decimal.Decimal(v)  # decimal.format=NUMERIC; the envelope kept every digit
        elif isinstance(v, float):
            value = decimal.Decimal(repr(v))  # the shortest text of a float is the number that was written
        else:
            raise BadValue(f"{_show(v)[:40]} is not a decimal")
        if not value.is_finite():
            raise BadValue(f"{value} is not a decimal number")
        try:
            value = value.quantize(quantum, context=_EXACT)
        except decimal.DecimalException:
            raise BadValue(f"{value} has more than {store_scale} digits after the point", "out_of_range") from None
        if value and value.adjusted() >= whole_digits:
            raise BadValue(f"{value} has more than {precision} digits", "out_of_range")
        return format(value, "f") if as_text else value

    return convert


def _variable_scale_decimal(v: Any) -> str:
    """Debezium's VariableScaleDecimal `{scale, value}`: the exact decimal as text (its scale varies per row)."""
    if not isinstance(v, dict) or isinstance(v.get("scale"), bool) or not isinstance(v.get("scale"), int):
        raise BadValue(f"{_show(v)[:60]} is not a VariableScaleDecimal {{scale, value}}")
    try:
        return format(_unscaled(v.get("value"), v["scale"]), "f")
    except decimal.DecimalException:
        raise BadValue(f"scale {v['scale']} is out of range", "out_of_range") from None


def _zoned_timestamp(v: Any) -> dt.datetime:
    try:
        parsed = dt.datetime.fromisoformat(_string(v))
    except ValueError as exc:
        raise BadValue(f"{v!r} is not an ISO-8601 timestamp") from exc
    try:
        return (parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)).astimezone(dt.timezone.utc)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-00:01 is in the year 10000 in UTC
        raise BadValue(f"{v!r} is outside the years 1 to 9999 in UTC", "out_of_range") from None


_INFERRED: dict[type, FieldType] = {
    bool: FieldType(pa.bool_(), lambda v: v),
    int: FieldType(pa.int64(), lambda v: v),
    float: FieldType(pa.float64(), lambda v: v),
    # A number with more digits than a float holds, without a schema to say it is a decimal: a JSON
    # number is a double to every inferring reader (Spark's JSON source too). Exact decimals need the
    # schema wrapper (schemas.enable=true), which says Decimal.
    decimal.Decimal: FieldType(pa.float64(), float),
    str: FieldType(pa.string(), lambda v: v),
    dict: FieldType(pa.string(), _json_text),
    list: FieldType(pa.string(), _json_text),
}


def _whole_decimal(v: Any) -> decimal.Decimal:
    if len(str(abs(v))) > MAX_DECIMAL_DIGITS:
        raise BadValue(f"{str(v)[:40]}... has more than {MAX_DECIMAL_DIGITS} digits", "out_of_range")
    return decimal.Decimal(v)


#: Integers beyond 64 bits (an unsigned BIGINT past 2^63, say) are exact decimals: 20 digits hold
#: every unsigned 64-bit value, 38 are the most Spark and Delta store.
_UNSIGNED_64 = FieldType(pa.decimal128(20, 0), _whole_decimal)
_WIDE_INTEGER = FieldType(pa.decimal128(MAX_DECIMAL_DIGITS, 0), _whole_decimal)


def infer_type(value: Any) -> FieldType | None:
    """Type of a JSON value without a schema; None for null (a null says nothing about its column)."""
    if value is None:
        return None
    if type(value) is int and not -(2**63) <= value < 2**63:
        return _UNSIGNED_64 if len(str(abs(value))) <= 20 else _WIDE_INTEGER
    return _INFERRED[type(value)]


def _normalise(t: pa.DataType) -> pa.DataType:
    """Delta reads give large/view variants; compare and write the plain ones."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_timestamp(t):
        return TS
    return t


def join_types(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The narrowest type both widen to without changing meaning, or None when they are incompatible."""
    a, b = _normalise(a), _normalise(b)
    if a == b:
        return a
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return max(a, b, key=_INTS.index)
    small_exact = (pa.int8(), pa.int16(), pa.float32())
    if (pa.types.is_integer(a) or pa.types.is_floating(a)) and (pa.types.is_integer(b) or pa.types.is_floating(b)):
        return pa.float32() if a in small_exact and b in small_exact else pa.float64()
    if pa.types.is_decimal(a) or pa.types.is_decimal(b):
        da = a if pa.types.is_decimal(a) else (pa.decimal128(19, 0) if pa.types.is_integer(a) else None)
        db = b if pa.types.is_decimal(b) else (pa.decimal128(19, 0) if pa.types.is_integer(b) else None)
        if da is None or db is None:
            return None
        scale = max(da.scale, db.scale)
        digits = max(da.precision - da.scale, db.precision - db.scale) + scale
        return pa.decimal128(digits, scale) if digits <= 38 else None
    return None


def type_name(t: pa.DataType) -> str:
    """The Spark SQL name a user sees for a type (what `DESCRIBE` prints)."""
    t = _normalise(t)
    names = {
        pa.int8(): "tinyint", pa.int16(): "smallint", pa.int32(): "int", pa.int64(): "bigint",
        pa.float32(): "float", pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string",
        pa.binary(): "binary", pa.date32(): "date", TS: "timestamp",
    }
    if t in names:
        return names[t]
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    return str(t)


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
            before = _loads(befores[i])
            if isinstance(before, dict) and all(before.get(k) is not None for k in key_columns):
                old = canonical_json({k: before[k] for k in key_columns})
                if old != key:
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
        ftype = decl.get(col) if decl else None
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


_INT_RANGES = {pa.int8(): 2**7, pa.int16(): 2**15, pa.int32(): 2**31, pa.int64(): 2**63}


def _fits(inferred: pa.DataType, target: pa.DataType, values: Iterable[Any]) -> bool:
    """Whether values whose type was only inferred from JSON can be stored as `target` exactly."""
    if inferred == pa.int64():
        if target in _INT_RANGES:
            bound = _INT_RANGES[target]
            return all(-bound <= v < bound for v in values)
        if target == pa.float32():
            return all(abs(v) <= 2**24 for v in values)
        if pa.types.is_decimal(target):
            return all(len(str(abs(v))) <= target.precision - target.scale for v in values)
    return inferred == pa.float64() and target == pa.float32()


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


def type_rows(
    rows: list[ChangeRow],
    events: Events,
    stored: Mapping[str, pa.DataType],
    table: TableConfig,
    *,
    coerce: bool = False,
) -> TypedRows:
    """Type every change row against the stored source columns, column by column.

    Without `coerce` (the stream) a value whose type cannot widen to the stored one dead-letters its
    event. With `coerce` (rebuild) the newest event's type wins and older values are cast to it; only
    values that cannot be cast are dead-lettered.
    """
    dead: dict[int, tuple[str, str]] = {}
    images = [r.image for r in rows]
    events_of = [r.event for r in rows]
    texts = events.col("row_schema")
    declared: list[dict[str, FieldType] | None] | None = None
    if any(t is not None for t in texts):
        cache: dict[str, dict[str, FieldType]] = {}
        declared = [_declared(texts[e], cache) for e in events_of]
    order: dict[str, None] = dict.fromkeys(stored)
    for img in images:
        if img:
            for col in img:
                if col not in order:
                    order[col] = None
    _fold_case(order, images, events_of, dead, table)
    for col in [c for c in order if c.lower() in RESERVED]:
        for idx, img in enumerate(images):
            if img and col in img:
                dead.setdefault(events_of[idx], (
                    "reserved_column",
                    f"source column `{col}` of {table.source} has the name of a platform metadata column; rename it at "
                    f"the source or with a column-renaming SMT, then run `cdc rebuild --table {table.name}`",
                ))
        del order[col]

    order_lists: list[list[Any]] = []

    def newness(i: int) -> tuple[str, int, int]:
        """Source order of a row's event: position, then transaction order, then arrival."""
        if not order_lists:
            order_lists.extend([events.col("position"), events.col("tx_total_order")])
        pos, tx = order_lists
        e = events_of[i]
        return (pos[e] or "", tx[e] if tx[e] is not None else -1, e)

    def newest(idxs: Iterable[int]) -> int:
        return max(idxs, key=newness)

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
        if old is None and not hard and not soft:
            continue  # only nulls so far and no declared type: wait for a value to say what it is
        if old is not None and not coerce:
            target = _normalise(old)
        else:  # a new column (or a rebuild): the newest declared type, else the newest inferred one
            groups = hard or soft
            if len(groups) == 1:
                (target,) = groups
            else:
                n = newest(i for idxs in groups.values() for i in idxs)
                target = next(t for t, idxs in groups.items() if n in idxs)
        if len(hard) + len(soft) > 1 or ((hard or soft) and next(iter(hard or soft)) != target):
            ranked = sorted(hard, key=lambda t: newness(newest(hard[t])), reverse=True)
            for dtype in ranked:  # widen with every compatible declared type, newest first
                joined = join_types(target, dtype)
                if joined is not None:
                    target = joined
            fitting: set[pa.DataType] = set()
            for dtype, idxs in soft.items():  # inferred types fit where they can, else widen
                if dtype == target:
                    continue
                if _fits(dtype, target, (converted[i] for i in idxs)):
                    fitting.add(dtype)
                    continue
                joined = join_types(target, dtype)
                if joined is not None:
                    target = joined
            for dtype, idxs in [*hard.items(), *soft.items()]:
                if join_types(dtype, target) == target or (dtype in fitting and _fits(dtype, target, (converted[i] for i in idxs))):
                    if pa.types.is_decimal(target) and not pa.types.is_decimal(dtype):
                        for i in idxs:
                            converted[i] = decimal.Decimal(converted[i])
                    continue
                for i in idxs:
                    if coerce:
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
        elif not coerce and target != _normalise(old):
            widened[col] = (_normalise(old), target)
        columns[col] = target
        values[col] = converted
    return TypedRows(columns=columns, values=values, rows=rows, dead=dead, widened=widened, added=added)


def _declared(text: str | None, cache: dict[str, dict[str, FieldType]]) -> dict[str, FieldType]:
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
                found[str(f["field"])] = ftype
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


def conform(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """`data` with exactly `schema`'s columns, in order: missing ones null, present ones cast."""
    arrays = []
    for f in schema:
        if f.name in data.column_names:
            arrays.append(data.column(f.name).cast(f.type, safe=False))
        else:
            arrays.append(pa.nulls(data.num_rows, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


# --- Writing -----------------------------------------------------------------------------------------

def ensure_tables(lake_dir: Path, table: TableConfig) -> None:
    """Create `<name>` (and `<name>_history`) with metadata columns only; source columns come with data."""
    lake.ensure_table(lake.table_path(lake_dir, table.name), pa.schema(list(META_FIELDS)), [LAYER])
    if table.history:
        lake.ensure_table(lake.table_path(lake_dir, table.history_name), pa.schema(list(HISTORY_META)))


def widen(path: Path, target: pa.Schema, partition_by: list[str] | None) -> None:
    """Rewrite a table with wider column types (Delta cannot change a column's type in place here).

    Streams the current snapshot through Arrow batches, so memory stays bounded; the old files stay
    until `cdc maintain` vacuums them. Application transactions survive an overwrite.
    """

    def attempt() -> None:  # a retry after a conflicting commit must re-read the newer snapshot
        table = lake.open_table(path)
        scanner = table.to_pyarrow_dataset().scanner(batch_size=262_144)

        def batches() -> Iterable[pa.RecordBatch]:
            for batch in scanner.to_batches():
                yield from conform(pa.Table.from_batches([batch]), target).to_batches()

        reader = pa.RecordBatchReader.from_batches(target, batches())
        write_deltalake(table, reader, mode="overwrite", schema_mode="overwrite", partition_by=partition_by,
                        commit_properties=lake.commit_props(None, None, cdc_operation="widen"))

    lake.with_retries(attempt, what=f"widen {path.name}")


def _evolved(current: pa.Schema, columns: Mapping[str, pa.DataType], meta: Sequence[pa.Field]) -> tuple[pa.Schema, bool]:
    """The table schema after this batch's columns, and whether a rewrite (widening) is needed."""
    existing = source_columns(current, meta)
    rewrite = any(c in existing and existing[c] != t for c, t in columns.items())
    fields = [pa.field(c, columns.get(c, t)) for c, t in existing.items()]
    fields += [pa.field(c, t) for c, t in columns.items() if c not in existing]
    return pa.schema(fields + list(meta)), rewrite


def _layer_rows(table: DeltaTable) -> dict[str, int]:
    actions = pa.table(table.get_add_actions(flatten=True))
    out = {BASE: 0, DELTA: 0}
    col = f"partition.{LAYER}"
    if actions.num_rows == 0 or col not in actions.column_names:
        return out
    for layer, n in zip(actions.column(col).to_pylist(), actions.column("num_records").to_pylist()):
        if layer in out and n is not None:
            out[layer] += int(n)
    return out


# --- The stage ------------------------------------------------------------------------------------

@dataclass
class TableApply:
    """What one batch did to one table."""

    rows: int = 0
    history_rows: int = 0
    tombstones: int = 0
    truncates: int = 0
    added_columns: int = 0
    widened_columns: int = 0
    compacted: int = 0
    compact_seconds: float = 0.0
    unavailable_filled: int = 0  # Debezium placeholders replaced by the previous value (`unavailable`)
    unavailable_unresolved: int = 0  # ... for which no previous value was known: stored as NULL
    dead: list[dict[str, Any]] = field(default_factory=list)


class LatestStateStage:
    """Appends each batch's changes to `<name>` (delta layer) and `<name>_history`, exactly once."""

    name = STAGE

    def __init__(self, compact_min_changes: int = COMPACT_MIN_CHANGES, compact_ratio: float = COMPACT_RATIO) -> None:
        self.compact_min_changes = compact_min_changes
        self.compact_ratio = compact_ratio

    def setup(self, config: PlatformConfig) -> None:
        for table in config.tables:
            ensure_tables(config.lake, table)

    def prepare(self, batch: ParsedBatch, ctx: BatchContext) -> list[TablePlan]:
        events = batch.events
        if events.num_rows == 0 or not ctx.config.tables:
            return []
        table_ids = events.column("table_id")
        plans = []
        for table in ctx.config.tables:
            mine = events.filter(pc.equal(table_ids, table.source))
            if mine.num_rows:
                plans.append(prepare_table(ctx.config.lake, table, Events(mine)))
        return plans

    def commit(self, plans: list[TablePlan], ctx: BatchContext) -> StageResult:
        result = StageResult()
        dead: list[dict[str, Any]] = []
        totals: dict[str, float] = {}
        for plan in plans:
            done = commit_table(plan, ctx=ctx, stage=self)
            if done.rows:
                result.rows_landed[plan.table.name] = done.rows
            if done.history_rows:
                result.rows_landed[plan.table.history_name] = done.history_rows
            dead.extend(done.dead)
            for k in ("rows", "tombstones", "truncates", "added_columns", "widened_columns", "compacted", "compact_seconds",
                      "unavailable_filled", "unavailable_unresolved"):
                totals[k] = totals.get(k, 0.0) + float(getattr(done, k))
        if plans:
            totals["dead_letters"] = float(len(dead))
            result.figures = totals
        if dead:
            result.dead_letters = dead_letter_rows(dead, stage=STAGE, batch_id=ctx.batch_id)
        return result

    def should_compact(self, layers: Mapping[str, int]) -> bool:
        return layers[DELTA] >= max(self.compact_min_changes, self.compact_ratio * layers[BASE])


def _dead_rows(events: Events, dead: Mapping[int, tuple[str, str]]) -> list[dict[str, Any]]:
    if not dead:
        return []
    order = sorted(dead)
    cols = {c: events.take(c, order).to_pylist() for c in ("table_id", "event_id", "line", "source_file")}
    return [
        {"reason_code": dead[e][0], "reason": dead[e][1], **{c: cols[c][i] for c in cols}}
        for i, e in enumerate(order)
    ]


@dataclass
class TablePlan:
    """One batch's changes to one table, typed and built, not yet written (see `stage.Stage.prepare`).

    Rows carry `_seq` 0 until `commit_table` knows the Delta version they land in.
    """

    lake_dir: Path
    table: TableConfig
    out: TableApply
    state: pa.Table | None = None  # rows for `<name>`, conformed to `state_target`
    state_target: pa.Schema | None = None
    state_rewrite: bool = False
    history: pa.Table | None = None
    history_target: pa.Schema | None = None
    history_rewrite: bool = False
    typed: TypedRows | None = None


def prepare_table(lake_dir: Path, table: TableConfig, events: Events) -> TablePlan:
    """Type, fold and build one batch's rows for one table; reads the stored schemas, writes nothing."""
    out = TableApply()
    plan = TablePlan(lake_dir, table, out)
    path = lake.table_path(lake_dir, table.name)
    current = table_schema(path) if (path / "_delta_log").is_dir() else state_schema({})
    rows, bad = change_rows(events, table.key)
    typed, out.unavailable_filled, out.unavailable_unresolved = unavailable.resolve_batch(
        rows, events, lambda: type_rows(rows, events, source_columns(current), table), table.key, unavailable.stored_lookup(path, table.key))
    for e, code, reason in bad:
        typed.dead.setdefault(e, (code, reason))
    out.dead = _dead_rows(events, typed.dead)
    live = [i for i, r in enumerate(rows) if r.event not in typed.dead]
    if not live:
        return plan
    winners = last_per_key([rows[i] for i in live], events)
    chosen = [live[i] for i in winners] + [i for i in live if rows[i].key is None]
    out.tombstones = sum(1 for i in chosen if rows[i].deleted and rows[i].key is not None)
    out.truncates = sum(1 for i in chosen if rows[i].key is None)
    out.added_columns, out.widened_columns = len(typed.added), len(typed.widened)
    plan.typed = typed
    plan.state_target, plan.state_rewrite = _evolved(current, typed.columns, META_FIELDS)
    plan.state = conform(build_rows(typed, events, sorted(chosen), table.key, seq=0), plan.state_target)
    if table.history:
        hpath = lake.table_path(lake_dir, table.history_name)
        hcurrent = table_schema(hpath) if (hpath / "_delta_log").is_dir() else history_schema({})
        plan.history_target, plan.history_rewrite = _evolved(hcurrent, typed.columns, HISTORY_META)
        plan.history = conform(build_rows(typed, events, live, table.key, seq=0, history=True), plan.history_target)
    return plan


def _with_seq(data: pa.Table, seq: int) -> pa.Table:
    return data.set_column(data.schema.get_field_index("_seq"), "_seq", pa.array([seq] * data.num_rows, pa.int64()))


def commit_table(plan: TablePlan, *, ctx: BatchContext, stage: LatestStateStage) -> TableApply:
    """Write a prepared table plan, exactly once per (query id, batch id); maybe compact."""
    table, out = plan.table, plan.out
    lake_dir = plan.lake_dir
    path = lake.table_path(lake_dir, table.name)
    if not (path / "_delta_log").is_dir() or (table.history and not (lake.table_path(lake_dir, table.history_name) / "_delta_log").is_dir()):
        ensure_tables(lake_dir, table)  # normally done by `setup`; a stage used on its own creates them here
    if plan.state is None:
        return out
    state = lake.open_table(path)
    app = ctx.app_id(table.name)
    if not lake.already_committed(state, app, ctx.batch_id):
        if plan.state_rewrite:
            widen(path, plan.state_target, [LAYER])
            state = lake.open_table(path)
        data = _with_seq(plan.state, state.version() + 1)
        lake.with_retries(
            lambda: write_deltalake(
                lake.open_table(path), data, mode="append", schema_mode="merge", partition_by=[LAYER],
                commit_properties=lake.commit_props(app, ctx.batch_id, stage=STAGE),
            ),
            what=f"append to {table.name}",
        )
        out.rows = data.num_rows
        layers = _layer_rows(lake.open_table(path))
        if stage.should_compact(layers):
            t0 = time.perf_counter()
            out.compacted = compact(path, table).folded
            out.compact_seconds = time.perf_counter() - t0
    else:
        out.added_columns = out.widened_columns = 0

    if plan.history is not None:
        hpath = lake.table_path(lake_dir, table.history_name)
        history = lake.open_table(hpath)
        happ = ctx.app_id(table.history_name)
        if not lake.already_committed(history, happ, ctx.batch_id):
            if plan.history_rewrite:
                widen(hpath, plan.history_target, None)
                history = lake.open_table(hpath)
            hdata = _with_seq(plan.history, history.version() + 1)
            lake.with_retries(
                lambda: write_deltalake(
                    lake.open_table(hpath), hdata, mode="append", schema_mode="merge",
                    commit_properties=lake.commit_props(happ, ctx.batch_id, stage=STAGE),
                ),
                what=f"append to {table.history_name}",
            )
            out.history_rows = hdata.num_rows
    return out


def apply_table(lake_dir: Path, table: TableConfig, events: Events, *, ctx: BatchContext, stage: LatestStateStage) -> TableApply:
    """Prepare and commit one table's events at once (backfills, which isolate nothing)."""
    return commit_table(prepare_table(lake_dir, table, events), ctx=ctx, stage=stage)


# --- Compaction, purge, rebuild ----------------------------------------------------------------------

@dataclass
class CompactReport:
    folded: int = 0  # delta rows folded into the base
    base_rows: int = 0
    truncated: bool = False
    seconds: float = 0.0


def _key_filter(key: Sequence[str], *, null: bool) -> pc.Expression:
    expr: pc.Expression | None = None
    for k in key:
        part = pc.field(k).is_null() if null else pc.field(k).is_valid()
        expr = part if expr is None else (expr & part)
    assert expr is not None
    return expr


def _delta_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


fold_latest = ordering.fold_latest  # one row per key by (position, first arrival); see `ordering`


def compact(path: Path, table: TableConfig) -> CompactReport:
    """Fold the delta layer into the base: MERGE by key where the change's position is higher, then
    drop the folded delta rows. Safe to repeat and to interrupt: until the DELETE commits, the view folds
    the same rows from both layers to the same answer.
    """
    t0 = time.perf_counter()
    report = CompactReport()
    state = lake.open_table(path)
    schema = pa.schema(state.schema().to_arrow())
    src_cols = source_columns(schema)
    if not all(k in src_cols for k in table.key):
        return report
    delta = state.to_pyarrow_dataset().to_table(filter=pc.field(LAYER) == DELTA)
    if delta.num_rows == 0:
        return report
    delta = conform(delta, schema)
    top_seq = int(pc.max(delta.column("_seq")).as_py())
    markers = delta.filter(_key_filter(table.key, null=True) & (pc.field("_op") == "t"))
    changes = fold_latest(delta.filter(_key_filter(table.key, null=False)), table.key)

    base_marker = _newest_marker(state, table.key)
    new_marker = _newest(markers) if markers.num_rows else None
    truncate_now = new_marker is not None and (base_marker is None or new_marker.column("_position")[0].as_py() > base_marker["_position"])
    cut = new_marker.to_pylist()[0] if truncate_now and new_marker is not None else base_marker
    if cut is not None:
        changes = _tombstone_below(changes, cut, table.key, src_cols)
    if truncate_now and cut is not None and new_marker is not None:
        _truncate_base(path, cut, table.key, src_cols)  # every stored row below the new truncate
        report.truncated = True
        changes = pa.concat_tables([changes, new_marker])

    source = changes.set_column(changes.schema.get_field_index(LAYER), LAYER, pa.array([BASE] * changes.num_rows, pa.string()))
    on = " AND ".join(f"t.{_delta_ident(k)} = s.{_delta_ident(k)}" for k in table.key)
    predicate = f"t.{_delta_ident(LAYER)} = '{BASE}' AND {on}"

    # Explicit, quoted assignments: delta-rs's update_all/insert_all do not quote odd column names.
    assign = {_delta_ident(c): f"s.{_delta_ident(c)}" for c in source.column_names}

    def merge() -> dict[str, Any]:
        return (
            lake.open_table(path)
            .merge(source, predicate, source_alias="s", target_alias="t", commit_properties=lake.commit_props(None, None, cdc_operation="compact"))
            .when_matched_update(updates=assign, predicate=ordering.MERGE_NEWER)
            .when_not_matched_insert(updates=assign)
            .execute()
        )

    lake.with_retries(merge, what=f"compact {path.name}")
    lake.with_retries(
        lambda: lake.open_table(path).delete(f"{_delta_ident(LAYER)} = '{DELTA}' AND _seq <= {top_seq}"),
        what=f"drop folded changes of {path.name}",
    )
    report.folded = delta.num_rows
    report.base_rows = _layer_rows(lake.open_table(path))[BASE]
    report.seconds = time.perf_counter() - t0
    return report


def _newest(rows: pa.Table) -> pa.Table:
    """The one row with the highest `_position`."""
    return rows.slice(pc.index(rows.column("_position"), pc.max(rows.column("_position"))).as_py(), 1)


def _newest_marker(state: DeltaTable, key: Sequence[str]) -> dict[str, Any] | None:
    base = lake.scan(
        state, [*key, "_op", "_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id"],
        _key_filter(key, null=True) & (pc.field("_op") == "t"), partitions=[(LAYER, "=", BASE)],
    ).select(["_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id"])
    if base.num_rows == 0:
        return None
    return _newest(base).to_pylist()[0]


def _tombstone_below(rows: pa.Table, cut: Mapping[str, Any], key: Sequence[str], src_cols: Mapping[str, pa.DataType]) -> pa.Table:
    """Rows below a truncate become the truncate's tombstones: key kept, values gone, its metadata."""
    below = pc.less(rows.column("_position"), cut["_position"])
    if not pc.any(below).as_py():
        return rows
    out = rows
    for col, dtype in src_cols.items():
        if col in key:
            continue
        i = out.schema.get_field_index(col)
        out = out.set_column(i, col, pc.if_else(below, pa.scalar(None, out.schema.field(col).type), out.column(col)))
    replace = {"_op": "t", "_deleted": True, "_position": cut["_position"], "_source_ts": cut["_source_ts"],
               "_transaction_id": cut["_transaction_id"], "_ingested_at": cut["_ingested_at"], "_event_id": cut["_event_id"]}
    for col, value in replace.items():
        i = out.schema.get_field_index(col)
        typ = out.schema.field(col).type
        out = out.set_column(i, col, pc.if_else(below, pa.scalar(value, typ), out.column(col)))
    return out


def _ts_literal(value: dt.datetime | None) -> str:
    if value is None:
        return "NULL"
    return f"arrow_cast('{value.astimezone(dt.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S.%f')}Z', 'Timestamp(Microsecond, Some(\"UTC\"))')"


def _truncate_base(path: Path, cut: Mapping[str, Any], key: Sequence[str], src_cols: Mapping[str, pa.DataType]) -> None:
    updates = {_delta_ident(c): "NULL" for c in src_cols if c not in key}
    updates |= {
        "_op": "'t'",
        "_deleted": "true",
        "_position": lake.delta_string(cut["_position"]),
        "_source_ts": _ts_literal(cut["_source_ts"]),
        "_transaction_id": "NULL" if cut["_transaction_id"] is None else lake.delta_string(cut["_transaction_id"]),
        "_ingested_at": _ts_literal(cut["_ingested_at"]),
        "_event_id": lake.delta_string(cut["_event_id"]),
    }
    keys_present = " AND ".join(f"{_delta_ident(k)} IS NOT NULL" for k in key)
    predicate = f"{_delta_ident(LAYER)} = '{BASE}' AND {keys_present} AND _position < {lake.delta_string(cut['_position'])}"
    lake.with_retries(lambda: lake.open_table(path).update(updates=updates, predicate=predicate), what=f"truncate {path.name}")


def purge_tombstones(path: Path, table: TableConfig, now: dt.datetime | None = None) -> int:
    """Delete base tombstones (and truncate markers) landed more than `tombstone_retention` ago.

    After this, a change older than a purged tombstone that still arrives would bring its row back:
    the retention is the promise of how late a stale change may be.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    cutoff = now - dt.timedelta(seconds=table.tombstone_retention)
    predicate = f"{_delta_ident(LAYER)} = '{BASE}' AND _deleted AND _ingested_at < {_ts_literal(cutoff)}"
    metrics = lake.with_retries(lambda: lake.open_table(path).delete(predicate), what=f"purge tombstones of {path.name}")
    return int((metrics or {}).get("num_deleted_rows", 0))


@dataclass
class RebuildReport:
    events: int = 0
    rows: int = 0
    history_rows: int = 0
    dead_letters: int = 0
    seconds: float = 0.0


def rebuild_table(config: PlatformConfig, name: str, progress: Callable[[str], None] | None = None) -> RebuildReport:
    """Rebuild `<name>` (and its history) from the raw log, letting the newest type of each column win.

    Stop the stream first: the rebuild replaces the table in one commit, and a batch appended meanwhile
    would be lost from it (it stays in the raw log, so a second rebuild recovers it).
    """
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    table = config.table(name)
    raw_path = lake.table_path(config.lake, RAW)
    if not lake.exists(raw_path):
        raise LakeError(f"{config.lake} has no raw_change_events; run `cdc run --config ...` before `cdc rebuild`")
    lake.ensure_table(raw_path, schemas.RAW_CHANGE_EVENTS, schemas.RAW_PARTITION_BY)  # a lake of an earlier version gains new columns
    raw = lake.scan(lake.open_table(raw_path), [f.name for f in schemas.RAW_CHANGE_EVENTS], pc.field("table_id") == table.source)
    # First-arrival order (the raw log keeps each event's first copy), so ties at one position fold as the stream did.
    raw = raw.sort_by([("ingested_at", "ascending"), ("kafka_topic", "ascending"), ("kafka_partition", "ascending"), ("kafka_offset", "ascending")])
    events = Events(raw)
    say(f"rebuilding {name} from {len(events):,} raw events of {table.source} ...")
    rows, bad = change_rows(events, table.key)
    typed, _, _ = unavailable.resolve_batch(rows, events, lambda: type_rows(rows, events, {}, table, coerce=True), table.key, None)
    for e, code, reason in bad:
        typed.dead.setdefault(e, (code, reason))
    live = [i for i, r in enumerate(rows) if r.event not in typed.dead]
    winners = [live[i] for i in last_per_key([rows[i] for i in live], events)]
    markers = [i for i in live if rows[i].key is None]
    report = RebuildReport(events=len(events), dead_letters=len(typed.dead))

    ensure_tables(config.lake, table)
    path = lake.table_path(config.lake, name)
    state = build_rows(typed, events, sorted(winners + markers), table.key, seq=0)
    state = state.set_column(state.schema.get_field_index(LAYER), LAYER, pa.array([BASE] * state.num_rows, pa.string()))
    if markers and all(k in typed.columns for k in table.key):
        newest = _newest(state.filter(_key_filter(table.key, null=True)))
        keyed = state.filter(_key_filter(table.key, null=False))
        state = pa.concat_tables([_tombstone_below(keyed, newest.to_pylist()[0], table.key, typed.columns), newest])
    lake.with_retries(
        lambda: write_deltalake(lake.open_table(path), state, mode="overwrite", schema_mode="overwrite", partition_by=[LAYER],
                                commit_properties=lake.commit_props(None, None, cdc_operation="rebuild")),
        what=f"rebuild {name}",
    )
    report.rows = state.num_rows
    if table.history:
        hpath = lake.table_path(config.lake, table.history_name)
        hist = build_rows(typed, events, live, table.key, seq=0, history=True)
        lake.with_retries(
            lambda: write_deltalake(lake.open_table(hpath), hist, mode="overwrite", schema_mode="overwrite",
                                    commit_properties=lake.commit_props(None, None, cdc_operation="rebuild")),
            what=f"rebuild {table.history_name}",
        )
        report.history_rows = hist.num_rows
    if typed.dead:
        dead = dead_letter_rows(_dead_rows(events, typed.dead), stage="rebuild", batch_id=None)
        dl = lake.ensure_table(lake.table_path(config.lake, "dead_letter"), schemas.DEAD_LETTER)
        lake.with_retries(lambda: write_deltalake(dl, dead, mode="append"), what="append rebuild dead letters")
    report.seconds = time.perf_counter() - t0
    say(f"rebuilt {name}: {report.rows:,} rows (tombstones included), {report.history_rows:,} history rows, "
        f"{report.dead_letters:,} events dead-lettered, {report.seconds:.1f} s")
    return report
