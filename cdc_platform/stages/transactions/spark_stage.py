"""The transaction stage on Spark: each micro-batch's aggregation runs on the executors, bucket by bucket.

Per batch (`SparkTransactionStage.run`):

1. Every stream's newest event time (`batch_clock`'s rows) comes with the batch: the ingest job's one
   aggregate of the batch already computed it (`SparkBatch.table_clocks`; for a batch built without them,
   `_clock` runs an aggregate of its own). The driver moves the clocks (`advance`), which every transaction
   is judged against.
2. The committed state's transaction rows and the batch's transactional events and markers are
   cogrouped by `hash(transaction_id)` into buckets; each group runs `buckets.bucket_parts` (the same
   `settle` the driver step runs) and returns its rows as encoded parts, kept on the executors. A batch
   with no transactional event or marker, over a state that holds no transaction, has nothing to group:
   the cogroup is skipped (a connector without transaction metadata, Debezium's default, never runs it).
3. The driver collects only the groups' summaries (what blocks the watermark, figures, poison ids),
   reduces the watermark candidates under the combined blocks with one Spark aggregate, and builds
   the few global rows (streams, sources, the watermark).
4. The outputs are written from the executors (decoded in `mapInArrow`), side by side, each guarded
   by Delta's `txnAppId`/`txnVersion`; the state last, as a whole overwrite. A crash in between
   replays the batch against the old state, which decides the same again.

What stays on the driver: the stream clocks and per-source marks (a few rows, cached between batches
and stamped with the state table's version like `TransactionStage`'s held state), and the
version reads of small tables through delta-rs. A small batch over a small state (a quiet stream's, a
new lake's first few events) is run whole by the driver stage instead (`driver_stage_for`): the
executors' fold has a fixed cost of several jobs that such a batch does not pay back. In local mode, where
the executors are the driver's own cores, so is any batch up to half a million events and markers
(`LOCAL_BATCH_ROWS`): there the buckets buy no core and cost the shuffle and the Python workers' round trips.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.lake import arrow_parts, lake_spark, schemas
from cdc_platform import lake
from cdc_platform.spark import spark_jobs
from cdc_platform.config import PlatformConfig
from cdc_platform.stages.stage import DEAD_LETTER, STAGE_ERROR, BatchContext, SparkBatch, StageFailure, StageResult, dead_letter_rows, poison_reason, summed
from cdc_platform.storage import LakePath
from cdc_platform.stages.transactions import buckets as B
from cdc_platform.stages.transactions.aggregation import CLOCK, _read_streams, advance
from cdc_platform.stages.transactions.schemas import (
    COMPLETED,
    EXPIRED,
    INCOMPLETE,
    LATE,
    MARKERS_STREAM,
    OPEN,
    OPEN_TRANSACTIONS,
    OPEN_TRANSACTIONS_SCHEMA,
    PROCESSING_TIME,
    SOURCE,
    STREAM,
    TABLE_SCHEMAS,
    TRANSACTIONS,
    WATERMARK,
    Settings,
)
from cdc_platform.stages.transactions.stage import STATE_TOKEN, TransactionStage, create_tables, held_after_commit, replay_pending
from cdc_platform.stages.transactions.watermark import CANDIDATES, EVERY_SOURCE, Blocks, _read_sources, _SourceMark

#: A quiet stream asks for idle expiry every poll; between two evaluations (each a Spark job) at least this long.
IDLE_EVERY_SECONDS = 5.0
#: The state columns of its stream and source rows (what the driver reads of the state table).
GLOBAL_COLUMNS = ("entry", "stream", "source", "event_time", "watermark_position", "watermark_ts", "settled_position", "settled_ts")
#: The bucket column of the cogroup.
BUCKET = "_bucket"
#: Where the fold of a batch runs. On a cluster, a batch of at most `SMALL_BATCH_ROWS` events and markers, over a
#: state of at most `SMALL_STATE_ROWS` held transactions, runs the driver stage's step (`TransactionStage`, the same
#: `settle`, landing the same rows) instead of the executors' buckets: collecting it costs less than the cogroup's
#: fixed cost (its Python workers, the summaries' collect, the watermark's aggregate and the decoded writes).
#: Measured on a new lake, 66 lines of 20 transactions: the stage's batch 2.9 s against 3.5-3.7 s on the executors;
#: at ~300 lines the two were level (benchmarks/README.md, "A tenth session on issue 44"). Above them the executors'
#: cores pay back, and the driver would hold the whole state.
SMALL_BATCH_ROWS = 100
SMALL_STATE_ROWS = 5_000
#: The same bounds in local mode (`local[n]`), where the executors are threads of the driver's own JVM on the same
#: cores: the buckets buy no core there and cost the shuffle of the row images, the Python workers' round trips and
#: the parts' encoding and decoding. Measured on local[2] (benchmarks/README.md, "A fifteenth session"): 125,000
#: events and markers a batch, eight batches, the stage 3.4-4.6 s a batch on the driver against 5.9-8.9 s on the
#: executors; one batch of 1,010,000, 18.1-20.5 s against 23.6-35.7 s. Bounded because the driver's Python holds
#: the collected batch: ~2 KB a row at its peak (5.2 GB for one stage batch of 2.5M rows, `cdc run` of 1M change
#: events, where that batch then took 91 s against 115 s on the executors), so about 1 GB at this bound; a stage
#: batch may be ~4M rows (`run.stage_queries.MAX_BYTES_PER_TRIGGER`), and beyond the bounds the executors fold it
#: as on a cluster.
LOCAL_BATCH_ROWS = 500_000
LOCAL_STATE_ROWS = 1_000_000


@dataclass(frozen=True)
class Globals:
    """The few state rows that are not per transaction, as the driver keeps them between batches."""

    progress: dict[str, int]
    stream_source: dict[str, str]
    sources: dict[str, _SourceMark]
    open_count: int
    held_count: int  # the per-transaction rows: open, and finished ones remembered for lateness


class SparkTransactionStage:
    """The transaction stage as Spark work (see the module doc); a `SparkStage`, with `on_idle` for `cdc stream`."""

    name = "transactions"
    reads_markers = True  # its query reads the transaction markers beside the raw log (run/stage_queries.py)

    def __init__(self, buckets: int | None = None, *, probe: Any = None, small_batch_rows: int | None = None,
                 small_state_rows: int | None = None) -> None:
        """`buckets`: how many groups the transactions are hashed into (default: Spark's shuffle partitions).
        `probe`: a test hook run on each group's events and markers before they settle (`FoldContext.probe`).
        `small_batch_rows`, `small_state_rows`: the most events and markers, and held transactions, of a batch the
        driver stage runs (`driver_stage_for`; default: `LOCAL_*` in local mode, `SMALL_*` on a cluster);
        `small_batch_rows=0`: every batch on the executors."""
        self._probe = probe
        self._small_batch_rows = small_batch_rows
        self._small_state_rows = small_state_rows
        self._driver = TransactionStage()
        self._lock = threading.RLock()  # a batch and an idle tick never interleave
        self._cache: tuple[LakePath, int, Globals] | None = None
        self._recovered: set[LakePath] = set()
        self._buckets = buckets
        self._idle_checked = 0.0

    def setup(self, config: PlatformConfig) -> None:
        create_tables(config)

    def _path(self, config: PlatformConfig, name: str) -> LakePath:
        return lake.table_path(config.lake, name)

    # --- the committed state's global rows ---------------------------------------------------------------

    def _globals(self, path: LakePath, table: Any) -> Globals:
        version = table.version()
        cached = self._cache
        if cached is not None and cached[0] == path and cached[1] == version:
            return cached[2]
        rows = lake.scan(table, list(GLOBAL_COLUMNS), pc.field("entry").isin([STREAM, SOURCE]))
        rows = rows if rows.num_rows else OPEN_TRANSACTIONS_SCHEMA.empty_table()
        entry = rows.column("entry")
        progress, stream_source = _read_streams(rows.filter(pc.equal(entry, STREAM)))
        held = lake.scan(table, ["entry"], pc.field("entry").isin([OPEN, COMPLETED, EXPIRED])).column("entry")
        found = Globals(progress, stream_source, _read_sources(rows.filter(pc.equal(entry, SOURCE))),
                        int(pc.sum(pc.equal(held, OPEN)).as_py() or 0), len(held))
        self._cache = (path, version, found)
        return found

    def driver_stage_for(self, batch: SparkBatch, ctx: BatchContext) -> TransactionStage | None:
        """The driver stage for a batch and state within the driver's bounds (`SMALL_*` on a cluster, `LOCAL_*` in
        local mode, or the constructor's), else None.

        Both stages read and write the same tables under the same guards, and each takes the state from the
        table when its version is not one it stamped itself, so a stream may switch between them at any batch."""
        counted = (batch.event_count, batch.marker_count)
        batch_rows, state_rows = self._bounds()
        if self._probe is not None or None in counted or sum(counted) > batch_rows:  # type: ignore[arg-type]
            return None  # a batch built without its counts (a tool's) is not known to be small
        path = self._path(ctx.config, OPEN_TRANSACTIONS)
        with self._lock:
            held = self._globals(path, lake.open_table(path))
        return self._driver if held.held_count <= state_rows else None

    def _bounds(self) -> tuple[int, int]:
        """The most events and markers, and held transactions, the driver stage takes (see `LOCAL_BATCH_ROWS`)."""
        local = local_mode()
        return (self._small_batch_rows if self._small_batch_rows is not None else LOCAL_BATCH_ROWS if local else SMALL_BATCH_ROWS,
                self._small_state_rows if self._small_state_rows is not None else LOCAL_STATE_ROWS if local else SMALL_STATE_ROWS)

    def _orphans(self, spark: Any, config: PlatformConfig, state: Any, open_count: int) -> frozenset[str]:
        """Open transactions an idle expiry wrote as expired but died before committing the state (once per process).

        With nothing open there is nothing to recover, and the join (a Spark job over two tables, ~2 s, on
        the batch's critical path: most of the stage's time in a small `cdc run`) is skipped, as the
        driver-side `TransactionStage` does.
        """
        from pyspark.sql import functions as F

        path = self._path(config, OPEN_TRANSACTIONS)
        if path in self._recovered:
            return frozenset()
        if open_count == 0:
            self._recovered.add(path)
            return frozenset()
        done = lake_spark.read(spark, self._path(config, INCOMPLETE)).where(F.col("expired_by") == PROCESSING_TIME).select("transaction_id")
        ids = state.where(F.col("entry") == OPEN).select("transaction_id").join(done.distinct(), "transaction_id", "left_semi")
        found = frozenset(r[0] for r in ids.collect())
        self._recovered.add(path)
        return found

    # --- one batch ----------------------------------------------------------------------------------------

    def run(self, batch: SparkBatch, ctx: BatchContext) -> StageResult:
        with self._lock:
            return self._run(batch, ctx)

    def _run(self, batch: SparkBatch | None, ctx: BatchContext, idle_us: int = 0) -> StageResult:
        config = ctx.config
        spark = lake_spark.session()
        state_path = self._path(config, OPEN_TRANSACTIONS)
        table = lake.open_table(state_path)
        guarded = batch is not None
        if guarded and lake.already_committed(table, ctx.app_id(OPEN_TRANSACTIONS), ctx.batch_id):
            return StageResult(figures={"replayed_batches": 1.0})  # the state is committed last: all done
        if batch is not None and batch.event_count == 0 and batch.marker_count == 0:
            return StageResult()  # nothing arrived (a heartbeat-only batch): nothing moves
        held = self._globals(state_path, table)
        seconds: dict[str, float] = {}
        t = time.perf_counter()
        events, markers = _inputs(spark, batch)
        clock, transactional = _clock(events, markers) if batch is not None and batch.table_clocks is None else _given_clock(batch)
        clocks = advance(held.progress, held.stream_source, clock)
        seconds["clock"] = time.perf_counter() - t

        state_version = table.version()
        state = lake_spark.read(spark, state_path, state_version)
        now = batch.ingested_at if batch is not None else dt.datetime.now(dt.timezone.utc)
        fold = B.FoldContext(clocks=clocks, settings=Settings.from_config(config), batch_id=ctx.batch_id if guarded else None,
                             now=now, idle_us=idle_us, orphans=self._orphans(spark, config, state, held.open_count), stage=self.name,
                             probe=self._probe)
        t = time.perf_counter()
        if transactional or held.held_count:
            parts = _parts(spark, fold, state, events, markers, self._buckets).persist()
        else:  # no transaction arrived and none is held: the cogroup would form no group (Debezium's default, no metadata)
            parts = lake_spark.from_arrow(spark, B.PARTS.empty_table(), B.PARTS)
        try:
            summaries = parts.where(parts["part"].isin(B.SUMMARY, B.POISON, B.FAILURE)).select("bucket", "part", "info").collect()
            seconds["fold"] = time.perf_counter() - t
            failures = [json.loads(r["info"])["message"] for r in summaries if r["part"] == B.FAILURE]
            if failures:
                raise StageFailure(failures[0])
            summary = [json.loads(r["info"]) for r in summaries if r["part"] == B.SUMMARY]
            poison = [json.loads(r["info"]) for r in summaries if r["part"] == B.POISON]
            held_back = Blocks.combine([Blocks.from_json(s["blocks"]) for s in summary])
            figures: dict[str, float] = summed(s["figures"] for s in summary)
            if not guarded and not figures.get("expired"):
                return StageResult()  # an idle tick that expired nothing commits nothing
            for k in ("completed", "expired", "late", "open", "finished_kept", "merged"):
                figures.setdefault(k, 0.0)
            landed: dict[str, int] = {}
            if poison:
                figures["isolated_events"] = float(len(poison))
                dead = _poison_letters(batch, poison, self.name, ctx.batch_id)
                if lake_spark.append_once(lake_spark.from_arrow(spark, dead, schemas.DEAD_LETTER), self._path(config, DEAD_LETTER),
                                          ctx.app_id(f"{DEAD_LETTER}.{self.name}"), ctx.batch_id):
                    landed[DEAD_LETTER] = dead.num_rows

            def place_watermark() -> tuple[pa.Table, pa.Table, Globals]:
                """The watermark and the state's global rows: one more Spark aggregate, run beside the outputs' writes."""
                t = time.perf_counter()
                tops = _tops(spark, parts, events, held_back)
                new_sources, watermark, global_rows = B.finish(held.sources, clocks, held_back, tops, fold.batch_id, now)
                seconds["watermark"] = time.perf_counter() - t
                figures["state_rows"] = float(sum(s["state_rows"] for s in summary) + global_rows.num_rows)
                return watermark, global_rows, Globals(clocks.after, clocks.stream_source, new_sources, int(figures["open"]),
                                                       int(figures["open"] + figures["finished_kept"]))

            t = time.perf_counter()
            landed |= self._commit(spark, config, ctx if guarded else None, parts, figures, place_watermark)
            seconds["commit"] = time.perf_counter() - t
        finally:
            parts.unpersist()
        figures |= {f"seconds.{k}": v for k, v in seconds.items()}
        return StageResult(rows_landed=landed, figures=figures)

    def _commit(self, spark: Any, config: PlatformConfig, ctx: BatchContext | None, parts: Any, figures: dict[str, float],
                place_watermark: Callable[[], tuple[pa.Table, pa.Table, Globals]]) -> dict[str, int]:
        """Outputs first (side by side, the watermark placed and written in one of the threads), state last,
        so a crash in between replays against the old state."""
        version = None if ctx is None else ctx.batch_id
        metadata = None if ctx is not None else "trigger=idle"
        counts = {TRANSACTIONS: int(figures["completed"]), INCOMPLETE: int(figures["expired"]), LATE: int(figures["late"])}
        part_of = {TRANSACTIONS: B.COMPLETED_PART, INCOMPLETE: B.INCOMPLETE_PART, LATE: B.LATE_PART}
        placed: list[tuple[pa.Table, pa.Table, Globals]] = []

        def output(name: str) -> bool:
            if name == WATERMARK:
                placed.append(place_watermark())
                data = lake_spark.from_arrow(spark, placed[0][0], TABLE_SCHEMAS[WATERMARK])
                return _write(data, self._path(config, name), None if ctx is None else ctx.app_id(name), version, "overwrite", metadata)
            if counts[name] == 0:
                return False
            data = _decoded(parts, part_of[name], TABLE_SCHEMAS[name])
            return _write(data, self._path(config, name), None if ctx is None else ctx.app_id(name), version, "append", metadata)

        names = [WATERMARK, TRANSACTIONS, INCOMPLETE, LATE]
        wrote = spark_jobs.side_by_side([lambda name=name: output(name) for name in names], name="cdc-tx-commit")
        landed = {name: counts[name] for name, done in zip(names, wrote) if done and name != WATERMARK}
        _, global_rows, after = placed[0]

        state_path = self._path(config, OPEN_TRANSACTIONS)
        token = STATE_TOKEN + uuid.uuid4().hex
        self._cache = None  # until the commit is known to be ours
        state = _decoded(parts, B.STATE, OPEN_TRANSACTIONS_SCHEMA).unionByName(lake_spark.from_arrow(spark, global_rows, OPEN_TRANSACTIONS_SCHEMA))
        _write(state, state_path, None if ctx is None else ctx.app_id(OPEN_TRANSACTIONS), version, "overwrite", token)
        self._cache = held_after_commit(config, state_path, token, after)
        return landed

    def on_idle(self, ctx: BatchContext, idle_seconds: float) -> StageResult | None:
        """`cdc stream` received nothing for `idle_seconds`: advance event time by that much and expire what is due.

        A quiet stream evaluates at most every `IDLE_EVERY_SECONDS` (the expiry is that much later at worst), and
        never when nothing is open. A state within the driver's bound (`_bounds`; a batch of no rows is within any
        but 0) is evaluated by the driver stage, as a batch would be: in local mode the executors' job over the
        held transactions is the same fold with the rows moved to Python workers and back.
        """
        config = ctx.config
        if idle_seconds < config.transaction_timeout or time.monotonic() - self._idle_checked < IDLE_EVERY_SECONDS:
            return None
        with self._lock:
            path = self._path(config, OPEN_TRANSACTIONS)
            held = self._globals(path, lake.open_table(path))
            if held.open_count == 0 or replay_pending(ctx):
                return None
            self._idle_checked = time.monotonic()
            batch_rows, state_rows = self._bounds()
            if self._probe is None and batch_rows > 0 and held.held_count <= state_rows:
                return self._driver.on_idle(ctx, idle_seconds)
            result = self._run(None, ctx, idle_us=int(idle_seconds * 1_000_000))
            return result if result.rows_landed or result.figures else None


# --- Spark plumbing ----------------------------------------------------------------------------------------

def local_mode() -> bool:
    """Whether the session runs in local mode (`local`, `local[n]`, `local[*]`): its executors share the driver's cores."""
    return str(lake_spark.session().sparkContext.master).startswith("local")


