"""Row images of the raw log typed in Spark SQL, value for value as the latest state types them.

Why this exists: a `<name>__consistent_view` reads the raw log as of the consistency watermark, so it
must type each event's JSON row image itself, in SQL: the same views are persistent views in `cdc
serve`'s catalog, which cannot call Python. Typing the columns from JSON samples, as it once did, showed
a Connect Decimal as its base64 text ("Cg==" where the full view shows 1.0) and a timestamp as a count
of microseconds.

What it does not decide: the type a column gets. That is the latest-state table's column type (from
`latest_state.connect_types`, the one mapping, and its widening rules); callers pass it in as the
Spark name `connect_types.type_name` gives it. This module only turns one JSON value into that type,
following the converters of `connect_types` rule for rule, with the Connect names, units and ranges
imported from there; `tests/cdc_platform/test_connect_sql.py` runs both over the same values.

Each value is converted by what its own event declared (`row_schema`, the Connect schema of the row),
not by what the column is now: after a schema change older events keep their own decimal scale or
timestamp unit. Values the Python converters refuse are dead-lettered by the latest-state stage, and
the consistent view leaves those events out; every conversion here still uses `try_` forms, so such a
value is NULL rather than a failed query.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping

from cdc_platform.lake import quote_identifier as q
from cdc_platform.lake.lake_spark import sql_string
from cdc_platform.stages.latest_state.connect_types import _DECIMAL, _EPOCH_TIMESTAMPS, _VARIABLE_SCALE_DECIMAL, _ZONED_TIMESTAMP
from cdc_platform.stages.unavailable import placeholder_forms

#: The part of a Connect struct schema (`raw_change_events.row_schema`) the conversions read.
ROW_SCHEMA = "STRUCT<fields: ARRAY<STRUCT<field: STRING, type: STRING, name: STRING, parameters: MAP<STRING, STRING>>>>"
#: The declaration of a column whose conversion does not depend on one (`needs_declaration`).
NULL_DECL = "CAST(NULL AS STRUCT<type: STRING, name: STRING, parameters: MAP<STRING, STRING>>)"

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_US = dt.timedelta(microseconds=1)
#: Microseconds and days since 1970 of the years 1 to 9999, the range Python's datetime (and so the latest state) holds.
MIN_MICROS = (dt.datetime(1, 1, 1, tzinfo=dt.timezone.utc) - _EPOCH) // _US
MAX_MICROS = (dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=dt.timezone.utc) - _EPOCH) // _US
MIN_DAYS = (dt.date(1, 1, 1) - dt.date(1970, 1, 1)).days
MAX_DAYS = (dt.date(9999, 12, 31) - dt.date(1970, 1, 1)).days

_INTEGERS = ("tinyint", "smallint", "int", "bigint")


def extracted_type(spark_type: str) -> str:
    """How `from_json` should read a column of `spark_type`.

    A text column as STRING: a string's characters, or an object's or array's JSON text, which is what
    the latest state stores. A float column also as STRING: the text of the double JSON's number is (its
    sign kept for -0.0, which a VARIANT's decimal loses), or the converter's "NaN" and "Infinity".
    Every other column as VARIANT, which keeps what JSON said: a string or a number (a Decimal arrives
    as either), and decimal numbers digit for digit.
    """
    return "STRING" if spark_type in ("string", "double", "float") else "VARIANT"


def row_struct(columns: Mapping[str, str]) -> str:
    """The `from_json` schema (as a DDL string) of a row image with these columns: name -> Spark type."""
    return "STRUCT<" + ", ".join(f"{q(name)}: {extracted_type(kind)}" for name, kind in columns.items()) + ">"


def needs_declaration(spark_type: str) -> bool:
    """Whether a column's values convert differently by their Connect declaration (a decimal's scale, a
    timestamp's unit, a text column's VariableScaleDecimal): only those columns read `row_schema`."""
    return spark_type in ("string", "timestamp") or spark_type.startswith("decimal")


def declaration(fields: str, column: str) -> str:
    """The Connect field an event declares for `column` (a struct of type, name, parameters), or NULL,
    from `fields`, the event's `from_json(row_schema, ROW_SCHEMA).fields`."""
    return f"try_element_at(filter({fields}, __x -> __x.field = {sql_string(column)}), 1)"


def placeholder_possible(spark_type: str) -> bool:
    """Whether Debezium's unavailable-value placeholder can stand in a column of this type: only values
    PostgreSQL may store out of line (TOAST: text, json, arrays, bytea, numeric) are ever left out of an
    update, and they arrive as text, base64 or a Decimal's base64; fixed-width types never do."""
    return spark_type in ("string", "binary") or spark_type.startswith("decimal")


def raw_text(spark_type: str, value: str) -> str:
    """The value as text, for recognising the placeholder's forms before any conversion."""
    return value if extracted_type(spark_type) == "STRING" else f"try_variant_get({value}, '$', 'string')"


