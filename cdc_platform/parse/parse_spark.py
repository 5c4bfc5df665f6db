"""The envelope parser on Spark's executors, and the split of a parsed micro-batch by destination.

Parsing runs where the lines are: `parse_lines` parses each line in the JVM (`jvm_parse`: the Java port of
`envelope` that jvm/parser/ holds, a Spark function of each line's bytes), giving the rows, reason codes,
positions and identities of the Python parser, byte for byte. Spark's JSON functions cannot do it: the
envelope's identity hashes canonical JSON, numbers must keep every digit, and a line's kind (change,
marker, tombstone, dead letter) decides its columns. With the session's `spark.cdc.parser` set to
`python` it runs the Python parser itself instead (`parsed_batches.parse_arrow_batches` in an Arrow-based
Python function, `mapInArrow`): the reference, several times slower.

`split` turns the parsed rows into the DataFrames the raw log, the markers and the dead letters take,
deduplicated within the batch by identity (the first in input order wins, as before the move), and
one small aggregate the driver needs for the batch's metrics and the transaction stage's stream clocks
(a row per kind and source table). Nothing here collects events.

The in-batch dedup ranks only (kind, id, input order) - three narrow columns - and drops the losers
from the wide rows with a join on the input order, which Spark broadcasts (redeliveries within a
batch are few): the wide rows, with their JSON text, are never shuffled for it. The losers are kept
(`persist`) for the batch, so the aggregate, both sides and the stages' collect share one ranking;
`SplitBatch.release` drops them. Measured on a 75k-line batch: the window over the wide rows and two
`count_distinct`s cost 3.0 s, this 0.6 s (benchmarks/throughput.py).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc_platform.errors import ConfigError
from cdc_platform.lake import schemas
from cdc_platform.parse import jvm_parse
from cdc_platform.parse.envelope import KeySpec
from cdc_platform.lake.footprints import Footprint, footprint_columns, footprint_of
from cdc_platform.lake.lake_spark import spark_schema
from cdc_platform.parse.parsed_batches import parse_arrow_batches
from cdc_platform.config_outbox import OutboxConfig
from cdc_platform.sources import outbox_routed
from cdc_platform.sources.streams import input_columns
from cdc_platform.stages.stage import ParsedBatch, TableClock

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: The input order of a parsed row within its batch (`monotonically_increasing_id`: partition, row).
SEQ = "_seq"
#: The Spark setting that picks the parser: `jvm` (the default) or `python` (the reference, `envelope`).
PARSER_CONF = "spark.cdc.parser"
PARSERS = ("jvm", "python")


def _parse_partition(batches: Iterator[pa.RecordBatch], keys: KeySpec) -> Iterator[pa.RecordBatch]:
    """What each executor runs: its partition's lines, in order, as `PARSED` rows (one per line)."""
    yield from parse_arrow_batches(batches, keys)


def parse_lines(lines: DataFrame, keys: KeySpec, parser: str | None = None, outbox: OutboxConfig | None = None) -> DataFrame:
    """Lines in `sources.py`'s column contract -> `PARSED` rows plus their input order (`SEQ`), parsed on the executors.

    `parser` is `jvm` or `python`; None reads the session's `spark.cdc.parser` (default `jvm`). The order
    is taken after parsing: either parser emits one row per line in the order it reads them and keeps
    the partitioning, so (partition, row) is the lines' order. With `outbox` topics, the Event Router's
    routed records of those topics become rows by Spark expressions instead (`sources.outbox_routed`), and
    every other record is parsed as before; each side keeps its partitions, so the order holds.
    """
    from pyspark.sql import functions as F

    chosen = parser or lines.sparkSession.conf.get(PARSER_CONF, "jvm")
    if chosen not in PARSERS:
        raise ConfigError(f"{PARSER_CONF} is {chosen!r}; it must be one of {', '.join(PARSERS)}")
    routed_where = outbox_routed.is_routed(outbox, lines.columns)
    routed = None
    if routed_where is not None and outbox is not None:
        routed = outbox_routed.routed_rows(lines.where(routed_where), outbox)
        lines = lines.where(~routed_where)
    lines = lines.select(*input_columns(lines.columns))
    if chosen == "jvm":
        parsed = jvm_parse.parse_rows(lines, keys)
    else:
        parsed = lines.mapInArrow(partial(_parse_partition, keys=keys), spark_schema(schemas.PARSED))
    if routed is not None:
        parsed = parsed.select(*routed.columns).unionByName(routed)
    return parsed.withColumn(SEQ, F.monotonically_increasing_id())


