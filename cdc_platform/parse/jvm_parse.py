"""The envelope parser on Spark's executors, in the JVM: each line's PARSED row from jvm/parser/.

`jvm/parser/` (Java, built by `make setup`, loaded by every session) is a port of `envelope.parse_bytes`
that gives the same rows byte for byte - kinds, event identities (the same BLAKE2b-128 of the same
canonical JSON: an existing lake needs no upgrade), table ids, positions, row-image texts, reason codes
and texts, times and dates. It runs as a Spark function of each line's bytes and Kafka key, so a line
never leaves the JVM: no Arrow batch to Python and back, no Python object per JSON value. The Python
module stays the reference of the rules and the tests' oracle (tests/cdc_platform/test_jvm_parse.py
holds the two to the same rows); `parse_spark.parse_lines` runs it instead when the session's
`spark.cdc.parser` is `python`.

The function returns a struct of the row's parsed fields; the columns the input already has (the source
file, the Kafka origin, the line itself unless it had to be rewritten) come from the input, and Spark turns
the function's epoch microseconds and days into timestamps and dates.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from cdc_platform.errors import EnvironmentNotReadyError
from cdc_platform.lake import schemas
from cdc_platform.lake.lake_spark import spark_schema
from cdc_platform.lake.schemas import KAFKA_ORIGIN_COLUMNS, RECORD_KEY_COLUMN, REJECT_CODE, REJECT_REASON
from cdc_platform.parse.envelope import KeySpec

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: The Java class whose `parse(value, key, keySpecJson)` builds the function's column.
ENTRY = "cdc.platform.parse.SparkParse"
#: The function's fields whose PARSED column Spark derives: (field, conversion), the rest are taken as they are.
_TIMES = {"source_ts": "source_ts_us", "envelope_ts": "envelope_ts_us", "marker_ts": "marker_ts_us"}
_DATES = {"event_date": "event_day", "marker_date": "marker_day"}
_PARSED = "_parsed"


def key_spec_json(keys: KeySpec) -> str:
    """The key spec as the Java parser takes it: `{"<table id>": ["col", ...]}`."""
    return json.dumps({table: list(cols) for table, cols in keys.keys_by_source.items()}, sort_keys=True)


def parse_column(lines: DataFrame, keys: KeySpec) -> Column:
    """The struct column of each line's parse (value and Kafka key as bytes: invalid UTF-8 is the parser's to find).

    A record the source rejected (`schemas.REJECT_CODE`, with `REJECT_REASON`) is not parsed: the function gives its
    dead letter, with that code and reason (`parse_rows` adds its value, base64, as the line)."""
    from pyspark.sql import functions as F
    from pyspark.sql.classic.column import Column

    value = F.col("value").cast("binary")
    key = F.col(RECORD_KEY_COLUMN).cast("binary") if RECORD_KEY_COLUMN in lines.columns else F.lit(None).cast("binary")
    none = F.lit(None).cast("string")
    code = F.col(REJECT_CODE).cast("string") if REJECT_CODE in lines.columns else none
    reason = F.col(REJECT_REASON).cast("string") if REJECT_REASON in lines.columns else none
    from cdc_platform.spark.session import jvm_class

    entry = jvm_class(lines.sparkSession, ENTRY)
    if entry is None:
        raise EnvironmentNotReadyError(f"the envelope parser ({ENTRY}) is not loaded in this Spark session: run `make setup`")
    return Column(entry.parse(value._jc, key._jc, code._jc, reason._jc, key_spec_json(keys)))


def parse_rows(lines: DataFrame, keys: KeySpec) -> DataFrame:
    """Lines in `sources.py`'s column contract -> `PARSED` rows, one per line, in the lines' order and partitions.

    A record the source rejected (`schemas.REJECT_CODE`: an Avro record it could not decode) is not parsed: it
    is a dead letter with the source's code and reason, its value (base64) as the line, as the Python parser
    makes it (`parsed_batches.parse_arrow_batches`). The Java function makes that dead letter (`parse_column`), so
    the columns here are the same expressions whether a source rejects records or not: a `CASE` per column on the
    reject code made the generated method of an Avro batch's decode and parse too large for HotSpot to compile."""
    from pyspark.sql import functions as F

    names = lines.columns
    kept = ("value", "source_file", *KAFKA_ORIGIN_COLUMNS)
    parsed = lines.select(parse_column(lines, keys).alias(_PARSED), *[c for c in kept if c in names])
    columns = []
    for field in spark_schema(schemas.PARSED).fields:
        name = field.name
        if name in KAFKA_ORIGIN_COLUMNS:
            column = F.col(name).cast(field.dataType) if name in names else F.lit(None).cast(field.dataType)
        elif name == "source_file":
            column = F.col("source_file")
        elif name == "line":  # rewritten only for a line that is not UTF-8 (and "" for a null value); a rejected record's value
            column = F.coalesce(F.col(f"{_PARSED}.line"), F.col("value"))
        elif name in _TIMES:
            column = F.timestamp_micros(F.col(f"{_PARSED}.{_TIMES[name]}"))
        elif name in _DATES:
            column = F.date_from_unix_date(F.col(f"{_PARSED}.{_DATES[name]}"))
        else:
            column = F.col(f"{_PARSED}.{name}")
        columns.append(column.cast(field.dataType).alias(name))
    return parsed.select(*columns)
