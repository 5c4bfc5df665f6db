"""Outbox rows of the raw log -> outbox events, in Spark's own functions (no Python UDF): each row's fields,
its canonical payload, its table name, and the reason it cannot land when it cannot.

Both inputs arrive as raw-log rows with an `after` image whose fields carry the configured column names:
the outbox table's own change events (the connector's row image), and the Event Router's routed records,
which the ingest turns into such rows (`sources/outbox_routed.py`). So one derivation serves both, and an
event read through either lands the same.

Why a map of strings: `from_json(after, map<string,string>)` keeps each field as text, a nested object or
array as its JSON text (so a `jsonb` payload captured as Debezium's `io.debezium.data.Json` string and an
expanded payload object read the same), and needs no schema of the outbox table. The payload is made
canonical with Spark's VARIANT (`try_parse_json`, then `to_json`: keys sorted, no insignificant space), so
the same event sent twice compares equal even when one copy's JSON was spelled differently (PostgreSQL's
`jsonb` output against the router's text); text that is not JSON is NULL there, which is how a bad payload
is told apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from cdc_platform.config_outbox import OutboxConfig

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

TS = pa.timestamp("us", tz="UTC")
#: The stage's name: its query, checkpoint (`stage_outbox`), dead letters and progress rows.
STAGE = "outbox"
#: Ops that are events: an insert into the outbox (or its snapshot read). Updates, deletes and truncates of
#: the outbox are its housekeeping (services delete the row right after inserting it) and never change an event.
EVENT_OPS = ("c", "r")
#: Table names of the event tables: `<safe aggregate type>_events`; the safe part is capped so the name fits.
SUFFIX = "_events"
MAX_SAFE = 100

# Dead-letter reason codes of this stage.
MISSING_ID = "outbox_missing_id"
MISSING_TYPE = "outbox_missing_type"
MISSING_AGGREGATE_TYPE = "outbox_missing_aggregate_type"
PAYLOAD_NOT_JSON = "outbox_payload_not_json"
UNUSABLE_NAME = "outbox_unusable_aggregate_type"
ID_CONFLICT = "outbox_id_conflict"

#: The columns every event table has, in order (payload fields declared in `payload_schema` follow `payload`,
#: then the configured additional fields). `content_hash` is not stored: it is recomputed from these.
BASE_FIELDS = (
    pa.field("event_id", pa.string(), nullable=False),
    pa.field("aggregate_type", pa.string()),
    pa.field("aggregate_id", pa.string()),
    pa.field("event_type", pa.string()),
    pa.field("payload", pa.string()),
)
ORIGIN_FIELDS = (
    pa.field("event_time", pa.string()),  # the outbox's own timestamp column, as sent (when `columns.timestamp` is set)
    pa.field("source_table", pa.string()),  # the raw log's table id: the outbox table, or `__outbox.<topic>`
    pa.field("source_position", pa.string()),
    pa.field("source_order", pa.int64()),  # `transaction.total_order`: orders events of one transaction at one position
    pa.field("transaction_id", pa.string()),
    pa.field("source_ts", TS),
    pa.field("ingested_at", TS),
    pa.field("arrival", pa.int64()),
    pa.field("raw_event_id", pa.string()),  # the raw-log row it came from
)
RESERVED = frozenset(f.name for f in (*BASE_FIELDS, *ORIGIN_FIELDS))


def safe_name_column(aggregate_type: Column) -> Column:
    """`<aggregatetype>_events` made a lake name: lower case, every run of other characters one `_`, no `_` at
    either end, `t_` before a leading digit. NULL when nothing usable is left (the event is a dead letter)."""
    from pyspark.sql import functions as F

    safe = F.regexp_replace(F.regexp_replace(F.lower(aggregate_type), r"[^a-z0-9]+", "_"), r"^_+|_+$", "")
    safe = F.when(safe.rlike(r"^[0-9]"), F.concat(F.lit("t_"), safe)).otherwise(safe)
    safe = F.substring(safe, 1, MAX_SAFE)
    safe = F.regexp_replace(safe, r"_+$", "")
    return F.when(F.length(safe) > 0, F.concat(safe, F.lit(SUFFIX)))


def safe_name(aggregate_type: str) -> str | None:
    """The same rule in Python, for tests and the README's examples (the stage runs the Spark one)."""
    import re

    safe = re.sub(r"^_+|_+$", "", re.sub(r"[^a-z0-9]+", "_", aggregate_type.lower()))
    safe = ("t_" + safe) if re.match(r"^[0-9]", safe) else safe
    safe = safe[:MAX_SAFE].rstrip("_")
    return safe + SUFFIX if safe else None


def canonical_json(text: Column) -> Column:
    """JSON text with keys sorted and no insignificant space; NULL for NULL and for text that is not JSON."""
    from pyspark.sql import functions as F

    return F.to_json(F.try_parse_json(text))


def content_hash(event: DataFrame, additional: Sequence[str]) -> Column:
    """What makes two copies of one event the same event: everything it says, not where or when it was read."""
    from pyspark.sql import functions as F

    parts = [F.col(c) for c in ("aggregate_type", "aggregate_id", "event_type", "payload", *additional)]
    return F.sha2(F.to_json(F.array(*[F.coalesce(p.cast("string"), F.lit("\u0000null")) for p in parts])), 256)


