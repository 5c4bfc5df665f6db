"""Dagster's standard asset metadata for the lake's tables and views: `dagster/row_count` and
`dagster/column_schema` (so the UI shows rows over time and a column list), a view's SQL, and a
Markdown sample of the newest dead letters. Values come from `cdc_platform`; this module only maps
them to Dagster's metadata types, for the assets and for the demo's recorded materialisations alike."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dagster import MetadataValue, TableColumn, TableSchema

from cdc_platform import checks, lake
from cdc_platform.storage import LakePath

ROW_COUNT = "dagster/row_count"
COLUMN_SCHEMA = "dagster/column_schema"
#: Dagster's key for when the data itself last changed; its freshness checks read it in place of the
#: event's own time. Here it is source time: the newest source commit the table holds.
LAST_UPDATED = "dagster/last_updated_timestamp"
SAMPLE_CELL_CHARS = 120


def values(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The platform's plain metadata (numbers, text, booleans, dicts and lists) as Dagster's metadata values."""
    out: dict[str, Any] = {}
    for name, value in meta.items():
        if isinstance(value, bool):
            out[name] = MetadataValue.bool(value)
        elif isinstance(value, (int, float)):
            out[name] = value
        elif isinstance(value, (dict, list)):
            out[name] = MetadataValue.json(value)
        else:
            out[name] = MetadataValue.text(str(value))
    return out


def column_schema(columns: Iterable[tuple[str, str, bool]]) -> MetadataValue:
    """(name, type, nullable) per column as a `TableSchema`."""
    return MetadataValue.table_schema(TableSchema(columns=[
        TableColumn(name=name, type=type_, constraints=None if nullable else _required()) for name, type_, nullable in columns
    ]))


def _required() -> Any:
    from dagster import TableColumnConstraints

    return TableColumnConstraints(nullable=False)


def delta_columns(path: Path) -> list[tuple[str, str, bool]]:
    """A Delta table's columns from its log (no scan): (name, Arrow type, nullable)."""
    import pyarrow as pa

    schema = pa.schema(lake.open_table(path).schema().to_arrow())  # delta-rs hands out an arro3 schema; its type names read as Rust
    return [(f.name, str(f.type), f.nullable) for f in schema]


def spark_columns(schema: Any) -> list[tuple[str, str, bool]]:
    """A Spark `StructType`'s columns: (name, Spark SQL type, nullable)."""
    return [(f.name, f.dataType.simpleString(), f.nullable) for f in schema.fields]


def table_metadata(path: Path, rows: int | None = None) -> dict[str, Any]:
    """Row count (file statistics unless `rows` is given) and column schema of one lake table."""
    meta: dict[str, Any] = {COLUMN_SCHEMA: column_schema(delta_columns(path))}
    meta[ROW_COUNT] = int(rows if rows is not None else checks.table_stats(path).rows)
    return meta


def source_time(newest: dt.datetime | None) -> dict[str, Any]:
    """`dagster/last_updated_timestamp` set to the newest source commit a table holds (nothing when it holds none).

    Dagster's freshness checks then judge how far the lake trails its source, not when a run last wrote
    it: a stream that keeps committing while it falls behind the database is stale here too.
    """
    if newest is None:
        return {}
    if newest.tzinfo is None:  # the lake's timestamps are UTC
        newest = newest.replace(tzinfo=dt.timezone.utc)
    return {LAST_UPDATED: MetadataValue.timestamp(newest)}


def sql_block(sql: str) -> MetadataValue:
    return MetadataValue.md(f"```sql\n{sql.strip()}\n```")


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table; cells are one line, pipes escaped, long values cut with an ellipsis."""

    def cell(value: Any) -> str:
        text = "" if value is None else " ".join(str(value).split())
        if len(text) > SAMPLE_CELL_CHARS:
            text = text[: SAMPLE_CELL_CHARS - 1] + "…"
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def dead_letter_sample(lake_dir: LakePath, n: int = 5) -> MetadataValue:
    rows = checks.newest_dead_letters(lake_dir, n)
    if not rows:
        return MetadataValue.md("No dead letters: every line and event was used.")
    return MetadataValue.md(f"The {len(rows)} newest of the dead letters, newest first:\n\n"
                            + markdown_table(rows, checks.DEAD_LETTER_SAMPLE_COLUMNS))
