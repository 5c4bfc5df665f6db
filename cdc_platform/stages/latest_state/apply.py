"""The latest-state stage: each micro-batch's changes appended to `<name>` and `<name>_history`, exactly once.

Where the work runs. The executors type, fold and build each table's rows (`staging`: the batch grouped
by table, `prepare_table` per group); the driver decides from the plans they return (a few small rows)
and commits with delta-spark: the rows go from the executors into the Delta append, under the batch's
application transaction (`txnAppId`/`txnVersion`), so Delta itself refuses a replayed batch. A widened
column rewrites the table first (`writing.widen`); the delta layer is compacted once it has grown past
the threshold (`compaction`).

`prepare_table` is also what a backfill runs in the driver (`apply_table`), on a snapshot it holds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc_platform.lake import arrow_parts, lake_spark, schemas
from cdc_platform import lake
from cdc_platform.spark import spark_jobs
from cdc_platform.stages import unavailable
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.stages.latest_state import staging
from cdc_platform.stages.latest_state.compaction import compact
from cdc_platform.stages.latest_state.layout import BASE, DELTA, HISTORY_META, LAYER, META_FIELDS, STAGE
from cdc_platform.stages.latest_state.rows import (
    Events,
    TypedRows,
    build_rows,
    change_rows,
    dead_rows,
    history_schema,
    last_per_key,
    source_columns,
    state_schema,
    type_rows,
)
from cdc_platform.stages.latest_state.writing import _evolved, accept_names, ensure_tables, layer_rows, stored_lookup, stored_schema, table_specs, widen
from cdc_platform.stages.stage import BatchContext, SparkBatch, StageFailure, StageResult, dead_letter_rows
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

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


@dataclass
class TablePlan:
    """One batch's changes to one table, typed and built, not yet written.

    Rows carry `_seq` 0 until the commit knows the Delta version they land in.
    """

    table: TableConfig
    out: TableApply
    state: pa.Table | None = None  # rows for `<name>`, conformed to `state_target`
    state_target: pa.Schema | None = None
    state_rewrite: bool = False
    history: pa.Table | None = None
    history_target: pa.Schema | None = None
    history_rewrite: bool = False
    typed: TypedRows | None = None


def prepare_table(
    table: TableConfig, current: pa.Schema, hcurrent: pa.Schema | None, events: Events, lookup: unavailable.StoredLookup | None,
) -> TablePlan:
    """Type, fold and build one batch's rows for one table against its stored schemas; pure (no I/O
    beyond `lookup`, the stored values of keys whose unavailable-value placeholder the batch cannot fill)."""
    out = TableApply()
    plan = TablePlan(table, out)
    rows, bad = change_rows(events, table.key)
    typed, out.unavailable_filled, out.unavailable_unresolved = unavailable.resolve_batch(
        rows, events, lambda: type_rows(rows, events, source_columns(current), table), table.key, lookup)
    for e, code, reason in bad:
        typed.dead.setdefault(e, (code, reason))
    out.dead = dead_rows(events, typed.dead)
    live = [i for i, r in enumerate(rows) if r.event not in typed.dead]
    plan.typed = typed
    if not live:
        return plan
    winners = last_per_key([rows[i] for i in live], events)
    chosen = [live[i] for i in winners] + [i for i in live if rows[i].key is None]
    out.tombstones = sum(1 for i in chosen if rows[i].deleted and rows[i].key is not None)
    out.truncates = sum(1 for i in chosen if rows[i].key is None)
    out.added_columns, out.widened_columns = len(typed.added), len(typed.widened)
    plan.state_target, plan.state_rewrite = _evolved(current, typed.columns, META_FIELDS)
    plan.state = schemas.conform(build_rows(typed, events, sorted(chosen), table.key, seq=0), plan.state_target, safe=False)
    if table.history:
        plan.history_target, plan.history_rewrite = _evolved(hcurrent if hcurrent is not None else history_schema({}), typed.columns, HISTORY_META)
        plan.history = schemas.conform(build_rows(typed, events, live, table.key, seq=0, history=True), plan.history_target, safe=False)
    return plan


class LatestStateStage:
    """Appends each batch's changes to `<name>` (delta layer) and `<name>_history`, exactly once.

    A Spark stage (`stage.SparkStage`): `run` takes the batch as DataFrames. `prepare` replaces
    `prepare_table` in the executors' groups (tests inject failures through it).
    """

    name = STAGE
    keeps_tables = True  # a table added to the config is built from the raw log before its query keeps it

    def __init__(self, compact_min_changes: int = COMPACT_MIN_CHANGES, compact_ratio: float = COMPACT_RATIO,
                 prepare: staging.Prepare | None = None) -> None:
        self.compact_min_changes = compact_min_changes
        self.compact_ratio = compact_ratio
        self.prepare = prepare
        self._layers: dict[str, tuple[int, dict[str, int]]] = {}  # path -> (version, rows per layer at it)

    def setup(self, config: PlatformConfig) -> None:
        lake_spark.ensure_tables(lake_spark.session(), [spec for table in config.tables for spec in table_specs(config.lake, table)])

    def should_compact(self, layers: Mapping[str, int]) -> bool:
        return layers[DELTA] >= max(self.compact_min_changes, self.compact_ratio * layers[BASE])

    def run(self, batch: SparkBatch, ctx: BatchContext) -> StageResult:
        """Stage the batch's events on the executors, then commit each table's rows (see the module doc)."""
        config = ctx.config
        tables = [t for t in config.tables if t.source in batch.table_ids]
        if not tables:
            return StageResult()
        spark = batch.events.sparkSession
        inputs = dict(zip((t.source for t in tables),
                          spark_jobs.side_by_side([lambda t=t: _table_input(spark, config.lake, t) for t in tables], name="cdc-schema")))
        staged, plans = self._stage(batch.events, inputs, ctx)
        try:
            needs = {tid: p for tid, p in plans.items() if p.part == staging.NEED}
            if needs:  # placeholders only the stored state can fill: read it, stage those tables again
                again = {}
                for tid, need in needs.items():
                    table = inputs[tid].table
                    keys = arrow_parts.decode_one(need.payload)
                    found = stored_lookup(spark, lake.table_path(config.lake, table.name), table.key, keys, need.info["columns"])
                    again[tid] = _with_lookup(inputs[tid], found)
                restaged, replans = self._stage(batch.events.where(_table_in(again)), again, ctx)
                staged = _Staged([*staged.frames, *restaged.frames])
                plans.update(replans)
            result = StageResult()
            totals: dict[str, float] = {}
            dead_frames: list[DataFrame] = []
            order = sorted(plans)
            for tid in order:
                if plans[tid].part == staging.NEED:
                    raise StageFailure(f"the {STAGE} stage asked twice for stored values of {tid} in batch {ctx.batch_id}; the batch replays on restart")
            frames = {tid: staged.frame_of(tid) for tid in order}
            # Tables commit side by side: a Delta commit is mostly the driver waiting (log listing, writing the
            # commit file, the snapshot after it), and each table's is independent of the others'.
            tasks = [(tid, part) for tid in order for part in (staging.STATE, staging.HISTORY)]
            parts = spark_jobs.side_by_side([lambda tid=tid, part=part: self._commit_part(spark, config.lake, inputs[tid].table, plans[tid],
                                                                                          frames[tid], ctx, part) for tid, part in tasks], name="cdc-commit")
            committed = [TableApply(rows=state.rows, compacted=state.compacted, compact_seconds=state.compact_seconds,
                                    history_rows=history.history_rows) for state, history in zip(parts[::2], parts[1::2])]
            for tid, done in zip(order, committed):
                plan, frame = plans[tid], frames[tid]
                if done.rows:
                    result.rows_landed[inputs[tid].table.name] = done.rows
                if done.history_rows:
                    result.rows_landed[inputs[tid].table.history_name] = done.history_rows
                for k, v in plan.info["figures"].items():
                    totals[k] = totals.get(k, 0.0) + float(v)
                for k in ("compacted", "compact_seconds"):
                    totals[k] = totals.get(k, 0.0) + float(getattr(done, k))
                if not done.rows:
                    for k in ("added_columns", "widened_columns"):
                        totals[k] = totals.get(k, 0.0) - float(plan.info["figures"].get(k, 0.0))
                if plan.info.get("dead"):
                    dead_frames.append(decoded_part(frame, staging.DEAD, schemas.DEAD_LETTER))
                    totals["dead_letters"] = totals.get("dead_letters", 0.0) + float(plan.info["dead"])
            totals.setdefault("dead_letters", 0.0)
            result.figures = totals
            if dead_frames:
                dead = dead_frames[0]
                for more in dead_frames[1:]:
                    dead = dead.unionByName(more)
                result.dead_frame, result.dead_count = dead, int(totals["dead_letters"])
            result.release = staged.release
            return result
        except BaseException:
            staged.release()
            raise

    def _stage(self, events: DataFrame, inputs: Mapping[str, staging.TableInput], ctx: BatchContext) -> tuple[_Staged, dict[str, _Plan]]:
        """The executors' part: one `applyInArrow` group per table; the plans (small) come back to the driver."""
        from pyspark.sql import functions as F

        context = staging.StagingContext(tables=dict(inputs), stage=STAGE, batch_id=ctx.batch_id, prepare=self.prepare or prepare_table)
        # `line` (the whole envelope, the widest column) stays out of the shuffle: only dead letters need it,
        # and they take it back from the batch by input order.
        wanted = [c for c in events.columns if c != "line"]
        staged = (events.where(_table_in(inputs)).select(*wanted)
                  .groupBy("table_id").applyInArrow(staging.group_function(context), lake_spark.spark_schema(staging.STAGED)))
        staged = staged.persist()
        try:
            small = staged.where(F.col("part").isin(staging.PLAN, staging.NEED, staging.FAILURE)).collect()
        except BaseException:
            staged.unpersist()
            raise
        failures = [r for r in small if r["part"] == staging.FAILURE]
        if failures:
            staged.unpersist()
            raise StageFailure(json.loads(sorted(failures, key=lambda r: r["table_id"])[0]["info"])["message"])
        plans = {r["table_id"]: _Plan(r["part"], r["payload"], json.loads(r["info"] or "{}")) for r in small}
        return _Staged([(set(plans), staged, events)]), plans

    def _commit_part(self, spark: SparkSession, lake_dir: LakePath, table: TableConfig, plan: _Plan, frame: tuple[DataFrame, DataFrame],
                     ctx: BatchContext, part: str) -> TableApply:
        """Append one table's staged rows (`STATE`, then maybe compact) or its history rows (`HISTORY`) exactly
        once, widening first if a column widened. The two are separate tables, committed side by side."""
        out = TableApply()
        info = plan.info
        if plan.payload is None:
            return out  # every event of the table was dead-lettered
        if part == staging.STATE:
            target = pa.ipc.read_schema(pa.py_buffer(plan.payload))
            path = lake.table_path(lake_dir, table.name)
            if self._append(spark, path, ctx.app_id(table.name), ctx.batch_id, target, info["state_rewrite"], [LAYER],
                            lambda seq: decoded_part(frame, staging.STATE, target, seq=seq), rows=int(info["figures"]["rows"])):
                out.rows = int(info["figures"]["rows"])
                self._maybe_compact(spark, path, table, out)
            return out
        htarget = staging.schema_of(info.get("history_schema"))
        if htarget is not None and info.get("history_rows"):
            hpath = lake.table_path(lake_dir, table.history_name)
            if self._append(spark, hpath, ctx.app_id(table.history_name), ctx.batch_id, htarget, info["history_rewrite"], None,
                            lambda seq: decoded_part(frame, staging.HISTORY, htarget, seq=seq)):
                out.history_rows = int(info["history_rows"])
        return out

    def _append(self, spark: SparkSession, path: Path, app: str, batch_id: int, target: pa.Schema, rewrite: bool,
                partition_by: list[str] | None, rows_of: Callable[[int], DataFrame], rows: int = 0) -> bool:
        """Widen if needed, then append exactly once; True if this call wrote.

        No "already committed?" check first: Delta's own (`txnAppId`/`txnVersion`) refuses a replay, and
        a replay needs no widening (the stored schema it types against is already the widened one).
        `_seq` is the version the rows land in, as read just before (a concurrent commit in between
        only makes it lower than that version, still above every earlier batch's).
        """
        lake_spark.with_retries(lambda: accept_names(spark, path, target), what=f"column mapping of {path.name}")
        if rewrite:
            widen(spark, path, target, partition_by)

        def attempt() -> tuple[int, int | None]:  # again after a conflict (a backfill's schema change, say), from its version
            first = lake_spark.version(spark, path)
            return first, lake_spark.append_version(rows_of(first + 1), path, app, batch_id, merge_schema=True)

        before, after = lake_spark.with_retries(attempt, what=f"append to {path.name}")
        if after is None:
            return False
        if partition_by:  # a latest-state table: its delta layer grew by `rows`
            known = self._layers.get(str(path))
            if known is not None and known[0] == before:
                self._layers[str(path)] = (after, {BASE: known[1][BASE], DELTA: known[1][DELTA] + rows})
            else:
                self._layers.pop(str(path), None)
        return True

    def _maybe_compact(self, spark: SparkSession, path: Path, table: TableConfig, out: TableApply) -> None:
        """Compact once the delta layer passed the threshold. The layer sizes are kept from the last look and
        the appends since; they are read from the log again (a Spark job, ~1 s) only when another writer
        (compaction, `cdc maintain`, a backfill) committed in between."""
        known = self._layers.get(str(path))
        current = lake_spark.version(spark, path)
        if known is None or known[0] != current:
            known = (current, layer_rows(spark, path))
            self._layers[str(path)] = known
        if self.should_compact(known[1]):
            t0 = time.perf_counter()
            out.compacted = compact(path, table, spark).folded
            out.compact_seconds = time.perf_counter() - t0
            self._layers.pop(str(path), None)