@dataclass(frozen=True)
class BatchFigures:
    """The small aggregate of one parsed batch (a few rows collected to the driver), with where its
    events and markers can already be in the raw log and markers (`footprints.Footprint`)."""

    rows_read: int
    change_events: int
    distinct_events: int
    markers: int
    distinct_markers: int
    tombstones: int
    dead_letters: int
    newest_source_ts: dt.datetime | None
    events_footprint: Footprint
    markers_footprint: Footprint
    heartbeats: int = 0  # control records (`control_records.py`): counted, never stored
    schema_changes: int = 0
    newest_heartbeat_ts: dt.datetime | None = None  # the newest heartbeat's `ts_ms` (control_records)
    table_ids: tuple[str, ...] = ()  # the source tables the batch's change events belong to
    table_clocks: tuple[TableClock, ...] = ()  # by table id
    #: The newest marker time (microseconds) and the count of the markers that name a transaction.
    marker_clock: tuple[int | None, int] = (None, 0)
    #: Records the source has not made lines of yet (`schemas.LINES_INCOMPLETE`): the batch must be made again.
    incomplete_lines: int = 0

    @property
    def in_batch_duplicates(self) -> int:
        return self.change_events - self.distinct_events + self.markers - self.distinct_markers


@dataclass(frozen=True)
class SplitBatch:
    """A parsed micro-batch as DataFrames shaped to their tables; events and markers keep `SEQ`."""

    events: DataFrame  # RAW_CHANGE_EVENTS + SEQ, one row per event id
    markers: DataFrame  # TRANSACTION_MARKERS + SEQ, one row per marker id
    dead_letters: DataFrame  # DEAD_LETTER
    figures: BatchFigures
    losers: DataFrame | None = None  # (SEQ) of the in-batch repeats, kept for the batch

    def release(self) -> None:
        """Drop what `split` kept for the batch; call once the batch is committed."""
        if self.losers is not None:
            self.losers.unpersist()


#: The batch's counts of each kind of line: the rows of that kind's groups (`figures_of`).
_KIND_COUNTS = {"change": "change_events", "marker": "markers", "tombstone": "tombstones", "dead_letter": "dead_letters"}


#: Up to this many in-batch repeats, their input positions reach the driver and the batch drops them by a literal
#: set; beyond it, by a broadcast join (whose broadcast is a job of its own in each query that reads the batch).
LITERAL_REPEATS = 1_000


@dataclass(frozen=True)
class Repeats:
    """The batch's in-batch repeats (`repeats`), counted by kind, with their positions when there are few."""

    by_kind: dict[str, int]
    seqs: list[int] | None  # every repeat's SEQ; None when there are more than LITERAL_REPEATS

    @classmethod
    def of(cls, losers: DataFrame) -> Repeats:
        """One job over the (persisted) repeats, a row per kind: their count and at most LITERAL_REPEATS of their
        positions, which are all of them whenever they are used (a `limit` would run a job per round of partitions)."""
        from pyspark.sql import functions as F

        seqs = F.slice(F.collect_list(SEQ), 1, LITERAL_REPEATS)
        rows = losers.groupBy("kind").agg(F.count(F.lit(1)).alias("n"), seqs.alias("seqs")).collect()
        by_kind = {r["kind"]: int(r["n"]) for r in rows}
        few = sum(by_kind.values()) <= LITERAL_REPEATS
        return cls(by_kind, [int(seq) for r in rows for seq in r["seqs"]] if few else None)

    def dropped_from(self, parsed: DataFrame, losers: DataFrame) -> DataFrame:
        """`parsed` without the repeats: as it is when there are none, by a literal set when few (no broadcast job in
        the queries that read it: the raw log's lookup and its append would each run one), else by a broadcast join."""
        from pyspark.sql import functions as F

        if self.seqs is None:
            return parsed.join(F.broadcast(losers.select(SEQ)), on=SEQ, how="left_anti")
        if not self.seqs:
            return parsed
        return parsed.where(~F.col(SEQ).isin(self.seqs))


