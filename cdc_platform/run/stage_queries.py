"""The stages as streaming queries of their own, each reading the raw log as a Delta streaming source.

Why: the raw log is the source of truth and the only table on a reader's path (the latest-state views
read its not-yet-folded tail, `views`). Everything else derived from it (latest state, transactions)
runs as its own query with its own checkpoint (`<lake>/_checkpoints/stage_<name>`), so a slow or
failing stage delays only its own tables, never the raw log, and the ingest batch writes one table's
worth of commits instead of every stage's.

A stage query's micro-batch is the raw-log rows (and, for a stage that reads them, the markers) that
landed since its last batch, in the order they landed: `_seq` is made from each row's `ingested_at`
(its ingest batch) and `arrival` (its place in that batch), which is what the stages order two distinct
events at one source position by. The stage then runs exactly as it ran inside the ingest batch (the
`SparkStage`/`Stage` protocols of `stages.stage`, poison events isolated and dead-lettered), committing
with Delta's application transaction `<stage query id>:<table>` = the stage batch's id, so a replayed
batch (after a crash anywhere) commits nothing twice. Each batch ends with one `stage_progress` row,
whose `applied_through` tells the views how far the stage has folded the raw log.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc_platform import lake
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.lake import lake_spark, schemas
from cdc_platform.parse import parse_spark
from cdc_platform.backfill.onboarding import ConfigWatch, build_from_raw_log
from cdc_platform.run.queries import BatchGate, StopRequested, quiet_refused_batches
from cdc_platform.run.run_reports import BatchReport
from cdc_platform.spark import spark_jobs
from cdc_platform.stages.stage import (
    DEAD_LETTER,
    MARKERS,
    PROGRESS,
    RAW,
    BatchContext,
    ParsedBatch,
    SparkBatch,
    SparkStage,
    Stage,
    StageResult,
    TableClock,
    run_spark_stage,
    run_stage,
)
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

#: `_seq` = (rank of the row's ingest batch in the stage batch) << ARRIVAL_BITS | its `arrival`: an ingest batch's
#: `arrival` is `monotonically_increasing_id` (partition << 33 | row), below 2**43 for batches of under 1,024 partitions.
ARRIVAL_BITS = 43
#: Above this many ingest batches in one stage batch, or an `arrival` past its bits, `_seq` is ranked by a window.
MAX_RANKED_BATCHES = 4096
#: The most raw-log data one stage batch reads (Delta's `maxBytesPerTrigger`, a soft limit): a stage that fell
#: far behind catches up in batches of this size instead of one batch holding everything.
MAX_BYTES_PER_TRIGGER = "512m"
#: The columns a stage batch carries of each side; markers reach only the stages that read them.
KIND = "__kind"


def checkpoint_dir(config: PlatformConfig, name: str) -> LakePath:
    """A stage query's checkpoint: in the lake beside the ingest's, since it reads the lake, not the source."""
    return config.lake / "_checkpoints" / f"stage_{name}"


@dataclass(frozen=True)
class _Shape:
    """The stage batch's small aggregate, collected: what the driver needs to build the batch and its progress row."""

    events: int
    markers: int
    table_ids: frozenset[str]
    batches: tuple[dt.datetime, ...]  # the distinct `ingested_at` of its rows, oldest first
    max_arrival: int | None
    applied_through: dt.datetime | None
    newest_source_ts: dt.datetime | None
    table_clocks: tuple[TableClock, ...] = ()  # as the ingest's parse counts them (`parse_spark.table_clocks`)
    marker_clock: tuple[int | None, int] = (None, 0)