def both_images_sql(spark_type: str, column: str, decl: str) -> str:
    """`column` typed from both row images of an event, as an array (`[0]` its `after`, `[1]` its `before`).

    Reads the relation's `_row` and `_before` (the images as `row_struct` extracted them) and `after` and
    `before` (their JSON text). One expression over the pair, not `value_sql` twice: the conversions are long
    SQL, and Spark analyses and optimises every copy of them on each query of a view.
    """
    return (f"transform(array(named_struct('v', _row.{q(column)}, 'i', after), named_struct('v', _before.{q(column)}, 'i', before)), "
            f"__img -> {value_sql(spark_type, '__img.v', decl, '__img.i', column)})")


@functools.cache
def _placeholder_texts() -> str:
    scalars, shaped = placeholder_forms()
    return ", ".join(sql_string(f) for f in sorted(scalars | shaped))


def known_sql(spark_type: str, now_text: str, old_text: str, now: str, old: str, forgotten: str) -> str:
    """A placeholder column's known value as a struct `{v}`, by the latest-state rules (`stages.unavailable`):
    the event's own value unless it is Debezium's placeholder, else its `before` image's (REPLICA IDENTITY
    FULL), else NULL (the caller then takes the key's newest earlier known value); `{v: NULL}` when
    `forgotten` (a delete forgets the values before it).

    `now_text`/`old_text` are the two images' values as extracted (`raw_text` makes them text), `now`/`old`
    the same values typed.
    """
    now_text, old_text, forms = raw_text(spark_type, now_text), raw_text(spark_type, old_text), _placeholder_texts()
    return (f"CASE WHEN {forgotten} THEN named_struct('v', CAST(NULL AS {spark_type})) "
            f"WHEN {now_text} IS NULL OR {now_text} NOT IN ({forms}) THEN named_struct('v', {now}) "
            f"WHEN {old_text} IS NOT NULL AND {old_text} NOT IN ({forms}) THEN named_struct('v', {old}) END")


def value_sql(spark_type: str, value: str, decl: str, image: str, column: str) -> str:
    """SQL for one column's value in `spark_type`, as `connect_types` converts it for the latest state.

    `value` is the column as `row_struct` extracted it, `decl` the event's `declaration` of the column
    (or NULL), `image` the row image's JSON text, read again only for a Decimal the VARIANT cannot give
    exactly (a number it holds as a double) or in a text column (which needs to know whether JSON sent
    a string or a number).
    """
    if spark_type == "string":
        return _text(value, decl, image, column)
    if spark_type in _INTEGERS or spark_type == "boolean":
        return f"try_variant_get({value}, '$', {sql_string(spark_type)})"
    if spark_type == "double":
        return f"try_cast({value} AS DOUBLE)"
    if spark_type == "float":
        return f"CAST(try_cast({value} AS DOUBLE) AS FLOAT)"  # through a double, as Python rounds
    if spark_type.startswith("decimal"):
        scale = _scale(decl)
        base64 = f"try_cast({_plain(_string(value), scale)} AS {spark_type})"
        # A number the VARIANT holds as a double (written with an exponent, or of more than 38 digits) is read
        # again from the image's text straight into the decimal, digit for digit.
        exact = f"from_json({image}, {sql_string(f'STRUCT<{q(column)}: {spark_type}>')}).{q(column)}"
        return (f"CASE WHEN schema_of_variant({value}) = 'STRING' AND {_named(decl, _DECIMAL, 'bytes')} THEN {base64} "
                f"WHEN schema_of_variant({value}) = 'DOUBLE' THEN {exact} "
                f"ELSE try_variant_get({value}, '$', {sql_string(spark_type)}) END")
    if spark_type == "date":
        days = f"try_variant_get({value}, '$', 'bigint')"
        return f"CASE WHEN {days} BETWEEN {MIN_DAYS} AND {MAX_DAYS} THEN date_from_unix_date(CAST({days} AS INT)) END"
    if spark_type == "timestamp":
        return _timestamp(value, decl)
    if spark_type == "binary":
        return f"try_to_binary({_string(value)}, 'base64')"
    return f"CAST(NULL AS {spark_type})"  # no other type comes out of connect_types


def _string(value: str) -> str:
    return f"try_variant_get({value}, '$', 'string')"


def _named(decl: str, name: str, base: str) -> str:
    return f"coalesce({decl}.name = {sql_string(name)} AND {decl}.type = {sql_string(base)}, false)"


def _scale(decl: str) -> str:
    """The declared scale (a Connect Decimal's parameter; 0 when not given, as `connect_types` reads it)."""
    return f"CAST(coalesce(try_element_at({decl}.parameters, 'scale'), '0') AS INT)"


def _let(value: str, body: str, name: str = "__v") -> str:
    """`body` with `name` bound to `value`, evaluated once (a value read again from the image, or a Java call,
    which Spark does not share between copies)."""
    return f"element_at(transform(array({value}), {name} -> {body}), 1)"


