"""Ingest: the Structured Streaming job from landing files or Kafka topics to the raw change-event log.

Shape of the job: a stream of lines from the configured source (`sources.py`: the landing directory at
any depth, new files picked up as they arrive; or Kafka topics) -> `foreachBatch`, where the driver
takes the batch's lines as Arrow, parses them (`LineParser`: inline, or on a pool of worker processes
for large batches) and commits them with delta-rs. Inside a batch the data flows one way: the raw log and markers first, then every later
stage (latest state, transactions) from the same parsed batch, then dead letters and one
`pipeline_metrics` row.

Exactly once: the source's checkpoint (kept in the lake) names each batch's files or Kafka offset
ranges, so a restart replays an unfinished batch with the same id and the same lines; every commit is
guarded by an application transaction `<query id>:<table>` = batch id (see `lake.py`), and the raw log
and markers additionally dedup by event identity, so redelivered input inserts nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform import lake, schemas, sources
from cdc_platform.config import PlatformConfig
from cdc_platform.envelope import KeySpec, parse_arrow_batches
from cdc_platform.errors import CdcError
from cdc_platform.stage import DEAD_LETTER, MARKERS, METRICS, RAW, BatchContext, ParsedBatch, Stage, run_stage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

IDLE_POLL_SECONDS = 0.5  # how often a running stream asks stages with `on_idle` whether time is up


@dataclass
class BatchReport:
    batch_id: int
    rows_read: int
    change_events: int
    markers: int
    tombstones: int
    dead_letters: int
    duplicates_skipped: int
    rows_landed: dict[str, int]
    stage_seconds: dict[str, float]
    seconds: float


@dataclass
class RunReport:
    batches: list[BatchReport] = field(default_factory=list)
    seconds: float = 0.0

    def total(self, attr: str) -> int:
        return sum(getattr(b, attr) for b in self.batches)

    def landed(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.batches:
            for k, v in b.rows_landed.items():
                out[k] = out.get(k, 0) + v
        return out


def default_stages(config: PlatformConfig) -> list[Stage]:
    """The stages after the raw log, in data-flow order."""
    # Imported here, not at the top: both modules import this one for its batch types.
    from cdc_platform.latest_state import LatestStateStage
    from cdc_platform.transactions import TransactionStage

    return [LatestStateStage(), TransactionStage()]


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def split_parsed(parsed: pa.Table, batch_id: int, ingested_at: dt.datetime | None = None) -> ParsedBatch:
    """Split the parser's wide rows by kind and shape them to their tables' schemas."""
    ingested_at = ingested_at or _now()
    kinds = parsed.column("kind")
    n = parsed.num_rows
    ingest_ts = pa.scalar(ingested_at, schemas.TS)
    today = pa.scalar(ingested_at.date(), pa.date32())

    def rows_of(kind: str) -> pa.Table:
        return parsed.filter(pc.equal(kinds, kind))

    changes = rows_of("change")
    changes = changes.set_column(changes.schema.get_field_index("event_date"), "event_date", pc.fill_null(changes.column("event_date"), today))
    events = _project(changes, schemas.RAW_CHANGE_EVENTS, {"ingested_at": ingest_ts})
    events, dups = _dedup_first(events, "event_id")

    marker_rows = rows_of("marker")
    marker_rows = marker_rows.set_column(marker_rows.schema.get_field_index("marker_date"), "marker_date", pc.fill_null(marker_rows.column("marker_date"), today))
    markers = _project(marker_rows, schemas.TRANSACTION_MARKERS, {"ingested_at": ingest_ts})
    markers, marker_dups = _dedup_first(markers, "marker_id")

    dead = rows_of("dead_letter")
    dead_letters = _project(
        dead,
        schemas.DEAD_LETTER,
        {"stage": pa.scalar("ingest"), "event_id": pa.scalar(None, pa.string()), "batch_id": pa.scalar(batch_id, pa.int64()), "dead_lettered_at": ingest_ts},
    )
    tombstones = int(pc.sum(pc.equal(kinds, "tombstone")).as_py() or 0) if n else 0
    return ParsedBatch(
        batch_id=batch_id,
        events=events,
        markers=markers,
        dead_letters=dead_letters,
        tombstones=tombstones,
        rows_read=n,
        in_batch_duplicates=dups + marker_dups,
        ingested_at=ingested_at,
    )


def _project(table: pa.Table, schema: pa.Schema, constants: dict[str, pa.Scalar]) -> pa.Table:
    arrays = []
    for f in schema:
        if f.name in constants:
            arrays.append(pa.array([constants[f.name].as_py()] * table.num_rows, f.type))
        else:
            arrays.append(table.column(f.name).cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _dedup_first(table: pa.Table, column: str) -> tuple[pa.Table, int]:
    if table.num_rows == 0:
        return table, 0
    indexed = table.select([column]).append_column("__i", pa.array(range(table.num_rows), pa.int64()))
    first = indexed.group_by(column, use_threads=False).aggregate([("__i", "min")]).column("__i_min")
    if len(first) == table.num_rows:
        return table, 0
    first = first.combine_chunks() if isinstance(first, pa.ChunkedArray) else first
    return table.take(first.take(pc.sort_indices(first))), table.num_rows - len(first)  # first row per id, in input order


def _to_ipc(data: pa.RecordBatch | pa.Table) -> pa.Buffer:
    """Arrow IPC bytes: unlike pickling a slice, the stream carries only the slice's own bytes."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, data.schema) as writer:
        writer.write(data)
    return sink.getvalue()