class StageQuery:
    """One stage (`SparkStage` or driver-side `Stage`) run as a streaming query over the raw log."""

    def __init__(self, stage: Stage | SparkStage, config: PlatformConfig, progress: Callable[[str], None] | None = None) -> None:
        self.stage = stage
        self.config = config
        self.progress = progress or (lambda _msg: None)
        self.name = stage.name
        #: Whether the stage reads transaction markers beside the events (the transaction stage does).
        self.reads_markers = bool(getattr(stage, "reads_markers", False))
        self.reports: list[BatchReport] = []
        self.failure: BaseException | None = None
        self._query_id: str | None = None
        self.gate = BatchGate()
        self.last_activity = time.monotonic()
        self.last_batch_id = -1
        #: Tables added to the config file while the stream runs are onboarded before this query's next batch.
        self._config_watch = ConfigWatch(config, self.progress) if config.source_file is not None else None

    # -- where it reads and keeps its progress --------------------------------------------------------
    @property
    def checkpoint(self) -> LakePath:
        return checkpoint_dir(self.config, self.name)

    def path(self, name: str) -> LakePath:
        return lake.table_path(self.config.lake, name)

    def query_id(self) -> str:
        """The query's id from its checkpoint (stable across restarts): the application of its Delta commits."""
        if self._query_id is None:
            meta = self.checkpoint / "metadata"
            self._query_id = json.loads(meta.read_text(encoding="utf-8").splitlines()[0])["id"]
        return self._query_id

    def onboard(self, updated: PlatformConfig, added: Sequence[TableConfig]) -> None:
        """Take tables added to the config: a stage that keeps per-table state (`keeps_tables`, the latest state)
        builds each new table from the raw log first (its whole past, the fold `cdc rebuild` runs), then keeps it
        from this query's next batch on. Rows of that batch the build already folded fold again to the same state."""
        if not added:
            return
        if getattr(self.stage, "keeps_tables", False):
            build_from_raw_log(updated, added, self.progress)
        self.config = updated
        self.stage.setup(updated)
        if getattr(self.stage, "keeps_tables", False):
            self.progress(f"onboarded {', '.join(f'{t.source} as {t.name}' for t in added)}: kept from this batch on, without a restart")

    def _poll_config(self) -> None:
        updated = self._config_watch.poll() if self._config_watch is not None else None
        if updated is not None:
            self.onboard(updated, [t for t in updated.tables if t not in self.config.tables])

    def note_upgrade(self, raw_version: int) -> None:
        """A lake whose stages ran inside the ingest batch (before stage queries): they applied every raw-log
        version up to `raw_version`, so this query starts after it instead of folding the whole log again."""
        lake.write_json_atomic(self.checkpoint / "start.json", {"startingVersion": raw_version + 1})

    def _starting_version(self, table: LakePath) -> int | None:
        """Where a query without offsets starts reading `table`: after an upgraded lake's applied versions
        (`note_upgrade`), else at version 0 when that reads what the current snapshot holds and the snapshot's
        listing can be skipped (`lake.appends_from_version_zero`), else (None) at the current snapshot."""
        if (self.checkpoint / "offsets").is_dir():
            return None  # the checkpoint decides
        start = self.checkpoint / "start.json"
        if start.exists():
            return int(json.loads(start.read_text(encoding="utf-8"))["startingVersion"])
        return 0 if lake.appends_from_version_zero(table) else None

    # -- the stream -----------------------------------------------------------------------------------
    def stream(self, spark: SparkSession) -> DataFrame:
        """The raw log as a Delta stream (and the markers beside it, tagged, for a stage that reads them)."""
        from pyspark.sql import functions as F

        def read(name: str) -> DataFrame:
            reader = spark.readStream.format("delta").option("maxBytesPerTrigger", MAX_BYTES_PER_TRIGGER)
            start = self._starting_version(self.path(name))
            if start is not None:
                reader = reader.option("startingVersion", start)
            return reader.load(lake_spark.location(self.path(name)))

        events = read(RAW).withColumn(KIND, F.lit("event"))
        if not self.reads_markers:
            return events
        markers = read(MARKERS).withColumn(KIND, F.lit("marker"))
        return events.unionByName(markers, allowMissingColumns=True)

    def start(self, spark: SparkSession, *, available_now: bool, interval: str | None = None) -> StreamingQuery:
        quiet_refused_batches()
        writer = (self.stream(spark).writeStream.foreachBatch(self.foreach_batch)
                  .option("checkpointLocation", lake_spark.location(self.checkpoint))
                  .queryName(f"cdc_stage_{self.name}_{abs(hash(str(self.config.lake))) % 10**8}"))
        writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=interval or self.config.trigger_interval)
        return writer.start()

    def foreach_batch(self, df: DataFrame, batch_id: int) -> None:
        try:
            with self.gate.lock, spark_jobs.in_pool("stages"):
                self.gate.check(batch_id)
                self._poll_config()
                report = self.run_batch(df, batch_id)
                self.last_activity = time.monotonic()
                self.last_batch_id = batch_id
        except StopRequested:  # an orderly stop refusing the next batch, not a failed stage: it replays on restart
            raise
        except BaseException as exc:  # keep the original error; Spark would wrap it beyond recognition
            self.failure = exc
            if not isinstance(exc, Exception):  # py4j's callback thread would die on it and the query would never end
                raise RuntimeError(f"{type(exc).__name__} in the batch") from exc
            raise
        self.reports.append(report)
        landed = ", ".join(f"{v:,} {k}" for k, v in sorted(report.rows_landed.items()) if v)
        self.progress(f"{self.name} batch {batch_id}: {report.change_events:,} events, {report.markers:,} markers -> "
                      f"{landed or 'nothing new'}, {report.dead_letters:,} dead letters ({report.seconds:.2f} s)")

    # -- one batch ------------------------------------------------------------------------------------
    def run_batch(self, rows: DataFrame, batch_id: int) -> BatchReport:
        """Run the stage on one batch of raw-log rows (and markers), then write its dead letters and progress."""
        t0 = time.perf_counter()
        started = dt.datetime.now(dt.timezone.utc)
        ctx = BatchContext(self.config, self.query_id(), batch_id)
        with spark_jobs.labelled(self.name, f"cdc {self.name} batch {batch_id}"):
            shape = _shape_of(rows, self.reads_markers)
            events, markers = self._sides(rows, shape)
            batch = SparkBatch(batch_id, events, markers, shape.table_ids, started, event_count=shape.events, marker_count=shape.markers,
                               table_clocks=shape.table_clocks, marker_clock=shape.marker_clock)
            result, seconds = self._run_stage(batch, ctx)
            landed = dict(result.rows_landed)
            dead = self._write_dead(result, ctx, landed)
            report = BatchReport(batch_id=batch_id, rows_read=0, change_events=shape.events, markers=shape.markers, tombstones=0,
                                 dead_letters=dead, duplicates_skipped=0, rows_landed=landed,
                                 stage_seconds={self.name: seconds}, seconds=time.perf_counter() - t0)
            self._write_progress(report, result.figures, shape, started, ctx)
        report.seconds = time.perf_counter() - t0
        return report

    def _sides(self, rows: DataFrame, shape: _Shape) -> tuple[DataFrame, DataFrame]:
        from pyspark.sql import functions as F

        seq = _seq_column(shape)
        kind = F.col(KIND)
        events = rows.where(kind == "event").select(*[F.col(f.name) for f in schemas.RAW_CHANGE_EVENTS])
        events = _ranked(events) if seq is _WINDOWED else events.withColumn(parse_spark.SEQ, seq)
        if self.reads_markers:
            markers = rows.where(kind == "marker").select(*[F.col(f.name) for f in schemas.TRANSACTION_MARKERS],
                                                          F.unix_micros(F.col("ingested_at")).alias(parse_spark.SEQ))
        else:
            markers = lake_spark.from_arrow(rows.sparkSession, schemas.TRANSACTION_MARKERS.empty_table(), schemas.TRANSACTION_MARKERS)
            markers = markers.withColumn(parse_spark.SEQ, F.lit(0).cast("bigint"))
        return events, markers

    def _run_stage(self, batch: SparkBatch, ctx: BatchContext) -> tuple[StageResult, float]:
        t = time.perf_counter()
        pick = getattr(self.stage, "driver_stage_for", None)
        twin: Stage | None = pick(batch, ctx) if callable(pick) else None  # a small batch a Spark stage runs on the driver
        if twin is None and callable(getattr(self.stage, "run", None)):
            result = run_spark_stage(self.stage, batch, ctx)  # type: ignore[arg-type]
        else:
            stage = twin or self.stage
            parsed = _driver_batch(batch, getattr(stage, "driver_columns", None))
            isolated: list[pa.Table] = []

            def write_isolated(rows: pa.Table, _stage_name: str) -> None:
                isolated.append(rows)

            result = run_stage(stage, parsed, ctx, write_isolated)  # type: ignore[arg-type]
            if twin is not None:
                result.figures["driver_batches"] = 1.0
            if isolated:  # written with the stage's own dead letters, under one guard
                result.dead_letters = pa.concat_tables([*isolated, *([result.dead_letters] if result.dead_letters is not None else [])])
            if result.dead_letters is not None and result.dead_letters.num_rows:
                # The driver's copy may have left the lines out (`driver_columns`): taken back from the batch by event id.
                result.dead_letters = parse_spark.with_lines(result.dead_letters, batch.events)
        return result, time.perf_counter() - t

    def _write_dead(self, result: StageResult, ctx: BatchContext, landed: dict[str, int]) -> int:
        """The stage's dead letters (a DataFrame from the executors, or Arrow), exactly once per batch."""
        spark = lake_spark.session()
        try:
            frames: list[DataFrame] = []
            count = 0
            if result.dead_letters is not None and result.dead_letters.num_rows:
                frames.append(lake_spark.from_arrow(spark, result.dead_letters, schemas.DEAD_LETTER))
                count += result.dead_letters.num_rows
            if result.dead_frame is not None and result.dead_count:
                frames.append(result.dead_frame)
                count += result.dead_count
            if not frames:
                return 0
            dead = frames[0]
            for more in frames[1:]:
                dead = dead.unionByName(more)
            if lake_spark.append_once(dead, self.path(DEAD_LETTER), ctx.app_id(DEAD_LETTER), ctx.batch_id):
                landed[DEAD_LETTER] = landed.get(DEAD_LETTER, 0) + count
            return count
        finally:
            if result.release is not None:
                result.release()

    def _write_progress(self, report: BatchReport, figures: dict[str, float], shape: _Shape, started: dt.datetime, ctx: BatchContext) -> None:
        row = {
            "query": self.name,
            "query_id": ctx.query_id,
            "batch_id": report.batch_id,
            "started_at": started,
            "finished_at": dt.datetime.now(dt.timezone.utc),
            "events": report.change_events,
            "markers": report.markers,
            "dead_letters": report.dead_letters,
            "rows_landed": list(report.rows_landed.items()),
            "stage_seconds": list(report.stage_seconds.items()),
            "stage_figures": [(f"{self.name}.{k}", float(v)) for k, v in figures.items()],
            "newest_source_ts": shape.newest_source_ts,
            "applied_through": shape.applied_through,
        }
        table = pa.Table.from_pylist([row], schema=schemas.STAGE_PROGRESS)
        lake_spark.append_once(lake_spark.from_arrow(lake_spark.session(), table, schemas.STAGE_PROGRESS), self.path(PROGRESS),
                               ctx.app_id(PROGRESS), report.batch_id)

    # -- idle -------------------------------------------------------------------------------------------
    def on_idle(self, idle_seconds: float) -> StageResult | None:
        """Time-based work of the stage (transaction timeouts) while its query has no data; None if it has none."""
        on_idle = getattr(self.stage, "on_idle", None)
        if not callable(on_idle) or self.last_batch_id < 0 and not (self.checkpoint / "metadata").exists():
            return None
        with self.gate.lock:
            return on_idle(BatchContext(self.config, self.query_id(), self.last_batch_id), idle_seconds)