def outbox_rows(events: DataFrame, config: OutboxConfig) -> DataFrame:
    """The batch's raw-log rows of the outbox (its table and its routed topics), every op."""
    from pyspark.sql import functions as F

    return events.where(F.col("table_id").isin(list(config.source_table_ids)))


def derive(rows: DataFrame, config: OutboxConfig, reserved_names: Sequence[str]) -> DataFrame:
    """Inserts of the outbox -> one row per event: the event table's columns, `table_name`, `content_hash`,
    `reason_code`/`reason` (NULL when it can land), and what a dead letter needs (`line`, `source_file`, ...).

    `reserved_names`: lake names an event table may not take (the platform's and the configured tables'):
    an aggregate type whose table would be one of them is a dead letter, never a write into that table.
    """
    from pyspark.sql import functions as F

    cols = config.columns
    image = F.from_json(F.col("after"), "map<string,string>")
    field = lambda name: image.getItem(name)  # noqa: E731 - a field of the row image, as text
    raw_payload = field(cols.payload)
    out = rows.where(F.col("op").isin(*EVENT_OPS)).select(
        F.col("event_id").alias("raw_event_id"),
        F.col("table_id").alias("source_table"),
        field(cols.id).alias("event_id"),
        field(cols.aggregate_type).alias("aggregate_type"),
        field(cols.aggregate_id).alias("aggregate_id"),
        field(cols.type).alias("event_type"),
        raw_payload.alias("_raw_payload"),
        canonical_json(raw_payload).alias("payload"),
        *([field(cols.timestamp).alias("event_time")] if cols.timestamp else [F.lit(None).cast("string").alias("event_time")]),
        *[field(c).alias(c) for c in cols.additional],
        F.col("position").alias("source_position"),
        F.col("tx_total_order").alias("source_order"),
        F.col("transaction_id"), F.col("source_ts"), F.col("ingested_at"), F.col("arrival"),
        F.col("line"), F.col("source_file"), F.col("_seq"),
    )
    out = out.withColumn("table_name", safe_name_column(F.col("aggregate_type")))
    blank = lambda c: F.col(c).isNull() | (F.trim(F.col(c)) == "")  # noqa: E731
    reserved = F.col("table_name").isin(list(reserved_names)) if reserved_names else F.lit(False)
    code = (F.when(blank("event_id"), F.lit(MISSING_ID))
            .when(blank("event_type"), F.lit(MISSING_TYPE))
            .when(blank("aggregate_type"), F.lit(MISSING_AGGREGATE_TYPE))
            .when(F.col("_raw_payload").isNotNull() & F.col("payload").isNull(), F.lit(PAYLOAD_NOT_JSON))
            .when(F.col("table_name").isNull() | reserved, F.lit(UNUSABLE_NAME)))
    reason = (F.when(code == MISSING_ID, F.lit(f"the outbox event has no id (column `{cols.id}`, or the router's `{config.router.id_header}` "
                                                 "header): it cannot be deduplicated, so it is not landed; give every outbox row an id"))
              .when(code == MISSING_TYPE, F.lit(f"the outbox event has no type (column `{cols.type}`, or the router's "
                                                f"`{config.router.type_header}` header): set `outbox.columns.type` or the router's "
                                                "`table.fields.additional.placement` so the type reaches the lake"))
              .when(code == MISSING_AGGREGATE_TYPE, F.lit(f"the outbox event has no aggregate type (column `{cols.aggregate_type}`), "
                                                          "which names its event table"))
              .when(code == PAYLOAD_NOT_JSON, F.concat(F.lit(f"the outbox event's payload (column `{cols.payload}`) is not JSON: "),
                                                       F.substring(F.col("_raw_payload"), 1, 80)))
              .when(code == UNUSABLE_NAME, F.concat(F.lit("the aggregate type "), F.to_json(F.array(F.col("aggregate_type"))),
                                                    F.lit(" makes no usable event table name (it has no letter or digit, or its table "),
                                                    F.coalesce(F.col("table_name"), F.lit("")),
                                                    F.lit(" is a platform or configured table): rename the aggregate type"))))
    out = out.withColumn("reason_code", code).withColumn("reason", reason).drop("_raw_payload")
    return out.withColumn("content_hash", content_hash(out, cols.additional))


def payload_struct(ddl: str) -> object:
    """A declared payload schema as Spark's type (parsed by the running Spark), or a `ConfigError` naming what it could not read."""
    from pyspark.sql.types import StructType

    from cdc_platform.errors import ConfigError

    try:
        parsed = StructType.fromDDL(ddl)
    except Exception as exc:  # noqa: BLE001 - Spark's parse errors have many classes
        raise ConfigError(f"outbox.payload_schema: {ddl!r} is not a Spark DDL schema such as 'order_id bigint, total double' "
                          f"({str(exc).splitlines()[0]})") from exc
    clash = sorted(f.name for f in parsed.fields if f.name in RESERVED)
    if clash:
        raise ConfigError(f"outbox.payload_schema: field(s) {', '.join(clash)} of {ddl!r} would clash with the event table's own columns; "
                          "leave them out (they stay in `payload`)")
    return parsed
