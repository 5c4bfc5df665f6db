"""`connect_sql` against `connect_types`: each SQL conversion gives what the Python converter gives.

One table of cases per target type (a Connect declaration, a JSON value), converted by both: the
latest-state converter in Python (then cast to the column's type, as the stage casts a narrower value
into a wider column), and the SQL in one Spark query. Values the converter refuses are dead-lettered
by the stage and left out of the consistent view, so for those the SQL only has to give NULL or any
value without failing the query.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import math
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform.views import connect_sql as C
from cdc_platform.parse.envelope import loads_json
from cdc_platform.parse.json_codec import json_text
from cdc_platform.stages.latest_state.connect_types import BadValue, connect_type, infer_type, type_name

D = decimal.Decimal
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


def b64(unscaled: int, size: int | None = None) -> str:
    """Connect's Decimal bytes of an unscaled value (minimal two's complement, or `size` bytes)."""
    n = size or max(1, (unscaled.bit_length() + 8) // 8)
    return base64.b64encode(unscaled.to_bytes(n, "big", signed=True)).decode()


def decimal_decl(scale: int, precision: int | None = None) -> dict[str, Any]:
    params: dict[str, str] = {"scale": str(scale)}
    if precision is not None:
        params["connect.decimal.precision"] = str(precision)
    return {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": params}


VSD = {"type": "struct", "name": "io.debezium.data.VariableScaleDecimal"}
UNSCALED = [0, 1, -1, 5, -5, 127, 128, -128, -129, 255, 256, -256, 150, 10**17, -(10**17), 2**63, -(2**63) - 1,
            10**37 + 12345, -(10**37) - 1, 10**45 + 7, -(10**60) - 3]

# (case name, declaration or None, JSON value, target Spark type)
Case = tuple[str, dict[str, Any] | None, Any, str]


def cases() -> list[Case]:
    out: list[Case] = []
    for scale in (0, 2, 5, -2):
        for u in UNSCALED:
            target = type_name(connect_type(decimal_decl(scale, 38)).dtype)
            if abs(u) < 10**36:
                out.append((f"decimal({scale}) {u}", decimal_decl(scale, 38), b64(u), target))
            out.append((f"wide decimal({scale}) {u}", decimal_decl(scale, 70), b64(u), "string"))
        out.append((f"padded decimal({scale})", decimal_decl(scale, 10), b64(-3, size=6), type_name(connect_type(decimal_decl(scale, 10)).dtype)))
    for number in (1, -1, 0, D("1.5"), D("-12.25"), 10**20):
        out.append((f"numeric decimal {number}", decimal_decl(2, 30), number, "decimal(30,2)"))
        out.append((f"numeric wide decimal {number}", decimal_decl(2, 60), number, "string"))
    for number, scale in ((D("-99999999999999.9999999999999999999999"), 24), (D("1.25"), 1), (None, 3)):
        out.append((f"numeric wide decimal {number} at scale {scale}", decimal_decl(scale, 41), number, "string"))
    for number in (D("-1E-27"), D("1.23456789012345678901E-7"), D("12.5E+3"), D("9" * 30 + ".5")):
        out.append((f"numeric decimal {number} read as a double by VARIANT", decimal_decl(27, 38), number, "decimal(38,27)"
                    if number < 10**11 else "decimal(38,1)"))
    out.append(("decimal widened into a wider column", decimal_decl(2, 10), b64(12345), "decimal(20,4)"))
    out.append(("int widened into a decimal column", {"type": "int64"}, 123, "decimal(23,4)"))
    out.append(("schemaless big integer", None, 2**64 - 1, "decimal(20,0)"))
    for u in UNSCALED:
        for scale in (0, 3, -3):
            out.append((f"variable scale {u} e-{scale}", VSD, {"scale": scale, "value": b64(u)}, "string"))
    for scale in (100_000, -100_000, 100_001, 2**31 - 1, -(2**31)):  # the bound, and a corrupt scale: no text of 2 GB
        out.append((f"variable scale 7 e-{scale}", VSD, {"scale": scale, "value": b64(7)}, "string"))
    for name, unit in (("org.apache.kafka.connect.data.Timestamp", 10**3), ("io.debezium.time.Timestamp", 10**3),
                       ("io.debezium.time.MicroTimestamp", 10**6), ("io.debezium.time.NanoTimestamp", 10**9)):
        for seconds in (0, 1_700_000_000, -1, -86_400 * 365 * 500):
            for frac in (0, 1, 999, unit // 3):
                value = seconds * unit + (frac if unit > 1 else 0)
                if -(2**63) <= value < 2**63:
                    out.append((f"{name} {value}", {"type": "int64", "name": name}, value, "timestamp"))
        out.append((f"{name} -1", {"type": "int64", "name": name}, -1, "timestamp"))
        out.append((f"{name} out of range", {"type": "int64", "name": name}, 2**62, "timestamp"))
    zoned = {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}
    for text in ("2024-01-01T10:00:00Z", "2024-01-01T10:00:00.123456789+05:30", "1969-12-31T23:59:59.999999-01:00",
                 "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "2024-01-01T10:00:00", "2024-06-01T00:00:00.5-00:00:30",
                 "0001-01-01T00:10:00+01:00"):
        out.append((f"zoned {text}", zoned, text, "timestamp"))
    for name in ("org.apache.kafka.connect.data.Date", "io.debezium.time.Date"):
        for days in (0, -1, 19_700, C.MIN_DAYS, C.MAX_DAYS, C.MAX_DAYS + 1):
            out.append((f"{name} {days}", {"type": "int32", "name": name}, days, "date"))
    for raw in (b"", b"\x00", b"\xff\xfe", "é".encode(), bytes(range(256))):
        out.append((f"bytes {raw[:4]!r}", {"type": "bytes"}, base64.b64encode(raw).decode(), "binary"))
    for value in (1.5, -0.0, 1e300, "NaN", "Infinity", "-Infinity", 3, 0.1):
        out.append((f"float64 {value}", {"type": "float64"}, value, "double"))
        out.append((f"float32 {value}", {"type": "float32"}, value, "float"))
    for base, target in (("int8", "tinyint"), ("int16", "smallint"), ("int32", "int"), ("int64", "bigint")):
        out.append((f"{base}", {"type": base}, -5, target))
    out.append(("int32 widened to bigint", {"type": "int32"}, 2**31 - 1, "bigint"))
    out.append(("boolean", {"type": "boolean"}, True, "boolean"))
    out.append(("schemaless double", None, 2.5, "double"))
    out.append(("schemaless integer", None, 2**62, "bigint"))
    out.append(("string", {"type": "string"}, "a 'quoted' é", "string"))
    out.append(("json string", {"type": "string", "name": "io.debezium.data.Json"}, '{"a": 1}', "string"))
    out.append(("struct as JSON text", {"type": "struct"}, {"b": 1, "a": [True, None, "x"]}, "string"))
    out.append(("schemaless object", None, {"k": "v"}, "string"))
    return out


def python_value(decl: dict[str, Any] | None, value: Any, target: str) -> Any:
    """What the latest state stores, or BadValue's code when it dead-letters the event."""
    value = loads_json(json_text({"c": value}))["c"]  # as the stage reads it from the raw log's image
    ftype = connect_type(decl) if decl else None
    ftype = ftype or infer_type(value)
    assert ftype is not None
    try:
        converted = ftype.convert(value)
    except BadValue as exc:
        return BadValue(exc.code)
    if isinstance(converted, dt.datetime):
        return (converted - EPOCH) // dt.timedelta(microseconds=1)
    if isinstance(converted, dt.date):
        return (converted - EPOCH.date()).days
    if type_name(ftype.dtype) == target:
        return pa.array([converted], ftype.dtype).to_pylist()[0]  # as the stage builds its Arrow column
    arrow = {"decimal(20,4)": pa.decimal128(20, 4), "decimal(23,4)": pa.decimal128(23, 4), "decimal(20,0)": pa.decimal128(20, 0), "bigint": pa.int64()}[target]
    return pa.array([converted], ftype.dtype).cast(arrow).to_pylist()[0]


