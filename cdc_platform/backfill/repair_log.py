"""The lake's record of repairs: `source_repairs`, one row per repair of a table's source coverage.

Every repair is recorded whatever became of it (re-read, timed out, refused by a bound, no channel), so the
table answers "what did the platform ask the connector for, and what came back" and the bound on repairs per
hour is counted from it (only repairs that sent signals count). Written by delta-spark (an append, which never
conflicts with another append), read on the driver by delta-rs: the table is small, a row per repair.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform import lake
from cdc_platform.lake import lake_spark, schemas
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPAIRS = "source_repairs"
#: Outcomes of repairs that asked the connector for rows: what `max_repairs_per_hour` counts.
SENT = ("repaired", "partial", "timed_out")


def record(spark: SparkSession, lake_dir: LakePath, row: Mapping[str, Any]) -> None:
    """Append one repair's row (the columns of `schemas.SOURCE_REPAIRS`; `detail` may be any JSON value)."""
    path = lake.table_path(lake_dir, REPAIRS)
    lake_spark.ensure_table(spark, path, lake_spark.spark_schema(schemas.SOURCE_REPAIRS))
    values = dict(row)
    if not isinstance(values.get("detail"), (str, type(None))):
        values["detail"] = json.dumps(values["detail"], default=str, ensure_ascii=False, sort_keys=True)
    data = pa.Table.from_pylist([values], schema=schemas.SOURCE_REPAIRS)
    lake_spark.writer(lake_spark.from_arrow(spark, data, schemas.SOURCE_REPAIRS), "append").save(lake_spark.location(path))


def repairs(lake_dir: LakePath, table_name: str | None = None, since: dt.datetime | None = None) -> list[dict[str, Any]]:
    """The recorded repairs (of one table, started at or after `since`), oldest first; [] before the first."""
    path = lake.table_path(lake_dir, REPAIRS)
    if not lake.exists(path):
        return []
    data = lake.scan(lake.open_table(path), [f.name for f in schemas.SOURCE_REPAIRS])
    if table_name is not None:
        data = data.filter(pc.equal(data.column("table_name"), table_name))
    if since is not None:
        data = data.filter(pc.greater_equal(data.column("started_at"), pa.scalar(since, schemas.TS)))
    return sorted(data.to_pylist(), key=lambda r: r["started_at"])


def sent_since(lake_dir: LakePath, table_name: str, since: dt.datetime) -> int:
    """How many repairs of the table sent signals since `since` (what the hourly bound counts)."""
    return sum(1 for r in repairs(lake_dir, table_name, since) if r["outcome"] in SENT)
