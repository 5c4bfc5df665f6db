"""`defs`: the Dagster definitions for one lake, built from its `cdc.yaml`.

The config file comes from `CDC_CONFIG`; without it, the demo's (`.cdc-demo/cdc.yaml`, written by
`make demo`). A missing file still loads (with no source tables) so the UI can say what to do.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from dagster import (
    AssetKey,
    AssetObservation,
    AssetSelection,
    DefaultScheduleStatus,
    DefaultSensorStatus,
    Definitions,
    RunRequest,
    ScheduleDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    define_asset_job,
    in_process_executor,
    sensor,
)

from cdc_platform import checks, lake
from cdc_platform.config import PlatformConfig, load_config, parse_config, resolve_config_path
from dagster_project.assets import build_backfill_asset, build_ingest_asset, build_repair_asset, build_view_assets, lake_maintenance
from dagster_project import metadata as md
from dagster_project.checks import CHECK_JOB, build_checks, freshness_policy_checks, freshness_policy_sensor, scheduled_checks
from dagster_project.resources import CdcResource

REPO = Path(__file__).resolve().parents[1]
DEMO_CONFIG = REPO / ".cdc-demo" / "cdc.yaml"
PIPELINE_JOB = "cdc_pipeline"


def _config(path: Path) -> PlatformConfig:
    if path.is_file():
        return load_config(path)
    # No config yet: an empty platform over the demo's paths, so definitions still load.
    return parse_config({"landing": "landing", "lake": "lake"}, base=path.parent, where=str(path))


def landing_files(config: PlatformConfig) -> list[Path]:
    if not config.landing.is_dir():
        return []
    return sorted(p for p in config.landing.rglob("*") if p.is_file() and not p.name.startswith((".", "_")))


#: Micro-batches one sensor tick reports at most (the first tick: the newest this many).
STREAM_BATCHES_PER_TICK = 200


def stream_batch_metadata(batch: dict[str, object]) -> dict[str, object]:
    """A batch's figures as observation metadata: numbers plot in the asset's page; ids say which batch."""
    keys = ("rows_read", "change_events", "markers", "dead_letters", "duplicates_skipped", "seconds", "rows_per_second", "lag_seconds")
    meta: dict[str, object] = {k: batch[k] for k in keys if batch.get(k) is not None}
    meta["query_id"] = str(batch["query_id"])
    meta["batch_id"] = int(batch["batch_id"])  # type: ignore[call-overload]
    meta["finished_at"] = str(batch["finished_at"])
    if batch.get("newest_heartbeat_ts") is not None:
        meta["newest_heartbeat_ts"] = str(batch["newest_heartbeat_ts"])
    # how far the source was read (its newest change, or a newer heartbeat), as the freshness checks judge it
    return meta | md.source_time(lake.newest(batch.get("newest_source_ts"), batch.get("newest_heartbeat_ts")))


def latest_state_observations(config: PlatformConfig, batches: list[dict[str, object]]) -> list[AssetObservation]:
    """One observation per latest-state table for a tick's finished batches: every stage took each of
    them, so every table holds the source up to their newest time (`checks.applied_source_time`), and
    its freshness policy sees the running stream, not only the last Dagster run."""
    newest = lake.newest(*(lake.newest(b.get("newest_source_ts"), b.get("newest_heartbeat_ts")) for b in batches))  # type: ignore[arg-type]
    if newest is None:  # no batch read a change or a heartbeat (or none at all)
        return []
    last = batches[-1]
    meta = {"query_id": str(last["query_id"]), "batch_id": int(last["batch_id"]), **md.source_time(newest)}  # type: ignore[call-overload]
    return [AssetObservation(asset_key=AssetKey(t.name), metadata=meta) for t in config.tables]


def build_defs(config_path: Path | None = None) -> Definitions:
    path = config_path or resolve_config_path(None) or DEMO_CONFIG
    config = _config(Path(path))
    ingest = build_ingest_asset(config)
    views = build_view_assets(config)
    asset_checks = build_checks(config)
    policy = freshness_policy_checks(config)
    snapshot_load = build_backfill_asset(config)
    source_repair = build_repair_asset(config)

    # One process per run (`in_process_executor`), so every step shares one Spark session: with
    # Dagster's default executor each step is a process of its own that starts its own JVM (13 Spark
    # starts for the sample, 12-16 minutes). Spark parallelises within a step; nothing is lost by
    # running the steps one after another, and a run needs no `cdc serve` to be up.
    pipeline = define_asset_job(PIPELINE_JOB, selection=AssetSelection.assets(ingest, *views), executor_def=in_process_executor,
                                description="Ingest everything landed since the last run, then refresh the views; runs every check on them.")
    check_job = define_asset_job(CHECK_JOB, selection=AssetSelection.checks(*scheduled_checks(config)),
                                 executor_def=in_process_executor,
                                 description="The coverage and completeness checks, without materialising anything.")

    @sensor(job=pipeline, minimum_interval_seconds=30, default_status=DefaultSensorStatus.STOPPED,
            description="Runs cdc_pipeline when new files appear in the landing directory.")
    def new_landing_files(context: SensorEvaluationContext):  # type: ignore[no-untyped-def]
        files = landing_files(config)
        newest = max((p.stat().st_mtime for p in files), default=0.0)
        cursor = f"{len(files)}:{newest}"
        if cursor == context.cursor:
            return SkipReason(f"no new files in {config.landing}")
        context.update_cursor(cursor)
        return RunRequest(run_key=cursor)

    @sensor(minimum_interval_seconds=300, default_status=DefaultSensorStatus.RUNNING,
            description="Reports source tables that reach the raw log but have no `tables:` entry in cdc.yaml (no latest state yet).")
    def unconfigured_source_tables(context: SensorEvaluationContext):  # type: ignore[no-untyped-def]
        # The cursor keeps the last count: each tick reads only the raw log's files added since (checks.raw_census).
        census = checks.raw_census(config.lake, checks.TableCensus.from_cursor(context.cursor))
        if census is not None:
            context.update_cursor(census.to_cursor())
        found = checks.unconfigured(census, {t.source for t in config.tables})
        if not found:
            return SkipReason("every source table in the raw log is configured")
        listing = ", ".join(f"{name} ({n:,} events)" for name, n in sorted(found.items()))
        context.log.warning(f"source tables without a latest state: {listing}")
        return SkipReason(f"not configured yet: {listing}. Add them under `tables:` in {path} with their `key:` to get a latest state.")

    @sensor(minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
            description="Shows a running `cdc stream` (or any run) in Dagster: each micro-batch of pipeline_metrics becomes an "
                        "observation of raw_change_events with its rows, rows/s and lag, so they plot over time; each "
                        "latest-state table is observed as current to the newest of them (its freshness).")
    def stream_batches(context: SensorEvaluationContext):  # type: ignore[no-untyped-def]
        after = dt.datetime.fromisoformat(context.cursor) if context.cursor else None
        batches = checks.batches_since(config.lake, after, limit=STREAM_BATCHES_PER_TICK)
        if not batches:
            return SkipReason(f"no new micro-batches in {config.lake / 'pipeline_metrics'}")
        return SensorResult(
            asset_events=[AssetObservation(asset_key=AssetKey("raw_change_events"), metadata=stream_batch_metadata(b)) for b in batches]
            + latest_state_observations(config, batches),
            cursor=batches[-1]["finished_at"].isoformat(),
        )

    return Definitions(
        assets=[ingest, *views, *(a for a in (snapshot_load, source_repair) if a is not None)],
        asset_checks=[asset_checks, *policy],
        jobs=[pipeline, check_job, lake_maintenance],
        schedules=[
            ScheduleDefinition(name="cdc_pipeline_every_5_minutes", job=pipeline, cron_schedule="*/5 * * * *",
                               default_status=DefaultScheduleStatus.STOPPED),
            ScheduleDefinition(name="checks_hourly", job=check_job, cron_schedule="0 * * * *", default_status=DefaultScheduleStatus.STOPPED),
            ScheduleDefinition(name="maintenance_daily", job=lake_maintenance, cron_schedule="0 3 * * *", default_status=DefaultScheduleStatus.STOPPED),
        ],
        # A Kafka source has no landing folder to watch: `cdc stream` reads it, and stream_batches shows that.
        sensors=[*([new_landing_files] if config.source.kafka is None else []), unconfigured_source_tables, stream_batches,
                 freshness_policy_sensor(policy)],
        resources={"cdc": CdcResource(config_path=str(path))},
        # Every other run too (a backfill, maintenance, the freshness_policy sensor's check runs, a run
        # launched from the UI's asset graph): one process, so at most one Spark and one import of the project.
        executor=in_process_executor,
    )