def _inputs(spark: Any, batch: SparkBatch | None) -> tuple[Any, Any]:
    """The batch's events and markers with the columns the stage reads (empty frames for an idle tick)."""
    from pyspark.sql import functions as F

    if batch is None:
        events = lake_spark.from_arrow(spark, schemas.RAW_CHANGE_EVENTS.empty_table(), schemas.RAW_CHANGE_EVENTS)
        markers = lake_spark.from_arrow(spark, schemas.TRANSACTION_MARKERS.empty_table(), schemas.TRANSACTION_MARKERS)
    else:
        events, markers = batch.events, batch.markers
    return (events.select(*[F.col(c) for c in B.EVENT_COLUMNS]),
            markers.select(*[F.col(c) for c in B.MARKER_COLUMNS]))


def _clock(events: Any, markers: Any) -> tuple[pa.Table, bool]:
    """`batch_clock` in Spark: one small aggregate over the batch, collected (`CLOCK` rows); and whether any event
    or marker of the batch belongs to a transaction, counted in the same aggregate."""
    from pyspark.sql import functions as F

    table = F.coalesce(F.col("table_id"), F.lit(""))
    per_table = (events.where(F.col("transaction_id").isNotNull() | F.col("source_ts").isNotNull())
                 .groupBy(table.alias("stream"))
                 .agg(F.max(F.unix_micros("source_ts")).alias("ts"), F.min(F.coalesce(F.col("source_name"), F.lit(""))).alias("source"),
                      F.count("transaction_id").alias("n")))
    on_markers = (markers.where(F.col("transaction_id").isNotNull())
                  .agg(F.lit(MARKERS_STREAM).alias("stream"), F.max(F.unix_micros("marker_ts")).alias("ts"),
                       F.count(F.lit(1)).alias("n"), F.lit(None).cast("string").alias("source")))
    rows = per_table.unionByName(on_markers.where(F.col("n") > 0)).collect()
    clock = pa.Table.from_pylist([{k: r[k] for k in CLOCK.names} for r in rows], schema=CLOCK)
    return clock, any(r["n"] for r in rows)