def figures_of(parsed: DataFrame, ingested_at: dt.datetime, losers: DataFrame) -> tuple[BatchFigures, Repeats]:
    """The batch's one aggregate, grouped by kind and source table: a row per group (a few) reaches the driver.

    Grouped, not global, so that the same job also gives each source table's clock (`TableClock`), which the
    transaction stage would otherwise read from the batch with an aggregate of its own (one job more on its
    path, 0.8 s of a small batch and 11 s of a batch of 500,000 lines beside the other stages). The distinct
    counts are the counts less the repeats (`losers`, found by `Repeats.of`, which is returned too).

    Repeats stay in: a redelivered event has the same source time, source name and transaction as its first
    copy (the identity hashes them), so the clocks, which take maxima, minima and "any", do not see them.
    """
    from pyspark.sql import functions as F

    kind = F.col("kind")
    change = kind == "change"
    heartbeat = (kind == "control") & (F.col("reason_code") == "heartbeat")
    today = F.lit(ingested_at.date())
    clocked = F.col("transaction_id").isNotNull() | F.col("source_ts").isNotNull()  # what a stream clock reads

    def count(where: Column) -> Column:
        return F.count(F.when(where, F.lit(1)))

    groups = parsed.groupBy(kind.alias("group_kind"), F.when(change, F.col("table_id")).alias("group_table")).agg(
        F.count(F.lit(1)).alias("rows_read"),
        count(heartbeat).alias("heartbeats"),
        count((kind == "control") & (F.col("reason_code") == "schema_change")).alias("schema_changes"),
        count((kind == "dead_letter") & (F.col("reason_code") == schemas.LINES_INCOMPLETE)).alias("incomplete_lines"),
        F.unix_micros(F.max(F.when(change, F.col("source_ts")))).alias("newest_source_ts"),
        F.unix_micros(F.max(F.when(heartbeat, F.col("source_ts")))).alias("newest_heartbeat_ts"),
        count(change & clocked).alias("clocked"),
        F.min(F.when(change & clocked, F.coalesce(F.col("source_name"), F.lit("")))).alias("clock_source"),
        F.count(F.when(kind.isin("change", "marker"), F.col("transaction_id"))).alias("transactional"),
        F.unix_micros(F.max(F.when((kind == "marker") & F.col("transaction_id").isNotNull(), F.col("marker_ts")))).alias("newest_marker_ts"),
        *footprint_columns("events_", F.coalesce(F.col("event_date"), today), F.col("position"), where=change),
        *footprint_columns("markers_", F.coalesce(F.col("marker_date"), today), F.col("transaction_id"), where=kind == "marker"),
    )
    rows = [r.asDict() for r in groups.collect()]
    values: dict[str, int] = {k: sum(int(r[k]) for r in rows) for k in ("rows_read", "heartbeats", "schema_changes", "incomplete_lines")}
    values |= {name: sum(int(r["rows_read"]) for r in rows if r["group_kind"] == k) for k, name in _KIND_COUNTS.items()}
    # A batch without changes or markers (a heartbeat-only one, say) has no repeats: no job to find none.
    found = Repeats.of(losers) if values["change_events"] or values["markers"] else Repeats({}, [])
    repeated = found.by_kind
    footprints = {side: footprint_of(rows, f"{side}_", ranged=True) for side in ("events", "markers")}
    changes = [r for r in rows if r["group_kind"] == "change"]
    markers = [r for r in rows if r["group_kind"] == "marker"]
    figures = BatchFigures(
        **values,
        distinct_events=values["change_events"] - repeated.get("change", 0),
        distinct_markers=values["markers"] - repeated.get("marker", 0),
        # as numbers: Python reads Spark timestamps in its local zone
        newest_source_ts=_utc_micros(_newest(r["newest_source_ts"] for r in changes)),
        newest_heartbeat_ts=_utc_micros(_newest(r["newest_heartbeat_ts"] for r in rows)),
        events_footprint=footprints["events"],
        markers_footprint=footprints["markers"],
        table_ids=tuple(sorted({r["group_table"] for r in changes if r["group_table"] is not None})),
        table_clocks=table_clocks(changes),
        marker_clock=(_newest(r["newest_marker_ts"] for r in markers), sum(int(r["transactional"]) for r in markers)),
    )
    return figures, found


