"""The latest-state stage: each micro-batch's changes appended to `<name>` and `<name>_history`, exactly once.

`prepare` types, folds and builds each table's rows and only reads; `commit` appends them to the delta
layer and the history (widening the table first when a column's type widened) under the batch's
application transaction, then compacts when the delta layer has grown past the threshold.
`apply_table` does both at once for backfills.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from cdc_platform import lake, unavailable
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.latest_state.compaction import compact
from cdc_platform.latest_state.layout import BASE, DELTA, HISTORY_META, LAYER, META_FIELDS, STAGE
from cdc_platform.latest_state.rows import (
    Events,
    TypedRows,
    build_rows,
    change_rows,
    conform,
    history_schema,
    last_per_key,
    source_columns,
    state_schema,
    table_schema,
    type_rows,
)
from cdc_platform.latest_state.writing import _evolved, _layer_rows, ensure_tables, widen
from cdc_platform.stage import BatchContext, ParsedBatch, StageResult, dead_letter_rows

#: Compaction threshold: fold the delta layer into the base once it holds this many rows, or this
#: fraction of the base, whichever is larger (a fixed fraction keeps the amortised cost per change flat).
COMPACT_MIN_CHANGES = 100_000
COMPACT_RATIO = 0.1


@dataclass
class TableApply:
    """What one batch did to one table."""

    rows: int = 0
    history_rows: int = 0
    tombstones: int = 0
    truncates: int = 0
    added_columns: int = 0
    widened_columns: int = 0
    compacted: int = 0
    compact_seconds: float = 0.0
    unavailable_filled: int = 0  # Debezium placeholders replaced by the previous value (`unavailable`)
    unavailable_unresolved: int = 0  # ... for which no previous value was known: stored as NULL
    dead: list[dict[str, Any]] = field(default_factory=list)


class LatestStateStage:
    """Appends each batch's changes to `<name>` (delta layer) and `<name>_history`, exactly once."""

    name = STAGE

    def __init__(self, compact_min_changes: int = COMPACT_MIN_CHANGES, compact_ratio: float = COMPACT_RATIO) -> None:
        self.compact_min_changes = compact_min_changes
        self.compact_ratio = compact_ratio

    def setup(self, config: PlatformConfig) -> None:
        for table in config.tables:
            ensure_tables(config.lake, table)

    def prepare(self, batch: ParsedBatch, ctx: BatchContext) -> list[TablePlan]:
        events = batch.events
        if events.num_rows == 0 or not ctx.config.tables:
            return []
        table_ids = events.column("table_id")
        plans = []
        for table in ctx.config.tables:
            mine = events.filter(pc.equal(table_ids, table.source))
            if mine.num_rows:
                plans.append(prepare_table(ctx.config.lake, table, Events(mine)))
        return plans

    def commit(self, plans: list[TablePlan], ctx: BatchContext) -> StageResult:
        result = StageResult()
        dead: list[dict[str, Any]] = []
        totals: dict[str, float] = {}
        for plan in plans:
            done = commit_table(plan, ctx=ctx, stage=self)
            if done.rows:
                result.rows_landed[plan.table.name] = done.rows
            if done.history_rows:
                result.rows_landed[plan.table.history_name] = done.history_rows
            dead.extend(done.dead)
            for k in ("rows", "tombstones", "truncates", "added_columns", "widened_columns", "compacted", "compact_seconds",
                      "unavailable_filled", "unavailable_unresolved"):
                totals[k] = totals.get(k, 0.0) + float(getattr(done, k))
        if plans:
            totals["dead_letters"] = float(len(dead))
            result.figures = totals
        if dead:
            result.dead_letters = dead_letter_rows(dead, stage=STAGE, batch_id=ctx.batch_id)
        return result

    def should_compact(self, layers: Mapping[str, int]) -> bool:
        return layers[DELTA] >= max(self.compact_min_changes, self.compact_ratio * layers[BASE])


def _dead_rows(events: Events, dead: Mapping[int, tuple[str, str]]) -> list[dict[str, Any]]:
    if not dead:
        return []
    order = sorted(dead)
    cols = {c: events.take(c, order).to_pylist() for c in ("table_id", "event_id", "line", "source_file")}
    return [
        {"reason_code": dead[e][0], "reason": dead[e][1], **{c: cols[c][i] for c in cols}}
        for i, e in enumerate(order)
    ]


@dataclass
class TablePlan:
    """One batch's changes to one table, typed and built, not yet written (see `stage.Stage.prepare`).

    Rows carry `_seq` 0 until `commit_table` knows the Delta version they land in.
    """

    lake_dir: Path
    table: TableConfig
    out: TableApply
    state: pa.Table | None = None  # rows for `<name>`, conformed to `state_target`
    state_target: pa.Schema | None = None
    state_rewrite: bool = False
    history: pa.Table | None = None
    history_target: pa.Schema | None = None
    history_rewrite: bool = False
    typed: TypedRows | None = None


