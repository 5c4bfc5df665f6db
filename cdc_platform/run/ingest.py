"""Ingest: the Structured Streaming job from landing files or Kafka topics to the raw change-event log,
and the stage queries that read the raw log (`stage_queries.py`).

Shape of the job: a stream of lines from the configured source (`sources/streams.py`: the landing directory at
any depth, new files picked up as they arrive; or Kafka topics) -> `foreachBatch`, where the executors
parse the batch's lines (`parse_spark.parse_lines`) and delta-spark commits them (`lake_spark`); the
driver sees one small aggregate per batch. An ingest batch writes only what is on a reader's path: the
raw log, then the markers (a reader never sees an END before its events), then dead letters and one
`pipeline_metrics` row. Nothing else holds it back.

Every stage after the raw log (latest state, transactions) is a streaming query of its own that reads
the raw log as a Delta streaming source, with its own checkpoint (`StageQuery`): a slow or failing stage
delays only its own tables. `IngestJob` runs them together: `cdc stream` runs the ingest and every stage
query side by side in one Spark application, `cdc run` ingests what is available, then drains every stage
query. The latest-state views read the raw log's events the fold has not taken yet, so a change is visible
once the raw log commits it (`views`).

Exactly once: the source's checkpoint (kept in the lake) names each batch's files or Kafka offset
ranges, so a restart replays an unfinished batch with the same id and the same lines; every commit
carries Delta's application transaction `<query id>:<table>` = batch id, and Delta skips a write it
already holds (see `lake_spark.py`); the raw log and markers additionally dedup by event identity, so
redelivered input inserts nothing. Each stage query does the same with its own query id.
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
from cdc_platform.lake import insert_new, lake_spark, schemas
from cdc_platform.parse import parse_spark
from cdc_platform.spark import spark_jobs
from cdc_platform.config import PlatformConfig
from cdc_platform.parse.envelope import KeySpec
from cdc_platform.errors import CdcError
from cdc_platform.backfill.onboarding import ConfigWatch
from cdc_platform.run.run_reports import BatchReport, FoldedBatches, RunReport
from cdc_platform.run.queries import BatchGate, StageRunner, StopRequested, await_queries, quiet_refused_batches, stop_after_batch
from cdc_platform.run.stage_queries import StageQuery, progress_table_spec, upgrade_start
from cdc_platform.stages.stage import (
    DEAD_LETTER,
    MARKERS,
    METRICS,
    RAW,
    BatchContext,
    SparkStage,
    Stage,
)
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

#: A batch of nothing but heartbeats writes its `pipeline_metrics` row at most this often (seconds);
#: the ones between are folded into the next row written (their lines into its `rows_read`, their
#: count into `stage_figures['ingest.idle_batches_folded']`), or into a last row when the run stops.
#: Why: with Debezium's `heartbeat.interval.ms` the source is never silent, so an idle stream runs a
#: batch every trigger; a row (a Delta commit, ~1 s) for each of them was about half of that batch's
#: cost and buried the batches that carried data. The same idea as Spark's own throttling of progress
#: events for triggers without data (`spark.sql.streaming.noDataProgressEventInterval`).
IDLE_METRICS_INTERVAL = 60.0


def default_stages(config: PlatformConfig) -> list[Stage | SparkStage]:
    """The stages after the raw log, in data-flow order."""
    # Imported here, not at the top: a tool that only reads or writes the raw log need not load the stages.
    from cdc_platform.stages.latest_state import LatestStateStage
    from cdc_platform.stages.outbox import OutboxStage
    from cdc_platform.stages.transactions import SparkTransactionStage

    stages: list[Stage | SparkStage] = [LatestStateStage(), SparkTransactionStage()]
    if config.outbox is not None:  # its own query only where there is an outbox: a lake without one keeps its stage set
        stages.append(OutboxStage())
    return stages


class LinesIncomplete(Exception):
    """The source has not made lines of some of the batch's records yet (`schemas.LINES_INCOMPLETE`), found by
    the batch's aggregate before anything is committed: `foreach_batch` asks the source again, learning."""

    def __init__(self, records: int) -> None:
        super().__init__(f"{records} records of the batch were not made into lines yet")
        self.records = records


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
    """The streaming job for one lake: the ingest query and the stage queries reading its raw log.

    Use `run_available_now` (cdc run) or `run_continuously` (cdc stream). `stages` are the stages after the
    raw log (`default_stages`), each run as a `StageQuery`; `[]` runs the ingest alone.
    """

    def __init__(
        self,
        config: PlatformConfig,
        stages: Sequence[Stage | SparkStage] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.stages = list(default_stages(config) if stages is None else stages)
        self.progress = progress or (lambda _msg: None)
        self.stage_queries = [StageQuery(stage, config, self.progress) for stage in self.stages]
        self.reports: list[BatchReport] = []
        self._failure: BaseException | None = None
        self._query_id: str | None = None
        self._lock = threading.Lock()
        self.gate = BatchGate()  # an ingest batch and a stop never interleave
        self.keys = KeySpec(dict(config.keys_by_source))
        #: A micro-batch of the stream made into lines (`sources.batch_lines`: Avro records decoded; else as is).
        self._lines = sources.batch_lines(config)
        self.idle_metrics_interval = IDLE_METRICS_INTERVAL
        self.last_activity = time.monotonic()  # the end of the ingest's newest batch (the stages' idle time counts from it)
        self._metrics_written_at: float | None = None  # monotonic time of the last metrics row this job wrote
        self._folded = FoldedBatches()  # heartbeat-only batches whose metrics rows were folded (in memory only)
        #: Tables added to the config file while the stream runs are onboarded between batches (onboarding.py).
        self._config_watch = ConfigWatch(config, self.progress) if config.source_file is not None else None
        self._last_ingested_at: dt.datetime | None = None

    # -- set-up -------------------------------------------------------------------------------------
    def setup(self, spark: SparkSession | None = None) -> None:
        """Create the lake's tables and registry so readers see them before any data lands."""
        cfg = self.config
        spark = spark or _spark()
        storage.ensure_dir(cfg.lake)
        # The registry first: a reader that finds a table's directory must already know what it is (`cdc serve`
        # registered a latest-state table it did not know yet as a plain table, then could not make its views).
        lake.write_registry(cfg)
        upgrade_start(spark, cfg, self.stage_queries)  # before `stage_progress` exists: it tells a lake from before stage queries
        own = [(self.path(name), lake_spark.spark_schema(schema), partition_by) for name, schema, partition_by in (
            (RAW, schemas.RAW_CHANGE_EVENTS, schemas.RAW_PARTITION_BY),
            (MARKERS, schemas.TRANSACTION_MARKERS, schemas.MARKERS_PARTITION_BY),
            (DEAD_LETTER, schemas.DEAD_LETTER, []),
            (METRICS, schemas.PIPELINE_METRICS, []),
        )] + [progress_table_spec(cfg)]
        # The stages' tables are independent of these and of each other: all are created side by side.
        with spark_jobs.labelled("setup", "cdc setup: creating the lake's tables"):
            spark_jobs.side_by_side([lambda: lake_spark.ensure_tables(spark, own), *(lambda s=s: s.setup(cfg) for s in self.stages)],
                                    name="cdc-setup")

    def onboard_added_tables(self) -> list[str]:
        """Tables added to the config file since the last batch: the ingest keys their events from now on, and
        the stage queries build and keep them (`StageQuery.onboard`)."""
        updated = self._config_watch.poll() if self._config_watch is not None else None
        if updated is None:
            return []
        added = [t for t in updated.tables if t not in self.config.tables]
        lake.write_registry(updated)  # before the new tables' directories appear (see `setup`)
        self.config = updated
        self.keys = KeySpec(dict(updated.keys_by_source))
        for query in self.stage_queries:
            query.onboard(updated, added)
        return [t.name for t in added]

    def path(self, name: str) -> LakePath:
        return lake.table_path(self.config.lake, name)

    # -- one batch ----------------------------------------------------------------------------------
    def process_parsed(
        self, parsed: DataFrame | pa.Table, batch_id: int, query_id: str, *, before: dict[str, float] | None = None,
        started: dt.datetime | None = None, drain: bool = True,
    ) -> BatchReport:
        """Commit one parsed micro-batch to the raw log exactly once per (query id, batch id), then (for tools
        and tests, `drain`) let every stage query take what the raw log now holds.

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
                report = self._commit_batch(parsed, batch_id, query_id, t0=t0, started=started, before=before)
        finally:
            parsed.unpersist()
        if drain and self.stage_queries:
            drained = self.drain_stages(parsed.sparkSession)
            for stage_report in drained:
                for k, v in stage_report.rows_landed.items():
                    report.rows_landed[k] = report.rows_landed.get(k, 0) + v
                report.dead_letters += stage_report.dead_letters
                for k, v in stage_report.stage_seconds.items():
                    report.stage_seconds[k] = report.stage_seconds.get(k, 0.0) + v
        return report

    def _commit_batch(
        self, parsed: DataFrame, batch_id: int, query_id: str, *, t0: float, started: dt.datetime, before: dict[str, float] | None
    ) -> BatchReport:
        t = time.perf_counter()
        # Arrivals are ordered by `ingested_at` (then by `arrival` within a batch): a batch's is later than the last
        # batch's, and whole milliseconds, because Delta keeps a timestamp's file statistics to the millisecond
        # and the views find the raw log's not-yet-folded tail by them (`views.tail`).
        started = started.replace(microsecond=started.microsecond // 1000 * 1000)
        if self._last_ingested_at is not None and started <= self._last_ingested_at:
            started = self._last_ingested_at + dt.timedelta(milliseconds=1)
        self._last_ingested_at = started
        with spark_jobs.batch_labelled(batch_id, "split"):
            split = parse_spark.split(parsed, batch_id, started)
        try:
            if split.figures.incomplete_lines:  # before anything is committed: `foreach_batch` makes the lines again
                raise LinesIncomplete(split.figures.incomplete_lines)
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
        landed: dict[str, int] = {RAW: 0, MARKERS: 0}
        figures: dict[str, float] = {}
        # heartbeats and schema-change records are counted, not stored (control_records.py)
        figures.update({k: float(v) for k, v in (("ingest.heartbeats", figures_.heartbeats), ("ingest.schema_changes", figures_.schema_changes)) if v})

        def raw_log_and_markers() -> int | None:
            """The raw log, then the markers (a reader never sees an END before its events)."""
            t = time.perf_counter()
            with spark_jobs.batch_labelled(batch_id, RAW, "raw log and markers"):
                # An empty side writes nothing (as `insert_new_once` itself decides), without its Spark jobs.
                inserted = insert_new.insert_new_once(
                    split.events, self.path(RAW), "event_id", "event_date", ctx.app_id(RAW), batch_id, range_column="position",
                    footprint=figures_.events_footprint, row_column=parse_spark.SEQ,
                ) if figures_.change_events else 0
                landed[RAW] = inserted if inserted is not None else 0
                markers_inserted = insert_new.insert_new_once(
                    split.markers, self.path(MARKERS), "marker_id", "marker_date", ctx.app_id(MARKERS), batch_id,
                    range_column="transaction_id", footprint=figures_.markers_footprint, row_column=parse_spark.SEQ,
                ) if figures_.markers else 0  # the marker id is `<transaction id>|<status>`
                landed[MARKERS] = markers_inserted if markers_inserted is not None else 0
            seconds["raw"] = time.perf_counter() - t
            return inserted

        def dead_letters() -> None:
            """The lines no event came of: no reader orders them against the raw log, so they commit beside it."""
            t = time.perf_counter()
            with spark_jobs.batch_labelled(batch_id, DEAD_LETTER, "dead letters"):
                if lake_spark.append_once(split.dead_letters, self.path(DEAD_LETTER), ctx.app_id(DEAD_LETTER), batch_id):
                    landed[DEAD_LETTER] = figures_.dead_letters
            seconds["dead_letter"] = time.perf_counter() - t

        seconds["dead_letter"] = 0.0
        inserted = spark_jobs.side_by_side([raw_log_and_markers, dead_letters])[0] if figures_.dead_letters else raw_log_and_markers()
        distinct = figures_.distinct_events + figures_.distinct_markers
        duplicates = figures_.in_batch_duplicates + (0 if inserted is None else distinct - landed[RAW] - landed[MARKERS])

        report = BatchReport(
            batch_id=batch_id,
            rows_read=figures_.rows_read,
            change_events=figures_.distinct_events,
            markers=figures_.distinct_markers,
            tombstones=figures_.tombstones,
            dead_letters=figures_.dead_letters,
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

    def drain_stages(self, spark: SparkSession) -> list[BatchReport]:
        """Run every stage query until it has taken all the raw log holds now (side by side); their reports.

        A stage that fails leaves the others to finish and is raised then: its batch replays next time."""
        if not self.stage_queries:
            return []
        counts = [len(q.reports) for q in self.stage_queries]
        for q in self.stage_queries:
            q.failure = None
        started = [(q, q.start(spark, available_now=True)) for q in self.stage_queries]
        await_queries(started)
        return [r for q, n in zip(self.stage_queries, counts) for r in q.reports[n:]]

    def flush_folded_metrics(self) -> None:
        """Write the row of the newest heartbeat-only batch whose row was folded, carrying the ones before
        it: called when a run or stream ends, so its metrics total every line it read."""
        with self.gate.lock:
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
            with self.gate.lock:
                self.onboard_added_tables()
            try:
                parsed = parse_spark.parse_lines(self._lines(df), self.keys, outbox=self.config.outbox)
                with self.gate.lock, spark_jobs.in_pool("ingest"):
                    self.gate.check(batch_id)
                    try:
                        report = self.process_parsed(parsed, batch_id, self.query_id(), started=started, drain=False)
                    except LinesIncomplete as incomplete:
                        self.progress(f"batch {batch_id}: {incomplete.records:,} records name a schema not read yet; decoding the batch again")
                        parsed = parse_spark.parse_lines(self._lines(df, learn=True), self.keys, outbox=self.config.outbox)
                        report = self.process_parsed(parsed, batch_id, self.query_id(), started=started, drain=False)
            finally:
                self._lines.release()
        except StopRequested:
            raise
        except BaseException as exc:  # keep the original error; Spark would wrap it beyond recognition
            self._failure = exc
            if not isinstance(exc, Exception):  # py4j's callback thread would die on it and the query would never end
                raise RuntimeError(f"{type(exc).__name__} in the batch") from exc
            raise
        with self._lock:
            self.reports.append(report)
        self.last_activity = time.monotonic()
        self.progress(
            f"batch {batch_id}: {report.rows_read:,} lines -> {report.rows_landed.get(RAW, 0):,} new events, "
            f"{report.markers:,} markers, {report.dead_letters:,} dead letters, {report.duplicates_skipped:,} duplicates skipped "
            f"({report.seconds:.2f} s)"
        )

    def stream(self, spark: SparkSession) -> DataFrame:
        """The configured source (files or Kafka) as lines in `sources/streams.py`'s column contract; `foreach_batch` parses them."""
        return sources.stream(spark, self.config)

    def start(self, spark: SparkSession, *, available_now: bool, interval: str | None = None) -> StreamingQuery:
        """Start the ingest query (after `setup`); the stage queries are started by the run methods."""
        self.setup(spark)
        self._discard_unfinished_checkpoint_writes()
        quiet_refused_batches()
        writer = self.stream(spark).writeStream.foreachBatch(self.foreach_batch).option(
            "checkpointLocation", lake_spark.location(self.config.checkpoint_dir)
        ).queryName(f"cdc_ingest_{abs(hash(str(self.config.lake))) % 10**8}")
        if available_now:
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=interval or self.config.trigger_interval)
        return writer.start()

    def _discard_unfinished_checkpoint_writes(self) -> None:
        """Remove temp files a killed stream left in the checkpoints' logs (the ingest's and every stage query's).

        Spark writes each log entry to `.<n>.<uuid>.tmp` and renames it; a SIGKILL between the two leaves
        the temp file, which was never committed, and Spark then refuses to start batch 0 again
        (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY) until someone deletes it. Safe because one stream
        writes a lake (the same rule as the exactly-once guard). Found by the crash trials.
        """
        for root in [self.config.checkpoint_dir, *(q.checkpoint for q in self.stage_queries)]:
            for log_dir in [root / "offsets", root / "commits", *sorted((root / "sources").glob("*"))]:
                if log_dir.is_dir():
                    for leftover in log_dir.glob(".*.tmp*"):
                        leftover.unlink(missing_ok=True)

    def run_available_now(self, spark: SparkSession, stop: threading.Event | None = None) -> RunReport:
        """Process everything that has landed, then let every stage query take all of it, and return
        (what `cdc run` and the Dagster asset do).

        `stop` (set by Ctrl-C in `cdc run`) ends the run after the batch in flight; the report says so,
        and the stage queries then take what the raw log got. A stage query that fails leaves the others
        to finish; its error is raised after them (its batch replays on the next run).
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
        t1 = time.perf_counter()
        stage_reports = self.drain_stages(spark)
        return RunReport(batches=list(self.reports), seconds=time.perf_counter() - t0, stopped=stopped, stage_batches=stage_reports,
                         drain_seconds=time.perf_counter() - t1)

    def run_continuously(
        self, spark: SparkSession, interval: str | None = None, timeout: float | None = None, stop: threading.Event | None = None
    ) -> RunReport:
        """Run the ingest and every stage query until interrupted (Ctrl-C), `timeout` seconds have passed, or
        `stop` is set (for programs that embed the job).

        Every way out finishes the batches in flight first: stopping Spark's query mid-batch interrupts
        the batch's writes (harmless for the lake, which replays it, but Spark then reports the
        interrupt as a failure, with a stack trace). A stage query that fails is reported and started
        again after a pause (`StageRestarts`), while the ingest and the other stages go on; the ingest
        failing stops everything.
        """
        t0 = time.perf_counter()
        counts = [len(q.reports) for q in self.stage_queries]
        running = self.start_streaming(spark, interval)
        try:
            self._await(running.query, timeout, stop)
        except KeyboardInterrupt:
            self.progress("stopping after the current batch ...")
        finally:
            running.stop()
        self.flush_folded_metrics()
        stage_reports = [r for q, n in zip(self.stage_queries, counts) for r in q.reports[n:]]
        return RunReport(batches=list(self.reports), seconds=time.perf_counter() - t0, stage_batches=stage_reports)

    def start_streaming(self, spark: SparkSession, interval: str | None = None) -> Streaming:
        """Start the ingest and every stage query beside it, and return at once (`run_continuously` waits on
        it; programs and tests that embed the stream hold the handle and `stop` it)."""
        return Streaming(self, spark, interval)

    def stop_after_batch(self, query: StreamingQuery) -> None:
        """Stop a started stream without interrupting a batch: the one in flight, if any, commits whole;
        a later one refuses to start and replays on restart. (`query.stop()` alone interrupts the batch.)

        In flight means from the moment Spark constructed the batch (logged its offsets) on, not from
        `foreach_batch` on: stopping in the gap between the two (Spark plans and lists files there)
        cancelled the batch half-started, with error logs (a Ctrl-C test found it). Spark starts the next
        batch the moment one ends, so it is the batch's id that is waited for, not a quiet trigger.
        """
        stop_after_batch(query, self.gate)

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


class Streaming:
    """A started stream: the ingest query, and the stage queries beside it with the thread that tends them
    (restarts a failed one after a pause, calls an idle one's `on_idle`)."""

    def __init__(self, job: IngestJob, spark: SparkSession, interval: str | None) -> None:
        self.job = job
        self.query = job.start(spark, available_now=False, interval=interval)
        job.last_activity = time.monotonic()
        stage_interval = job.config.stage_trigger_interval or interval or job.config.trigger_interval
        self.stages = StageRunner(spark, job.stage_queries, stage_interval, job.progress, self.source_idle)
        self._stop_watch = threading.Event()
        self._watcher = self.stages.watch(self._stop_watch)

    def source_idle(self) -> float | None:
        """Seconds since the ingest's last batch ended, or None while it runs one or has data waiting."""
        status = self.query.status
        if status.get("isTriggerActive") or status.get("isDataAvailable"):
            return None
        return time.monotonic() - self.job.last_activity

    def stage_failures(self) -> dict[str, BaseException]:
        """The stage queries whose last batch failed (each is started again after its pause), by name."""
        return {q.name: q.failure for q in self.job.stage_queries if q.failure is not None}

    def stop(self) -> None:
        """Stop every query after its batch in flight (none is interrupted mid-batch)."""
        self._stop_watch.set()
        self._watcher.join()
        self.job.stop_after_batch(self.query)
        self.stages.stop()
