"""Arrow schemas of the platform's own Delta tables.

They live in one place because three parties must agree on them: the parser that produces rows, the
writer that creates the tables, and the readers (Spark SQL, Dagster checks) that query them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

TS = pa.timestamp("us", tz="UTC")

#: Where a Kafka record came from: the Kafka source delivers these beside each line, the parser carries
#: them through to the raw log, and they are null for lines read from files. Added after the first
#: release, so `lake.ensure_table` adds them to an existing raw log (nullable, like every later column).
KAFKA_ORIGIN = (
    pa.field("kafka_topic", pa.string()),
    pa.field("kafka_partition", pa.int32()),
    pa.field("kafka_offset", pa.int64()),
)
KAFKA_ORIGIN_COLUMNS = tuple(f.name for f in KAFKA_ORIGIN)
#: The Kafka record's key beside its value (JSON text), when the lines are Kafka records (`sources.py`).
RECORD_KEY_COLUMN = "kafka_key"
#: A record the source could not make a line of (an Avro record whose schema id the registry does not
#: know, or whose bytes do not decode: `sources/avro_decode.py`): its dead-letter code and reason, beside
#: the record's bytes in base64 as the line. Null for every line that is one.
REJECT_CODE = "reject_code"
REJECT_REASON = "reject_reason"
#: The reject code of a record the source has not made a line of *yet* (an Avro record naming a schema id the
#: decoder had not read when it planned the batch): never a dead letter. The ingest counts them in the batch's
#: aggregate and, before committing anything, asks the source for the batch again, learning (`BatchLines`).
LINES_INCOMPLETE = "lines_incomplete"

RAW_CHANGE_EVENTS = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("event_date", pa.date32(), nullable=False),
        pa.field("table_id", pa.string()),
        pa.field("source_connector", pa.string()),
        pa.field("source_name", pa.string()),
        pa.field("source_db", pa.string()),
        pa.field("source_schema", pa.string()),
        pa.field("source_table", pa.string()),
        pa.field("op", pa.string()),
        pa.field("key", pa.string()),
        pa.field("before", pa.string()),
        pa.field("after", pa.string()),
        pa.field("row_schema", pa.string()),
        pa.field("position", pa.string()),
        pa.field("position_kind", pa.string()),
        pa.field("source_ts", TS),
        pa.field("envelope_ts", TS),
        pa.field("snapshot", pa.bool_()),
        pa.field("transaction_id", pa.string()),
        pa.field("transaction_raw_id", pa.string()),
        pa.field("tx_total_order", pa.int64()),
        pa.field("tx_collection_order", pa.int64()),
        pa.field("source_file", pa.string()),
        pa.field("ingested_at", TS),
        pa.field("line", pa.string()),
        *KAFKA_ORIGIN,
        # The line's place in its ingest batch (the batch's input order); with `ingested_at` it orders arrivals
        # across batches, which the stages reading the raw log need for two distinct events at one position.
        # Added after the first release: null in rows an earlier version wrote.
        pa.field("arrival", pa.int64()),
    ]
)
RAW_PARTITION_BY = ["event_date"]

TRANSACTION_MARKERS = pa.schema(
    [
        pa.field("marker_id", pa.string(), nullable=False),
        pa.field("marker_date", pa.date32(), nullable=False),
        pa.field("transaction_id", pa.string()),
        pa.field("transaction_raw_id", pa.string()),
        pa.field("status", pa.string()),
        pa.field("event_count", pa.int64()),
        pa.field("data_collections", pa.map_(pa.string(), pa.int64())),
        pa.field("marker_shape", pa.string()),
        pa.field("marker_ts", TS),
        pa.field("source_file", pa.string()),
        pa.field("ingested_at", TS),
        pa.field("line", pa.string()),
    ]
)
MARKERS_PARTITION_BY = ["marker_date"]

DEAD_LETTER = pa.schema(
    [
        pa.field("reason_code", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("stage", pa.string(), nullable=False),
        pa.field("table_id", pa.string()),
        pa.field("event_id", pa.string()),
        pa.field("line", pa.string()),
        pa.field("source_file", pa.string()),
        pa.field("batch_id", pa.int64()),
        pa.field("dead_lettered_at", TS, nullable=False),
    ]
)

#: Per platform table (by its folder name), the columns Delta keeps no file statistics for: the events' text
#: (images, the original line, its file). Delta computes min, max and null count for the first 32 columns
#: of every file it writes; on these long strings that was a seventh of the raw log's write (400,000 rows:
#: 4.99 s against 4.30 s, benchmarks/README.md) and most of each add action's statistics in the log, while no
#: lookup filters on them. A new table gets `delta.dataSkippingStatsColumns` naming every other column
#: Delta can skip by (`lake_spark.ensure_table`); a table made before keeps statistics on every column.
UNSKIPPED_COLUMNS: Mapping[str, tuple[str, ...]] = {
    "raw_change_events": ("key", "before", "after", "row_schema", "source_file", "line"),
    "transaction_markers": ("source_file", "line"),
    "dead_letter": ("line", "source_file"),
}

PIPELINE_METRICS = pa.schema(
    [
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("started_at", TS),
        pa.field("finished_at", TS),
        pa.field("rows_read", pa.int64()),
        pa.field("change_events", pa.int64()),
        pa.field("markers", pa.int64()),
        pa.field("tombstones", pa.int64()),
        pa.field("dead_letters", pa.int64()),
        pa.field("duplicates_skipped", pa.int64()),
        pa.field("rows_landed", pa.map_(pa.string(), pa.int64())),
        pa.field("stage_seconds", pa.map_(pa.string(), pa.float64())),
        pa.field("stage_figures", pa.map_(pa.string(), pa.float64())),
        pa.field("newest_source_ts", TS),
        pa.field("lag_seconds", pa.float64()),
        # The newest Debezium heartbeat's time in the batch (control_records): how far an idle source was read.
        pa.field("newest_heartbeat_ts", TS),
    ]
)

#: One row per micro-batch of a stage query (latest state, transactions, ...: each reads the raw log as a
#: stream of its own, `run/stage_queries.py`): what it read, landed and dead-lettered, its seconds and figures,
#: and how far into the raw log it has applied (`applied_through`: the newest `ingested_at` of the raw-log rows
#: it has taken, this batch's and every earlier one's), which the views read as "folded up to here".
STAGE_PROGRESS = pa.schema(
    [
        pa.field("query", pa.string(), nullable=False),
        pa.field("query_id", pa.string(), nullable=False),
        pa.field("batch_id", pa.int64(), nullable=False),
        pa.field("started_at", TS),
        pa.field("finished_at", TS),
        pa.field("events", pa.int64()),
        pa.field("markers", pa.int64()),
        pa.field("dead_letters", pa.int64()),
        pa.field("rows_landed", pa.map_(pa.string(), pa.int64())),
        pa.field("stage_seconds", pa.map_(pa.string(), pa.float64())),
        pa.field("stage_figures", pa.map_(pa.string(), pa.float64())),
        pa.field("newest_source_ts", TS),
        pa.field("applied_through", TS),
    ]
)

#: One row per repair of a table's source coverage (`backfill.repair`): what was asked of the connector, what
#: came back, and the coverage before and after.
SOURCE_REPAIRS = pa.schema(
    [
        pa.field("repair_id", pa.string(), nullable=False),
        pa.field("table_name", pa.string(), nullable=False),
        pa.field("source_table", pa.string()),
        pa.field("outcome", pa.string(), nullable=False),
        pa.field("channel", pa.string()),
        pa.field("started_at", TS, nullable=False),
        pa.field("signalled_at", TS),
        pa.field("finished_at", TS, nullable=False),
        pa.field("keys_differing", pa.int64()),
        pa.field("keys_asked", pa.int64()),
        pa.field("keys_landed", pa.int64()),
        pa.field("keys_unexpressible", pa.int64()),
        pa.field("keys_absent", pa.int64()),
        pa.field("keys_removed", pa.int64()),
        pa.field("signals", pa.int64()),
        pa.field("reread_events", pa.int64()),
        pa.field("coverage_before_percent", pa.float64()),
        pa.field("coverage_after_percent", pa.float64()),
        pa.field("detail", pa.string()),
    ]
)

#: What the parser emits per input line: one wide row whose `kind` says which table it feeds.
PARSED = pa.schema(
    [pa.field("kind", pa.string())]
    + [pa.field(f.name, f.type) for f in RAW_CHANGE_EVENTS if f.name not in ("source_file", "ingested_at", "line", "event_date", "arrival")]
    + [
        pa.field("event_date", pa.date32()),
        pa.field("marker_id", pa.string()),
        pa.field("marker_date", pa.date32()),
        pa.field("status", pa.string()),
        pa.field("event_count", pa.int64()),
        pa.field("data_collections", pa.map_(pa.string(), pa.int64())),
        pa.field("marker_shape", pa.string()),
        pa.field("marker_ts", TS),
        pa.field("reason_code", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("source_file", pa.string()),
        pa.field("line", pa.string()),
    ]
)


def conform(table: pa.Table, schema: pa.Schema, *, safe: bool = True, constants: Mapping[str, Any] | None = None) -> pa.Table:
    """`table` reordered and cast to `schema`, with the columns it lacks as nulls (a narrowed collect, a
    Delta read that names list items differently, a latest-state table's rows against its evolved schema).

    `safe=False` casts without Arrow's overflow and truncation checks (values already typed for the
    column); `constants` gives columns one value for every row. The names are indexed once: a lookup in
    `table.column_names` per field rebuilds that list each time, which for a 5,001-column row
    (tests/data/bad_input/35_very_wide_row.jsonl) cost 21 s of one batch on the driver.
    """
    index: dict[str, int | None] = {}
    for i, name in enumerate(table.column_names):
        index[name] = None if name in index else i  # a name held twice: Arrow's lookup by name refuses it below
    fixed = constants or {}
    arrays = []
    for f in schema:
        if f.name in fixed:
            arrays.append(pa.array([fixed[f.name]] * table.num_rows, f.type))
        elif f.name not in index:
            arrays.append(pa.nulls(table.num_rows, f.type))
        else:
            i = index[f.name]
            arrays.append((table.column(f.name) if i is None else table.column(i)).cast(f.type, safe=safe))
    return pa.Table.from_arrays(arrays, schema=schema)
