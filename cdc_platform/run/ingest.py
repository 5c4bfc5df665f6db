"""Ingest: the Structured Streaming job from landing files or Kafka topics to the raw change-event log.

Shape of the job: a stream of lines from the configured source (`sources.py`: the landing directory at
any depth, new files picked up as they arrive; or Kafka topics) -> `foreachBatch`, where the executors
parse the batch's lines (`parse_spark.parse_lines`) and delta-spark commits them (`lake_spark`); the
driver sees one small aggregate per batch. Inside a batch the data flows one way: the raw log and
markers are committed first, then every later stage (latest state, transactions) from the same parsed
batch (they stage and fold beside the raw log's write and commit after it: `SparkBatch.raw_landed`),
then dead letters and one `pipeline_metrics` row.

Stages come in two kinds (`stage.py`). A Spark stage (latest state, transactions) takes the batch as
DataFrames and does its per-event work on the executors; the stages run side by side, each in its own
thread, so one's commits overlap the other's jobs. A driver-side stage (the `Stage` protocol: tools,
tests, the transaction stage's single-process reference `TransactionStage`) gets the batch collected,
once (`parse_spark.driver_batch`, only the columns it reads). The raw log, markers, dead letters,
metrics, latest state and transactions never pass through the driver.

Exactly once: the source's checkpoint (kept in the lake) names each batch's files or Kafka offset
ranges, so a restart replays an unfinished batch with the same id and the same lines; every commit
carries Delta's application transaction `<query id>:<table>` = batch id, and Delta skips a write it
already holds (see `lake_spark.py`); the raw log and markers additionally dedup by event identity, so
redelivered input inserts nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from cdc_platform import lake
from cdc_platform.sources import streams as sources
from cdc_platform import storage
from cdc_platform.lake import lake_spark, schemas
from cdc_platform.parse import parse_spark
from cdc_platform.spark import spark_jobs
from cdc_platform.config import PlatformConfig
from cdc_platform.parse.envelope import KeySpec
from cdc_platform.errors import CdcError
from cdc_platform.backfill.onboarding import ConfigWatch, build_from_raw_log
from cdc_platform.run.run_reports import BatchReport, FoldedBatches, RunReport
from cdc_platform.stages.stage import (
    DEAD_LETTER,
    MARKERS,
    METRICS,
    RAW,
    BatchContext,
    RawLogGate,
    SparkBatch,
    SparkStage,
    Stage,
    StageResult,
    run_spark_stage,
    run_stage,
)
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

IDLE_POLL_SECONDS = 0.5  # how often a running stream asks stages with `on_idle` whether time is up
#: A batch of nothing but heartbeats writes its `pipeline_metrics` row at most this often (seconds);
#: the ones between are folded into the next row written (their lines into its `rows_read`, their
#: count into `stage_figures['ingest.idle_batches_folded']`), or into a last row when the run stops.
#: Why: with Debezium's `heartbeat.interval.ms` the source is never silent, so an idle stream runs a
#: batch every trigger; a row (a Delta commit, ~1 s) for each of them was about half of that batch's
#: cost and buried the batches that carried data. The same idea as Spark's own throttling of progress
#: events for triggers without data (`spark.sql.streaming.noDataProgressEventInterval`).
IDLE_METRICS_INTERVAL = 60.0


class _StopRequested(Exception):
    """A micro-batch Spark started while the job was stopping: refused, so it replays on restart."""


def default_stages(config: PlatformConfig) -> list[Stage | SparkStage]:
    """The stages after the raw log, in data-flow order."""
    # Imported here, not at the top: a tool that only reads or writes the raw log need not load the stages.
    from cdc_platform.stages.latest_state import LatestStateStage
    from cdc_platform.stages.transactions import SparkTransactionStage

    return [LatestStateStage(), SparkTransactionStage()]


def _spark_batch(query: StreamingQuery) -> tuple[int, bool] | None:
    """The id of the batch Spark is on and whether it is constructed yet (its offsets logged), or None if unknown.

    From Spark's internal `latestExecutionContext` (Spark 4): no public API says which batch runs. If a
    Spark upgrade moves it, `stop_after_batch` stops at once instead, refusing the batch (which replays).
    """
    try:
        context = query._jsq.streamingQuery().latestExecutionContext()  # type: ignore[attr-defined]
        return int(context.batchId()), bool(context.isCurrentBatchConstructed())
    except Exception:  # noqa: BLE001 - any failure means "unknown", handled by the caller
        return None


def _batch_in_flight(query: StreamingQuery) -> int | None:
    found = _spark_batch(query) if query.isActive else None
    return found[0] if found is not None and found[1] else None


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _spark() -> SparkSession:
    """The session a tool or test drives the job's batch commit with (the stream passes its own)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    from cdc_platform.spark.session import get_spark

    return get_spark()


