"""Asset checks: each reads the resource, calls a function of `cdc_platform.checks` (or the GX adapter
in `cdc_platform.quality`), and maps its `CheckOutcome` to an `AssetCheckResult` through `to_result`,
the one adapter."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Sequence
from typing import Any

from dagster import (
    AssetCheckResult,
    AssetCheckSeverity,
    AssetChecksDefinition,
    DefaultSensorStatus,
    MetadataValue,
    SensorDefinition,
    SupersessionWarning,
    asset_check,
    build_last_update_freshness_checks,
    build_sensor_for_freshness_checks,
)

from cdc_platform import backfill, checks, quality
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.lake import table_path
from dagster_project.assets import fresh_assets
from dagster_project.resources import CdcResource

#: Check names that the hourly coverage-and-completeness schedule runs.
SCHEDULED_CHECKS = ("coverage", "source_coverage", "completeness")


def to_result(outcome: checks.CheckOutcome) -> AssetCheckResult:
    """The single mapping from a platform check to Dagster: pass/fail, severity, description, metadata."""
    meta: dict[str, Any] = {}
    for key, value in outcome.metadata.items():
        if isinstance(value, bool):
            meta[key] = MetadataValue.bool(value)
        elif isinstance(value, (int, float)):
            meta[key] = value
        elif isinstance(value, (dict, list)):
            meta[key] = MetadataValue.json(value)
        else:
            meta[key] = MetadataValue.text(str(value))
    severity = AssetCheckSeverity.WARN if outcome.severity is checks.Severity.WARN else AssetCheckSeverity.ERROR
    return AssetCheckResult(passed=outcome.passed, severity=severity, description=outcome.description, metadata=meta)


def _combine(outcomes: list[checks.CheckOutcome], empty: str) -> checks.CheckOutcome:
    if not outcomes:
        return checks.CheckOutcome(False, checks.Severity.WARN, empty, {})
    if len(outcomes) == 1:
        return outcomes[0]
    meta: dict[str, Any] = {}
    for o in outcomes:
        meta |= o.metadata
    return checks.CheckOutcome(all(o.passed for o in outcomes), checks.Severity.ERROR, " | ".join(o.description for o in outcomes), meta)


def gx_check(table: str, keys: tuple[str, ...] = (), latest_state: bool = False) -> AssetChecksDefinition:
    @asset_check(asset=table, name="great_expectations", description=f"Great Expectations suites for {table} (expectations/).")
    def _check(cdc: CdcResource) -> AssetCheckResult:
        from cdc_platform.views import table_frame

        suites = quality.suites_for(table, keys, latest_state=latest_state, directory=cdc.expectations())
        df = table_frame(cdc.spark(), cdc.lake, table)  # a latest-state table as its folded state, tombstones included
        return to_result(_combine([quality.validate(df, s) for s in suites], f"no suite found for {table}"))

    return _check


def coverage_check(table: TableConfig) -> AssetChecksDefinition:
    @asset_check(asset=table.name, name="coverage",
                 description="Every live key of the raw log is in the latest state at its position, and nothing else is; "
                             f"with a source snapshot in `snapshots/{table.name}/`, source rows vs lake rows too.")
    def _check(cdc: CdcResource) -> AssetCheckResult:
        outcomes = [checks.coverage(cdc.spark(), cdc.lake, table)]
        if backfill.snapshot_dir(cdc.config, table).is_dir():
            outcomes.append(backfill.compare_snapshot(cdc.config, table.name))
        return to_result(_combine(outcomes, ""))

    return _check


def source_coverage_check(table: TableConfig) -> AssetChecksDefinition:
    @asset_check(asset=table.name, name="source_coverage",
                 description="Source rows, read from the database itself (`source_connection`), vs lake rows: coverage %, "
                             "missing, different and extra keys; rows changed after the read are left out.")
    def _check(cdc: CdcResource) -> AssetCheckResult:
        from cdc_platform.source_coverage import source_coverage

        connection = cdc.config.source_connection
        assert connection is not None  # built only when the config names one
        return to_result(source_coverage(cdc.spark(), cdc.lake, table, connection))

    return _check


def freshness_check(table: TableConfig) -> AssetChecksDefinition:
    @asset_check(asset=table.name, name="freshness", description="Lag from the newest source commit to now and to this table, against the SLO.")
    def _check(cdc: CdcResource) -> AssetCheckResult:
        return to_result(checks.freshness(cdc.lake, cdc.config.freshness_slo, latest_state=table_path(cdc.lake, table.name)))

    return _check


@asset_check(asset="raw_change_events", name="freshness", description="Lag from the newest source commit to now, against `freshness_slo`.")
def raw_freshness(cdc: CdcResource) -> AssetCheckResult:
    return to_result(checks.freshness(cdc.lake, cdc.config.freshness_slo))


@asset_check(asset="dead_letter", name="new_dead_letters", description="New dead-letter rows since the previous check (warn).")
def new_dead_letters(cdc: CdcResource) -> AssetCheckResult:
    return to_result(checks.new_dead_letters(cdc.lake))


@asset_check(asset="transactions", name="completeness",
             description="END counts per table vs events landed; transactions expired incomplete or open past the timeout.")
def completeness(cdc: CdcResource) -> AssetCheckResult:
    config = cdc.config
    return to_result(checks.completeness(cdc.spark(), cdc.lake, config.transaction_timeout, config.transaction_retention))


def freshness_policy_checks(config: PlatformConfig) -> Sequence[AssetChecksDefinition]:
    """The freshness SLO as Dagster's own freshness checks (`freshness_check` on the raw log and each
    latest-state table), in place of a `FreshnessPolicy`.

    A policy is judged only on when the asset was last materialised (its evaluator reads nothing else),
    so a lake that a run wrote a minute ago but that trails its database by an hour would pass. Dagster's
    freshness checks read `dagster/last_updated_timestamp` when a materialisation or an observation
    carries it, and every one of these assets' events does, set to the newest source commit the table
    holds (the ingest's materialisations, the `stream_batches` observations, `make demo`'s records). So
    the policy and the `freshness` check judge the same time: source time against `freshness_slo`.
    `freshness_policy` (a sensor, running by default) evaluates them between runs, as a policy would be.
    """
    with warnings.catch_warnings():  # Dagster calls these superseded by FreshnessPolicy, which cannot judge source time (above)
        warnings.simplefilter("ignore", SupersessionWarning)
        return build_last_update_freshness_checks(assets=fresh_assets(config), lower_bound_delta=dt.timedelta(seconds=config.freshness_slo),
                                                  severity=AssetCheckSeverity.ERROR)


def freshness_policy_sensor(policy: Sequence[AssetChecksDefinition]) -> SensorDefinition:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SupersessionWarning)
        return build_sensor_for_freshness_checks(freshness_checks=policy, minimum_interval_seconds=60, name="freshness_policy",
                                                 default_status=DefaultSensorStatus.RUNNING)


def build_checks(config: PlatformConfig) -> list[AssetChecksDefinition]:
    built: list[AssetChecksDefinition] = [
        raw_freshness, new_dead_letters, completeness,
        gx_check("raw_change_events"), gx_check("dead_letter"), gx_check("transactions"),
    ]
    for table in config.tables:
        built += [coverage_check(table), freshness_check(table), gx_check(table.name, table.key, latest_state=True)]
        if config.source_connection is not None:
            built.append(source_coverage_check(table))
    return built


def scheduled_checks(built: list[AssetChecksDefinition]) -> list[AssetChecksDefinition]:
    return [c for c in built if any(key.name in SCHEDULED_CHECKS for key in c.check_keys)]
