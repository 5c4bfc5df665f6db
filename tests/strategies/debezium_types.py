"""Debezium change events with Kafka Connect schemas, and the full-view row each one must give.

Each generated `TableCase` is one source table: a key column `id` (int64) plus a few columns of one or
more type *families*, and a handful of create/update events in source order (MySQL binlog positions or
PostgreSQL LSNs, so order is well defined). A table is either schema-wrapped (`{"schema", "payload"}`,
the JSON converter with `schemas.enable=true`) or plain. Every cell carries the JSON value the event
writes (numbers spelled as the Java producers spell them: `Double.toString`, `BigDecimal.toString`,
base64 two's-complement bytes) and what the full view must show for it, or that its event must be
dead-lettered and with which reason codes.

The oracle here is the target type mapping of issue 13, written out on its own: nothing in this module
imports `cdc_platform`, so the code under test can never vouch for itself.

Expected values are plain Python: int, float (the float32 value for float32 columns; NaN and infinities
included), bool, str, bytes, `decimal.Decimal`, `datetime.date`, `datetime.datetime` in UTC, and
`JsonText(value)` for text that must parse to `value`.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import math
import string
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import strategies as st

# --- JSON text as the producers write it ------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """A JSON number written verbatim (the producer's spelling decides what a reader can recover)."""

    text: str


def dumps(obj: Any) -> str:
    """Compact JSON, UTF-8 text as Kafka's converters write it, with `Raw` numbers kept verbatim."""
    if isinstance(obj, Raw):
        return obj.text
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return str(obj)
    if isinstance(obj, float):
        return java_double_text(obj)
    if isinstance(obj, str):
        return json.dumps(obj, ensure_ascii=False)
    if isinstance(obj, (list, tuple)):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{dumps(v)}" for k, v in obj.items()) + "}"
    raise TypeError(f"cannot write {type(obj).__name__} as JSON")


