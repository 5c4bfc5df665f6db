"""The pipeline stage around the pure step: Delta tables, exactly once, the held state, idle-time expiry.

`TransactionStage` creates the tables, keeps the state in memory between batches (stamped with the
state table's version), commits the outputs first and the state last, honours an idle expiry that
died before its state commit (`mark_expired`), vacuums the tables it rewrites, and expires on idle
time for `cdc stream`. All the package's I/O is here, so the other modules stay pure and testable
without a lake.

Writes go through delta-spark (`_write`: Delta's `txnAppId`/`txnVersion` guard each
table per batch), the three outputs and the watermark side by side, the state last. The few reads
(the state table into the held state, versions, application transactions, the last commit's
metadata) go through delta-rs: they are small tables read on the driver, where delta-rs answers in
milliseconds and a Spark job costs 0.3-1 s (see the README, "Which Delta library, and why").
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.spark import spark_jobs
from cdc_platform.config import PlatformConfig
from cdc_platform.stages.stage import BatchContext, ParsedBatch, StageResult
from cdc_platform.storage import LakePath
from cdc_platform.stages.transactions.aggregation import Held, hold, mark_expired, step
from cdc_platform.stages.transactions.arrow_ops import _arr, _conform
from cdc_platform.stages.transactions.schemas import (
    INCOMPLETE,
    LATE,
    OPEN,
    OPEN_TRANSACTIONS,
    OPEN_TRANSACTIONS_SCHEMA,
    PROCESSING_TIME,
    TABLE_SCHEMAS,
    TRANSACTIONS,
    WATERMARK,
    Settings,
    Step,
)

#: Overwritten tables (state, watermark) get a new file per batch; vacuum them every this many commits.
MAINTENANCE_EVERY = 100
MAINTENANCE_RETENTION_HOURS = 1
#: Prefix of the state commit's `userMetadata`, whose random rest tells the stage the commit is its own (see `TransactionStage`).
STATE_TOKEN = "cdc_state_commit="


def _write(spark: Any, path: LakePath, data: pa.Table, schema: pa.Schema, application: str | None, version: int | None,
           *, mode: str, metadata: str | None = None) -> bool:
    """Append to or overwrite (`mode`) one of the stage's tables unless this application already committed
    `version`; True when it committed.

    Without an application id the write is unguarded (a running stream's idle-time expiries have no
    batch id). An empty append commits nothing: the state commit, last, is what marks a batch done.
    The recorded version is read first (delta-rs, milliseconds) so that a replay ships no rows to Spark.
    """
    if mode == "append" and data.num_rows == 0:
        return False
    if application is not None and version is not None and lake.already_committed(lake.open_table(path), application, version):
        return False
    frame = lake_spark.from_arrow(spark, data, schema)
    return lake_spark.with_retries(lambda: lake_spark.save(frame, path, mode, application, version, metadata=metadata),
                                   what=f"{mode} {path.name}") is not None


#: What `TransactionStage.prepare` returns for a batch whose state is already committed.
REPLAYED = "replayed"


class TransactionStage:
    """The pipeline stage: one aggregation step per micro-batch, plus idle-time expiry for `cdc stream`.

    The state is held in memory between batches (`Held`), stamped with the version of the state
    table it equals. Why: reading, splitting and re-judging the whole state each batch made a batch
    cost as much as the open state. The stamp is only ever a version this stage read, or one it
    committed itself and recognised by a token in the commit's metadata; any other version (another
    process, a restart, a crash mid-batch, a commit that failed after landing) reloads the table.
    """

    name = "transactions"
    reads_markers = True  # its query reads the transaction markers beside the raw log (run/stage_queries.py)

    #: The event columns a step reads, plus what a dead letter names (`stage.poison_rows`).
    EVENT_COLUMNS = ("event_id", "transaction_id", "source_name", "table_id", "op", "key", "before", "after", "position",
                     "source_ts", "tx_total_order", "tx_collection_order", "source_file")
    #: Row images a step reads only for events in a transaction (the others only move clocks and marks).
    IMAGE_COLUMNS = ("op", "key", "before", "after")

    @classmethod
    def driver_columns(cls, columns: Sequence[str]) -> list[Any]:
        """What the driver collects of a batch's events (a DataFrame with `columns`) for this stage, as
        Spark columns: those a step reads, and row images only of events in a transaction. The original
        line stays on the executors, and the job takes it back by event id for the rare dead letter
        (`ingest`)."""
        from pyspark.sql import functions as F

        in_tx = F.col("transaction_id").isNotNull()
        return [F.when(in_tx, F.col(c)).alias(c) if c in cls.IMAGE_COLUMNS else F.col(c) for c in columns if c in cls.EVENT_COLUMNS]

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a batch and an idle tick never interleave
        self._cache: tuple[LakePath, int, Held] | None = None
        self._recovered: set[LakePath] = set()

    def setup(self, config: PlatformConfig) -> None:
        create_tables(config)

    def _path(self, config: PlatformConfig, name: str) -> LakePath:
        return lake.table_path(config.lake, name)

    def _cached(self, path: LakePath, version: int) -> Held | None:
        cached = self._cache
        if cached is not None and cached[0] == path and cached[1] == version:
            return cached[2]
        return None

    def _load(self, config: PlatformConfig, table: Any = None) -> Held:
        """The committed state: held from the last batch when the table is still at that version, else read."""
        path = self._path(config, OPEN_TRANSACTIONS)
        table = table if table is not None else lake.open_table(path)
        version = table.version()
        held = self._cached(path, version)
        if held is None:
            state = _conform(table.to_pyarrow_table(), OPEN_TRANSACTIONS_SCHEMA)
            if path not in self._recovered:
                state = self._recover_idle_expiries(config, state)
                self._recovered.add(path)
            held = hold(state)
            self._cache = (path, version, held)
        return held

    def _recover_idle_expiries(self, config: PlatformConfig, state: pa.Table) -> pa.Table:
        """An idle expiry that wrote its rows but died before the state commit: honour the rows."""
        open_ids = state.filter(pc.equal(state.column("entry"), OPEN)).column("transaction_id")
        if len(open_ids) == 0:
            return state
        done = lake.scan(lake.open_table(self._path(config, INCOMPLETE)), ["transaction_id", "expired_by"],
                         pc.field("expired_by") == PROCESSING_TIME)
        orphans = pc.unique(_arr(done.column("transaction_id")).filter(pc.is_in(_arr(done.column("transaction_id")), value_set=_arr(open_ids))))
        return mark_expired(state, orphans.to_pylist()) if len(orphans) else state

    def prepare(self, batch: ParsedBatch, ctx: BatchContext) -> tuple[Step, Held] | str | None:
        """One aggregation step against the committed state; `REPLAYED` or None when there is nothing to commit.

        `step` builds new tables and leaves the held state as it was, so the job may call this again
        on parts of the batch. A batch whose state is already committed is a replay: nothing to do.
        """
        config = ctx.config
        with self._lock:
            table = lake.open_table(self._path(config, OPEN_TRANSACTIONS))
            if lake.already_committed(table, ctx.app_id(OPEN_TRANSACTIONS), ctx.batch_id):
                return REPLAYED  # state is committed last: all done
            if batch.events.num_rows == 0 and batch.markers.num_rows == 0:
                return None
            held = self._load(config, table)
            return step(held, batch.events, batch.markers, Settings.from_config(config), batch_id=ctx.batch_id, now=batch.ingested_at)

    def commit(self, prepared: tuple[Step, Held] | str | None, ctx: BatchContext) -> StageResult:
        if prepared is None:
            return StageResult()
        if prepared == REPLAYED:
            return StageResult(figures={"replayed_batches": 1.0})
        result, after = prepared
        with self._lock:
            landed = self._commit(ctx.config, result, after, ctx)
        return StageResult(rows_landed=landed, figures=result.figures)

    def _commit(self, config: PlatformConfig, result: Step, after: Held, ctx: BatchContext | None) -> dict[str, int]:
        """Outputs first (side by side), state last, so a crash in between replays against the old state."""
        spark = lake_spark.session()
        version = None if ctx is None else ctx.batch_id

        def output(name: str, data: pa.Table) -> bool:
            app = None if ctx is None else ctx.app_id(name)
            return _write(spark, self._path(config, name), data, TABLE_SCHEMAS[name], app, version,
                          mode="overwrite" if name == WATERMARK else "append", metadata=None if ctx is not None else "trigger=idle")

        outputs = [(TRANSACTIONS, result.completed), (INCOMPLETE, result.incomplete), (LATE, result.late), (WATERMARK, result.watermark)]
        wrote = spark_jobs.side_by_side([lambda item=item: output(*item) for item in outputs], name="cdc-tx-commit")
        landed = {name: data.num_rows for (name, data), done in zip(outputs, wrote) if done and name != WATERMARK}
        state_path = self._path(config, OPEN_TRANSACTIONS)
        app = None if ctx is None else ctx.app_id(OPEN_TRANSACTIONS)
        token = STATE_TOKEN + uuid.uuid4().hex
        self._cache = None  # until the commit is known to be ours
        _write(spark, state_path, result.state, OPEN_TRANSACTIONS_SCHEMA, app, version, mode="overwrite", metadata=token)
        self._cache = held_after_commit(config, state_path, token, after)
        return landed

    def on_idle(self, ctx: BatchContext, idle_seconds: float) -> StageResult | None:
        """`cdc stream` received nothing for `idle_seconds`: advance event time by that much and expire what is due."""
        config = ctx.config
        if idle_seconds < config.transaction_timeout:
            return None
        with self._lock:
            path = self._path(config, OPEN_TRANSACTIONS)
            cached = self._cached(path, lake.open_table(path).version())
            if cached is not None and not cached.has_open:
                return None
            if replay_pending(ctx):
                return None
            held = self._load(config)
            if not held.has_open:
                return None
            result, after = step(
                held, pa.table({}), pa.table({}), Settings.from_config(config),
                batch_id=None, now=dt.datetime.now(dt.timezone.utc), idle_us=int(idle_seconds * 1_000_000),
            )
            if result.incomplete.num_rows == 0:
                return None
            landed = self._commit(config, result, after, None)
            return StageResult(rows_landed=landed, figures=result.figures)


def create_tables(config: PlatformConfig) -> None:
    """The stage's five tables, created side by side where missing."""
    spark = lake_spark.session()
    lake_spark.ensure_tables(spark, [(lake.table_path(config.lake, name), lake_spark.spark_schema(schema), ())
                                     for name, schema in TABLE_SCHEMAS.items()])


