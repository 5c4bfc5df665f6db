"""The Delta operations a latest-state table needs beyond an append, on delta-spark, shared by the stage,
compaction, rebuild and backfill.

Creating `<name>` and `<name>_history` (metadata columns only), rewriting a table with wider column
types (`widen`: Delta cannot change a column's type in place without a table feature older readers
lack), the schema after a batch's new columns, the rows each `_layer` holds (which decides when to
compact), the stored schema the executors type against, and the stored values of a few keys (the
unavailable-value placeholder's last resort). Apart from the stage so that compaction and rebuild use
it without importing the stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.stages import ordering
from cdc_platform.config import TableConfig
from cdc_platform.stages.latest_state.layout import BASE, DELTA, HISTORY_META, LAYER, META_FIELDS
from cdc_platform.stages.latest_state.rows import source_columns
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType


def table_specs(lake_dir: LakePath, table: TableConfig) -> list[tuple[Path, StructType, list[str]]]:
    """`<name>` (and `<name>_history`) with metadata columns only, for `lake_spark.ensure_tables`; source
    columns come with data."""
    specs = [(lake.table_path(lake_dir, table.name), lake_spark.spark_schema(pa.schema(list(META_FIELDS))), [LAYER])]
    if table.history:
        specs.append((lake.table_path(lake_dir, table.history_name), lake_spark.spark_schema(pa.schema(list(HISTORY_META))), []))
    return specs


def ensure_tables(spark: SparkSession, lake_dir: LakePath, table: TableConfig) -> None:
    """Create `<name>` (and `<name>_history`) if absent (`table_specs`)."""
    lake_spark.ensure_tables(spark, table_specs(lake_dir, table))


def accept_names(spark: SparkSession, path: Path, schema: pa.Schema) -> None:
    """Before writing `schema` to the table: a column name Delta refuses without column mapping (a space,
    a comma, a parenthesis: source columns may have them) turns the table's column mapping on first."""
    if lake_spark.needs_column_mapping(schema.names):
        lake_spark.allow_any_column_names(spark, path)


def stored_schema(spark: SparkSession, path: Path) -> pa.Schema | None:
    """The table's schema as Arrow (None when there is no table), from its Delta log."""
    from pyspark.sql.pandas.types import to_arrow_schema

    if not lake_spark.is_table(spark, path):
        return None
    return to_arrow_schema(lake_spark.read(spark, path).schema)


def widen(spark: SparkSession, path: Path, target: pa.Schema, partition_by: list[str] | None) -> None:
    """Rewrite a table with wider column types, in one overwrite commit.

    Only widening reaches here (`connect_types.join_types`), so every cast keeps its values. The old
    files stay until `cdc maintain` vacuums them; application transactions survive an overwrite.
    """
    from pyspark.sql import functions as F

    schema = lake_spark.spark_schema(target)

    def attempt() -> None:  # a retry after a conflicting commit re-reads the newer snapshot
        current = lake_spark.read(spark, path)
        present = set(current.columns)
        columns = [(F.col(lake.quote_identifier(f.name)) if f.name in present else F.lit(None)).cast(f.dataType).alias(f.name)
                   for f in schema.fields]
        writer = current.select(*columns).write.format("delta").mode("overwrite").option("overwriteSchema", "true")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.option("userMetadata", "cdc_operation=widen").save(lake_spark.location(path))

    lake_spark.with_retries(attempt, what=f"widen {path.name}")


def _evolved(current: pa.Schema, columns: Mapping[str, pa.DataType], meta: Sequence[pa.Field]) -> tuple[pa.Schema, bool]:
    """The table schema after this batch's columns, and whether a rewrite (widening) is needed."""
    existing = source_columns(current, meta)
    rewrite = any(c in existing and existing[c] != t for c, t in columns.items())
    fields = [pa.field(c, columns.get(c, t)) for c, t in existing.items()]
    fields += [pa.field(c, t) for c, t in columns.items() if c not in existing]
    return pa.schema(fields + list(meta)), rewrite


def layer_rows(spark: SparkSession, path: Path) -> dict[str, int]:
    """Rows per `_layer` of the current snapshot, from the log's file statistics (no data read).

    Read with delta-rs, which replays the log in the driver in milliseconds; the same through Spark
    (`lake_spark.partition_rows`, a job over the snapshot's files) cost 0.9-2.5 s a table here, on the
    path of a stream's first batch. A log delta-rs cannot read (a feature it lacks) goes through Spark.
    """
    out = {BASE: 0, DELTA: 0}
    try:
        actions = pa.table(lake.open_table(path).get_add_actions(flatten=True))
        column = f"partition.{LAYER}"
        if actions.num_rows and (column not in actions.column_names or actions.column("num_records").null_count):
            raise ValueError("no per-file row counts")
        counted: dict[str, int] = {}
        if actions.num_rows:
            for layer, n in zip(actions.column(column).to_pylist(), actions.column("num_records").to_pylist()):
                counted[layer] = counted.get(layer, 0) + int(n)
    except Exception:  # noqa: BLE001 - anything delta-rs cannot answer, Spark can
        counted = lake_spark.partition_rows(spark, path, LAYER)
    for layer, rows in counted.items():
        if layer in out:
            out[layer] += rows
    return out


def stored_lookup(spark: SparkSession, path: Path, key_columns: Sequence[str], keys: pa.Table, columns: Sequence[str]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """The stored values of `columns` for the typed `keys` (an Arrow table of the key columns): base and
    delta folded by `ordering`, tombstones and rows below the newest truncate left out.

    Reads only the given keys' rows (a semi-join) and the truncate markers, so it costs the keys, not
    the table; it runs only for a batch whose placeholders nothing in the batch resolves.
    """
    from pyspark.sql import functions as F

    if keys.num_rows == 0 or not lake_spark.is_table(spark, path):
        return {}
    stored = lake_spark.read(spark, path)
    names = set(stored.columns)
    if not all(k in names for k in key_columns):
        return {}
    cols = [c for c in columns if c in names and c not in key_columns]
    meta = ["_position", "_seq", "_deleted", "_event_id", "_op"]
    wanted = lake_spark.from_arrow(spark, keys.select(list(key_columns)))
    quoted = [F.col(lake.quote_identifier(c)) for c in [*key_columns, *cols, *meta]]
    rows = stored.join(wanted, on=list(key_columns), how="left_semi").select(*quoted).toArrow()
    absent = None
    for k in key_columns:
        part = F.col(lake.quote_identifier(k)).isNull()
        absent = part if absent is None else (absent & part)
    cut_row = stored.where(absent & (F.col("_op") == "t")).agg(F.max("_position").alias("cut")).first()
    cut = None if cut_row is None else cut_row["cut"]
    wanted_keys = {tuple(r[k] for k in key_columns) for r in keys.to_pylist()}
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    if rows.num_rows == 0:
        return out
    rows = pa.Table.from_arrays([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in rows.columns], names=rows.column_names)
    for r in ordering.fold_latest(rows, key_columns).to_pylist():
        k = tuple(r[c] for c in key_columns)
        if k in wanted_keys and not r["_deleted"] and (cut is None or r["_position"] >= cut):
            out[k] = {c: r[c] for c in cols}
    return out

