"""The Outbox Event Router's routed records as raw-log rows, in Spark expressions beside the envelope parse.

A routed record is not a Debezium change event: the Event Router SMT (`io.debezium.transforms.outbox.EventRouter`)
replaces the envelope with the outbox row's payload (the record's value), keys the record by the aggregate id,
puts the event id in the header `id` and other columns where `table.fields.additional.placement` says (the
event type in a header, here `outbox.router.type_header`), and routes it to a topic per aggregate type
(`outbox.event.<aggregatetype>`). Neither parser takes it, and it needs no parser: each field is one Spark
expression over the record's columns, so the records of `outbox.topics` are turned into `PARSED` change rows
here and the envelope parser (JVM or Python) takes every other record, unchanged (`parse_spark.parse_lines`).

What a routed record becomes in the raw log:

| raw-log column | from |
|---|---|
| `table_id` | `__outbox.<topic>` (never a real source's: `__` prefix) |
| `op` | `c`: the router routes the outbox's inserts only |
| `after` | a JSON object with the outbox's configured column names: id (header), aggregate type (a header, else the topic's last `.` part), aggregate id (the key), type (header), payload (the value), timestamp and additional fields (headers of their names) |
| `position`, `position_kind` | `<partition, 10 digits>/<offset, 20 digits>`, `kafka_offset`: the router keys by aggregate id, so one aggregate's events are in one partition and this order is theirs |
| `source_ts` | the record's timestamp (the router sets it from the outbox row, `table.field.event.timestamp`, or the change's time) |
| `event_id` | a hash of topic, key, value and headers: a connector that sends the record again (a restart) lands it once |
| `transaction_id` | NULL: the router drops the envelope and its transaction block (the consistency check reads the outbox table's own events) |

Keys, values and headers may be written by the JSON converter with schemas (`{"schema": ..., "payload": ...}`),
without them (a JSON string or object), or as plain text (Connect's `SimpleHeaderConverter`, the default for
headers): `unwrapped` takes the text out of each. Records with a null value (tombstones) are left to the
parser, which counts them as tombstones.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc_platform.config_outbox import ROUTED_PREFIX, OutboxConfig
from cdc_platform.lake import schemas
from cdc_platform.sources.streams import HEADERS_COLUMN, TIMESTAMP_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

POSITION_KIND = "kafka_offset"
CONNECTOR = "outbox_router"


def unwrapped(text: Column) -> Column:
    """The text inside a converter's output: the JSON converter's `payload` when wrapped with its schema, a JSON
    string's content, other JSON as its text, and text that is no JSON (a plain header) as it is."""
    from pyspark.sql import functions as F

    v = F.try_parse_json(text)
    wrapped = F.try_variant_get(v, "$.schema", "variant").isNotNull() & F.try_variant_get(v, "$.payload", "variant").isNotNull()
    return (F.when(v.isNull(), text)
            .when(wrapped, F.try_variant_get(v, "$.payload", "string"))
            .otherwise(F.try_variant_get(v, "$", "string")))


def header(name: str) -> Column:
    """The last header of that name, unwrapped; NULL when the record has none."""
    from pyspark.sql import functions as F

    found = F.filter(F.col(HEADERS_COLUMN), lambda h: h["key"] == F.lit(name))
    return unwrapped(F.try_element_at(found, F.lit(-1))["value"].cast("string"))


def is_routed(outbox: OutboxConfig | None, columns: list[str]) -> Column | None:
    """Which records of a batch are routed outbox records (a value on one of `outbox.topics`); None: none can be."""
    from pyspark.sql import functions as F

    if outbox is None or not outbox.topics or HEADERS_COLUMN not in columns:
        return None
    return F.col("kafka_topic").isin(list(outbox.topics)) & F.col("value").isNotNull()


def routed_rows(records: DataFrame, outbox: OutboxConfig) -> DataFrame:
    """Routed records -> `PARSED` change rows (module doc), in their input order and partitioning."""
    from pyspark.sql import functions as F

    cols, router = outbox.columns, outbox.router
    topic = F.col("kafka_topic")
    aggregate_type = header(router.aggregate_type_header) if router.aggregate_type_header else F.try_element_at(F.split(topic, r"\."), F.lit(-1))
    fields: list[tuple[str, Column]] = [
        (cols.id, header(router.id_header)),
        (cols.aggregate_type, aggregate_type),
        (cols.aggregate_id, unwrapped(F.col(schemas.RECORD_KEY_COLUMN))),
        (cols.type, header(router.type_header)),
        (cols.payload, unwrapped(F.col("value"))),
        *([(cols.timestamp, header(cols.timestamp))] if cols.timestamp else []),
        *[(c, header(c)) for c in cols.additional],
    ]
    after = F.to_json(F.create_map(*[part for name, value in fields for part in (F.lit(name), value)]))
    headers_text = F.to_json(F.map_from_entries(F.transform(F.coalesce(F.col(HEADERS_COLUMN), F.array()),
                                                            lambda h: F.struct(h["key"], h["value"].cast("string")))))
    identity = F.concat_ws("\u0001", F.lit(CONNECTOR), topic, F.coalesce(F.col(schemas.RECORD_KEY_COLUMN), F.lit("")), F.col("value"), headers_text)
    ts = F.col(TIMESTAMP_COLUMN)
    line = F.to_json(F.struct(F.col(schemas.RECORD_KEY_COLUMN).alias("key"), F.col("value").alias("value"), F.from_json(headers_text, "map<string,string>").alias("headers")))
    values: dict[str, Column] = {
        "kind": F.lit("change"),
        "event_id": F.substring(F.sha2(identity, 256), 1, 32),
        "table_id": F.concat(F.lit(ROUTED_PREFIX), topic),
        "source_connector": F.lit(CONNECTOR),
        "source_name": topic,
        "source_db": F.lit(ROUTED_PREFIX.rstrip(".")),
        "source_table": topic,
        "op": F.lit("c"),
        "after": after,
        "position": F.concat(F.lpad(F.col("kafka_partition").cast("string"), 10, "0"), F.lit("/"), F.lpad(F.col("kafka_offset").cast("string"), 20, "0")),
        "position_kind": F.lit(POSITION_KIND),
        "source_ts": ts,
        "envelope_ts": ts,
        "snapshot": F.lit(False),
        "event_date": F.to_date(ts),
        "kafka_topic": topic,
        "kafka_partition": F.col("kafka_partition"),
        "kafka_offset": F.col("kafka_offset"),
        "source_file": F.col("source_file"),
        "line": line,
    }
    from cdc_platform.lake.lake_spark import spark_schema

    return records.select(*[(values[f.name] if f.name in values else F.lit(None)).cast(f.dataType).alias(f.name) for f in spark_schema(schemas.PARSED).fields])