def to_float32(x: float) -> float:
    """The float32 nearest to `x` (round half to even), as a Python float."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:  # rounds past the largest float32
        return math.copysign(math.inf, x)


def _shortest(x: float, bits: int) -> str:
    """Fewest significant digits that read back (as a float of `bits` bits) to exactly `x`."""
    if bits == 64:
        return repr(x)
    for n in range(1, 10):
        text = f"{x:.{n - 1}e}"
        if to_float32(float(text)) == x:
            return text
    return f"{x:.8e}"  # pragma: no cover - 9 digits always round-trip a float32


def java_double_text(x: float, bits: int = 64) -> str:
    """`Double.toString` / `Float.toString` (what Jackson writes for a Connect float64 / float32):
    plain notation with at least one fractional digit for 1e-3 <= |x| < 1e7, else `d.dddE[-]n`."""
    if math.isnan(x) or math.isinf(x):
        raise ValueError("JSON has no spelling for a non-finite number")
    if x == 0:
        return "-0.0" if math.copysign(1.0, x) < 0 else "0.0"
    sign, digits, exp = decimal.Decimal(_shortest(x, bits)).as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    exp += len(digits) - len(ds)
    point = len(ds) - 1 + int(exp)  # decimal exponent of the first digit
    if 1e-3 <= abs(x) < 1e7:
        if point >= 0:
            whole, frac = ds[: point + 1].ljust(point + 1, "0"), ds[point + 1 :] or "0"
        else:
            whole, frac = "0", "0" * (-point - 1) + ds
        text = f"{whole}.{frac}"
    else:
        text = f"{ds[0]}.{ds[1:] or '0'}E{point}"
    return ("-" if sign else "") + text


def plain_decimal(unscaled: int, scale: int) -> str:
    """Plain notation with exactly `scale` fractional digits (`BigDecimal.toPlainString` for scale >= 0)."""
    digits = str(abs(unscaled))
    sign = "-" if unscaled < 0 else ""
    if scale <= 0:
        return sign + digits + "0" * (-scale) if unscaled else "0"
    digits = digits.rjust(scale + 1, "0")
    return f"{sign}{digits[:-scale]}.{digits[-scale:]}"


def bigdecimal_text(unscaled: int, scale: int) -> str:
    """`BigDecimal.toString`: plain unless the adjusted exponent is below -6 (then `1.5E-7` style)."""
    digits = str(abs(unscaled))
    adjusted = len(digits) - 1 - scale
    if scale >= 0 and adjusted >= -6:
        return plain_decimal(unscaled, scale)
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{'-' if unscaled < 0 else ''}{mantissa}E{'+' if adjusted > 0 else ''}{adjusted}"


def exact_decimal(unscaled: int, scale: int) -> decimal.Decimal:
    """unscaled x 10^-scale, built digit by digit (no arithmetic context can round it)."""
    return decimal.Decimal((1 if unscaled < 0 else 0, tuple(map(int, str(abs(unscaled)))), -scale))


def java_bytes(unscaled: int) -> bytes:
    """`BigInteger.toByteArray`: minimal big-endian two's complement."""
    n = ((~unscaled if unscaled < 0 else unscaled).bit_length() + 8) // 8
    return unscaled.to_bytes(n, "big", signed=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# --- What the full view must show -----------------------------------------------------------------------


@dataclass(frozen=True)
class JsonText:
    """Expected: a string that parses (as JSON) to `value`."""

    value: Any


#: Reason codes that say "this value cannot be stored" (README: latest state `invalid_value`, and
#: `out_of_range`, which ingest also uses for numbers and times outside what the lake holds).
UNSTORABLE = frozenset({"invalid_value", "out_of_range"})
#: Every reason code the latest-state stage may use. `stage_error` is deliberately not in it: for this
#: property it means a stage raised.
LATEST_STATE_CODES = frozenset({"incompatible_type", "invalid_value", "reserved_column", "ambiguous_columns", "out_of_range"})


@dataclass(frozen=True)
class Dead:
    """Expected: the event is dead-lettered with one of `codes`."""

    codes: frozenset[str]
    why: str


@dataclass(frozen=True)
class Cell:
    """One column of one event: what the JSON says, and what the view must show (or `Dead`)."""

    json: Any
    expected: Any
    note: str = ""  # the case's name, for failure counts (`bound`, `NaN`, `41 digits`, ...)


NULL = Cell(None, None, "null")


@dataclass(frozen=True)
class Kind:
    """A column's type as a producer declares it: its Connect schema (None in the plain form), what
    Spark type the view must give it, and the values it can hold."""

    family: str
    label: str  # e.g. `int16`, `Decimal(40,3) numeric`, `io.debezium.time.NanoTime`
    schema: dict[str, Any] | None
    spark: frozenset[str] | Callable[[Sequence[Any]], frozenset[str]] = field(repr=False)  # accepted `simpleString`s
    cells: st.SearchStrategy[Cell] = field(repr=False)
    optional: bool = True

    def spark_types(self, live_expected: Sequence[Any]) -> frozenset[str]:
        return self.spark if isinstance(self.spark, frozenset) else self.spark(live_expected)


def _types(*names: str) -> frozenset[str]:
    return frozenset(names)


def _field(schema: Mapping[str, Any], name: str, optional: bool) -> dict[str, Any]:
    return {**schema, "optional": optional, "field": name}


# --- Value strategies per family ------------------------------------------------------------------------

INT_BOUNDS = {8: 2**7, 16: 2**15, 32: 2**31, 64: 2**63}
INT_SPARK = {8: "tinyint", 16: "smallint", 32: "int", 64: "bigint"}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
EPOCH_DAY = dt.date(1970, 1, 1)
MIN_DAY, MAX_DAY = (dt.date(1, 1, 1) - EPOCH_DAY).days, (dt.date(9999, 12, 31) - EPOCH_DAY).days
MIN_MS, MAX_MS = -62_135_596_800_000, 253_402_300_799_999
MIN_US, MAX_US = MIN_MS * 1000, MAX_MS * 1000 + 999
FLOAT32_EDGES = (3.4028234663852886e38, 1.1754943508222875e-38, 1.401298464324817e-45, 16777217.0, 0.1, -0.0, 1e-3, 1e7)
FLOAT64_EDGES = (1.7976931348623157e308, 2.2250738585072014e-308, 5e-324, 9007199254740993.0, 0.1, -0.0, 1e-3, 1e7, 0.001 - 2**-62)
SPECIALS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _integers_with_bounds(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = sorted({v for v in (lo, lo + 1, -1, 0, 1, hi - 1, hi) if lo <= v <= hi})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def _bits_of_int(bits: int) -> st.SearchStrategy[Cell]:
    bound = INT_BOUNDS[bits]
    return _integers_with_bounds(-bound, bound - 1).map(lambda v: Cell(v, v, "bound" if abs(v) >= bound - 1 else "int"))


def integers() -> st.SearchStrategy[Kind]:
    def kind(bits: int) -> Kind:
        return Kind("integers", f"int{bits}", {"type": f"int{bits}"}, _types(INT_SPARK[bits]), _bits_of_int(bits))

    return st.sampled_from((8, 16, 32, 64)).map(kind)


def _float_cells(bits: int) -> st.SearchStrategy[Cell]:
    edges = FLOAT32_EDGES if bits == 32 else FLOAT64_EDGES
    values = st.one_of(st.sampled_from(edges).flatmap(lambda e: st.sampled_from((e, -e))), st.floats(width=bits, allow_nan=False, allow_infinity=False))
    if bits == 32:
        return values.map(to_float32).map(lambda v: Cell(Raw(java_double_text(v, 32)), v, "float32"))
    return values.map(lambda v: Cell(Raw(java_double_text(v)), v, "float64"))


def floats(bits: int) -> st.SearchStrategy[Kind]:
    name = f"float{bits}"
    return st.just(Kind(name, name, {"type": name}, _types("float" if bits == 32 else "double"), _float_cells(bits)))


def float_specials() -> st.SearchStrategy[Kind]:
    """NaN and infinities as Kafka's JsonConverter writes them: Jackson quotes them as strings."""

    def kind(bits: int) -> Kind:
        special = st.sampled_from(sorted(SPECIALS)).map(lambda s: Cell(s, SPECIALS[s], f"'{s}' string"))
        return Kind("float_specials", f"float{bits} NaN/Infinity", {"type": f"float{bits}"},
                    _types("float" if bits == 32 else "double"), st.one_of(special, _float_cells(bits)))

    return st.sampled_from((32, 64)).map(kind)


def booleans() -> st.SearchStrategy[Kind]:
    return st.just(Kind("boolean", "boolean", {"type": "boolean"}, _types("boolean"), st.booleans().map(lambda v: Cell(v, v, "boolean"))))


def strings() -> st.SearchStrategy[Kind]:
    return st.just(Kind("string", "string", {"type": "string"}, _types("string"), st.text(max_size=40).map(lambda v: Cell(v, v, "string"))))


def binary() -> st.SearchStrategy[Kind]:
    return st.just(Kind("bytes", "bytes", {"type": "bytes"}, _types("binary"), st.binary(max_size=40).map(lambda v: Cell(b64(v), v, "bytes"))))


DECIMAL = "org.apache.kafka.connect.data.Decimal"


def _unscaled(digits: int) -> st.SearchStrategy[int]:
    """Integers of at most `digits` digits, with the extremes and every length well represented."""
    top = 10**digits - 1
    by_length = st.integers(1, digits).flatmap(lambda n: st.integers(10 ** (n - 1) if n > 1 else 0, 10**n - 1))
    return st.one_of(st.sampled_from((top, -top, 0, 1, -1)), st.tuples(by_length, st.booleans()).map(lambda t: -t[0] if t[1] else t[0]))


def _decimal_json(unscaled: int, scale: int, numeric: bool) -> tuple[Any, str]:
    if not numeric:
        return b64(java_bytes(unscaled)), "base64"
    return Raw(bigdecimal_text(unscaled, scale)), "number"


def _decimal_schema(precision: int | None, scale: int) -> dict[str, Any]:
    params = {"scale": str(scale)}
    if precision is not None:
        params["connect.decimal.precision"] = str(precision)
    return {"type": "bytes", "name": DECIMAL, "version": 1, "parameters": params}


def decimals(*, numeric: bool | None, wide: bool) -> st.SearchStrategy[Kind]:
    """Connect Decimal with a precision: <= 38 lands as decimal(p,s), > 38 as exact plain text.

    `numeric`: values as JSON numbers (`decimal.format=NUMERIC`), else base64 unscaled bytes (the
    converter's default); None draws either per column.
    """
    family = "decimal_wide" if wide else ("decimal_numeric" if numeric else "decimal_base64")

    @st.composite
    def kind(draw: st.DrawFn) -> Kind:
        precision = draw(st.integers(39, 60) if wide else st.one_of(st.sampled_from((1, 18, 19, 28, 29, 38)), st.integers(1, 38)))
        scale = draw(st.one_of(st.sampled_from((0, precision)), st.integers(0, precision)))
        as_number = draw(st.booleans()) if numeric is None else numeric

        def cell(unscaled: int) -> Cell:
            value, how = _decimal_json(unscaled, scale, as_number)
            expected = plain_decimal(unscaled, scale) if wide else exact_decimal(unscaled, scale)
            return Cell(value, expected, f"Decimal({precision},{scale}) {how}, {len(str(abs(unscaled)))} digits")

        spark = _types("string") if wide else _types(f"decimal({precision},{scale})")
        label = f"Decimal(p{'>38' if wide else '<=38'}) {'number' if as_number else 'base64'}"
        return Kind(family, label, _decimal_schema(precision, scale), spark, _unscaled(precision).map(cell))

    return kind()


def decimals_without_precision() -> st.SearchStrategy[Kind]:
    """Connect Decimal without `connect.decimal.precision`: decimal(38, scale); beyond 38 digits, dead."""

    @st.composite
    def kind(draw: st.DrawFn) -> Kind:
        scale = draw(st.one_of(st.sampled_from((0, 2, 38)), st.integers(0, 38)))
        as_number = draw(st.booleans())

        def cell(unscaled: int) -> Cell:
            value, how = _decimal_json(unscaled, scale, as_number)
            n = len(str(abs(unscaled)))
            if n > 38:
                return Cell(value, Dead(UNSTORABLE, f"{n} digits do not fit decimal(38,{scale})"), f"no precision {how}, {n} digits")
            return Cell(value, exact_decimal(unscaled, scale), f"no precision {how}, {n} digits")

        label = f"Decimal(no precision) {'number' if as_number else 'base64'}"
        return Kind("decimal_no_precision", label, _decimal_schema(None, scale), _types(f"decimal(38,{scale})"), _unscaled(41).map(cell))

    return kind()


def decimal_handling_string() -> st.SearchStrategy[Kind]:
    """`decimal.handling.mode=string`: a plain string schema carrying `BigDecimal.toPlainString`."""

    def cell(t: tuple[int, int]) -> Cell:
        text = plain_decimal(*t)
        return Cell(text, text, "decimal as string")

    values = st.tuples(_unscaled(45), st.integers(0, 20)).map(cell)
    return st.just(Kind("decimal_mode_string", "string (decimal.handling.mode=string)", {"type": "string"}, _types("string"), values))


def decimal_handling_double() -> st.SearchStrategy[Kind]:
    """`decimal.handling.mode=double`: float64 holding the nearest double of a decimal."""

    def cell(t: tuple[int, int]) -> Cell:
        value = float(exact_decimal(*t))
        return Cell(Raw(java_double_text(value)), value, "decimal as double")

    values = st.tuples(_unscaled(20), st.integers(0, 12)).map(cell)
    return st.just(Kind("decimal_mode_double", "float64 (decimal.handling.mode=double)", {"type": "float64"}, _types("double"), values))


VARIABLE_SCALE = {
    "type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "version": 1, "doc": "Variable scaled decimal",
    "fields": [{"type": "int32", "optional": False, "field": "scale"}, {"type": "bytes", "optional": False, "field": "value"}],
}


def variable_scale_decimals() -> st.SearchStrategy[Kind]:
    """io.debezium.data.VariableScaleDecimal (PostgreSQL NUMERIC without a typmod): exact decimal text."""

    def cell(t: tuple[int, int]) -> Cell:
        unscaled, scale = t
        return Cell({"scale": scale, "value": b64(java_bytes(unscaled))}, plain_decimal(unscaled, scale),
                    f"VariableScaleDecimal scale {scale}, {len(str(abs(unscaled)))} digits")

    values = st.tuples(_unscaled(50), st.one_of(st.sampled_from((0, 1, 38)), st.integers(0, 45))).map(cell)
    return st.just(Kind("variable_scale_decimal", "VariableScaleDecimal", VARIABLE_SCALE, _types("string"), values))


def dates() -> st.SearchStrategy[Kind]:
    def kind(name: str) -> Kind:
        values = _integers_with_bounds(MIN_DAY, MAX_DAY).map(lambda d: Cell(d, EPOCH_DAY + dt.timedelta(days=d), "date"))
        schema = {"type": "int32", "name": name, "version": 1} if name.startswith("org.") else {"type": "int32", "name": name}
        return Kind("date", name, schema, _types("date"), values)

    return st.sampled_from(("org.apache.kafka.connect.data.Date", "io.debezium.time.Date")).map(kind)


TIME_TYPES = {  # name -> (base type, typical range in its unit)
    "org.apache.kafka.connect.data.Time": ("int32", 86_400_000),
    "io.debezium.time.Time": ("int32", 86_400_000),
    "io.debezium.time.MicroTime": ("int64", 86_400_000_000),
    "io.debezium.time.NanoTime": ("int64", 86_400_000_000_000),
}


def times() -> st.SearchStrategy[Kind]:
    """Time of day in its unit, kept as the integer (MySQL TIME can be negative or past 24 h)."""

    def kind(name: str) -> Kind:
        base, day = TIME_TYPES[name]
        bits = int(base[3:])
        values = st.one_of(_integers_with_bounds(-day, day), _integers_with_bounds(-INT_BOUNDS[bits], INT_BOUNDS[bits] - 1))
        return Kind("time", name, {"type": base, "name": name, "version": 1} if name.startswith("org.") else {"type": base, "name": name},
                    _types(INT_SPARK[bits]), values.map(lambda v: Cell(v, v, name.rsplit(".", 1)[1])))

    return st.sampled_from(sorted(TIME_TYPES)).map(kind)


def _micros(us: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=us)


def timestamps_ms() -> st.SearchStrategy[Kind]:
    def kind(name: str) -> Kind:
        values = _integers_with_bounds(MIN_MS, MAX_MS).map(lambda ms: Cell(ms, _micros(ms * 1000), "Timestamp ms"))
        schema = {"type": "int64", "name": name, "version": 1} if name.startswith("org.") else {"type": "int64", "name": name}
        return Kind("timestamp", name, schema, _types("timestamp"), values)

    return st.sampled_from(("org.apache.kafka.connect.data.Timestamp", "io.debezium.time.Timestamp")).map(kind)


def micro_timestamps() -> st.SearchStrategy[Kind]:
    values = _integers_with_bounds(MIN_US, MAX_US).map(lambda us: Cell(us, _micros(us), "MicroTimestamp"))
    return st.just(Kind("micro_timestamp", "io.debezium.time.MicroTimestamp", {"type": "int64", "name": "io.debezium.time.MicroTimestamp"},
                        _types("timestamp"), values))


def nano_timestamps() -> st.SearchStrategy[Kind]:
    """Nanoseconds (int64 covers 1677-2262): truncated to the microsecond (floor: a time is cut, not rounded)."""
    values = _integers_with_bounds(-(2**63), 2**63 - 1).map(lambda ns: Cell(ns, _micros(ns // 1000), "NanoTimestamp"))
    return st.just(Kind("nano_timestamp", "io.debezium.time.NanoTimestamp", {"type": "int64", "name": "io.debezium.time.NanoTimestamp"},
                        _types("timestamp"), values))


ZONED = "io.debezium.time.ZonedTimestamp"


def iso_offset_text(local: dt.datetime, nanos: int, offset_s: int, utc_as_z: bool = True) -> str:
    """`DateTimeFormatter.ISO_OFFSET_DATE_TIME`: fraction without trailing zeros, `Z` for UTC."""
    text = f"{local.year:04d}-{local.month:02d}-{local.day:02d}T{local.hour:02d}:{local.minute:02d}:{local.second:02d}"
    if nanos:
        text += "." + f"{nanos:09d}".rstrip("0")
    if offset_s == 0 and utc_as_z:
        return text + "Z"
    sign = "-" if offset_s < 0 else "+"
    h, rest = divmod(abs(offset_s), 3600)
    m, s = divmod(rest, 60)
    return text + f"{sign}{h:02d}:{m:02d}" + (f":{s:02d}" if s else "")


_OFFSETS = st.one_of(
    st.just(0),
    st.sampled_from((3600, -3600, 19800, -34200, 50400, -43200, 64800, -64800)),  # +01, -01, +05:30, -09:30, +14, -12, +-18
    st.integers(-1080, 1080).map(lambda m: m * 60),
    st.integers(-64800, 64800),  # historic zone offsets (local mean time) have seconds
)


def zoned_timestamps() -> st.SearchStrategy[Kind]:
    @st.composite
    def cell(draw: st.DrawFn) -> Cell:
        us = draw(_integers_with_bounds(MIN_US, MAX_US))
        below_us = draw(st.one_of(st.just(0), st.integers(0, 999)))
        offset = draw(_OFFSETS)
        local = _micros(us).replace(tzinfo=None) + dt.timedelta(seconds=offset) if MIN_US + 86_400_000_000 < us < MAX_US - 86_400_000_000 else None
        if local is None:  # near the ends of the range: keep the local time writable (years 1-9999)
            offset = 0
            local = _micros(us).replace(tzinfo=None)
        text = iso_offset_text(local, (us % 1_000_000) * 1000 + below_us, offset, utc_as_z=draw(st.booleans()))
        return Cell(text, _micros(us), "ZonedTimestamp" + (" ns" if below_us else ""))

    return st.just(Kind("zoned_timestamp", ZONED, {"type": "string", "name": ZONED, "version": 1}, _types("timestamp"), cell()))


def times_out_of_range() -> st.SearchStrategy[Kind]:
    """Dates and instants outside years 1-9999 (which neither Python nor the README's range holds): dead."""
    dead = Dead(UNSTORABLE, "outside years 1-9999")

    def ints_outside(lo: int, hi: int, bits: int) -> st.SearchStrategy[int]:
        bound = INT_BOUNDS[bits]
        return st.one_of(st.sampled_from((lo - 1, hi + 1, -bound, bound - 1)), st.integers(-bound, lo - 1), st.integers(hi + 1, bound - 1))

    @st.composite
    def zoned(draw: st.DrawFn) -> Cell:
        early = draw(st.booleans())
        minutes = draw(st.integers(1, 18 * 60))
        if early:  # 0001-01-01T00:xx:00+hh:mm is an instant in the year 0
            local, offset = dt.datetime(1, 1, 1, 0, 0) + dt.timedelta(minutes=draw(st.integers(0, minutes - 1))), minutes * 60
        else:
            local, offset = dt.datetime(9999, 12, 31, 23, 59, 59) - dt.timedelta(minutes=draw(st.integers(0, minutes - 1))), -minutes * 60
        return Cell(iso_offset_text(local, 0, offset), dead, "ZonedTimestamp out of range")

    choices = {
        "io.debezium.time.Date": ("int32", ints_outside(MIN_DAY, MAX_DAY, 32).map(lambda v: Cell(v, dead, "Date out of range"))),
        "org.apache.kafka.connect.data.Timestamp": ("int64", ints_outside(MIN_MS, MAX_MS, 64).map(lambda v: Cell(v, dead, "Timestamp out of range"))),
        "io.debezium.time.MicroTimestamp": ("int64", ints_outside(MIN_US, MAX_US, 64).map(lambda v: Cell(v, dead, "MicroTimestamp out of range"))),
        ZONED: ("string", zoned()),
    }

    def kind(name: str) -> Kind:
        base, values = choices[name]
        spark = "date" if name.endswith("Date") else "timestamp"
        # Only some events carry an out-of-range value; the others land as usual.
        ok = {"io.debezium.time.Date": dates(), "org.apache.kafka.connect.data.Timestamp": timestamps_ms(),
              "io.debezium.time.MicroTimestamp": micro_timestamps(), ZONED: zoned_timestamps()}[name]
        fine = ok.flatmap(lambda k: k.cells)
        return Kind("time_out_of_range", f"{name} out of range", {"type": base, "name": name}, _types(spark), st.one_of(values, fine))

    return st.sampled_from(sorted(choices)).map(kind)


def _json_values(max_leaves: int = 6) -> st.SearchStrategy[Any]:
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-(10**25), 10**25), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8))
    return st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                        max_leaves=max_leaves)


SEMANTIC = ("io.debezium.data.Json", "io.debezium.data.Uuid", "io.debezium.data.Enum", "io.debezium.data.EnumSet", "io.debezium.data.Xml")


def semantic_strings() -> st.SearchStrategy[Kind]:
    """String logical types: the text is the value."""
    allowed = ("small", "medium", "large", "x-large", "ünïcode")

    def kind(name: str) -> Kind:
        params: dict[str, str] = {}
        if name == "io.debezium.data.Json":
            values = _json_values().map(lambda v: json.dumps(v, ensure_ascii=False))
        elif name == "io.debezium.data.Uuid":
            values = st.uuids().map(str)
        elif name == "io.debezium.data.Enum":
            params, values = {"allowed": ",".join(allowed)}, st.sampled_from(allowed)
        elif name == "io.debezium.data.EnumSet":
            params = {"allowed": ",".join(allowed)}
            values = st.lists(st.sampled_from(allowed), unique=True, max_size=len(allowed)).map(",".join)
        else:
            values = st.text(alphabet=string.ascii_letters + " &;", max_size=12).map(lambda t: f"<doc a=\"1\">{t}<e/></doc>")
        schema: dict[str, Any] = {"type": "string", "name": name, "version": 1}
        if params:
            schema["parameters"] = params
        return Kind("semantic_string", name, schema, _types("string"), values.map(lambda v: Cell(v, v, name.rsplit(".", 1)[1])))

    return st.sampled_from(SEMANTIC).map(kind)


_ITEM_TYPES = {
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": _integers_with_bounds(-(2**63), 2**63 - 1),
    "string": st.text(max_size=8),
    "boolean": st.booleans(),
    "float64": st.floats(allow_nan=False, allow_infinity=False),
}


def arrays() -> st.SearchStrategy[Kind]:
    def kind(item: str) -> Kind:
        values = st.lists(_ITEM_TYPES[item], max_size=5).map(lambda v: Cell(v, JsonText(v), f"array<{item}>"))
        return Kind("array", f"array<{item}>", {"type": "array", "items": {"type": item, "optional": False}}, _types("string"), values)

    return st.sampled_from(sorted(_ITEM_TYPES)).map(kind)


def maps() -> st.SearchStrategy[Kind]:
    """Connect maps: string keys as a JSON object, other keys as an array of [key, value] pairs."""

    def kind(key_type: str) -> Kind:
        if key_type == "string":
            values = st.dictionaries(st.text(max_size=6), _ITEM_TYPES["int64"], max_size=4).map(lambda v: Cell(v, JsonText(v), "map<string,int64>"))
        else:
            pairs = st.dictionaries(_ITEM_TYPES["int32"], st.text(max_size=6), max_size=4).map(lambda d: [[k, v] for k, v in d.items()])
            values = pairs.map(lambda v: Cell(v, JsonText(v), "map<int32,string>"))
        schema = {"type": "map", "keys": {"type": key_type, "optional": False}, "values": {"type": "int64" if key_type == "string" else "string", "optional": True}}
        return Kind("map", f"map<{key_type},...>", schema, _types("string"), values)

    return st.sampled_from(("string", "int32")).map(kind)


def structs() -> st.SearchStrategy[Kind]:
    schema = {"type": "struct", "name": "shop.Address", "fields": [
        {"type": "string", "optional": True, "field": "street"},
        {"type": "int32", "optional": True, "field": "number"},
        {"type": "int64", "optional": True, "field": "big"},
        {"type": "float64", "optional": True, "field": "lat"},
        {"type": "struct", "optional": True, "field": "geo", "fields": [{"type": "boolean", "optional": True, "field": "ok"}]},
    ]}
    values = st.fixed_dictionaries({
        "street": st.one_of(st.none(), st.text(max_size=10)),
        "number": st.one_of(st.none(), _ITEM_TYPES["int32"]),
        "big": st.one_of(st.none(), _ITEM_TYPES["int64"]),
        "lat": st.one_of(st.none(), _ITEM_TYPES["float64"]),
        "geo": st.one_of(st.none(), st.fixed_dictionaries({"ok": st.one_of(st.none(), st.booleans())})),
    }).map(lambda v: Cell(v, JsonText(v), "struct"))
    return st.just(Kind("struct", "struct", schema, _types("string"), values))


# --- Plain form (no schema): inferred types --------------------------------------------------------------


def plain_ints() -> st.SearchStrategy[Kind]:
    values = _integers_with_bounds(-(2**63), 2**63 - 1).map(lambda v: Cell(v, v, "int64 bound" if abs(v) >= 2**63 - 1 else "int"))
    return st.just(Kind("plain_int", "JSON integer", None, _types("bigint"), values))


def _big_int_spark(live: Sequence[Any]) -> frozenset[str]:
    big = [v for v in live if isinstance(v, int) and not -(2**63) <= v < 2**63]
    if not big:
        return _types("bigint")
    return _types("decimal(20,0)", "decimal(38,0)") if max(len(str(abs(v))) for v in big) <= 20 else _types("decimal(38,0)")


def plain_big_ints() -> st.SearchStrategy[Kind]:
    """JSON integers beyond int64: decimal(20,0) / decimal(38,0) exactly; beyond 38 digits, dead."""

    def cell(v: int) -> Cell:
        n = len(str(abs(v)))
        if n > 38:
            return Cell(v, Dead(UNSTORABLE, f"a {n}-digit integer fits no decimal(38,0)"), "integer > 38 digits")
        return Cell(v, v, "integer beyond int64" if not -(2**63) <= v < 2**63 else "int")

    beyond = st.one_of(
        st.sampled_from((2**63, -(2**63) - 1, 2**64 - 1, 2**64, 10**20 - 1, 10**38 - 1, -(10**38) + 1, 10**38, 10**40)),
        st.integers(2**63, 10**38 - 1), st.integers(-(10**38) + 1, -(2**63) - 1), st.integers(10**38, 10**45),
    )
    values = st.one_of(beyond, beyond, st.integers(-(2**63), 2**63 - 1)).map(cell)
    return st.just(Kind("plain_big_int", "JSON integer beyond int64", None, _big_int_spark, values))


def plain_doubles() -> st.SearchStrategy[Kind]:
    """JSON numbers with a fraction or exponent: double (the nearest one; inferred, so not exact beyond it)."""

    @st.composite
    def long_decimal(draw: st.DrawFn) -> Cell:  # e.g. a NUMERIC decimal written without a schema
        digits = draw(st.integers(1, 40))
        unscaled = draw(st.integers(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)) * draw(st.sampled_from((1, -1)))
        scale = draw(st.integers(1, digits + 2))
        text = plain_decimal(unscaled, scale)
        return Cell(Raw(text), float(decimal.Decimal(text)), "long decimal number")

    @st.composite
    def exponent(draw: st.DrawFn) -> Cell:
        mantissa = draw(st.integers(-(10**17), 10**17))
        exp = draw(st.integers(-290, 290))
        text = f"{mantissa}{draw(st.sampled_from(('e', 'E')))}{draw(st.sampled_from(('', '+'))) if exp >= 0 else ''}{exp}"
        return Cell(Raw(text), float(decimal.Decimal(text)), "exponent number")

    java = st.floats(allow_nan=False, allow_infinity=False).map(lambda v: Cell(Raw(java_double_text(v)), v, "double"))
    return st.just(Kind("plain_double", "JSON number", None, _types("double"), st.one_of(java, long_decimal(), exponent())))


def plain_strings() -> st.SearchStrategy[Kind]:
    return st.just(Kind("plain_string", "JSON string", None, _types("string"), st.text(max_size=40).map(lambda v: Cell(v, v, "string"))))


def plain_booleans() -> st.SearchStrategy[Kind]:
    return st.just(Kind("plain_boolean", "JSON boolean", None, _types("boolean"), st.booleans().map(lambda v: Cell(v, v, "boolean"))))


def plain_json() -> st.SearchStrategy[Kind]:
    def kind(container: str) -> Kind:
        inner = _json_values()
        values = st.lists(inner, max_size=4) if container == "array" else st.dictionaries(st.text(max_size=6), inner, max_size=4)
        return Kind("plain_json", f"JSON {container}", None, _types("string"), values.map(lambda v: Cell(v, JsonText(v), container)))

    return st.sampled_from(("object", "array")).map(kind)


@dataclass(frozen=True)
class Family:
    name: str
    form: str  # "wrapped" | "plain"
    kinds: Callable[[], st.SearchStrategy[Kind]]


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("integers", "wrapped", integers),
        Family("float32", "wrapped", lambda: floats(32)),
        Family("float64", "wrapped", lambda: floats(64)),
        Family("float_specials", "wrapped", float_specials),
        Family("boolean", "wrapped", booleans),
        Family("string", "wrapped", strings),
        Family("bytes", "wrapped", binary),
        Family("decimal_base64", "wrapped", lambda: decimals(numeric=False, wide=False)),
        Family("decimal_numeric", "wrapped", lambda: decimals(numeric=True, wide=False)),
        Family("decimal_wide", "wrapped", lambda: decimals(numeric=None, wide=True)),
        Family("decimal_no_precision", "wrapped", decimals_without_precision),
        Family("decimal_mode_string", "wrapped", decimal_handling_string),
        Family("decimal_mode_double", "wrapped", decimal_handling_double),
        Family("variable_scale_decimal", "wrapped", variable_scale_decimals),
        Family("date", "wrapped", dates),
        Family("time", "wrapped", times),
        Family("timestamp", "wrapped", timestamps_ms),
        Family("micro_timestamp", "wrapped", micro_timestamps),
        Family("nano_timestamp", "wrapped", nano_timestamps),
        Family("zoned_timestamp", "wrapped", zoned_timestamps),
        Family("time_out_of_range", "wrapped", times_out_of_range),
        Family("semantic_string", "wrapped", semantic_strings),
        Family("array", "wrapped", arrays),
        Family("map", "wrapped", maps),
        Family("struct", "wrapped", structs),
        Family("plain_int", "plain", plain_ints),
        Family("plain_big_int", "plain", plain_big_ints),
        Family("plain_double", "plain", plain_doubles),
        Family("plain_string", "plain", plain_strings),
        Family("plain_boolean", "plain", plain_booleans),
        Family("plain_json", "plain", plain_json),
    )
}
WRAPPED = tuple(n for n, f in FAMILIES.items() if f.form == "wrapped")
PLAIN = tuple(n for n, f in FAMILIES.items() if f.form == "plain")


