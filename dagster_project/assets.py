"""Assets: thin wrappers that read the resource, call `cdc_platform`, and return metadata.

One streaming run (available-now trigger) writes every table of the pipeline at once, so the ingest is
one multi-asset whose specs are built from `cdc.yaml` by a factory; the views are separate assets that
register and count each view.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

from dagster import (
    AssetKey,
    AssetSpec,
    BackfillPolicy,
    Failure,
    Field,
    MaterializeResult,
    MetadataValue,
    StaticPartitionsDefinition,
    asset,
    job,
    multi_asset,
    op,
)
from cdc_platform import backfill, checks, maintenance
from cdc_platform.config import PlatformConfig
from cdc_platform.lake import quote_identifier
from cdc_platform.run.ingest import IngestJob
from dagster_project import metadata as md
from dagster_project.resources import CdcResource

INGEST_TABLES: dict[str, str] = {
    "raw_change_events": "Every distinct change event exactly once, in source-position order per table (the source of truth).",
    "transaction_markers": "Every distinct transaction BEGIN/END marker, normalised from Debezium or Stripe shapes.",
    "dead_letter": "Every input line or event the pipeline could not use, with a reason a person can act on.",
    "pipeline_metrics": "One row per micro-batch: rows read and landed, duplicates, dead letters, seconds per stage, lag.",
}
TRANSACTION_TABLES: dict[str, str] = {
    "transactions": "Complete source transactions across tables (BEGIN, END and every counted event), emitted once.",
    "incomplete_transactions": "Transactions that timed out incomplete, with the reason and expected vs seen counts per table.",
    "late_transaction_events": "Events that arrived after their transaction was emitted or expired, with its fate.",
    "open_transactions": "The aggregation's state: transactions still waiting for events or markers.",
    "consistency_watermark": "Per source, the highest position at or below which every transaction is complete.",
}
INGEST_GROUP = "ingest"
TRANSACTIONS_GROUP = "transactions"
LATEST_STATE_GROUP = "latest_state"
VIEWS_GROUP = "views"


def source_time_columns(config: PlatformConfig) -> dict[str, str]:
    """The tables whose freshness is judged (the raw log and each latest-state table), each with the column
    that holds its source commit time; their materialisations carry `dagster/last_updated_timestamp`."""
    return {"raw_change_events": "source_ts"} | {t.name: "_source_ts" for t in config.tables}


def fresh_assets(config: PlatformConfig) -> list[AssetKey]:
    return [AssetKey(n) for n in source_time_columns(config)]


def latest_state_specs(config: PlatformConfig) -> list[AssetSpec]:
    specs = []
    for table in config.tables:
        specs.append(
            AssetSpec(
                table.name,
                description=f"Latest state of {table.source} (key {', '.join(table.key)}), merged by source position, with tombstones.",
                group_name=LATEST_STATE_GROUP,
                deps=["raw_change_events"],
                kinds={"delta", "spark"},
                metadata={"source_table": table.source, "key": ", ".join(table.key), "masked": ", ".join(table.mask) or "none"},
            )
        )
        if table.history:
            specs.append(
                AssetSpec(
                    f"{table.name}_history",
                    description=f"SCD2 history of {table.source}: every version with its validity positions and a current flag.",
                    group_name=LATEST_STATE_GROUP,
                    deps=["raw_change_events"],
                    kinds={"delta", "spark"},
                )
            )
    return specs


def ingest_specs(config: PlatformConfig) -> list[AssetSpec]:
    specs = [
        AssetSpec(name, description=text, group_name=INGEST_GROUP, kinds={"delta", "spark"})
        for name, text in INGEST_TABLES.items()
    ]
    specs += [
        AssetSpec(name, description=text, group_name=TRANSACTIONS_GROUP, deps=["raw_change_events", "transaction_markers"], kinds={"delta", "spark"})
        for name, text in TRANSACTION_TABLES.items()
    ]
    return specs + latest_state_specs(config)


def latest_state_rows(spark: Any, config: PlatformConfig) -> dict[str, int]:
    """Live rows per latest-state table, counted through its full view."""
    from cdc_platform.views import live_rows

    return live_rows(spark, config.lake, [t.name for t in config.tables]) if config.tables else {}


def build_ingest_asset(config: PlatformConfig):  # type: ignore[no-untyped-def]
    specs = ingest_specs(config)

    @multi_asset(name="cdc_ingest", specs=specs, can_subset=False, pool="cdc_ingest", op_tags={"cdc/lake": str(config.lake)},
                 description="Runs the streaming ingest with an available-now trigger: everything landed since the last run, exactly once.")
    def cdc_ingest(context, cdc: CdcResource) -> Iterator[MaterializeResult]:  # type: ignore[no-untyped-def]  # Dagster rejects a postponed `context` annotation
        spark = cdc.spark()
        report = IngestJob(cdc.config, progress=context.log.info).run_available_now(spark)
        landed = report.landed()
        live = latest_state_rows(spark, cdc.config)
        source_time = source_time_columns(cdc.config)
        for spec in specs:
            name = spec.key.path[-1]
            path = cdc.lake / name
            meta: dict[str, object] = {"landed_this_run": landed.get(name, 0), "batches": len(report.batches)}
            if path.is_dir():
                meta |= checks.table_stats(path).as_metadata()
                meta |= md.table_metadata(path, rows=live.get(name, meta.get("rows")))
            if name in live:  # the stored rows above include tombstones and not-yet-folded changes
                meta["stored_rows"] = meta.pop("rows", 0)
                meta["rows"] = live[name]
            if name == "dead_letter":
                meta["newest_dead_letters"] = md.dead_letter_sample(cdc.lake)
            newest = checks.table_source_time(cdc.lake, name, source_time[name]) if name in source_time else None
            meta |= md.source_time(newest)
            if name == "raw_change_events":
                meta |= {"lines_read": report.total("rows_read"), "duplicates_skipped": report.total("duplicates_skipped"),
                         "dead_letters": report.total("dead_letters"), "seconds": round(report.seconds, 2)}
                if newest is not None:
                    meta["lag_seconds"] = round((dt.datetime.now(dt.timezone.utc) - newest).total_seconds(), 1)
            yield MaterializeResult(asset_key=spec.key, metadata=meta)

    return cdc_ingest


VIEW_KINDS = ("full", "clean", "consistent")


def view_specs(config: PlatformConfig) -> list[AssetSpec]:
    specs = []
    for table in config.tables:
        text = {
            "full": f"{table.source} as it is now: latest state without tombstones, source columns first.",
            "clean": f"{table.source} as it is now with masked columns ({', '.join(table.mask) or 'none'}) never visible.",
            "consistent": f"{table.source} as of the consistency watermark: no half-landed transaction is visible.",
        }
        for kind in VIEW_KINDS:
            deps = [AssetKey(table.name)] + ([AssetKey("consistency_watermark")] if kind == "consistent" else [])
            specs.append(AssetSpec(f"{table.name}__{kind}_view", group_name=VIEWS_GROUP, deps=deps, description=text[kind], kinds={"spark", "sql"}))
    return specs


def build_view_assets(config: PlatformConfig) -> list:  # type: ignore[type-arg]
    """One op for every view: registering a lake's views costs the same for one view as for all."""
    specs = view_specs(config)
    if not specs:
        return []

    @multi_asset(name="cdc_views", specs=specs, can_subset=True, description="Registers the lake's views once and counts each selected one.")
    def cdc_views(context, cdc: CdcResource) -> Iterator[MaterializeResult]:  # type: ignore[no-untyped-def]
        from cdc_platform.views import count_views, register_lake, view_text

        spark = cdc.spark()
        register_lake(spark, cdc.lake)
        selected = sorted(key.path[-1] for key in context.selected_asset_keys)
        counts = count_views(spark, selected)  # one query; a table's full and clean views share one count
        for view in selected:
            key, frame, rows = AssetKey(view), spark.table(quote_identifier(view)), counts[view]
            yield MaterializeResult(asset_key=key, metadata={
                "rows": rows, md.ROW_COUNT: rows, md.COLUMN_SCHEMA: md.column_schema(md.spark_columns(frame.schema)),
                "query": f"SELECT * FROM {view}", "sql": md.sql_block(view_text(spark, view) or f"-- the SQL of {view} was not recorded"),
            })

    return [cdc_views]