def _parse_table(lines: pa.Table, keys: KeySpec) -> pa.Table:
    """(value, source_file) lines -> `PARSED` rows, batch by batch as the table holds them."""
    return pa.Table.from_batches(list(parse_arrow_batches(iter(lines.to_batches()), keys)), schemas.PARSED)


def _parse_ipc(blob: pa.Buffer, keys: KeySpec) -> pa.Buffer:
    """A pool worker's task: `_parse_table`, with lines in and rows out as Arrow IPC."""
    return _to_ipc(_parse_table(pa.ipc.open_stream(blob).read_all(), keys))


def _exit_with_parent(parent: int) -> None:
    """Pool worker initializer: leave when the driver is gone (SIGKILLed drivers must not leave orphans)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


class LineParser:
    """Parses a micro-batch's lines in the driver: inline when small, on worker processes when large.

    Why not in Spark: every batch ends in the driver anyway (delta-rs commits there), and parsing inside
    `mapInArrow` made each line cross JVM -> Python worker -> JVM -> driver; measured on 505,616 lines
    (benchmarks/README.md) that round trip cost 10.5-10.9 s against 5.0 s for one `toArrow()` of the raw
    lines plus a two-process pool here, and small stream batches paid ~0.2 s of fixed worker overhead.
    Chunks travel as Arrow IPC and come back in order, so the result is the same as parsing inline.
    Workers are spawned (not forked: the driver holds JVM gateway threads) on the first large batch, so
    a program that embeds the job needs Python's usual `if __name__ == "__main__":` guard.

    A pool that breaks (a worker killed, or unable to start) costs speed, never the batch: that batch
    is parsed inline, and after `MAX_POOL_FAILURES` breaks the job parses inline from then on.
    """

    MAX_POOL_FAILURES = 2

    def __init__(
        self, keys: KeySpec, workers: int, *, chunk_rows: int = 10_000, inline_below: int = 20_000,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.keys = keys
        self.workers = workers
        self.chunk_rows = chunk_rows
        self.inline_below = inline_below
        self.warn = warn or (lambda _msg: None)
        self.pool_failures = 0
        self._pool: ProcessPoolExecutor | None = None

    def parse(self, lines: pa.Table) -> pa.Table:
        lines = lines.select(sources.input_columns(lines.column_names))  # Kafka adds its key and origin
        if self.workers <= 1 or lines.num_rows < self.inline_below or self.pool_failures >= self.MAX_POOL_FAILURES:
            return self._inline(lines)
        chunks = [_to_ipc(b) for b in lines.to_batches(max_chunksize=self.chunk_rows)]
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=multiprocessing.get_context("spawn"), initializer=_exit_with_parent, initargs=(os.getpid(),)
            )
        try:
            blobs = list(self._pool.map(partial(_parse_ipc, keys=self.keys), chunks))
        except BrokenProcessPool:
            self.close()
            self.pool_failures += 1
            final = self.pool_failures >= self.MAX_POOL_FAILURES
            self.warn(
                "a parser worker process died (killed, out of memory, or the program that embeds the job lacks an "
                "`if __name__ == \"__main__\":` guard); this micro-batch is parsed in the driver instead"
                + ("; the pool is not used again in this run (set parse_workers: 1 to skip it)" if final else "")
            )
            return self._inline(lines)
        return pa.concat_tables([pa.ipc.open_stream(b).read_all() for b in blobs]) if blobs else self._inline(lines)

    def _inline(self, lines: pa.Table) -> pa.Table:
        batches = lines.to_batches(max_chunksize=self.chunk_rows)
        return _parse_table(pa.Table.from_batches(batches, lines.schema), self.keys)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class IngestJob:
    """The streaming job for one lake. Use `run_available_now` (cdc run) or `start` (cdc stream)."""

    def __init__(
        self,
        config: PlatformConfig,
        stages: Sequence[Stage] | None = None,
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
        self._last_activity = time.monotonic()
        self._last_batch_id = -1
        self.parser = LineParser(KeySpec(dict(config.keys_by_source)), config.parse_workers, warn=self.progress)

    # -- set-up -------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Create the lake's tables and registry so readers see them before any data lands."""
        cfg = self.config
        cfg.lake.mkdir(parents=True, exist_ok=True)
        lake.ensure_table(self.path(RAW), schemas.RAW_CHANGE_EVENTS, schemas.RAW_PARTITION_BY)
        lake.ensure_table(self.path(MARKERS), schemas.TRANSACTION_MARKERS, schemas.MARKERS_PARTITION_BY)
        lake.ensure_table(self.path(DEAD_LETTER), schemas.DEAD_LETTER)
        lake.ensure_table(self.path(METRICS), schemas.PIPELINE_METRICS)
        for stage in self.stages:
            stage.setup(cfg)
        lake.write_registry(cfg)

    def path(self, name: str) -> Path:
        return lake.table_path(self.config.lake, name)

    # -- one batch ----------------------------------------------------------------------------------
    def process_parsed(
        self, parsed: pa.Table, batch_id: int, query_id: str, *, before: dict[str, float] | None = None, started: dt.datetime | None = None
    ) -> BatchReport:
        """Commit one parsed micro-batch to every table, exactly once per (query id, batch id).

        `before` carries the seconds spent on this batch before it was parsed (collecting it, parsing),
        `started` when that began, so the batch's metrics cover all of the driver's work on it.
        """
        t0 = time.perf_counter() - sum((before or {}).values())
        started = started or _now()
        batch = split_parsed(parsed, batch_id, started)
        ctx = BatchContext(self.config, query_id, batch_id)
        seconds: dict[str, float] = dict(before or {})
        landed: dict[str, int] = {}
        figures: dict[str, float] = {}

        t = time.perf_counter()
        inserted = lake.insert_new_once(
            self.path(RAW), batch.events, "event_id", "event_date", ctx.app_id(RAW), batch_id, range_column="position"
        )
        landed[RAW] = inserted if inserted is not None else 0
        markers_inserted = lake.insert_new_once(
            self.path(MARKERS), batch.markers, "marker_id", "marker_date", ctx.app_id(MARKERS), batch_id, range_column="transaction_id"
        )  # the marker id is `<transaction id>|<status>`
        landed[MARKERS] = markers_inserted if markers_inserted is not None else 0
        seconds["raw"] = time.perf_counter() - t
        replayed = inserted is None
        duplicates = batch.in_batch_duplicates
        if not replayed:
            duplicates += batch.events.num_rows - landed[RAW] + batch.markers.num_rows - landed[MARKERS]

        dead_tables = [batch.dead_letters]
        isolated = 0

        def write_isolated(rows: pa.Table, stage_name: str) -> None:
            nonlocal isolated
            isolated += rows.num_rows
            if lake.append_once(self.path(DEAD_LETTER), rows, ctx.app_id(f"{DEAD_LETTER}.{stage_name}"), batch_id):
                landed[DEAD_LETTER] = landed.get(DEAD_LETTER, 0) + rows.num_rows

        for stage in self.stages:
            t = time.perf_counter()
            result = run_stage(stage, batch, ctx, write_isolated)
            seconds[stage.name] = time.perf_counter() - t
            for k, v in result.rows_landed.items():
                landed[k] = landed.get(k, 0) + v
            figures.update({f"{stage.name}.{k}": float(v) for k, v in result.figures.items()})
            if result.dead_letters is not None and result.dead_letters.num_rows:
                dead_tables.append(result.dead_letters)

        t = time.perf_counter()
        dead = pa.concat_tables(dead_tables) if len(dead_tables) > 1 else dead_tables[0]
        if lake.append_once(self.path(DEAD_LETTER), dead, ctx.app_id(DEAD_LETTER), batch_id):
            landed[DEAD_LETTER] = landed.get(DEAD_LETTER, 0) + dead.num_rows
        seconds["dead_letter"] = time.perf_counter() - t

        report = BatchReport(
            batch_id=batch_id,
            rows_read=batch.rows_read,
            change_events=batch.events.num_rows,
            markers=batch.markers.num_rows,
            tombstones=batch.tombstones,
            dead_letters=dead.num_rows + isolated,
            duplicates_skipped=duplicates,
            rows_landed=landed,
            stage_seconds=seconds,
            seconds=time.perf_counter() - t0,
        )
        self._write_metrics(report, batch, figures, started, ctx)
        return report

    def _write_metrics(self, report: BatchReport, batch: ParsedBatch, figures: dict[str, float], started: dt.datetime, ctx: BatchContext) -> None:
        newest = pc.max(batch.events.column("source_ts")).as_py() if batch.events.num_rows else None
        finished = _now()
        lag = (finished - newest).total_seconds() if newest is not None else None
        row = {
            "query_id": ctx.query_id,
            "batch_id": report.batch_id,
            "started_at": started,
            "finished_at": finished,
            "rows_read": report.rows_read,
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
        }
        table = pa.Table.from_pylist([row], schema=schemas.PIPELINE_METRICS)
        lake.append_once(self.path(METRICS), table, ctx.app_id(METRICS), report.batch_id)

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
            t = time.perf_counter()
            lines = df.toArrow()
            collected = time.perf_counter()
            parsed = self.parser.parse(lines)
            before = {"collect": collected - t, "parse": time.perf_counter() - collected}
            with self._batch_lock:
                report = self.process_parsed(parsed, batch_id, self.query_id(), before=before, started=started)
                self._last_activity = time.monotonic()
                self._last_batch_id = batch_id
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
        self.setup()
        self._discard_unfinished_checkpoint_writes()
        writer = self.stream(spark).writeStream.foreachBatch(self.foreach_batch).option(
            "checkpointLocation", str(self.config.checkpoint_dir)
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

    def run_available_now(self, spark: SparkSession) -> RunReport:
        """Process everything that has landed, then return (what `cdc run` and the Dagster asset do)."""
        t0 = time.perf_counter()
        try:
            query = self.start(spark, available_now=True)
            self._await(query, None)
        finally:
            self.parser.close()
        return RunReport(batches=list(self.reports), seconds=time.perf_counter() - t0)

    def run_continuously(self, spark: SparkSession, interval: str | None = None, timeout: float | None = None) -> RunReport:
        """Run until interrupted (Ctrl-C) or `timeout` seconds have passed."""
        t0 = time.perf_counter()
        query = self.start(spark, available_now=False, interval=interval)
        stop_watch = threading.Event()
        watcher = self._watch_idle(query, stop_watch)
        try:
            self._await(query, timeout)
        except KeyboardInterrupt:
            self.progress("stopping after the current batch ...")
        finally:
            stop_watch.set()
            if watcher is not None:
                watcher.join()
            if query.isActive:
                query.stop()
            self.parser.close()
        return RunReport(batches=list(self.reports), seconds=time.perf_counter() - t0)

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

    def _await(self, query: StreamingQuery, timeout: float | None) -> None:
        from pyspark.errors import StreamingQueryException

        try:
            if timeout is None:
                query.awaitTermination()
            else:
                query.awaitTermination(timeout)
        except StreamingQueryException as exc:
            if self._failure is not None:
                raise self._failure from None
            raise CdcError(f"the streaming job failed: {str(exc).splitlines()[0]}") from exc
        if self._failure is not None:
            raise self._failure