# --- Tables and events -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column:
    name: str
    kind: Kind


@dataclass
class Event:
    op: str  # c | u
    key: int
    cells: dict[str, Cell]  # by column name, without `id`
    before: dict[str, Cell] | None
    ts_ms: int
    position: int  # binlog pos or LSN, increasing in file order

    @property
    def dead(self) -> Dead | None:
        for cell in self.cells.values():
            if isinstance(cell.expected, Dead):
                return cell.expected
        return None

    def expected_row(self) -> dict[str, Any]:
        return {"id": self.key, **{name: cell.expected for name, cell in self.cells.items()}}


KEYS = (1, 2, 3, 4, 2**63 - 1, -(2**63))
ID_SCHEMA = {"type": "int64", "optional": False, "field": "id"}
BASE_TS_MS = 1_767_225_600_000  # 2026-01-01


@dataclass
class TableCase:
    form: str
    connector: str  # mysql | postgresql
    namespace: str
    table: str
    columns: list[Column]
    events: list[Event] = field(default_factory=list)

    @property
    def source(self) -> str:
        return f"{self.namespace}.{self.table}"

    @property
    def families(self) -> list[str]:
        return sorted({c.kind.family for c in self.columns})

    def column(self, name: str) -> Column:
        return next(c for c in self.columns if c.name == name)

    def only(self, names: Sequence[str]) -> TableCase:
        """The same events with only these columns (to find which column a failure belongs to)."""
        keep = set(names)
        events = [replace(e, cells={k: v for k, v in e.cells.items() if k in keep},
                          before=None if e.before is None else {k: v for k, v in e.before.items() if k in keep}) for e in self.events]
        return replace(self, columns=[c for c in self.columns if c.name in keep], events=events)

    # -- lines --------------------------------------------------------------------------------------
    def _image(self, cells: Mapping[str, Cell], key: int) -> dict[str, Any]:
        return {"id": key, **{name: cell.json for name, cell in cells.items()}}

    def _source(self, e: Event) -> dict[str, Any]:
        if self.connector == "mysql":
            return {"version": "2.7.3.Final", "connector": "mysql", "name": "dbserver1", "ts_ms": e.ts_ms, "snapshot": "false",
                    "db": self.namespace, "sequence": None, "table": self.table, "server_id": 223344, "gtid": None,
                    "file": "mysql-bin.000003", "pos": e.position, "row": 0, "thread": 7, "query": None}
        return {"version": "2.7.3.Final", "connector": "postgresql", "name": "dbserver1", "ts_ms": e.ts_ms, "snapshot": "false",
                "db": "postgres", "sequence": f'[null,"{e.position}"]', "schema": self.namespace, "table": self.table,
                "txId": 780 + e.position // 1000, "lsn": e.position, "xmin": None}

    def _row_schema(self) -> list[dict[str, Any]]:
        return [ID_SCHEMA] + [_field(c.kind.schema or {}, c.name, c.kind.optional) for c in self.columns]

    def _envelope_schema(self) -> dict[str, Any]:
        value = f"dbserver1.{self.namespace}.{self.table}.Value"
        if self.connector == "mysql":
            src_fields = [("string", "version"), ("string", "connector"), ("string", "name"), ("int64", "ts_ms"), ("string", "snapshot"),
                          ("string", "db"), ("string", "sequence"), ("string", "table"), ("int64", "server_id"), ("string", "gtid"),
                          ("string", "file"), ("int64", "pos"), ("int32", "row"), ("int64", "thread"), ("string", "query")]
        else:
            src_fields = [("string", "version"), ("string", "connector"), ("string", "name"), ("int64", "ts_ms"), ("string", "snapshot"),
                          ("string", "db"), ("string", "sequence"), ("string", "schema"), ("string", "table"), ("int64", "txId"),
                          ("int64", "lsn"), ("int64", "xmin")]
        source = {"type": "struct", "fields": [{"type": t, "optional": n not in ("version", "connector", "name", "ts_ms", "db", "table"), "field": n}
                                               for t, n in src_fields],
                  "optional": False, "name": f"io.debezium.connector.{self.connector}.Source", "field": "source"}
        row = self._row_schema()
        return {"type": "struct", "fields": [
            {"type": "struct", "fields": row, "optional": True, "name": value, "field": "before"},
            {"type": "struct", "fields": row, "optional": True, "name": value, "field": "after"},
            source,
            {"type": "string", "optional": False, "field": "op"},
            {"type": "int64", "optional": True, "field": "ts_ms"},
            {"type": "struct", "fields": [{"type": "string", "optional": False, "field": "id"},
                                          {"type": "int64", "optional": False, "field": "total_order"},
                                          {"type": "int64", "optional": False, "field": "data_collection_order"}],
             "optional": True, "name": "event.block", "version": 1, "field": "transaction"},
        ], "optional": False, "name": f"dbserver1.{self.namespace}.{self.table}.Envelope", "version": 1}

    def line(self, i: int) -> str:
        e = self.events[i]
        envelope = {
            "before": None if e.before is None else self._image(e.before, e.key),
            "after": self._image(e.cells, e.key),
            "source": self._source(e),
            "op": e.op,
            "ts_ms": e.ts_ms + 250,
            "transaction": None,
        }
        if self.form == "wrapped":
            return dumps({"schema": self._envelope_schema(), "payload": envelope})
        return dumps(envelope)

    def lines(self) -> list[str]:
        return [self.line(i) for i in range(len(self.events))]

    # -- the oracle's full view ------------------------------------------------------------------------
    def live_events(self) -> list[int]:
        return [i for i, e in enumerate(self.events) if e.dead is None]

    def full_view(self) -> dict[int, dict[str, Any]]:
        """Key -> expected row: the last event per key that is not dead (events are in source order)."""
        out: dict[int, dict[str, Any]] = {}
        for i in self.live_events():
            out[self.events[i].key] = self.events[i].expected_row()
        return out

    def spark_types(self) -> dict[str, frozenset[str]]:
        """Accepted Spark type per column; a plain column that never held a value has no type to check.

        Columns come from the events that land: a table none of whose events landed has no source columns
        (its every event is a dead letter, which the dead-letter checks cover)."""
        live = self.live_events()
        if not live:
            return {}
        out: dict[str, frozenset[str]] = {"id": _types("bigint")}
        for c in self.columns:
            values = [self.events[i].cells[c.name].expected for i in live if self.events[i].cells[c.name].json is not None]
            if c.kind.schema is None and not values:
                continue
            out[c.name] = c.kind.spark_types(values)
        return out


_NAME_START = string.ascii_letters
_NAME_REST = string.ascii_letters + string.digits + "_"
column_names = st.builds(lambda a, b: a + b, st.sampled_from(_NAME_START), st.text(alphabet=_NAME_REST, max_size=10)).filter(
    lambda n: n.lower() != "id"
)


@st.composite
def table_cases(
    draw: st.DrawFn,
    families: Sequence[str],
    *,
    table: str | None = None,
    min_columns: int = 1,
    max_columns: int = 3,
    min_events: int = 1,
    max_events: int = 6,
    every_family: bool = False,
    keys: Sequence[int] = KEYS,
) -> TableCase:
    """One source table whose columns come from `families` (all of one form), with its events.

    `every_family`: the first columns take each family once (so `min_columns` should be at least
    their number); `keys`: the key values events draw from (few keys, many updates).
    """
    forms = {FAMILIES[f].form for f in families}
    if len(forms) != 1:
        raise ValueError(f"families {families} mix the wrapped and the plain form")
    (form,) = forms
    connector = draw(st.sampled_from(("mysql", "postgresql")))
    names = draw(st.lists(column_names, min_size=min_columns, max_size=max_columns, unique_by=str.lower))
    columns = []
    for i, name in enumerate(names):
        family = families[i] if every_family and i < len(families) else draw(st.sampled_from(list(families)))
        kind = draw(FAMILIES[family].kinds())
        if form == "wrapped":
            kind = replace(kind, optional=draw(st.booleans()))
        columns.append(Column(name, kind))
    case = TableCase(form, connector, "inventory" if connector == "mysql" else "public", table or draw(st.sampled_from(("orders", "items", "accounts"))),
                     columns)
    n = draw(st.integers(min_events, max_events))
    keys = draw(st.lists(st.sampled_from(list(keys)), min_size=n, max_size=n))
    position = draw(st.integers(1_000, 10**9))
    last: dict[int, dict[str, Cell]] = {}
    for i, key in enumerate(keys):
        cells = {}
        for c in columns:
            null = c.kind.optional and draw(st.integers(0, 5)) == 0
            cells[c.name] = NULL if null else draw(c.kind.cells)
        position += draw(st.integers(1, 5_000))
        case.events.append(Event("u" if key in last else "c", key, cells, last.get(key), BASE_TS_MS + i * 1000, position))
        last[key] = cells
    return case
