"""The transaction tables' shapes and the words stored in them, in one place the whole package reads.

The Arrow schemas of the five tables (`TABLE_SCHEMAS`: the stage creates them, the views and the
catalog read them), the `open_transactions.entry` kinds, the reasons a transaction is incomplete and
how it expired, and the step's `Settings` and `Step`. Kept apart, importing nothing of the package,
so every other module can import it and the tables' contract reads in one file.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from cdc_platform.config import PlatformConfig
from cdc_platform.lake.schemas import TS

TRANSACTIONS = "transactions"
INCOMPLETE = "incomplete_transactions"
LATE = "late_transaction_events"
OPEN_TRANSACTIONS = "open_transactions"
WATERMARK = "consistency_watermark"

#: The stream name of the transaction markers; table streams are named by `<db-or-schema>.<table>`,
#: which never contains a parenthesis.
MARKERS_STREAM = "(markers)"

# `open_transactions.entry` values.
OPEN = "open"
COMPLETED = "completed"
EXPIRED = "expired"
STREAM = "stream"
SOURCE = "source"

# Reasons a transaction is incomplete, most fundamental first.
MISSING_END = "missing_end"
COUNT_MISMATCH = "count_mismatch"
MISSING_EVENTS = "missing_events"
MISSING_BEGIN = "missing_begin"

EVENT_TIME = "event_time"
PROCESSING_TIME = "processing_time"


EVENT = pa.struct(
    [
        pa.field("tx_total_order", pa.int64()),
        pa.field("table_id", pa.string()),
        pa.field("op", pa.string()),
        pa.field("key", pa.string()),
        pa.field("before", pa.string()),
        pa.field("after", pa.string()),
        pa.field("position", pa.string()),
        pa.field("source_ts", TS),
        pa.field("tx_collection_order", pa.int64()),
        pa.field("event_id", pa.string()),
    ]
)
EVENTS = pa.list_(EVENT)
COUNTS = pa.map_(pa.string(), pa.int64())

OPEN_TRANSACTIONS_SCHEMA = pa.schema(
    [
        pa.field("entry", pa.string(), nullable=False),  # open | completed | expired | stream | source
        pa.field("transaction_id", pa.string()),
        pa.field("source", pa.string()),  # Debezium source.name of the events ('' when absent)
        pa.field("stream", pa.string()),  # stream rows: table id or "(markers)"
        pa.field("has_begin", pa.bool_()),
        pa.field("has_end", pa.bool_()),
        pa.field("begin_ts", TS),
        pa.field("end_ts", TS),
        pa.field("marker_shape", pa.string()),
        pa.field("expected_count", pa.int64()),
        pa.field("expected_per_table", COUNTS),  # as the END marker names the tables
        pa.field("seen_count", pa.int64()),  # distinct events
        pa.field("seen_per_table", COUNTS),
        pa.field("first_position", pa.string()),
        pa.field("last_position", pa.string()),
        pa.field("last_event_ts", TS),
        pa.field("event_time", TS),  # stream: its event time; finished: when it finished (event time)
        pa.field("tables", pa.list_(pa.string())),  # finished: streams that must pass before it is forgotten
        pa.field("watermark_position", pa.string()),  # source rows
        pa.field("watermark_ts", TS),
        pa.field("settled_position", pa.string()),
        pa.field("settled_ts", TS),
        pa.field("events", EVENTS),  # open: the distinct events seen so far
        pa.field("updated_batch", pa.int64()),
    ]
)

TRANSACTIONS_SCHEMA = pa.schema(
    [
        pa.field("transaction_id", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("begin_ts", TS),
        pa.field("end_ts", TS),
        pa.field("event_count", pa.int64()),
        pa.field("events_per_table", COUNTS),
        pa.field("first_position", pa.string()),
        pa.field("last_position", pa.string()),  # the commit position used by the consistency watermark
        pa.field("marker_shape", pa.string()),
        pa.field("events", EVENTS),
        pa.field("completed_batch", pa.int64()),
        pa.field("completed_at", TS),
    ]
)

INCOMPLETE_SCHEMA = pa.schema(
    [
        pa.field("transaction_id", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("has_begin", pa.bool_()),
        pa.field("has_end", pa.bool_()),
        pa.field("begin_ts", TS),
        pa.field("end_ts", TS),
        pa.field("last_event_ts", TS),
        pa.field("expected_count", pa.int64()),
        pa.field("seen_count", pa.int64()),
        pa.field("expected_per_table", COUNTS),  # table names matched to the events' table ids
        pa.field("seen_per_table", COUNTS),
        pa.field("first_position", pa.string()),
        pa.field("last_position", pa.string()),
        pa.field("marker_shape", pa.string()),
        pa.field("events", EVENTS),
        pa.field("expired_by", pa.string(), nullable=False),  # event_time | processing_time
        pa.field("expired_batch", pa.int64()),
        pa.field("expired_at", TS),
    ]
)

LATE_SCHEMA = pa.schema(
    [
        pa.field("transaction_id", pa.string(), nullable=False),
        pa.field("fate", pa.string(), nullable=False),  # completed | expired | unknown (forgotten)
        pa.field("kind", pa.string(), nullable=False),  # event | marker
        pa.field("item_id", pa.string()),  # event_id or marker_id
        pa.field("table_id", pa.string()),
        pa.field("op", pa.string()),
        pa.field("key", pa.string()),
        pa.field("before", pa.string()),
        pa.field("after", pa.string()),
        pa.field("position", pa.string()),
        pa.field("status", pa.string()),
        pa.field("item_ts", TS),
        pa.field("batch_id", pa.int64()),
        pa.field("detected_at", TS),
    ]
)

WATERMARK_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("position", pa.string()),  # null: nothing of this source is consistent yet
        pa.field("position_ts", TS),
        pa.field("open_transactions", pa.int64()),
        pa.field("blocking_transaction_id", pa.string()),
        pa.field("batch_id", pa.int64()),
        pa.field("updated_at", TS),
    ]
)

TABLE_SCHEMAS: dict[str, pa.Schema] = {
    TRANSACTIONS: TRANSACTIONS_SCHEMA,
    INCOMPLETE: INCOMPLETE_SCHEMA,
    LATE: LATE_SCHEMA,
    WATERMARK: WATERMARK_SCHEMA,
    OPEN_TRANSACTIONS: OPEN_TRANSACTIONS_SCHEMA,
}

# Internal: one transactional event, flat.
_ITEM = pa.schema(
    [
        pa.field("transaction_id", pa.string()),
        pa.field("source", pa.string()),
        *[pa.field(f.name, f.type) for f in EVENT],
    ]
)
_FINISHED_COLUMNS = (
    "transaction_id", "source", "has_begin", "has_end", "begin_ts", "end_ts", "marker_shape",
    "first_position", "last_position", "last_event_ts",
)


#: Default `transaction_retention` in multiples of `transaction_timeout`.
RETENTION_TIMEOUTS = 5


@dataclass(frozen=True)
class Settings:
    """The aggregation's time limits, in microseconds of event time.

    `retention`: a finished transaction is remembered until every stream it touched has moved this far
    past it, so a late event or marker is reported with the transaction's fate. An arrival older than
    that on its own stream, for a transaction no longer known, is reported late with fate `unknown`
    instead of opening a transaction that could only time out. It is at least the timeout.
    """

    timeout_us: int
    retention_us: int

    @classmethod
    def from_config(cls, config: PlatformConfig) -> Settings:
        retention = config.transaction_retention
        if retention is None:
            retention = RETENTION_TIMEOUTS * config.transaction_timeout
        return cls(timeout_us=int(round(config.transaction_timeout * 1_000_000)), retention_us=int(round(retention * 1_000_000)))


@dataclass
class Step:
    """Everything one aggregation step decided; the stage commits it, tests inspect it."""

    state: pa.Table
    completed: pa.Table
    incomplete: pa.Table
    late: pa.Table
    watermark: pa.Table
    figures: dict[str, float]