def _newest(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def table_clocks(changes: list[dict[str, Any]]) -> tuple[TableClock, ...]:
    """Each table's clock from the change groups; a null table id and "" are one stream, as the clocks name them."""
    clocks: dict[str, TableClock] = {}
    for r in changes:
        if not r["clocked"]:
            continue  # none of its events has a source time or a transaction: it says nothing to the clocks
        stream = r["group_table"] or ""
        ts, source, n = r["newest_source_ts"], r["clock_source"], int(r["transactional"])
        if stream in clocks:
            _, ts_before, source_before, n_before = clocks[stream]
            ts, source, n = _newest((ts, ts_before)), min(source, source_before), n + n_before
        clocks[stream] = (stream, ts, source, n)
    return tuple(clocks[k] for k in sorted(clocks))


def _utc_micros(micros: int | None) -> dt.datetime | None:
    return None if micros is None else dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(microseconds=micros)


def split(parsed: DataFrame, batch_id: int, ingested_at: dt.datetime) -> SplitBatch:
    """Shape the parsed rows to the raw log, markers and dead-letter tables (lazily, but the aggregate)."""
    from pyspark.sql import functions as F

    today = F.lit(ingested_at.date())
    at = F.lit(ingested_at).cast("timestamp")
    kind = F.col("kind")
    losers = repeats(parsed).persist()
    try:
        figures, found = figures_of(parsed, ingested_at, losers)
    except BaseException:
        losers.unpersist()
        raise
    firsts = found.dropped_from(parsed, losers)
    events = _shape(firsts.where(kind == "change"), schemas.RAW_CHANGE_EVENTS,
                    {"ingested_at": at, "event_date": F.coalesce(F.col("event_date"), today), "arrival": F.col(SEQ)})
    markers = _shape(firsts.where(kind == "marker"), schemas.TRANSACTION_MARKERS, {"ingested_at": at, "marker_date": F.coalesce(F.col("marker_date"), today)})
    dead = _shape(
        parsed.where(kind == "dead_letter"),
        schemas.DEAD_LETTER,
        {"stage": F.lit("ingest"), "event_id": F.lit(None).cast("string"), "batch_id": F.lit(batch_id).cast("bigint"), "dead_lettered_at": at},
        keep_seq=False,
    )
    return SplitBatch(events=events, markers=markers, dead_letters=dead, figures=figures, losers=losers)


def _shape(rows: DataFrame, schema: pa.Schema, computed: dict[str, Column], *, keep_seq: bool = True) -> DataFrame:
    from pyspark.sql import functions as F

    target = spark_schema(schema)
    columns = [(computed[f.name] if f.name in computed else F.col(f.name)).cast(f.dataType).alias(f.name) for f in target.fields]
    return rows.select(*columns, *([F.col(SEQ)] if keep_seq else []))


def repeats(parsed: DataFrame) -> DataFrame:
    """(kind, SEQ) of every change or marker whose id came earlier in the batch: all but the first in
    input order (a redelivered line later in the batch adds nothing). Ranks three narrow columns only."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    kind = F.col("kind")
    ids = parsed.where(kind.isin("change", "marker")).select(
        "kind", F.when(kind == "change", F.col("event_id")).otherwise(F.col("marker_id")).alias("_id"), SEQ
    )
    rank = F.row_number().over(Window.partitionBy("kind", "_id").orderBy(SEQ))
    return ids.withColumn("_n", rank).where(F.col("_n") > 1).select("kind", SEQ)


def driver_batch(split: SplitBatch, batch_id: int, started: dt.datetime,
                 event_columns: Callable[[Sequence[str]], list[Column]] | None = None) -> ParsedBatch:
    """The batch a stage that works on Arrow in the driver takes (the transaction stage, until its fold
    moves onto Spark): collected once, in input order, and only when such a stage runs.

    `event_columns` (the stage's `driver_columns`) narrows what is collected of the events; the columns
    it leaves out read as null (the original line, above all: `with_lines` takes it back for a dead letter).
    """
    figures = split.figures

    def collect(rows: DataFrame, schema: pa.Schema, count: int) -> pa.Table:
        return schemas.conform(in_order(rows), schema) if count else schema.empty_table()

    events = split.events if event_columns is None else split.events.select(*event_columns(split.events.columns), SEQ)
    return ParsedBatch(
        batch_id=batch_id,
        events=collect(events, schemas.RAW_CHANGE_EVENTS, figures.change_events),
        markers=collect(split.markers, schemas.TRANSACTION_MARKERS, figures.markers),
        dead_letters=schemas.DEAD_LETTER.empty_table(),
        tombstones=figures.tombstones,
        rows_read=figures.rows_read,
        in_batch_duplicates=figures.in_batch_duplicates,
        ingested_at=started,
    )


def with_lines(dead: pa.Table, events: DataFrame) -> pa.Table:
    """Dead letters of events with the original line filled in from the batch's events (by event id)
    where a narrowed driver copy of the batch (`driver_batch`) left it out: nothing of an event is lost."""
    from pyspark.sql import functions as F

    ids, lines = dead.column("event_id").to_pylist(), dead.column("line").to_pylist()
    missing = sorted({i for i, line in zip(ids, lines) if i is not None and line is None})
    if not missing:
        return dead
    found = {r["event_id"]: r["line"] for r in events.where(F.col("event_id").isin(missing)).select("event_id", "line").collect()}
    filled = [found.get(i) if line is None and i is not None else line for i, line in zip(ids, lines)]
    return dead.set_column(dead.schema.get_field_index("line"), dead.schema.field("line"), pa.array(filled, pa.string()))


def in_order(rows: DataFrame) -> pa.Table:
    """Collect rows in input order, without `SEQ`: for the stages not yet moved onto Spark (issue 10).

    Sorted in the driver, on the collected Arrow table: a Spark `orderBy` is a range shuffle of the
    wide rows and a sampling job, 1.4 s of 3.3 s on a 72k-event batch."""
    table = rows.toArrow()
    return table.sort_by(SEQ).drop_columns([SEQ])