#: The JVM class (jvm/parser/, in every session's `spark.jars`) that writes a Connect decimal as exact text: `cdc serve`'s
#: Spark Connect and JDBC sessions load it too (`test_serve.py` queries the views' SQL through both).
DECIMAL_CLASS = "cdc.platform.views.ConnectDecimal"


def _plain(base64: str, scale: str) -> str:
    """A Connect Decimal's unscaled value (big-endian two's complement bytes in base64) at `scale`, as Python's
    `format(Decimal(unscaled).scaleb(-scale), 'f')` writes it: of any length (a VariableScaleDecimal, a 60-digit
    numeric), so not through Spark's 38-digit decimals. A static Java method (`ConnectDecimal.plain`) through
    `try_reflect`, not SQL: written in SQL it was ~2 KB per column, which Spark analysed and optimised on every
    query of a view (a point lookup on a full view spent 0.15-0.2 s of its ~1 s planning them)."""
    return _decimal_call("plain", base64, scale)


def _decimal_call(method: str, *args: str) -> str:
    """A call of `ConnectDecimal.<method>` on these SQL arguments: NULL where it refuses the value (`try_reflect`)."""
    return f"try_reflect('{DECIMAL_CLASS}', '{method}', {', '.join(args)})"


def _text(value: str, decl: str, image: str, column: str) -> str:
    """A text column: the string or JSON text as extracted, except the two decimals `connect_types`
    keeps as exact text: a VariableScaleDecimal `{scale, value}`, and a Decimal wider than 38 digits,
    whose JSON form (base64 string or number) is read again from the image as a VARIANT."""
    # The image read again as a VARIANT, bound once (`__j`) in each branch that needs it.
    variant = f"from_json({image}, {sql_string(f'STRUCT<{q(column)}: VARIANT>')}).{q(column)}"
    vsd = _plain("try_variant_get(__j, '$.value', 'string')", "try_variant_get(__j, '$.scale', 'int')")
    scale = _scale(decl)
    wide = (f"CASE WHEN schema_of_variant(__j) = 'STRING' THEN {_plain(_string('__j'), scale)} "
            f"ELSE {_quantized('__j', f'greatest({scale}, 0)')} END")
    return (f"CASE WHEN {value} IS NULL THEN NULL WHEN {_named(decl, _VARIABLE_SCALE_DECIMAL, 'struct')} THEN {_let(variant, vsd, name='__j')} "
            f"WHEN {_named(decl, _DECIMAL, 'bytes')} THEN {_let(variant, wide, name='__j')} ELSE {value} END")


def _quantized(variant: str, scale: str) -> str:
    """A Decimal sent as a JSON number (decimal.format=NUMERIC) as exact text with `scale` digits after
    the point, as Python's `quantize` and `format` write it; NULL where that would drop a digit (Python
    refuses the value; `ConnectDecimal.quantized`). The number is read from the VARIANT, which holds a
    plain number of up to 38 digits exactly and any other (more digits, or an exponent, as the raw log
    writes 1E-27) as a double: such a value is NULL here, a known gap (the full view has its digits).
    Spark reads a JSON number exactly only into a decimal of a scale fixed in the query, which a column
    wider than Spark's decimals does not have; the gap needs both the non-default decimal.format=NUMERIC
    and a column of more than 38 digits."""
    return (f"CASE WHEN schema_of_variant({variant}) = 'DOUBLE' THEN NULL "
            f"ELSE {_decimal_call('quantized', _string(variant), scale)} END")


def _timestamp(value: str, decl: str) -> str:
    """Epoch numbers by their declared unit (floored to the microsecond), ISO-8601 text (ZonedTimestamp)
    to the instant it names; a text without an offset is UTC, as Python reads it, whatever the session's zone.

    The unit is looked up by the declared name in one map literal, and the number scaled in exact decimal
    arithmetic (no overflow, `floor` as Python's `//`), not a branch per unit with its own range checks: each
    timestamp column's SQL is analysed and optimised on every query of a view, so its length is a lookup's time."""
    n = f"try_variant_get({value}, '$', 'bigint')"
    units = ", ".join(f"{sql_string(name)}, {unit_ns}L" for name, unit_ns in sorted(_EPOCH_TIMESTAMPS.items()))
    unit = f"try_element_at(map({units}), {decl}.name)"
    epoch = f"WHEN coalesce({decl}.type = 'int64', false) THEN floor(CAST({n} AS DECIMAL(20,0)) * {unit} / 1000)"
    text = _string(value)
    zoned = f"unix_micros(try_cast(IF({text} RLIKE '[T ].*(Z|[+-][0-9:]+)$', {text}, concat({text}, 'Z')) AS TIMESTAMP))"
    micros = f"CASE {epoch} WHEN {_named(decl, _ZONED_TIMESTAMP, 'string')} THEN {zoned} END"
    return _let(micros, f"IF(__v BETWEEN {MIN_MICROS} AND {MAX_MICROS}, timestamp_micros(CAST(__v AS BIGINT)), NULL)")