def _given_clock(batch: SparkBatch | None) -> tuple[pa.Table, bool]:
    """`_clock`'s answer from what the batch's one aggregate already counted (`SparkBatch.table_clocks`), without a
    job of its own; an idle tick (no batch) moves no clock."""
    if batch is None:
        return CLOCK.empty_table(), False
    rows = [{"stream": stream, "ts": ts, "source": source} for stream, ts, source, _ in batch.table_clocks or ()]
    marker_ts, marker_n = batch.marker_clock or (None, 0)
    if marker_n:
        rows.append({"stream": MARKERS_STREAM, "ts": marker_ts, "source": None})
    transactional = bool(marker_n) or any(n for *_, n in batch.table_clocks or ())
    return pa.Table.from_pylist(rows, schema=CLOCK), transactional


def _parts(spark: Any, fold: B.FoldContext, state: Any, events: Any, markers: Any, buckets: int | None) -> Any:
    """The cogrouped fold: committed transaction rows and the batch's arrivals, by bucket, as `PARTS` rows."""
    from pyspark.sql import functions as F

    n = buckets or max(2, int(spark.conf.get("spark.sql.shuffle.partitions")))

    def bucket() -> Any:
        return F.pmod(F.xxhash64("transaction_id"), F.lit(n)).cast("int").alias(BUCKET)

    held = state.where(F.col("entry").isin(OPEN, COMPLETED, EXPIRED)).select(bucket(), *[F.col(f.name) for f in OPEN_TRANSACTIONS_SCHEMA])
    arrivals = (events.where(F.col("transaction_id").isNotNull()).withColumn(B.KIND, F.lit(B.EVENT))
                .unionByName(markers.where(F.col("transaction_id").isNotNull()).withColumn(B.KIND, F.lit(B.MARKER)), allowMissingColumns=True))
    arrivals = arrivals.select(bucket(), *[F.col(c) for c in arrivals.columns])
    fn = B.group_function(fold)

    def run(key: tuple[pa.Scalar, ...], state_rows: pa.Table, rows: pa.Table) -> pa.Table:
        return fn(key, state_rows.drop_columns([BUCKET]), rows.drop_columns([BUCKET]))

    return held.groupBy(BUCKET).cogroup(arrivals.groupBy(BUCKET)).applyInArrow(run, schema=lake_spark.spark_schema(B.PARTS))