def prepare_table(lake_dir: Path, table: TableConfig, events: Events) -> TablePlan:
    """Type, fold and build one batch's rows for one table; reads the stored schemas, writes nothing."""
    out = TableApply()
    plan = TablePlan(lake_dir, table, out)
    path = lake.table_path(lake_dir, table.name)
    current = table_schema(path) if (path / "_delta_log").is_dir() else state_schema({})
    rows, bad = change_rows(events, table.key)
    typed, out.unavailable_filled, out.unavailable_unresolved = unavailable.resolve_batch(
        rows, events, lambda: type_rows(rows, events, source_columns(current), table), table.key, unavailable.stored_lookup(path, table.key))
    for e, code, reason in bad:
        typed.dead.setdefault(e, (code, reason))
    out.dead = _dead_rows(events, typed.dead)
    live = [i for i, r in enumerate(rows) if r.event not in typed.dead]
    if not live:
        return plan
    winners = last_per_key([rows[i] for i in live], events)
    chosen = [live[i] for i in winners] + [i for i in live if rows[i].key is None]
    out.tombstones = sum(1 for i in chosen if rows[i].deleted and rows[i].key is not None)
    out.truncates = sum(1 for i in chosen if rows[i].key is None)
    out.added_columns, out.widened_columns = len(typed.added), len(typed.widened)
    plan.typed = typed
    plan.state_target, plan.state_rewrite = _evolved(current, typed.columns, META_FIELDS)
    plan.state = conform(build_rows(typed, events, sorted(chosen), table.key, seq=0), plan.state_target)
    if table.history:
        hpath = lake.table_path(lake_dir, table.history_name)
        hcurrent = table_schema(hpath) if (hpath / "_delta_log").is_dir() else history_schema({})
        plan.history_target, plan.history_rewrite = _evolved(hcurrent, typed.columns, HISTORY_META)
        plan.history = conform(build_rows(typed, events, live, table.key, seq=0, history=True), plan.history_target)
    return plan


def _with_seq(data: pa.Table, seq: int) -> pa.Table:
    return data.set_column(data.schema.get_field_index("_seq"), "_seq", pa.array([seq] * data.num_rows, pa.int64()))


def commit_table(plan: TablePlan, *, ctx: BatchContext, stage: LatestStateStage) -> TableApply:
    """Write a prepared table plan, exactly once per (query id, batch id); maybe compact."""
    table, out = plan.table, plan.out
    lake_dir = plan.lake_dir
    path = lake.table_path(lake_dir, table.name)
    if not (path / "_delta_log").is_dir() or (table.history and not (lake.table_path(lake_dir, table.history_name) / "_delta_log").is_dir()):
        ensure_tables(lake_dir, table)  # normally done by `setup`; a stage used on its own creates them here
    if plan.state is None:
        return out
    state = lake.open_table(path)
    app = ctx.app_id(table.name)
    if not lake.already_committed(state, app, ctx.batch_id):
        if plan.state_rewrite:
            widen(path, plan.state_target, [LAYER])
            state = lake.open_table(path)
        data = _with_seq(plan.state, state.version() + 1)
        lake.with_retries(
            lambda: write_deltalake(
                lake.open_table(path), data, mode="append", schema_mode="merge", partition_by=[LAYER],
                commit_properties=lake.commit_props(app, ctx.batch_id, stage=STAGE),
            ),
            what=f"append to {table.name}",
        )
        out.rows = data.num_rows
        layers = _layer_rows(lake.open_table(path))
        if stage.should_compact(layers):
            t0 = time.perf_counter()
            out.compacted = compact(path, table).folded
            out.compact_seconds = time.perf_counter() - t0
    else:
        out.added_columns = out.widened_columns = 0

    if plan.history is not None:
        hpath = lake.table_path(lake_dir, table.history_name)
        history = lake.open_table(hpath)
        happ = ctx.app_id(table.history_name)
        if not lake.already_committed(history, happ, ctx.batch_id):
            if plan.history_rewrite:
                widen(hpath, plan.history_target, None)
                history = lake.open_table(hpath)
            hdata = _with_seq(plan.history, history.version() + 1)
            lake.with_retries(
                lambda: write_deltalake(
                    lake.open_table(hpath), hdata, mode="append", schema_mode="merge",
                    commit_properties=lake.commit_props(happ, ctx.batch_id, stage=STAGE),
                ),
                what=f"append to {table.history_name}",
            )
            out.history_rows = hdata.num_rows
    return out


def apply_table(lake_dir: Path, table: TableConfig, events: Events, *, ctx: BatchContext, stage: LatestStateStage) -> TableApply:
    """Prepare and commit one table's events at once (backfills, which isolate nothing)."""
    return commit_table(prepare_table(lake_dir, table, events), ctx=ctx, stage=stage)