def sql_values(spark: Any, group: list[Case]) -> list[Any]:
    """Each case's value through `connect_sql`: one query per target type over rows of (image, row schema)
    that hold the value as column `c` (one column per query: a projection of hundreds is slow to compile)."""
    out: list[Any] = [None] * len(group)
    by_target: dict[str, list[int]] = {}
    for i, case in enumerate(group):
        by_target.setdefault(case[3], []).append(i)
    for target, indexes in sorted(by_target.items()):
        rows = []
        for i in indexes:
            _, decl, value, _t = group[i]
            schema = None if decl is None else json_text({"type": "struct", "fields": [{**decl, "field": "c"}]})
            rows.append((i, json_text({"c": value}), schema))
        spark.createDataFrame(rows, "i int, after string, row_schema string").createOrReplaceTempView("cases")
        expr = C.value_sql(target, "r._row.`c`", C.declaration("r.__decls.fields", "c"), "r.after", "c")
        # Timestamps and dates as integers: pyspark's conversion to datetime fails near the year 1.
        expr = f"unix_micros({expr})" if target == "timestamp" else f"unix_date({expr})" if target == "date" else expr
        for r in spark.sql(f"""SELECT i, {expr} AS v FROM (SELECT i, after, from_json(after, '{C.row_struct({"c": target})}') AS _row,
                              from_json(row_schema, '{C.ROW_SCHEMA}') AS __decls FROM cases) r""").collect():
            out[r["i"]] = r["v"]
    return out


