"""`cdc rebuild --table NAME`: a table and its history rebuilt from the raw log, the newest type winning.

It replays the stage's typing and folding over the table's whole raw log and replaces both tables in
one overwrite each, so it sits above the stage (its dead-letter rows, its decoding of staged parts) and
compaction (how a truncate tombstones older rows); nothing in the package imports it but the
latest-state package's own entry points (onboarding runs it inside the stream).

Where the work runs. On the executors, in two passes over one pinned version of the raw log
(`rebuild_parts`): one decides every column's type from summaries the partitions send (small), the
other folds the events bucketed by key. The driver holds the decided types, the buckets' counts and the
newest truncate marker; its memory does not grow with the table's past.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc_platform import lake
from cdc_platform.lake import lake_spark, schemas
from cdc_platform.spark import spark_jobs
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.errors import LakeError
from cdc_platform.stages.latest_state import rebuild_parts as P
from cdc_platform.stages.latest_state.apply import decoded_part
from cdc_platform.stages.latest_state.compaction import key_condition, marker_row, tombstone_below
from cdc_platform.stages.latest_state.layout import LAYER
from cdc_platform.stages.latest_state.rows import history_schema, state_schema
from cdc_platform.stages.latest_state.type_votes import decide_types
from cdc_platform.stages.latest_state.writing import accept_names, ensure_tables
from cdc_platform.stages.stage import RAW

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Events a bucket of the fold holds, about (a bucket is typed and folded in one Python worker).
BUCKET_EVENTS = 50_000
#: Up to this many dead letters get their lines by id; more, by a join with the table's raw log.
LINES_BY_ID = 10_000


@dataclass
class RebuildReport:
    events: int = 0
    rows: int = 0
    history_rows: int = 0
    dead_letters: int = 0
    seconds: float = 0.0


def rebuild_table(config: PlatformConfig, name: str, progress: Callable[[str], None] | None = None, *,
                  buckets: int | None = None) -> RebuildReport:
    """Rebuild `<name>` (and its history) from the raw log, letting the newest type of each column win.

    Stop the stream first: the rebuild replaces the table in one commit, and a batch appended meanwhile
    would be lost from it (it stays in the raw log, so a second rebuild recovers it). `buckets` overrides
    how many buckets the fold uses (about `BUCKET_EVENTS` events each, at least one per shuffle partition).
    """
    lake_spark.session()  # started first, so that its jobs carry the label
    with spark_jobs.labelled("rebuild", f"cdc rebuild: {name}"):
        return _rebuild(config, name, progress, buckets)


def _rebuild(config: PlatformConfig, name: str, progress: Callable[[str], None] | None, buckets: int | None = None) -> RebuildReport:
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    table = config.table(name)
    raw_path = lake.table_path(config.lake, RAW)
    spark = lake_spark.session()
    if not lake_spark.is_table(spark, raw_path):
        raise LakeError(f"{config.lake} has no raw_change_events; run `cdc run --config ...` before `cdc rebuild`")
    # a lake of an earlier version gains new columns
    lake_spark.ensure_table(spark, raw_path, lake_spark.spark_schema(schemas.RAW_CHANGE_EVENTS), schemas.RAW_PARTITION_BY)
    from pyspark.sql import functions as F

    _, raw = lake_spark.pinned(spark, raw_path)  # both passes read the same events
    frame = raw.where(F.col("table_id") == table.source)
    events = frame.select(*P.COLUMNS)
    votes = events.mapInArrow(P.votes_pass(table), f"{P.VOTES} binary, {P.EVENTS} bigint").collect()
    decided = decide_types(P.read_votes([r[P.VOTES] for r in votes]))
    count = sum(r[P.EVENTS] for r in votes)
    say(f"rebuilding {name} from {count:,} raw events of {table.source} ...")
    ensure_tables(spark, config.lake, table)
    n = buckets or max(int(spark.conf.get("spark.sql.shuffle.partitions")), math.ceil(count / BUCKET_EVENTS))
    parts = _second_pass(events, table, decided, n).persist()
    try:
        totals = {"state": 0, "markers": 0, "history": 0, "dead": 0}
        for r in parts.where(F.col("part") == P.COUNT).select("info").collect():
            for k, v in json.loads(r["info"]).items():
                totals[k] += int(v)
        report = RebuildReport(events=count, rows=totals["state"], dead_letters=totals["dead"])
        state = decoded_part((parts, frame), P.STATE, state_schema(decided))
        if totals["markers"] and all(k in decided for k in table.key):
            state, report.rows = _truncated(state, table, list(decided)), totals["state"] - totals["markers"] + 1
        _overwrite(spark, lake.table_path(config.lake, name), state, state_schema(decided), [LAYER], what=f"rebuild {name}")
        if table.history:
            hschema = history_schema(decided)
            history = decoded_part((parts, frame), P.HISTORY, hschema)
            _overwrite(spark, lake.table_path(config.lake, table.history_name), history, hschema, None, what=f"rebuild {table.history_name}")
            report.history_rows = totals["history"]
        if totals["dead"]:
            _dead_letters(spark, config, parts, frame, totals["dead"])
    finally:
        parts.unpersist(blocking=True)
    report.seconds = time.perf_counter() - t0
    say(f"rebuilt {name}: {report.rows:,} rows (tombstones included), {report.history_rows:,} history rows, "
        f"{report.dead_letters:,} events dead-lettered, {report.seconds:.1f} s")
    return report


def _second_pass(events: DataFrame, table: TableConfig, decided: dict[str, pa.DataType], buckets: int) -> DataFrame:
    """The events bucketed by key (a key change's also by its old key) and folded per bucket: `PARTS` rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    keyed = events.mapInArrow(P.keys_pass(table), StructType([*events.schema.fields, StructField(P.OLD_KEY, StringType())]))

    def bucket_of(column: Any) -> Any:
        return F.pmod(F.xxhash64(column), F.lit(buckets)).cast("int")

    own = F.when(F.col("key").isNotNull(), bucket_of(F.col("key"))).otherwise(bucket_of(F.col("event_id")))  # truncates, keyless
    old = F.when(F.col(P.OLD_KEY).isNotNull(), bucket_of(F.col(P.OLD_KEY)))
    mine = F.struct(own.alias(P.BUCKET), F.lit(True).alias(P.NEW), F.coalesce(old == own, F.lit(False)).alias(P.OLD))
    theirs = F.when(old.isNotNull() & (old != own), F.struct(old.alias(P.BUCKET), F.lit(False).alias(P.NEW), F.lit(True).alias(P.OLD)))
    copy = F.explode(F.array_compact(F.array(mine, theirs))).alias("__copy")  # one pass over the keyed events, not a union of two
    copies = keyed.select(*[F.col(c) for c in events.columns], copy).select(*events.columns, "__copy.*")
    return copies.groupBy(P.BUCKET).applyInArrow(P.bucket_pass(table, decided), schema=lake_spark.spark_schema(P.PARTS))


def _truncated(state: DataFrame, table: TableConfig, columns: list[str]) -> DataFrame:
    """The newest truncate marker kept, and every keyed row below it made its tombstone (the older markers go)."""
    from pyspark.sql import functions as F

    markers = state.where(key_condition(table.key, null=True))
    newest = markers.orderBy(F.col("_position").desc(), F.col("_event_id")).limit(1).collect()[0].asDict()
    keyed = tombstone_below(state.where(key_condition(table.key, null=False)), newest, table.key, columns)
    return keyed.unionByName(marker_row(markers, table.key, newest))


def _dead_letters(spark: SparkSession, config: PlatformConfig, parts: DataFrame, frame: DataFrame, count: int) -> None:
    """The rebuild's dead letters, each with its original line (read back by id), appended to `dead_letter`."""
    from pyspark.sql import functions as F

    lines = frame.select("event_id", "line")
    if count <= LINES_BY_ID:  # the lines of those ids only: a join with all of them would shuffle every line of the table
        ids = decoded_part((parts, None), P.DEAD, schemas.DEAD_LETTER).select("event_id").collect()
        lines = lines.where(F.col("event_id").isin([r["event_id"] for r in ids]))
    dead = decoded_part((parts, lines), P.DEAD, schemas.DEAD_LETTER)
    dl = lake.table_path(config.lake, "dead_letter")
    lake_spark.ensure_table(spark, dl, lake_spark.spark_schema(schemas.DEAD_LETTER))
    dead.write.format("delta").mode("append").save(lake_spark.location(dl))


def _overwrite(spark: SparkSession, path: Any, frame: DataFrame, schema: pa.Schema, partition_by: list[str] | None, *, what: str) -> None:
    """Replace a table's rows and schema with `frame` (of `schema`) in one delta-spark commit."""
    accept_names(spark, path, schema)

    def attempt() -> None:
        writer = frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").option("userMetadata", "cdc_operation=rebuild")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.save(lake_spark.location(path))

    lake_spark.with_retries(attempt, what=what)
