"""The outbox stage: each batch's outbox inserts landed in their event tables, once per event id.

Per batch (`OutboxStage.run`, a `SparkStage`: the rows never reach the driver):

1. The batch's rows of the outbox table and of the routed topics (`events.outbox_rows`); inserts become
   events (`events.derive`), updates, deletes and truncates are the outbox's housekeeping and are only
   counted (`outbox.housekeeping`). An event without id, type or aggregate type, with a payload that is not
   JSON, or whose aggregate type makes no usable table name, is a dead letter with its reason.
2. Within the batch, the copies of one event id are ranked by source position (then transaction order, then
   arrival): the first is the candidate; a later copy saying the same is a redelivery, one saying something
   else an `outbox_id_conflict` dead letter.
3. Against the event tables: a candidate whose id is already stored (in any event table) with the same
   content is a redelivery and lands nothing; with other content it is an `outbox_id_conflict` dead letter,
   never an overwrite. The lookup reads only the `event_id` column of the stored tables, and the full rows of
   the few ids found.
4. The rest is appended to `<aggregate type>_events`, one append per table guarded by Delta's application
   transaction (`<stage query id>:<table>`, version = batch id): a batch replayed after a crash commits
   nothing twice, and its recomputation finds its own rows stored with the same content, so it decides the
   same dead letters.

Why an anti-join and an idempotent append rather than `MERGE ... WHEN NOT MATCHED INSERT`: a conflict must
be told from a redelivery (same id, other content) and dead-lettered, which an insert-only MERGE would
silently skip; and the append carries `txnAppId`/`txnVersion`, which a MERGE takes only through session
settings (the same reasoning as the raw log's `insert_new.insert_new_once`). One stream writes a lake, so
nothing inserts between the lookup and the append.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from cdc_platform import lake
from cdc_platform.config import SYSTEM_TABLES, PlatformConfig
from cdc_platform.config_outbox import OutboxConfig
from cdc_platform.errors import ConfigError
from cdc_platform.lake import lake_spark, schemas
from cdc_platform.stages.outbox import events as E
from cdc_platform.stages.outbox import tables as T
from cdc_platform.stages.stage import BatchContext, SparkBatch, StageResult

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Above this many stored ids met again in one batch, their rows are read by a join instead of an IN list.
MAX_LISTED_IDS = 1000
#: The stage's figures (in `stage_progress.stage_figures`, prefixed `outbox.`).
LANDED, REDELIVERED, HOUSEKEEPING, CONFLICTS = "events_landed", "redelivered", "housekeeping", "id_conflicts"


class OutboxStage:
    """Outbox events -> `<aggregatetype>_events` tables (module doc). Does nothing for a config without `outbox:`."""

    name = E.STAGE

    def __init__(self) -> None:
        self._payload: dict[str, Any] = {}  # table name -> declared payload StructType
        self._schemas: dict[str, Any] = {}  # table name -> table StructType, once ensured

    def setup(self, config: PlatformConfig) -> None:
        outbox = config.outbox
        self._payload, self._schemas = {}, {}
        if outbox is None:
            return
        clash = sorted(set(outbox.columns.additional) & E.RESERVED)
        if clash:
            raise ConfigError(f"outbox.columns.additional: {', '.join(clash)} would clash with the event tables' own columns; "
                              "leave them out or rename them in the outbox table")
        for name, ddl in T.payload_schemas(outbox).items():
            self._payload[name] = E.payload_struct(ddl)

    def reserved_names(self, config: PlatformConfig) -> list[str]:
        """Lake names an event table may not take: the platform's tables and the configured tables' (and histories')."""
        return sorted({*SYSTEM_TABLES, *(t.name for t in config.tables), *(t.history_name for t in config.tables)})

    def run(self, batch: SparkBatch, ctx: BatchContext) -> StageResult:
        outbox = ctx.config.outbox
        if outbox is None or not batch.event_count or not (set(batch.table_ids) & set(outbox.source_table_ids)):
            return StageResult()
        from pyspark.sql import functions as F

        rows = E.outbox_rows(batch.events, outbox)
        derived = E.derive(rows, outbox, self.reserved_names(ctx.config)).persist()
        classified = None
        try:
            classified = self._classify(derived, ctx.config.lake, outbox).persist()
            counts = {(r["table_name"], r["verdict"]): int(r["n"]) for r in
                      classified.groupBy("table_name", "verdict").agg(F.count(F.lit(1)).alias("n")).collect()}
            housekeeping = rows.where(~F.col("op").isin(*E.EVENT_OPS)).count()
            fresh_tables = sorted({t for (t, v), n in counts.items() if v == "fresh" and n})
            landed = self._write(classified, {t: counts[(t, "fresh")] for t in fresh_tables}, outbox, ctx)
            dead = self._dead_letters(classified, ctx.batch_id)
            dead_count = sum(n for (_t, v), n in counts.items() if v in ("bad", "conflict"))
        except BaseException:
            derived.unpersist()
            if classified is not None:
                classified.unpersist()
            raise

        def release() -> None:
            derived.unpersist()
            classified.unpersist()

        figures = {
            LANDED: float(sum(landed.values())),
            REDELIVERED: float(sum(n for (_t, v), n in counts.items() if v == "redelivered")),
            HOUSEKEEPING: float(housekeeping),
            CONFLICTS: float(sum(n for (_t, v), n in counts.items() if v == "conflict")),
        }
        return StageResult(rows_landed=landed, figures=figures, dead_frame=dead if dead_count else None, dead_count=dead_count,
                           release=release)

    # -- deciding each event ----------------------------------------------------------------------------
    def _classify(self, derived: DataFrame, lake_dir: Any, outbox: OutboxConfig) -> DataFrame:
        """Every derived row with its `verdict`: bad (its reason), fresh, redelivered, or conflict (and what it met)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        order = [F.col("source_position").asc_nulls_last(), F.col("source_order").asc_nulls_last(), F.col("ingested_at"),
                 F.col("arrival").asc_nulls_last(), F.col("_seq")]
        good = derived.where(F.col("reason_code").isNull())
        by_id = Window.partitionBy("event_id").orderBy(*order)
        ranked = (good.withColumn("_rank", F.row_number().over(by_id))
                  .withColumn("_first_hash", F.first("content_hash").over(by_id))
                  .withColumn("_first_at", F.first("source_position").over(by_id)))
        stored = self._stored(ranked.where(F.col("_rank") == 1).select("event_id"), lake_dir, outbox.columns.additional)
        joined = ranked.join(stored, "event_id", "left")
        verdict = (F.when(F.col("_rank") > 1, F.when(F.col("content_hash") == F.col("_first_hash"), F.lit("redelivered")).otherwise(F.lit("conflict")))
                   .when(F.col("_stored_hash").isNull(), F.lit("fresh"))
                   .when(F.col("_stored_hash") == F.col("content_hash"), F.lit("redelivered"))
                   .otherwise(F.lit("conflict")))
        conflict_reason = F.concat(
            F.lit("outbox event id "), F.col("event_id"), F.lit(" is already "),
            F.when(F.col("_rank") > 1, F.concat(F.lit("taken in this batch by an event at position "), F.coalesce(F.col("_first_at"), F.lit("?"))))
             .otherwise(F.concat(F.lit("stored in "), F.col("_stored_table"), F.lit(" at position "), F.coalesce(F.col("_stored_at"), F.lit("?")))),
            F.lit(" with other content (aggregate, type or payload): two events may not share an id, and a stored event is never "
                  "overwritten; give each event its own id"))
        judged = (joined.withColumn("verdict", verdict)
                  .withColumn("reason_code", F.when(F.col("verdict") == "conflict", F.lit(E.ID_CONFLICT)))
                  .withColumn("reason", F.when(F.col("verdict") == "conflict", conflict_reason))
                  .drop("_rank", "_first_hash", "_first_at", "_stored_hash", "_stored_table", "_stored_at"))
        bad = derived.where(F.col("reason_code").isNotNull()).withColumn("verdict", F.lit("bad"))
        return judged.unionByName(bad)

    def _stored(self, candidate_ids: DataFrame, lake_dir: Any, additional: tuple[str, ...]) -> DataFrame:
        """The stored events (any event table) whose ids the batch carries: `_stored_hash`, `_stored_table`, `_stored_at`."""
        from pyspark.sql import functions as F

        spark = candidate_ids.sparkSession
        empty = spark.createDataFrame([], "event_id string, _stored_hash string, _stored_table string, _stored_at string")
        present = lake.lake_tables(lake_dir)
        names = [n for n in sorted(T.event_tables(lake_dir)) if n in present]
        if not names:
            return empty
        ids = None
        for name in names:
            part = lake_spark.read(spark, present[name]).select("event_id")
            ids = part if ids is None else ids.unionByName(part)
        assert ids is not None
        met = [r["event_id"] for r in ids.join(candidate_ids, "event_id", "left_semi").distinct().limit(MAX_LISTED_IDS + 1).collect()]
        if not met:
            return empty
        frames = []
        for name in names:
            table = lake_spark.read(spark, present[name])
            table = table.where(F.col("event_id").isin(met)) if len(met) <= MAX_LISTED_IDS else \
                table.join(candidate_ids, "event_id", "left_semi")
            for c in additional:
                if c not in table.columns:
                    table = table.withColumn(c, F.lit(None).cast("string"))
            frames.append(table.select("event_id", E.content_hash(table, additional).alias("_stored_hash"), F.lit(name).alias("_stored_table"),
                                       F.col("source_position").alias("_stored_at")))
        out = frames[0]
        for more in frames[1:]:
            out = out.unionByName(more)
        return out.dropDuplicates(["event_id"])

    # -- writing ------------------------------------------------------------------------------------------
    def _write(self, classified: DataFrame, names: dict[str, int], outbox: OutboxConfig, ctx: BatchContext) -> dict[str, int]:
        """The fresh events appended to their tables, each once per (stage query, batch); rows landed by table."""
        from pyspark.sql import functions as F

        spark = classified.sparkSession
        lake_dir = ctx.config.lake
        fresh = classified.where(F.col("verdict") == "fresh")
        if not names:
            return {}
        types = {r["table_name"]: sorted(set(r["types"])) for r in
                 fresh.groupBy("table_name").agg(F.collect_set("aggregate_type").alias("types")).collect()}
        T.note_tables(lake_dir, types)
        landed: dict[str, int] = {}
        for name in names:
            schema = self._ensure(spark, lake_dir, name, outbox)
            rows = fresh.where(F.col("table_name") == name)
            payload = self._payload.get(name)
            if payload is not None:
                rows = rows.withColumn("_payload", F.from_json(F.col("payload"), payload))
                rows = rows.select("*", *[F.col("_payload").getField(f.name).alias(f.name) for f in payload.fields])
            out = rows.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])
            if lake_spark.append_once(out, lake.table_path(lake_dir, name), ctx.app_id(name), ctx.batch_id):
                landed[name] = names[name]
        return landed

    def _ensure(self, spark: SparkSession, lake_dir: Any, name: str, outbox: OutboxConfig) -> Any:
        if name not in self._schemas:
            schema = T.table_schema(outbox, self._payload.get(name))
            T.ensure_event_table(spark, lake_dir, name, schema)
            self._schemas[name] = schema
        return self._schemas[name]

    def _dead_letters(self, classified: DataFrame, batch_id: int) -> DataFrame:
        from pyspark.sql import functions as F

        bad = classified.where(F.col("verdict").isin("bad", "conflict"))
        now = dt.datetime.now(dt.timezone.utc)
        return bad.select(
            F.col("reason_code"), F.col("reason"), F.lit(E.STAGE).alias("stage"), F.col("source_table").alias("table_id"),
            F.col("raw_event_id").alias("event_id"), F.col("line"), F.col("source_file"), F.lit(batch_id).cast("bigint").alias("batch_id"),
            F.lit(now).cast("timestamp").alias("dead_lettered_at"),
        ).select(*[F.col(f.name) for f in schemas.DEAD_LETTER])

