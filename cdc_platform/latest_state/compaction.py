"""Compaction and tombstone purge of a stored latest-state table.

`compact` folds the delta layer into the base with one delta-rs MERGE (applying truncate markers) and
drops the folded delta rows; `purge_tombstones` deletes tombstones older than the table's retention.
The stage compacts when the delta layer grows and `cdc maintain` does both; kept apart from the stage
because it works on the whole stored table, not on a batch.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdc_platform import lake, ordering
from cdc_platform.config import TableConfig
from cdc_platform.latest_state.layout import BASE, DELTA, LAYER
from cdc_platform.latest_state.rows import conform, source_columns
from cdc_platform.latest_state.writing import _layer_rows

@dataclass
class CompactReport:
    folded: int = 0  # delta rows folded into the base
    base_rows: int = 0
    truncated: bool = False
    seconds: float = 0.0


def _key_filter(key: Sequence[str], *, null: bool) -> pc.Expression:
    expr: pc.Expression | None = None
    for k in key:
        part = pc.field(k).is_null() if null else pc.field(k).is_valid()
        expr = part if expr is None else (expr & part)
    assert expr is not None
    return expr


def _delta_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


fold_latest = ordering.fold_latest  # one row per key by (position, first arrival); see `ordering`


def compact(path: Path, table: TableConfig) -> CompactReport:
    """Fold the delta layer into the base: MERGE by key where the change's position is higher, then
    drop the folded delta rows. Safe to repeat and to interrupt: until the DELETE commits, the view folds
    the same rows from both layers to the same answer.
    """
    t0 = time.perf_counter()
    report = CompactReport()
    state = lake.open_table(path)
    schema = pa.schema(state.schema().to_arrow())
    src_cols = source_columns(schema)
    if not all(k in src_cols for k in table.key):
        return report
    delta = state.to_pyarrow_dataset().to_table(filter=pc.field(LAYER) == DELTA)
    if delta.num_rows == 0:
        return report
    delta = conform(delta, schema)
    top_seq = int(pc.max(delta.column("_seq")).as_py())
    markers = delta.filter(_key_filter(table.key, null=True) & (pc.field("_op") == "t"))
    changes = fold_latest(delta.filter(_key_filter(table.key, null=False)), table.key)

    base_marker = _newest_marker(state, table.key)
    new_marker = _newest(markers) if markers.num_rows else None
    truncate_now = new_marker is not None and (base_marker is None or new_marker.column("_position")[0].as_py() > base_marker["_position"])
    cut = new_marker.to_pylist()[0] if truncate_now and new_marker is not None else base_marker
    if cut is not None:
        changes = _tombstone_below(changes, cut, table.key, src_cols)
    if truncate_now and cut is not None and new_marker is not None:
        _truncate_base(path, cut, table.key, src_cols)  # every stored row below the new truncate
        report.truncated = True
        changes = pa.concat_tables([changes, new_marker])

    source = changes.set_column(changes.schema.get_field_index(LAYER), LAYER, pa.array([BASE] * changes.num_rows, pa.string()))
    on = " AND ".join(f"t.{_delta_ident(k)} = s.{_delta_ident(k)}" for k in table.key)
    predicate = f"t.{_delta_ident(LAYER)} = '{BASE}' AND {on}"

    # Explicit, quoted assignments: delta-rs's update_all/insert_all do not quote odd column names.
    assign = {_delta_ident(c): f"s.{_delta_ident(c)}" for c in source.column_names}

    def merge() -> dict[str, Any]:
        return (
            lake.open_table(path)
            .merge(source, predicate, source_alias="s", target_alias="t", commit_properties=lake.commit_props(None, None, cdc_operation="compact"))
            .when_matched_update(updates=assign, predicate=ordering.MERGE_NEWER)
            .when_not_matched_insert(updates=assign)
            .execute()
        )

    lake.with_retries(merge, what=f"compact {path.name}")
    lake.with_retries(
        lambda: lake.open_table(path).delete(f"{_delta_ident(LAYER)} = '{DELTA}' AND _seq <= {top_seq}"),
        what=f"drop folded changes of {path.name}",
    )
    report.folded = delta.num_rows
    report.base_rows = _layer_rows(lake.open_table(path))[BASE]
    report.seconds = time.perf_counter() - t0
    return report


def _newest(rows: pa.Table) -> pa.Table:
    """The one row with the highest `_position`."""
    return rows.slice(pc.index(rows.column("_position"), pc.max(rows.column("_position"))).as_py(), 1)


def _newest_marker(state: DeltaTable, key: Sequence[str]) -> dict[str, Any] | None:
    base = lake.scan(
        state, [*key, "_op", "_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id"],
        _key_filter(key, null=True) & (pc.field("_op") == "t"), partitions=[(LAYER, "=", BASE)],
    ).select(["_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id"])
    if base.num_rows == 0:
        return None
    return _newest(base).to_pylist()[0]


def _tombstone_below(rows: pa.Table, cut: Mapping[str, Any], key: Sequence[str], src_cols: Mapping[str, pa.DataType]) -> pa.Table:
    """Rows below a truncate become the truncate's tombstones: key kept, values gone, its metadata."""
    below = pc.less(rows.column("_position"), cut["_position"])
    if not pc.any(below).as_py():
        return rows
    out = rows
    for col, dtype in src_cols.items():
        if col in key:
            continue
        i = out.schema.get_field_index(col)
        out = out.set_column(i, col, pc.if_else(below, pa.scalar(None, out.schema.field(col).type), out.column(col)))
    replace = {"_op": "t", "_deleted": True, "_position": cut["_position"], "_source_ts": cut["_source_ts"],
               "_transaction_id": cut["_transaction_id"], "_ingested_at": cut["_ingested_at"], "_event_id": cut["_event_id"]}
    for col, value in replace.items():
        i = out.schema.get_field_index(col)
        typ = out.schema.field(col).type
        out = out.set_column(i, col, pc.if_else(below, pa.scalar(value, typ), out.column(col)))
    return out