def _parsed_frame(spark: SparkSession, parsed: pa.Table) -> DataFrame:
    """A `PARSED` Arrow table as the parsed DataFrame `parse_spark.parse_lines` returns, in its row order."""
    from pyspark.sql import functions as F

    frame = lake_spark.from_arrow(spark, parsed, schemas.PARSED).coalesce(1)
    return frame.withColumn(parse_spark.SEQ, F.monotonically_increasing_id())


class IngestJob:
    """The streaming job for one lake. Use `run_available_now` (cdc run) or `start` (cdc stream)."""

    def __init__(
        self,
        config: PlatformConfig,
        stages: Sequence[Stage | SparkStage] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.stages = list(default_stages(config) if stages is None else stages)
        self.progress = progress or (lambda _msg: None)
        self.reports: list[BatchReport] = []
        self._failure: BaseException | None = None
        self._query_id: str | None = None
        self._lock = threading.Lock()
        self._batch_lock = threading.Lock()  # a batch and an idle call never interleave
        #: While the job stops: batches with a higher id are refused (they replay on restart); None otherwise.
        self._refuse_after: int | None = None
        self._last_activity = time.monotonic()
        self._last_batch_id = -1
        self.keys = KeySpec(dict(config.keys_by_source))
        #: A micro-batch of the stream made into lines (`sources.batch_lines`: Avro records decoded; else as is).
        self._lines = sources.batch_lines(config)
        self.idle_metrics_interval = IDLE_METRICS_INTERVAL
        self._metrics_written_at: float | None = None  # monotonic time of the last metrics row this job wrote
        self._folded = FoldedBatches()  # heartbeat-only batches whose metrics rows were folded (in memory only)
        #: Tables added to the config file while the stream runs are onboarded between batches (onboarding.py).
        self._config_watch = ConfigWatch(config, self.progress) if config.source_file is not None else None

    # -- set-up -------------------------------------------------------------------------------------
    def setup(self, spark: SparkSession | None = None) -> None:
        """Create the lake's tables and registry so readers see them before any data lands."""
        cfg = self.config
        spark = spark or _spark()
        storage.ensure_dir(cfg.lake)
        # The registry first: a reader that finds a table's directory must already know what it is (`cdc serve`
        # registered a latest-state table it did not know yet as a plain table, then could not make its views).
        lake.write_registry(cfg)
        own = [(self.path(name), lake_spark.spark_schema(schema), partition_by) for name, schema, partition_by in (
            (RAW, schemas.RAW_CHANGE_EVENTS, schemas.RAW_PARTITION_BY),
            (MARKERS, schemas.TRANSACTION_MARKERS, schemas.MARKERS_PARTITION_BY),
            (DEAD_LETTER, schemas.DEAD_LETTER, []),
            (METRICS, schemas.PIPELINE_METRICS, []),
        )]
        # The stages' tables are independent of these and of each other: all are created side by side.
        with spark_jobs.labelled("setup", "cdc setup: creating the lake's tables"):
            spark_jobs.side_by_side([lambda: lake_spark.ensure_tables(spark, own), *(lambda s=s: s.setup(cfg) for s in self.stages)],
                                    name="cdc-setup")

    def onboard_added_tables(self) -> list[str]:
        """Tables added to the config file since the last batch: built from the raw log, then kept by the stream."""
        updated = self._config_watch.poll() if self._config_watch is not None else None
        if updated is None:
            return []
        added = [t for t in updated.tables if t not in self.config.tables]
        lake.write_registry(updated)  # before the new tables' directories appear (see `setup`)
        build_from_raw_log(updated, added, self.progress)
        self.config = updated
        self.keys = KeySpec(dict(updated.keys_by_source))
        for stage in self.stages:
            stage.setup(updated)
        self.progress(f"onboarded {', '.join(f'{t.source} as {t.name}' for t in added)}: kept from this batch on, without a restart")
        return [t.name for t in added]

    def path(self, name: str) -> LakePath:
        return lake.table_path(self.config.lake, name)

    # -- one batch ----------------------------------------------------------------------------------
    def process_parsed(
        self, parsed: DataFrame | pa.Table, batch_id: int, query_id: str, *, before: dict[str, float] | None = None,
        started: dt.datetime | None = None,
    ) -> BatchReport:
        """Commit one parsed micro-batch to every table, exactly once per (query id, batch id).

        `parsed` is what `parse_spark.parse_lines` returns (or, from tools and tests, a `PARSED` Arrow
        table, taken in its row order). `before` carries seconds spent on this batch before (parsing),
        `started` when that began, so the batch's metrics cover all of the job's work on it.
        """
        t0 = time.perf_counter() - sum((before or {}).values())
        started = started or _now()
        if isinstance(parsed, pa.Table):
            parsed = _parsed_frame(_spark(), parsed)
        parsed = parsed.persist()
        try:
            with spark_jobs.labelled("batch", f"cdc batch {batch_id}"):
                return self._commit_batch(parsed, batch_id, query_id, t0=t0, started=started, before=before)
        finally:
            parsed.unpersist()

    def _commit_batch(
        self, parsed: DataFrame, batch_id: int, query_id: str, *, t0: float, started: dt.datetime, before: dict[str, float] | None
    ) -> BatchReport:
        t = time.perf_counter()
        with spark_jobs.batch_labelled(batch_id, "split"):
            split = parse_spark.split(parsed, batch_id, started)
        try:
            return self._commit_split(split, batch_id, query_id, t0=t0, started=started, before=before, split_seconds=time.perf_counter() - t)
        finally:
            split.release()

    def _commit_split(
        self, split: parse_spark.SplitBatch, batch_id: int, query_id: str, *, t0: float, started: dt.datetime,
        before: dict[str, float] | None, split_seconds: float,
    ) -> BatchReport:
        spark = split.events.sparkSession
        figures_ = split.figures
        ctx = BatchContext(self.config, query_id, batch_id)
        seconds: dict[str, float] = {**(before or {}), "split": split_seconds}
        landed: dict[str, int] = {}
        figures: dict[str, float] = {}
        # heartbeats and schema-change records are counted, not stored (control_records.py)
        figures.update({k: float(v) for k, v in (("ingest.heartbeats", figures_.heartbeats), ("ingest.schema_changes", figures_.schema_changes)) if v})

        landed[RAW] = landed[MARKERS] = 0
        raw_gate = RawLogGate(f"the raw log of batch {batch_id} was not committed, so no stage commits it; the batch replays on restart")

        def write_raw() -> bool:
            """The raw log, then the markers (a reader never sees an END before its events); True if replayed."""
            t = time.perf_counter()
            try:
                with spark_jobs.batch_labelled(batch_id, RAW, "raw log and markers"):
                    # An empty side writes nothing (as `insert_new_once` itself decides), without its Spark jobs.
                    inserted = lake_spark.insert_new_once(
                        split.events, self.path(RAW), "event_id", "event_date", ctx.app_id(RAW), batch_id, range_column="position",
                        footprint=figures_.events_footprint, row_column=parse_spark.SEQ,
                    ) if figures_.change_events else 0
                    landed[RAW] = inserted if inserted is not None else 0
                    markers_inserted = lake_spark.insert_new_once(
                        split.markers, self.path(MARKERS), "marker_id", "marker_date", ctx.app_id(MARKERS), batch_id,
                        range_column="transaction_id", footprint=figures_.markers_footprint, row_column=parse_spark.SEQ,
                    ) if figures_.markers else 0  # the marker id is `<transaction id>|<status>`
                    landed[MARKERS] = markers_inserted if markers_inserted is not None else 0
            except BaseException:
                raw_gate.fail()
                raise
            raw_gate.open()
            seconds["raw"] = time.perf_counter() - t
            return inserted is None

        spark_batch = SparkBatch(batch_id, split.events, split.markers, frozenset(figures_.table_ids), started,
                                 event_count=figures_.distinct_events, marker_count=figures_.distinct_markers,
                                 raw_landed=raw_gate.wait, table_clocks=figures_.table_clocks, marker_clock=figures_.marker_clock)
        isolated = 0

        def write_isolated(rows: pa.Table, stage_name: str) -> None:
            nonlocal isolated
            isolated += rows.num_rows
            dead_rows = lake_spark.from_arrow(spark, parse_spark.with_lines(rows, split.events), schemas.DEAD_LETTER)
            if lake_spark.append_once(dead_rows, self.path(DEAD_LETTER), ctx.app_id(f"{DEAD_LETTER}.{stage_name}"), batch_id):
                landed[DEAD_LETTER] = landed.get(DEAD_LETTER, 0) + rows.num_rows

        stage_dead: list[pa.Table] = []
        stage_frames: list[tuple[DataFrame, int]] = []

        def run_arrow_stages(stages: list[Stage]) -> dict[str, StageResult]:
            done: dict[str, StageResult] = {}
            raw_gate.wait()  # these commit inside `run_stage`: after the raw log, as the Spark stages do
            t = time.perf_counter()
            narrow = getattr(stages[0], "driver_columns", None) if len(stages) == 1 else None
            with spark_jobs.batch_labelled(batch_id, "collect", "collect for the driver's stages"):
                batch = parse_spark.driver_batch(split, batch_id, started, narrow)  # collected once for them all
            seconds["collect"] = time.perf_counter() - t
            for stage in stages:
                t = time.perf_counter()
                with spark_jobs.batch_labelled(batch_id, stage.name):
                    done[stage.name] = run_stage(stage, batch, ctx, write_isolated)
                seconds[stage.name] = time.perf_counter() - t
            return done

        results: dict[str, StageResult] = {}
        replayed: list[bool] = []
        try:
            # The stages are independent given the batch, and each commits exactly once on its own, so they run
            # side by side, and beside the raw log's write: their work before their first commit (staging,
            # folding, the clock) overlaps its jobs and commits, and their commits wait for it (`raw_landed`).
            # The driver-side (Arrow) stages run beside the Spark ones too.
            arrow_stages = [s for s in self.stages if not callable(getattr(s, "run", None))]

            def run_spark(stage: SparkStage) -> None:
                t = time.perf_counter()
                with spark_jobs.batch_labelled(batch_id, stage.name):
                    results[stage.name] = run_spark_stage(stage, spark_batch, ctx)  # as it returns: released even if another fails
                seconds[stage.name] = time.perf_counter() - t

            actions: list[Callable[[], None]] = [lambda: replayed.append(write_raw())]  # first: its failure is the one raised
            actions += [lambda stage=stage: run_spark(stage) for stage in self.stages if stage not in arrow_stages]  # type: ignore[misc]
            if arrow_stages:
                actions.append(lambda: results.update(run_arrow_stages(arrow_stages)))
            # Every stage runs to its end even when another fails (it may be committing); the first failure is raised.
            spark_jobs.side_by_side(actions, name="cdc-stages")
            distinct = figures_.distinct_events + figures_.distinct_markers
            duplicates = figures_.in_batch_duplicates + (0 if replayed[0] else distinct - landed[RAW] - landed[MARKERS])
            for stage in self.stages:
                result = results[stage.name]
                for k, v in result.rows_landed.items():
                    landed[k] = landed.get(k, 0) + v
                figures.update({f"{stage.name}.{k}": float(v) for k, v in result.figures.items()})
                if result.dead_letters is not None and result.dead_letters.num_rows:
                    stage_dead.append(result.dead_letters)
                if result.dead_frame is not None and result.dead_count:
                    stage_frames.append((result.dead_frame, result.dead_count))

            t = time.perf_counter()
            dead_count = figures_.dead_letters + sum(d.num_rows for d in stage_dead) + sum(n for _, n in stage_frames)
            if dead_count:
                dead = split.dead_letters
                for rows in stage_dead:
                    dead = dead.unionByName(lake_spark.from_arrow(spark, rows, schemas.DEAD_LETTER))
                for frame, _ in stage_frames:
                    dead = dead.unionByName(frame)
                with spark_jobs.batch_labelled(batch_id, DEAD_LETTER, "dead letters"):
                    if lake_spark.append_once(dead, self.path(DEAD_LETTER), ctx.app_id(DEAD_LETTER), batch_id):
                        landed[DEAD_LETTER] = landed.get(DEAD_LETTER, 0) + dead_count
            seconds["dead_letter"] = time.perf_counter() - t
        finally:  # every stage that returned, even when another failed
            for result in results.values():
                if result.release is not None:
                    result.release()

        report = BatchReport(
            batch_id=batch_id,
            rows_read=figures_.rows_read,
            change_events=figures_.distinct_events,
            markers=figures_.distinct_markers,
            tombstones=figures_.tombstones,
            dead_letters=dead_count + isolated,
            duplicates_skipped=duplicates,
            rows_landed=landed,
            stage_seconds=seconds,
            seconds=time.perf_counter() - t0,
        )
        heartbeats_only = figures_.rows_read == figures_.heartbeats and not figures_.dead_letters and not any(landed.values()) \
            and set(figures) <= {"ingest.heartbeats"}
        now = time.monotonic()
        if heartbeats_only and self._metrics_written_at is not None and now - self._metrics_written_at < self.idle_metrics_interval:
            self._folded.add(spark, report, figures_, started, ctx)
            return report
        figures, rows_read = self._folded.onto(figures, report.rows_read)
        heartbeat = lake.newest(figures_.newest_heartbeat_ts, self._folded.newest_heartbeat)
        with spark_jobs.batch_labelled(batch_id, "metrics"):
            self._write_metrics(spark, report, figures_.newest_source_ts, figures, started, ctx, rows_read=rows_read, heartbeat=heartbeat)
        self._metrics_written_at, self._folded = now, FoldedBatches()
        return report

    def flush_folded_metrics(self) -> None:
        """Write the row of the newest heartbeat-only batch whose row was folded, carrying the ones before
        it: called when a run or stream ends, so its metrics total every line it read."""
        with self._batch_lock:
            folded, self._folded = self._folded, FoldedBatches()
            if folded.last is None:
                return
            spark, report, heartbeats, started, ctx = folded.last
            before = FoldedBatches(folded.batches - 1, folded.heartbeats - heartbeats, folded.rows_read - report.rows_read)
            figures, rows_read = before.onto({"ingest.heartbeats": float(heartbeats)}, report.rows_read)
            self._write_metrics(spark, report, None, figures, started, ctx, rows_read=rows_read, heartbeat=folded.newest_heartbeat)
            self._metrics_written_at = time.monotonic()

    def _write_metrics(
        self, spark: SparkSession, report: BatchReport, newest: dt.datetime | None, figures: dict[str, float], started: dt.datetime,
        ctx: BatchContext, *, rows_read: int | None = None, heartbeat: dt.datetime | None = None,
    ) -> None:
        finished = _now()
        lag = (finished - newest).total_seconds() if newest is not None else None
        row = {
            "query_id": ctx.query_id,
            "batch_id": report.batch_id,
            "started_at": started,
            "finished_at": finished,
            "rows_read": report.rows_read if rows_read is None else rows_read,
            "change_events": report.change_events,
            "markers": report.markers,
            "tombstones": report.tombstones,
            "dead_letters": report.dead_letters,
            "duplicates_skipped": report.duplicates_skipped,
            "rows_landed": list(report.rows_landed.items()),
            "stage_seconds": list(report.stage_seconds.items()),
            "stage_figures": list(figures.items()),
            "newest_source_ts": newest,
            "lag_seconds": lag,
            "newest_heartbeat_ts": heartbeat,
        }
        table = pa.Table.from_pylist([row], schema=schemas.PIPELINE_METRICS)
        lake_spark.append_once(lake_spark.from_arrow(spark, table, schemas.PIPELINE_METRICS), self.path(METRICS), ctx.app_id(METRICS), report.batch_id)

    # -- streaming ----------------------------------------------------------------------------------
    def query_id(self) -> str:
        """The stream's id as recorded in its checkpoint: stable across restarts, new for a new checkpoint."""
        if self._query_id is None:
            meta = self.config.checkpoint_dir / "metadata"
            self._query_id = json.loads(meta.read_text(encoding="utf-8").splitlines()[0])["id"]
        return self._query_id

    def foreach_batch(self, df: DataFrame, batch_id: int) -> None:
        try:
            started = _now()
            with self._batch_lock:
                self.onboard_added_tables()
            parsed = parse_spark.parse_lines(self._lines(df), self.keys)
            with self._batch_lock:
                if self._refuse_after is not None and batch_id > self._refuse_after:
                    raise _StopRequested(f"batch {batch_id} started after the stop was asked for; it runs again on restart")
                report = self.process_parsed(parsed, batch_id, self.query_id(), started=started)
                self._last_activity = time.monotonic()
                self._last_batch_id = batch_id
        except _StopRequested:
            raise
        except BaseException as exc:  # keep the original error; Spark would wrap it beyond recognition
            self._failure = exc
            raise
        with self._lock:
            self.reports.append(report)
        self.progress(
            f"batch {batch_id}: {report.rows_read:,} lines -> {report.rows_landed.get(RAW, 0):,} new events, "
            f"{report.markers:,} markers, {report.dead_letters:,} dead letters, {report.duplicates_skipped:,} duplicates skipped "
            f"({report.seconds:.2f} s)"
        )

    def stream(self, spark: SparkSession) -> DataFrame:
        """The configured source (files or Kafka) as lines in `sources.py`'s column contract; `foreach_batch` parses them."""
        return sources.stream(spark, self.config)

    def start(self, spark: SparkSession, *, available_now: bool, interval: str | None = None) -> StreamingQuery:
        self.setup(spark)
        self._discard_unfinished_checkpoint_writes()
        writer = self.stream(spark).writeStream.foreachBatch(self.foreach_batch).option(
            "checkpointLocation", lake_spark.location(self.config.checkpoint_dir)
        ).queryName(f"cdc_ingest_{abs(hash(str(self.config.lake))) % 10**8}")
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=interval or self.config.trigger_interval)
        return writer.start()

    def _discard_unfinished_checkpoint_writes(self) -> None:
        """Remove temp files a killed stream left in the checkpoint's logs.

        Spark writes each log entry to `.<n>.<uuid>.tmp` and renames it; a SIGKILL between the two leaves
        the temp file, which was never committed, and Spark then refuses to start batch 0 again
        (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY) until someone deletes it. Safe because one stream
        writes a lake (the same rule as the exactly-once guard). Found by the crash trials.
        """
        root = self.config.checkpoint_dir
        for log_dir in [root / "offsets", root / "commits", *sorted((root / "sources").glob("*"))]:
            if log_dir.is_dir():
                for leftover in log_dir.glob(".*.tmp*"):
                    leftover.unlink(missing_ok=True)

    def run_available_now(self, spark: SparkSession, stop: threading.Event | None = None) -> RunReport:
        """Process everything that has landed, then return (what `cdc run` and the Dagster asset do).

        `stop` (set by Ctrl-C in `cdc run`) ends the run after the batch in flight; the report says so.
        """
        t0 = time.perf_counter()
        query = self.start(spark, available_now=True)
        stopped = False
        try:
            self._await(query, None, stop)
        finally:
            if stop is not None and stop.is_set() and query.isActive:
                stopped = True
                self.stop_after_batch(query)
        self.flush_folded_metrics()
        return RunReport(batches=list(self.reports), seconds=time.perf_counter() - t0, stopped=stopped)

    def run_continuously(
        self, spark: SparkSession, interval: str | None = None, timeout: float | None = None, stop: threading.Event | None = None
    ) -> RunReport:
        """Run until interrupted (Ctrl-C), `timeout` seconds have passed, or `stop` is set (for programs that embed the job).

        Every way out finishes the batch in flight first: stopping Spark's query mid-batch interrupts
        the batch's writes (harmless for the lake, which replays it, but Spark then reports the
        interrupt as a failure, with a stack trace).
        """
        t0 = time.perf_counter()
        query = self.start(spark, available_now=False, interval=interval)
        stop_watch = threading.Event()
        watcher = self._watch_idle(query, stop_watch)
        try:
            self._await(query, timeout, stop)
        except KeyboardInterrupt:
            self.progress("stopping after the current batch ...")
        finally:
            stop_watch.set()
            if watcher is not None:
                watcher.join()
            self.stop_after_batch(query)
        self.flush_folded_metrics()
        return RunReport(batches=list(self.reports), seconds=time.perf_counter() - t0)

    def stop_after_batch(self, query: StreamingQuery) -> None:
        """Stop a started stream without interrupting a batch: the one in flight, if any, commits whole;
        a later one refuses to start and replays on restart. (`query.stop()` alone interrupts the batch.)

        In flight means from the moment Spark constructed the batch (logged its offsets) on, not from
        `foreach_batch` on: stopping in the gap between the two (Spark plans and lists files there)
        cancelled the batch half-started, with error logs (a Ctrl-C test found it). Spark starts the next
        batch the moment one ends, so it is the batch's id that is waited for, not a quiet trigger.
        """
        in_flight = _batch_in_flight(query)
        self._refuse_after = -1 if in_flight is None else in_flight
        try:
            while in_flight is not None and query.isActive:
                now = _spark_batch(query)
                if now is None or now[0] > in_flight:
                    break
                time.sleep(0.1)
            with self._batch_lock:
                pass
            if query.isActive:
                query.stop()
        finally:
            self._refuse_after = None

    def _watch_idle(self, query: StreamingQuery, stop: threading.Event) -> threading.Thread | None:
        """Call the stages' `on_idle` while the stream is quiet; a failure stops the stream like a batch failure."""
        idle_stages = [s for s in self.stages if callable(getattr(s, "on_idle", None))]
        if not idle_stages:
            return None
        self._last_activity = time.monotonic()

        def watch() -> None:
            while not stop.wait(IDLE_POLL_SECONDS):
                try:
                    if not query.isActive:
                        return
                    status = query.status
                    if status.get("isTriggerActive") or status.get("isDataAvailable"):
                        continue
                    with self._batch_lock:
                        idle = time.monotonic() - self._last_activity
                        ctx = BatchContext(self.config, self.query_id(), self._last_batch_id)
                        for stage in idle_stages:
                            result = stage.on_idle(ctx, idle)  # type: ignore[attr-defined]
                            if result is not None and result.rows_landed:
                                landed = ", ".join(f"{v:,} {k}" for k, v in sorted(result.rows_landed.items()))
                                self.progress(f"idle for {idle:.0f} s: {stage.name} landed {landed}")
                except BaseException as exc:  # surfaced by _await, like a failed batch
                    if stop.is_set():
                        return
                    self._failure = exc
                    query.stop()
                    return

        thread = threading.Thread(target=watch, name="cdc-idle-watch", daemon=True)
        thread.start()
        return thread

    def _await(self, query: StreamingQuery, timeout: float | None, stop: threading.Event | None = None) -> None:
        from pyspark.errors import StreamingQueryException

        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            if stop is None:
                query.awaitTermination(timeout)
            else:  # in slices, to notice `stop`
                while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                    if query.awaitTermination(0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))):
                        break
        except StreamingQueryException as exc:
            if self._failure is not None:
                raise self._failure from None
            raise CdcError(f"the streaming job failed: {str(exc).splitlines()[0]}") from exc
        if self._failure is not None:
            raise self._failure