def _decoded(parts: Any, part: str, schema: pa.Schema) -> Any:
    from pyspark.sql import functions as F

    rows = parts.where(F.col("part") == part).select("payload")
    return rows.mapInArrow(arrow_parts.decoder(schema), lake_spark.spark_schema(schema))


def _tops(spark: Any, parts: Any, events: Any, held_back: Blocks) -> dict[str, tuple[Any, Any]]:
    """`watermark.reduce_candidates` in Spark: per source, the highest fresh mark and the highest below the blocks."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    plain = events.where(F.col("transaction_id").isNull() & F.col("position").isNotNull()).select(
        F.coalesce(F.col("source_name"), F.lit("")).alias("source"), F.col("position"),
        F.unix_micros("source_ts").alias("ts"), F.lit(True).alias("fresh"))
    cands = _decoded(parts, B.CANDIDATES_PART, CANDIDATES).unionByName(plain)
    limits = [(src, (held_back.lowest.get(src) or (None,))[0], (held_back.cap(src) or (None,))[0])
              for src in sorted(set(held_back.lowest) | set(held_back.ghosts))]
    every = held_back.ghosts.get(EVERY_SOURCE)
    limit_schema = StructType([StructField("source", StringType()), StructField("bound", StringType()), StructField("cap", LongType())])
    joined = cands.join(F.broadcast(spark.createDataFrame(limits, limit_schema)), "source", "left")
    cap = F.coalesce(F.col("cap"), F.lit(every[0]) if every is not None else F.lit(None).cast("long"))
    allowed = (F.col("bound").isNull() | (F.col("position") < F.col("bound"))) & (cap.isNull() | (F.col("ts").isNotNull() & (F.col("ts") < cap)))
    mark = F.struct(F.col("position"), F.col("ts"))
    rows = joined.groupBy("source").agg(F.max(F.when(F.col("fresh"), mark)).alias("top"), F.max(F.when(allowed, mark)).alias("best")).collect()
    return {r["source"]: tuple(None if m is None else (m["position"], m["ts"]) for m in (r["top"], r["best"])) for r in rows}  # type: ignore[misc]


def _write(data: Any, path: LakePath, application: str | None, version: int | None, mode: str, metadata: str | None) -> bool:
    """Write unless this application already committed `version` (`lake_spark.save` checks before any file is written)."""
    return lake_spark.with_retries(lambda: lake_spark.save(data, path, mode, application, version, metadata=metadata),
                                   what=f"{mode} {path.name}") is not None


def _poison_letters(batch: SparkBatch | None, poison: list[dict[str, str]], stage: str, batch_id: int) -> pa.Table:
    """Dead letters of the events and markers the groups set aside, with their lines taken from the batch."""
    from pyspark.sql import functions as F

    found: dict[tuple[str, str], dict[str, Any]] = {}
    if batch is not None:
        event_ids = sorted({p["id"] for p in poison if p["kind"] == B.EVENT})
        marker_ids = sorted({p["id"] for p in poison if p["kind"] == B.MARKER})
        if event_ids:
            for r in batch.events.where(F.col("event_id").isin(event_ids)).select("event_id", "table_id", "line", "source_file").collect():
                found[(B.EVENT, r["event_id"])] = r.asDict()
        if marker_ids:
            for r in batch.markers.where(F.col("marker_id").isin(marker_ids)).select("marker_id", "line", "source_file").collect():
                found[(B.MARKER, r["marker_id"])] = {"line": r["line"], "source_file": r["source_file"]}
    rows = []
    for p in sorted(poison, key=lambda p: (p["kind"], p["id"])):
        row = dict(found.get((p["kind"], p["id"]), {}))
        row.pop("marker_id", None)
        rows.append({**row, "reason_code": STAGE_ERROR, "reason": poison_reason(stage, p["kind"], p["error"])})
    return dead_letter_rows(rows, stage=stage, batch_id=batch_id)

