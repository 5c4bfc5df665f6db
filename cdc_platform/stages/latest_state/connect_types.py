"""Connect/Debezium field types as Arrow types, and the converters that make a JSON value one of them.

A value that does not fit its column's type raises `BadValue`, whose code becomes the event's
dead-letter reason. This knows nothing of events or tables: it is the one place that says what a
Connect schema field (`connect_type`) or a schemaless JSON value (`infer_type`) becomes in the lake,
how two types widen (`join_types`), and what Spark calls a type (`type_name`), so typing a batch and
the type tests use the same answers.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cdc_platform.parse.json_codec import json_text as _json_dump
from cdc_platform.parse.json_codec import quote_value as _show
from cdc_platform.stages.latest_state.layout import TS

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
#: The largest scale (either sign) a decimal stored as text may have: its text is about that many characters,
#: so a corrupt scale of two billion would be a 2 GB string (in Python here, in the views' Java). PostgreSQL's
#: numeric allows 16,383; a larger scale is refused (`out_of_range`), here and in `ConnectDecimal.java` alike.
MAX_TEXT_SCALE = 100_000
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
    if abs(scale) > MAX_TEXT_SCALE:
        raise BadValue(f"scale {scale} is beyond {MAX_TEXT_SCALE:,} either way", "out_of_range")
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
