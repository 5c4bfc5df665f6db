"""Asset checks: each reads the resource, calls a function of `cdc_platform.checks`, and maps its
`CheckOutcome` to an `AssetCheckResult` through `to_result`, the one adapter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dagster import AssetCheckResult, AssetCheckSeverity, AssetChecksDefinition, MetadataValue, asset_check

from cdc_platform import checks, quality
from cdc_platform.config import PlatformConfig
from cdc_platform.lake import read_table, table_path
from dagster_project.resources import CdcResource

FRESHNESS_SLO_SECONDS = 15 * 60


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


def gx_check(table: str, keys: tuple[str, ...] = (), latest_state: bool = False) -> AssetChecksDefinition:
    @asset_check(asset=table, name="great_expectations", description=f"Great Expectations suites for {table} (expectations/).")
    def _check(cdc: CdcResource) -> AssetCheckResult:
        suites = quality.suites_for(table, keys, latest_state=latest_state, directory=cdc.expectations())
        df = read_table(cdc.spark(), table_path(cdc.lake, table))
        outcomes = [quality.validate(df, suite) for suite in suites]
        return to_result(_combine(outcomes, f"no suite found for {table}"))

    return _check


def _combine(outcomes: list[checks.CheckOutcome], empty: str) -> checks.CheckOutcome:
    if not outcomes:
        return checks.CheckOutcome(False, checks.Severity.WARN, empty, {})
    if len(outcomes) == 1:
        return outcomes[0]
    meta: dict[str, Any] = {}
    for o in outcomes:
        meta |= o.metadata
    return checks.CheckOutcome(all(o.passed for o in outcomes), checks.Severity.ERROR, " | ".join(o.description for o in outcomes), meta)


@asset_check(asset="raw_change_events", name="freshness",
             description=f"Lag from the newest source commit to now, against the SLO ({FRESHNESS_SLO_SECONDS // 60} min).")
def raw_freshness(cdc: CdcResource) -> AssetCheckResult:
    return to_result(checks.freshness(cdc.lake, FRESHNESS_SLO_SECONDS))


@asset_check(asset="dead_letter", name="new_dead_letters", description="New dead-letter rows since the previous check (warn).")
def new_dead_letters(cdc: CdcResource) -> AssetCheckResult:
    return to_result(checks.new_dead_letters(cdc.lake))


def build_checks(config: PlatformConfig) -> list[AssetChecksDefinition]:
    built: list[AssetChecksDefinition] = [raw_freshness, new_dead_letters, gx_check("raw_change_events"), gx_check("dead_letter")]
    for table in config.tables:
        built.append(gx_check(table.name, table.key, latest_state=True))
    return built


CheckFactory = Callable[[PlatformConfig], list[AssetChecksDefinition]]
