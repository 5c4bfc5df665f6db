"""The event tables: their schemas, their creation, and the lake's list of them (`_cdc_outbox.json`).

Event tables appear as aggregate types appear in the data (a service adds `payment` events, and
`payment_events` is created by the batch that first carries one), so no config names them. The stage keeps
their list in one small file of the lake, which only it writes (one stream per lake): the views read it to
know which tables get a `__latest_view` (`views.outbox_sql`), without guessing from a `_events` suffix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc_platform import lake
from cdc_platform.config_outbox import OutboxConfig
from cdc_platform.stages.outbox.events import BASE_FIELDS, ORIGIN_FIELDS, safe_name
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

#: The lake's list of event tables: {"tables": {name: {"aggregate_types": [...]}}}.
LIST_FILE = "_cdc_outbox.json"


def event_tables(lake_dir: LakePath) -> dict[str, dict[str, Any]]:
    """The event tables the outbox stage has made, by name (empty for a lake without outbox events)."""
    path = lake_dir / LIST_FILE
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text(encoding="utf-8")).get("tables", {}))


def note_tables(lake_dir: LakePath, added: Mapping[str, list[str]]) -> None:
    """Add tables (name -> aggregate types seen) to the list; written before the tables' first rows commit."""
    tables = event_tables(lake_dir)
    changed = False
    for name, types in added.items():
        known = tables.get(name, {}).get("aggregate_types")
        merged = sorted(set(known or ()) | set(types))
        if known is None or merged != known:
            changed = True
            tables[name] = {"aggregate_types": merged}
    if changed:
        lake.write_json_atomic(lake_dir / LIST_FILE, {"tables": tables})


def payload_schemas(config: OutboxConfig) -> dict[str, str]:
    """Declared payload schemas by event table name (the aggregate types as written, made safe)."""
    out: dict[str, str] = {}
    for aggregate_type, ddl in config.payload_schema:
        name = safe_name(aggregate_type)
        if name is not None:
            out[name] = ddl
    return out


def table_schema(config: OutboxConfig, payload: StructType | None) -> StructType:
    """An event table's Spark schema: the event, its declared payload fields, the additional fields, its origin."""
    from pyspark.sql.types import StringType, StructField, StructType

    from cdc_platform.lake.lake_spark import spark_schema

    base = spark_schema(pa.schema(list(BASE_FIELDS)))
    origin = spark_schema(pa.schema(list(ORIGIN_FIELDS)))
    fields = [*base.fields, *(payload.fields if payload is not None else []),
              *(StructField(c, StringType(), True) for c in config.columns.additional), *origin.fields]
    return StructType([StructField(f.name, f.dataType, True) if f.name != "event_id" else f for f in fields])


def ensure_event_table(spark: SparkSession, lake_dir: LakePath, name: str, schema: StructType) -> None:
    from cdc_platform.lake import lake_spark

    lake_spark.ensure_table(spark, lake.table_path(lake_dir, name), schema)