def same(expected: Any, actual: Any) -> bool:
    if isinstance(expected, float) and isinstance(actual, float):
        return (math.isnan(expected) and math.isnan(actual)) or (expected == actual and math.copysign(1, expected) == math.copysign(1, actual))
    if isinstance(actual, bytearray):
        actual = bytes(actual)
    return type(expected) is type(actual) and expected == actual


def test_every_conversion_gives_what_the_latest_state_stores(spark: Any) -> None:
    group = cases()
    failures = []
    refused = 0
    for (name, decl, value, target), got in zip(group, sql_values(spark, group)):
        want = python_value(decl, value, target)
        if isinstance(want, BadValue):
            refused += 1
        elif not same(want, got):
            failures.append(f"{name} as {target}: Python {want!r}, SQL {got!r}")
    assert not failures, "\n".join(failures)
    assert refused >= 4, "some cases are out of range, refused by Python (so dead-lettered)"


def test_a_wide_numeric_decimal_read_as_a_double_is_null_a_known_gap(spark: Any) -> None:
    """decimal.format=NUMERIC writes a Decimal as a JSON number; in a column wider than 38 digits, one that
    Spark's VARIANT reads as a double (more than 38 digits, or an exponent) cannot be shown exactly, so the
    consistent view shows NULL (the full view has it). See `connect_sql._quantized`."""
    group: list[Case] = [("41 digits", decimal_decl(27, 41), D("-99999999999999.999999999999999999999999999"), "string"),
                         ("an exponent", decimal_decl(27, 41), D("-1E-27"), "string")]
    assert [python_value(*case[1:]) for case in group] == ["-99999999999999.999999999999999999999999999", "-0.000000000000000000000000001"]
    assert sql_values(spark, group) == [None, None]


def test_out_of_range_times_are_null_not_a_failed_query(spark: Any) -> None:
    """A value the latest state refuses is dead-lettered there; the SQL must not fail the whole view on it."""
    group: list[Case] = [
        ("ms", {"type": "int64", "name": "io.debezium.time.Timestamp"}, 2**62, "timestamp"),
        ("zoned year 0", {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, "0001-01-01T00:10:00+01:00", "timestamp"),
        ("days", {"type": "int32", "name": "io.debezium.time.Date"}, 2**31 - 1, "date"),
        ("bad base64", decimal_decl(2, 10), "@@", "decimal(10,2)"),
        ("bad bytes", {"type": "bytes"}, "@@", "binary"),
    ]
    assert sql_values(spark, group) == [None] * len(group)


@pytest.mark.parametrize("zone", ["UTC", "America/Los_Angeles"])
def test_a_zoned_text_without_offset_is_utc_whatever_the_sessions_zone(spark: Any, zone: str) -> None:
    case: Case = ("no offset", {"type": "string", "name": "io.debezium.time.ZonedTimestamp"}, "2024-01-01T10:00:00", "timestamp")
    old = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        (micros,) = sql_values(spark, [case])
    finally:
        spark.conf.set("spark.sql.session.timeZone", old)
    assert micros == (dt.datetime(2024, 1, 1, 10, tzinfo=dt.timezone.utc) - EPOCH) // dt.timedelta(microseconds=1)


def test_a_scale_beyond_the_bound_is_refused_not_a_text_of_that_length(spark: Any) -> None:
    """A corrupt VariableScaleDecimal scale of two billion would be a 2 GB text: both sides refuse a scale past
    `MAX_TEXT_SCALE` (the stage dead-letters the event, the view shows NULL), and write one at the bound."""
    from cdc_platform.stages.latest_state.connect_types import MAX_TEXT_SCALE

    group: list[Case] = [("corrupt", VSD, {"scale": 2**31 - 1, "value": b64(7)}, "string"),
                         ("past the bound", VSD, {"scale": -(MAX_TEXT_SCALE + 1), "value": b64(7)}, "string"),
                         ("at the bound", VSD, {"scale": -MAX_TEXT_SCALE, "value": b64(7)}, "string")]
    refused = [python_value(*case[1:]) for case in group[:2]]
    assert all(isinstance(r, BadValue) and str(r) == "out_of_range" for r in refused)  # `python_value` gives the code
    assert sql_values(spark, group) == [None, None, "7" + "0" * MAX_TEXT_SCALE]