def _ts_literal(value: dt.datetime | None) -> str:
    if value is None:
        return "NULL"
    return f"arrow_cast('{value.astimezone(dt.timezone.utc).strftime('%Y-%m-%dT%H:%M:%S.%f')}Z', 'Timestamp(Microsecond, Some(\"UTC\"))')"


def _truncate_base(path: Path, cut: Mapping[str, Any], key: Sequence[str], src_cols: Mapping[str, pa.DataType]) -> None:
    updates = {_delta_ident(c): "NULL" for c in src_cols if c not in key}
    updates |= {
        "_op": "'t'",
        "_deleted": "true",
        "_position": lake.delta_string(cut["_position"]),
        "_source_ts": _ts_literal(cut["_source_ts"]),
        "_transaction_id": "NULL" if cut["_transaction_id"] is None else lake.delta_string(cut["_transaction_id"]),
        "_ingested_at": _ts_literal(cut["_ingested_at"]),
        "_event_id": lake.delta_string(cut["_event_id"]),
    }
    keys_present = " AND ".join(f"{_delta_ident(k)} IS NOT NULL" for k in key)
    predicate = f"{_delta_ident(LAYER)} = '{BASE}' AND {keys_present} AND _position < {lake.delta_string(cut['_position'])}"
    lake.with_retries(lambda: lake.open_table(path).update(updates=updates, predicate=predicate), what=f"truncate {path.name}")


def purge_tombstones(path: Path, table: TableConfig, now: dt.datetime | None = None) -> int:
    """Delete base tombstones (and truncate markers) landed more than `tombstone_retention` ago.

    After this, a change older than a purged tombstone that still arrives would bring its row back:
    the retention is the promise of how late a stale change may be.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    cutoff = now - dt.timedelta(seconds=table.tombstone_retention)
    predicate = f"{_delta_ident(LAYER)} = '{BASE}' AND _deleted AND _ingested_at < {_ts_literal(cutoff)}"
    metrics = lake.with_retries(lambda: lake.open_table(path).delete(predicate), what=f"purge tombstones of {path.name}")
    return int((metrics or {}).get("num_deleted_rows", 0))