BACKFILL_GROUP = "backfill"


#: Launch config of a snapshot load (`config_schema`: Dagster cannot resolve a postponed Config annotation).
SNAPSHOT_LOAD_CONFIG = {
    "dry_run": Field(bool, default_value=False, description="Only compute and record the diff (inserted / updated / skipped as stale); commit nothing."),
}


def build_backfill_asset(platform: PlatformConfig):  # type: ignore[no-untyped-def]
    """One partition per configured table; a backfill of several partitions runs as one run."""
    if not platform.tables:
        return None

    @asset(
        name="snapshot_load",
        group_name=BACKFILL_GROUP,
        partitions_def=StaticPartitionsDefinition([t.name for t in platform.tables]),
        backfill_policy=BackfillPolicy.single_run(),
        deps=["raw_change_events"],
        pool="cdc_ingest",
        kinds={"delta"},
        config_schema=SNAPSHOT_LOAD_CONFIG,
        description=("Loads the partition's source snapshot (folder `snapshots/TABLE/`, TABLE being the partition) into the raw log "
                     "and latest state; never overwrites a newer row or resurrects a deleted key."),
    )
    def snapshot_load(context, cdc: CdcResource) -> MaterializeResult:  # type: ignore[no-untyped-def]
        dry_run = bool(context.op_config["dry_run"])
        diffs = [backfill.load_snapshot(cdc.config, name, dry_run=dry_run, progress=context.log.info) for name in context.partition_keys]
        totals = {k: sum(getattr(d, k) for d in diffs) for k in ("snapshot_rows", "inserted", "updated", "unchanged", "skipped_stale", "skipped_deleted", "invalid")}
        return MaterializeResult(metadata={**totals, "dry_run": dry_run, "tables": MetadataValue.json({d.table: d.as_metadata() for d in diffs})})

    return snapshot_load