@dataclass(frozen=True)
class _Plan:
    part: str  # PLAN or NEED
    payload: bytes | None
    info: dict[str, Any]


@dataclass
class _Staged:
    """The persisted staged frames of a batch (a second pass adds one), and the events each was made from."""

    frames: list[tuple[set[str], DataFrame, DataFrame]]

    def frame_of(self, table_id: str) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import functions as F

        for tids, staged, events in reversed(self.frames):  # the later pass wins
            if table_id in tids:
                return staged.where(F.col("table_id") == table_id), events
        raise KeyError(table_id)

    def release(self) -> None:
        for _, staged, _ in self.frames:
            staged.unpersist()


def decoded_part(frame: tuple[DataFrame, DataFrame | None], part: str, schema: pa.Schema, *, seq: int | None = None) -> DataFrame:
    """One part of staged rows (a `part` and an Arrow `payload` column, `arrow_parts`) as a DataFrame of
    `schema`, decoded on the executors; the rebuild's parts too.

    Dead letters get their `line` back from the events by event id (it stayed out of the shuffle); without
    events (None) they are decoded as they are.
    """
    from pyspark.sql import functions as F

    staged, events = frame
    rows = staged.where(F.col("part") == part).select("payload")
    constants = {"_seq": seq} if seq is not None else None
    decoded = rows.mapInArrow(arrow_parts.decoder(schema, constants), lake_spark.spark_schema(schema))
    if part != staging.DEAD or events is None:
        return decoded
    lines = events.select(F.col("event_id").alias("__id"), F.col("line").alias("__line"))  # one row per id (split)
    joined = decoded.join(lines, decoded["event_id"] == lines["__id"], "left")
    return joined.select(*[(F.coalesce(F.col("line"), F.col("__line")) if f.name == "line" else F.col(f.name)).alias(f.name) for f in schema])