def held_after_commit(config: PlatformConfig, state_path: LakePath, token: str, held: Any) -> tuple[LakePath, int, Any] | None:
    """What a stage may keep of the state it just committed: `held`, stamped with the new version, when
    that commit is its own (its `userMetadata` is `token`), else nothing. Every `MAINTENANCE_EVERY`
    versions the overwritten tables are vacuumed here too (`maintain`)."""
    table = lake.open_table(state_path)
    cached = (state_path, table.version(), held) if _latest_commit(table).get("userMetadata") == token else None
    if table.version() % MAINTENANCE_EVERY == 0:
        cached = maintain(config, cached)
    return cached


def maintain(config: PlatformConfig, cached: tuple[LakePath, int, Any] | None) -> tuple[LakePath, int, Any] | None:
    """The state and watermark tables are rewritten every batch: drop their old files. Returns what a
    stage held of the state (`cached`, stamped with a version) if it is still valid, restamped.

    Vacuum adds commits of its own that leave the rows as they are, so a held state stays valid when
    nothing but those lies between its stamp and the new version.
    """
    spark = lake_spark.session()
    for name in (OPEN_TRANSACTIONS, WATERMARK):
        lake_spark.vacuum(spark, lake.table_path(config.lake, name), MAINTENANCE_RETENTION_HOURS, enforce_retention=False)
    if cached is None:
        return None
    table = lake.open_table(cached[0])
    newer = table.version() - cached[1]
    if newer >= 0 and all(str(c.get("operation", "")).startswith("VACUUM") for c in (table.history(newer) if newer else [])):
        return (cached[0], table.version(), cached[2])
    return None


def replay_pending(ctx: BatchContext) -> bool:
    """True when a batch's outputs are ahead of the state: that batch must be replayed first (no idle expiry now)."""
    lake_dir = ctx.config.lake
    state_version = lake.open_table(lake.table_path(lake_dir, OPEN_TRANSACTIONS)).transaction_version(ctx.app_id(OPEN_TRANSACTIONS))
    for name in (TRANSACTIONS, INCOMPLETE, LATE, WATERMARK):
        v = lake.open_table(lake.table_path(lake_dir, name)).transaction_version(ctx.app_id(name))
        if v is not None and (state_version is None or v > state_version):
            return True
    return False


def _latest_commit(table: Any) -> dict[str, Any]:
    """The commit info of the table's current version (custom metadata appears as top-level keys)."""
    history = table.history(1)
    return history[0] if history else {}