REPAIR_ASSET = "source_repair"
#: Launch config of a repair (`config_schema`, as the snapshot load's).
SOURCE_REPAIR_CONFIG = {
    "dry_run": Field(bool, default_value=False, description="Only plan the signals (shown in the log); send nothing, record nothing."),
    "remove_absent": Field(bool, is_required=False, description="Also remove lake rows the source no longer has (default: repair.remove_absent)."),
    "wait": Field(float, is_required=False, description="Seconds to wait for the re-read rows to land (default: repair.wait)."),
}
#: Outcomes after which the repair's run is green.
HEALED = ("nothing_to_repair", "repaired", "removed", "planned")


def build_repair_asset(platform: PlatformConfig):  # type: ignore[no-untyped-def]
    """One partition per configured table, when the config names the live source: a materialisation is one repair."""
    if not platform.tables or platform.source_connection is None:
        return None

    @asset(
        name=REPAIR_ASSET,
        group_name=BACKFILL_GROUP,
        partitions_def=StaticPartitionsDefinition([t.name for t in platform.tables]),
        deps=[t.name for t in platform.tables],
        kinds={"delta", "debezium"},
        config_schema=SOURCE_REPAIR_CONFIG,
        description=("Repairs the partition's table where its source_coverage check failed: asks the source's Debezium connector to "
                     "re-read exactly the keys that differ (an incremental snapshot signal on the channel `repair:` names), waits until "
                     "they have landed, checks coverage again and records the repair in source_repairs. A running stream lands the rows."),
    )
    def source_repair(context, cdc: CdcResource) -> MaterializeResult:  # type: ignore[no-untyped-def]
        from cdc_platform.backfill.repair import repair_table

        options = context.op_config
        report = repair_table(cdc.spark(), cdc.config, cdc.config.table(context.partition_key), dry_run=bool(options["dry_run"]),
                              remove_absent=options.get("remove_absent"), wait=options.get("wait"), progress=context.log.info)
        for text in report.signal_texts if options["dry_run"] else ():
            context.log.info(f"signal: {text}")
        meta = md.values(report.as_metadata())
        if report.outcome not in HEALED:
            raise Failure(description=f"{report.table}: {report.outcome}: {report.message}", metadata=meta)
        return MaterializeResult(metadata=meta)

    return source_repair


@op(description="Fold latest-state delta layers, purge expired tombstones, compact small files and vacuum every table.")
def maintain_lake(context, cdc: CdcResource) -> None:  # type: ignore[no-untyped-def]
    maintenance.maintain(cdc.spark(), cdc.lake, tables=cdc.config.tables, progress=context.log.info)


@job(description="Daily lake maintenance (compaction, tombstone purge, vacuum).")
def lake_maintenance() -> None:
    maintain_lake()