def _table_in(inputs: Collection[str]) -> Any:
    from pyspark.sql import functions as F

    return F.col("table_id").isin(sorted(inputs))


def _table_input(spark: SparkSession, lake_dir: LakePath, table: TableConfig) -> staging.TableInput:
    path = lake.table_path(lake_dir, table.name)
    current = stored_schema(spark, path) or state_schema({})
    hcurrent = stored_schema(spark, lake.table_path(lake_dir, table.history_name)) if table.history else None
    return staging.TableInput(table=table, state_schema=current, history_schema=hcurrent)


def _with_lookup(given: staging.TableInput, found: staging.Stored) -> staging.TableInput:
    return staging.TableInput(table=given.table, state_schema=given.state_schema, history_schema=given.history_schema, lookup=found)


def apply_table(spark: SparkSession, lake_dir: LakePath, table: TableConfig, events: Events, *, ctx: BatchContext,
                stage: LatestStateStage) -> TableApply:
    """Prepare one table's events in the driver and commit them with delta-spark (backfills, which hold
    their snapshot in the driver already and isolate nothing)."""
    ensure_tables(spark, lake_dir, table)
    path = lake.table_path(lake_dir, table.name)
    current = stored_schema(spark, path) or state_schema({})
    hcurrent = stored_schema(spark, lake.table_path(lake_dir, table.history_name)) if table.history else None

    def lookup(keys: list[tuple[Any, ...]], columns: list[str]) -> staging.Stored:
        if not keys:
            return {}
        key_types = {k: current.field(k).type for k in table.key if k in current.names}
        if len(key_types) < len(table.key):
            return {}
        key_table = pa.table({k: pa.array([key[i] for key in keys], key_types[k]) for i, k in enumerate(table.key)})
        return stored_lookup(spark, path, table.key, key_table, columns)

    plan = prepare_table(table, current, hcurrent, events, lookup)
    out = plan.out
    if plan.state is not None and plan.state_target is not None:
        state, target = plan.state, plan.state_target
        if stage._append(spark, path, ctx.app_id(table.name), ctx.batch_id, target, plan.state_rewrite, [LAYER],
                         lambda seq: lake_spark.from_arrow(spark, _with_seq(state, seq), target), rows=state.num_rows):
            out.rows = state.num_rows
            stage._maybe_compact(spark, path, table, out)
        else:
            out.added_columns = out.widened_columns = 0
    if plan.history is not None and plan.history_target is not None:
        history, htarget = plan.history, plan.history_target
        hpath = lake.table_path(lake_dir, table.history_name)
        if stage._append(spark, hpath, ctx.app_id(table.history_name), ctx.batch_id, htarget, plan.history_rewrite, None,
                         lambda seq: lake_spark.from_arrow(spark, _with_seq(history, seq), htarget)):
            out.history_rows = history.num_rows
    return out


def _with_seq(data: pa.Table, seq: int) -> pa.Table:
    return data.set_column(data.schema.get_field_index("_seq"), "_seq", pa.array([seq] * data.num_rows, pa.int64()))


def dead_letters_of(out: TableApply, batch_id: int | None) -> pa.Table:
    """A prepared table's dead letters as `dead_letter` rows (the stage's own reasons)."""
    return dead_letter_rows(out.dead, stage=STAGE, batch_id=batch_id)