def _shape_of(rows: DataFrame, reads_markers: bool) -> _Shape:
    """One small aggregate over the stage batch (a row per ingest batch and table it holds), collected: the
    counts, the ingest batches, and the clocks the transaction stage would otherwise aggregate for itself."""
    from pyspark.sql import functions as F

    kind = F.col(KIND)
    event = kind == "event"
    clocked = event & (F.col("transaction_id").isNotNull() | F.col("source_ts").isNotNull())  # what a stream clock reads
    marker_ts = (F.unix_micros(F.max(F.when((kind == "marker") & F.col("transaction_id").isNotNull(), F.col("marker_ts"))))
                 if reads_markers else F.lit(None).cast("long"))
    groups = rows.groupBy(F.col("ingested_at").alias("at"), F.col(KIND).alias("group_kind"),
                          F.when(event, F.col("table_id")).alias("group_table")).agg(
        F.count(F.lit(1)).alias("n"),
        F.max(F.when(event, F.col("arrival"))).alias("max_arrival"),
        F.unix_micros(F.max(F.when(event, F.col("source_ts")))).alias("newest_source_ts"),
        F.count(F.when(clocked, F.lit(1))).alias("clocked"),
        F.min(F.when(clocked, F.coalesce(F.col("source_name"), F.lit("")))).alias("clock_source"),
        F.count(F.col("transaction_id")).alias("transactional"),
        marker_ts.alias("newest_marker_ts"),
        F.unix_micros(F.col("at")).alias("at_micros"),
    ).collect()
    rows_ = [r.asDict() for r in groups]
    changes = [r | {"group_kind": "change"} for r in rows_ if r["group_kind"] == "event"]
    markers = [r for r in rows_ if r["group_kind"] == "marker"]
    at = sorted({_micros(r["at_micros"]) for r in rows_ if r["at_micros"] is not None})
    arrivals = [int(r["max_arrival"]) for r in changes if r["max_arrival"] is not None]
    sources = [int(r["newest_source_ts"]) for r in changes if r["newest_source_ts"] is not None]
    marker_times = [int(r["newest_marker_ts"]) for r in markers if r["newest_marker_ts"] is not None]
    return _Shape(
        events=sum(int(r["n"]) for r in changes),
        markers=sum(int(r["n"]) for r in markers),
        table_ids=frozenset(r["group_table"] for r in changes if r["group_table"] is not None),
        batches=tuple(at),
        max_arrival=max(arrivals) if arrivals else None,
        applied_through=at[-1] if at else None,
        newest_source_ts=_micros(max(sources)) if sources else None,
        table_clocks=parse_spark.table_clocks(changes),
        marker_clock=(max(marker_times) if marker_times else None, sum(int(r["transactional"]) for r in markers)),
    )


