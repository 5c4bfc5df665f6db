"""The Delta writes a latest-state table needs beyond an append, shared by the stage and rebuild.

Creating `<name>` and `<name>_history` (metadata columns only), rewriting a table with wider column
types (`widen`: Delta cannot change a column's type in place here), the schema after a batch's new
columns, and how many rows each `_layer` holds (which decides when to compact). Apart from the stage
so that compaction and rebuild use it without importing the stage.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from cdc_platform import lake
from cdc_platform.config import TableConfig
from cdc_platform.latest_state.layout import BASE, DELTA, HISTORY_META, LAYER, META_FIELDS
from cdc_platform.latest_state.rows import conform, source_columns

def ensure_tables(lake_dir: Path, table: TableConfig) -> None:
    """Create `<name>` (and `<name>_history`) with metadata columns only; source columns come with data."""
    lake.ensure_table(lake.table_path(lake_dir, table.name), pa.schema(list(META_FIELDS)), [LAYER])
    if table.history:
        lake.ensure_table(lake.table_path(lake_dir, table.history_name), pa.schema(list(HISTORY_META)))


def widen(path: Path, target: pa.Schema, partition_by: list[str] | None) -> None:
    """Rewrite a table with wider column types (Delta cannot change a column's type in place here).

    Streams the current snapshot through Arrow batches, so memory stays bounded; the old files stay
    until `cdc maintain` vacuums them. Application transactions survive an overwrite.
    """

    def attempt() -> None:  # a retry after a conflicting commit must re-read the newer snapshot
        table = lake.open_table(path)
        scanner = table.to_pyarrow_dataset().scanner(batch_size=262_144)

        def batches() -> Iterable[pa.RecordBatch]:
            for batch in scanner.to_batches():
                yield from conform(pa.Table.from_batches([batch]), target).to_batches()

        reader = pa.RecordBatchReader.from_batches(target, batches())
        write_deltalake(table, reader, mode="overwrite", schema_mode="overwrite", partition_by=partition_by,
                        commit_properties=lake.commit_props(None, None, cdc_operation="widen"))

    lake.with_retries(attempt, what=f"widen {path.name}")


def _evolved(current: pa.Schema, columns: Mapping[str, pa.DataType], meta: Sequence[pa.Field]) -> tuple[pa.Schema, bool]:
    """The table schema after this batch's columns, and whether a rewrite (widening) is needed."""
    existing = source_columns(current, meta)
    rewrite = any(c in existing and existing[c] != t for c, t in columns.items())
    fields = [pa.field(c, columns.get(c, t)) for c, t in existing.items()]
    fields += [pa.field(c, t) for c, t in columns.items() if c not in existing]
    return pa.schema(fields + list(meta)), rewrite


def _layer_rows(table: DeltaTable) -> dict[str, int]:
    actions = pa.table(table.get_add_actions(flatten=True))
    out = {BASE: 0, DELTA: 0}
    col = f"partition.{LAYER}"
    if actions.num_rows == 0 or col not in actions.column_names:
        return out
    for layer, n in zip(actions.column(col).to_pylist(), actions.column("num_records").to_pylist()):
        if layer in out and n is not None:
            out[layer] += int(n)
    return out