def _micros(value: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=value)


_WINDOWED: Any = object()  # `_seq_column`'s answer when only a window can rank the rows


def _seq_column(shape: _Shape) -> Column:
    """The arrival order of the batch's events as one bigint (see `ARRIVAL_BITS`), or `_WINDOWED`.

    Rows an earlier version wrote have no `arrival`: their ingest batch still orders them, and within one
    such batch they are taken in the order they are read.
    """
    from pyspark.sql import functions as F

    if not shape.batches:
        return F.lit(0).cast("bigint")
    if len(shape.batches) > MAX_RANKED_BATCHES or (shape.max_arrival or 0) >= 1 << ARRIVAL_BITS:
        return _WINDOWED
    rank = F.array_position(F.array(*[F.lit(at).cast("timestamp") for at in shape.batches]), F.col("ingested_at")).cast("bigint")
    within = F.coalesce(F.col("arrival"), F.lit(0).cast("bigint"))
    return F.shiftleft(rank, ARRIVAL_BITS).bitwiseOR(within)


def _ranked(events: DataFrame) -> DataFrame:
    """`_seq` by a window over the whole batch (one partition): only for batches `_seq_column` cannot encode."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    order = Window.orderBy(F.col("ingested_at"), F.col("arrival").asc_nulls_first(), F.col("event_id"))
    return events.withColumn(parse_spark.SEQ, F.row_number().over(order).cast("bigint"))


def _driver_batch(batch: SparkBatch, columns: Callable[[list[str]], list[Column]] | None) -> ParsedBatch:
    """A driver-side stage's batch: collected once, in arrival order (tools, tests, the reference stage)."""
    events_frame = batch.events if columns is None else batch.events.select(*columns(batch.events.columns), parse_spark.SEQ)
    events = schemas.conform(parse_spark.in_order(events_frame), schemas.RAW_CHANGE_EVENTS) if batch.event_count else schemas.RAW_CHANGE_EVENTS.empty_table()
    markers = schemas.conform(parse_spark.in_order(batch.markers), schemas.TRANSACTION_MARKERS) if batch.marker_count \
        else schemas.TRANSACTION_MARKERS.empty_table()
    return ParsedBatch(batch_id=batch.batch_id, events=events, markers=markers, dead_letters=schemas.DEAD_LETTER.empty_table(),
                       tombstones=0, rows_read=events.num_rows + markers.num_rows, in_batch_duplicates=0, ingested_at=batch.ingested_at)


def progress_table_spec(config: PlatformConfig) -> tuple[LakePath, Any, list[str]]:
    """The stage queries' progress table, as `lake_spark.ensure_tables` takes it (created by the job's set-up)."""
    return lake.table_path(config.lake, PROGRESS), lake_spark.spark_schema(schemas.STAGE_PROGRESS), ["query"]


def upgrade_start(spark: SparkSession, config: PlatformConfig, queries: Sequence[StageQuery]) -> None:
    """A lake an earlier version ran (its stages applied every raw-log version inside the ingest batch) gets
    its stage queries started after the raw log's current version, not from its beginning. Told apart from a
    new lake by having raw-log data and no `stage_progress` table yet; a query that already has a
    checkpoint is left alone."""
    from cdc_platform.backfill.onboarding import raw_log_has_rows

    if lake.exists(lake.table_path(config.lake, PROGRESS)) or not raw_log_has_rows(config.lake):
        return
    version = lake.open_table(lake.table_path(config.lake, RAW)).version()
    for query in queries:
        if not (query.checkpoint / "metadata").exists():
            query.note_upgrade(version)
