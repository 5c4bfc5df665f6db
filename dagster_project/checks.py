"""Asset checks: each reads the resource, calls a function of `cdc_platform.checks` (or the GX adapter
in `cdc_platform.checks.quality`), and maps its `CheckOutcome` to an `AssetCheckResult` through `to_result`,
the one adapter. All of them are one multi-asset check (`build_checks`) that evaluates the selected
ones side by side on the run's Spark session."""

from __future__ import annotations

import datetime as dt
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetCheckKey,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetChecksDefinition,
    AssetCheckSpec,
    DefaultSensorStatus,
    SensorDefinition,
    SupersessionWarning,
    multi_asset_check,
    build_last_update_freshness_checks,
    build_sensor_for_freshness_checks,
)

from cdc_platform import backfill, checks
from cdc_platform.checks import quality
from cdc_platform.checks import outbox as outbox_checks
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.lake import table_path
from dagster_project import metadata as md
from dagster_project.assets import REPAIR_ASSET, fresh_assets
from dagster_project.resources import CdcResource

#: Check names that the hourly coverage-and-completeness schedule runs.
SCHEDULED_CHECKS = ("coverage", "source_coverage", "completeness", "outbox_consistency")
#: The job the hourly schedule runs: its source coverage checks repair what they find when `repair.auto` is on.
CHECK_JOB = "coverage_and_completeness_checks"


def to_result(outcome: checks.CheckOutcome, key: AssetCheckKey | None = None) -> AssetCheckResult:
    """The single mapping from a platform check to Dagster: pass/fail, severity, description, metadata."""
    meta = md.values(outcome.metadata)
    severity = AssetCheckSeverity.WARN if outcome.severity is checks.Severity.WARN else AssetCheckSeverity.ERROR
    where = {"asset_key": key.asset_key, "check_name": key.name} if key is not None else {}
    return AssetCheckResult(passed=outcome.passed, severity=severity, description=outcome.description, metadata=meta, **where)


def _combine(outcomes: list[checks.CheckOutcome], empty: str) -> checks.CheckOutcome:
    if not outcomes:
        return checks.CheckOutcome(False, checks.Severity.WARN, empty, {})
    if len(outcomes) == 1:
        return outcomes[0]
    meta: dict[str, Any] = {}
    for o in outcomes:
        meta |= o.metadata
    return checks.CheckOutcome(all(o.passed for o in outcomes), checks.Severity.ERROR, " | ".join(o.description for o in outcomes), meta)


@dataclass(frozen=True)
class PlatformCheck:
    """One check of the platform: what Dagster shows (its spec) and how it is judged (a function of the
    resource that returns the platform's `CheckOutcome`); `scheduled`, when set, judges it in the scheduled
    check job instead (the source coverage that repairs what it finds)."""

    spec: AssetCheckSpec
    evaluate: Callable[[CdcResource], checks.CheckOutcome]
    scheduled: Callable[[CdcResource], checks.CheckOutcome] | None = None

    @property
    def key(self) -> AssetCheckKey:
        return self.spec.key


def gx_check(table: str, keys: tuple[str, ...] = (), latest_state: bool = False) -> PlatformCheck:
    def evaluate(cdc: CdcResource) -> checks.CheckOutcome:
        from cdc_platform.views import table_frame

        suites = quality.suites_for(table, keys, latest_state=latest_state, directory=cdc.expectations())
        df = table_frame(cdc.spark(), cdc.lake, table)  # a latest-state table as its folded state, tombstones included
        return _combine([quality.validate(df, s) for s in suites], f"no suite found for {table}")

    return PlatformCheck(AssetCheckSpec("great_expectations", asset=table, description=f"Great Expectations suites for {table} (expectations/)."),
                         evaluate)


def coverage_check(table: TableConfig) -> PlatformCheck:
    def evaluate(cdc: CdcResource) -> checks.CheckOutcome:
        outcomes = [checks.coverage(cdc.spark(), cdc.lake, table)]
        if backfill.snapshot_dir(cdc.config, table).is_dir():
            outcomes.append(backfill.compare_snapshot(cdc.config, table.name))
        return _combine(outcomes, "")

    return PlatformCheck(AssetCheckSpec("coverage", asset=table.name,
                                        description="Every live key of the raw log is in the latest state at its position, and nothing else is; "
                                                    f"with a source snapshot in `snapshots/{table.name}/`, source rows vs lake rows too."), evaluate)


def _offer_repair(outcome: checks.CheckOutcome, table: TableConfig) -> checks.CheckOutcome:
    """A failed source coverage names its repair: the `source_repair` partition of the table, or `cdc repair`."""
    if outcome.passed:
        return outcome
    offer = f"materialise {REPAIR_ASSET}, partition {table.name} (or run `cdc repair --table {table.name}`)"
    return checks.CheckOutcome(outcome.passed, outcome.severity, outcome.description, {**outcome.metadata, "repair_with": offer})


def source_coverage_check(table: TableConfig) -> PlatformCheck:
    def evaluate(cdc: CdcResource) -> checks.CheckOutcome:
        from cdc_platform.checks.source_coverage import source_coverage

        connection = cdc.config.source_connection
        assert connection is not None  # built only when the config names one
        return _offer_repair(source_coverage(cdc.spark(), cdc.lake, table, connection), table)

    def scheduled(cdc: CdcResource) -> checks.CheckOutcome:
        from cdc_platform.backfill.repair import coverage_with_repair

        if not cdc.config.repair.auto:
            return evaluate(cdc)
        return _offer_repair(coverage_with_repair(cdc.spark(), cdc.config, table), table)

    return PlatformCheck(AssetCheckSpec("source_coverage", asset=table.name,
                                        description="Source rows, read from the database itself (`source_connection`), vs lake rows: coverage %, "
                                                    "missing, different and extra keys; rows changed after the read are left out. With "
                                                    "`repair.auto`, the hourly check job repairs what it finds."), evaluate, scheduled)


def freshness_check(table: TableConfig) -> PlatformCheck:
    def evaluate(cdc: CdcResource) -> checks.CheckOutcome:
        return checks.freshness(cdc.lake, cdc.config.freshness_slo, latest_state=table_path(cdc.lake, table.name))

    return PlatformCheck(AssetCheckSpec("freshness", asset=table.name, description="Lag from the newest source commit to now and to this table, against the SLO."),
                         evaluate)


RAW_FRESHNESS = PlatformCheck(
    AssetCheckSpec("freshness", asset="raw_change_events", description="Lag from the newest source commit to now, against `freshness_slo`."),
    lambda cdc: checks.freshness(cdc.lake, cdc.config.freshness_slo),
)
NEW_DEAD_LETTERS = PlatformCheck(
    AssetCheckSpec("new_dead_letters", asset="dead_letter", description="New dead-letter rows since the previous check (warn)."),
    lambda cdc: checks.new_dead_letters(cdc.lake),
)
COMPLETENESS = PlatformCheck(
    AssetCheckSpec("completeness", asset="transactions",
                   description="END counts per table vs events landed; transactions expired incomplete or open past the timeout."),
    lambda cdc: checks.completeness(cdc.spark(), cdc.lake, cdc.config.transaction_timeout, cdc.config.transaction_retention),
)

OUTBOX_CONSISTENCY = PlatformCheck(
    AssetCheckSpec("outbox_consistency", asset="transactions",
                   description="Every completed transaction holding outbox events also holds the business changes `outbox.expectations` "
                               "names for their types; metadata names the transactions that do not."),
    lambda cdc: outbox_checks.outbox_consistency(cdc.spark(), cdc.config),
)


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


def platform_checks(config: PlatformConfig) -> list[PlatformCheck]:
    built = [RAW_FRESHNESS, NEW_DEAD_LETTERS, COMPLETENESS, gx_check("raw_change_events"), gx_check("dead_letter"), gx_check("transactions")]
    if config.outbox is not None:
        built.append(OUTBOX_CONSISTENCY)
    for table in config.tables:
        built += [coverage_check(table), freshness_check(table), gx_check(table.name, table.key, latest_state=True)]
        if config.source_connection is not None:
            built.append(source_coverage_check(table))
    return built


def build_checks(config: PlatformConfig) -> AssetChecksDefinition:
    """Every platform check as one op that evaluates the selected ones side by side (`checks.side_by_side`).

    Each check is a few small Spark jobs, mostly the driver planning and reading Delta logs; one after
    another (one Dagster step each, as before) the sample's took about 19 s of a 60 s `cdc_pipeline`.
    In the UI each is still its own check: selectable, with its own result and history.
    """
    defined = {c.key: c for c in platform_checks(config)}

    @multi_asset_check(name="cdc_checks", specs=[c.spec for c in defined.values()], can_subset=True,
                       description="The platform's checks (coverage, completeness, freshness, dead letters, Great Expectations), evaluated side by side.")
    def cdc_checks(context, cdc: CdcResource) -> Iterator[AssetCheckResult]:  # type: ignore[no-untyped-def]  # Dagster rejects a postponed `context` annotation
        keys = {key.to_user_string(): key for key in context.selected_asset_check_keys}
        in_schedule = context.run.job_name == CHECK_JOB

        def judge(check: PlatformCheck) -> checks.CheckOutcome:
            return (check.scheduled if in_schedule and check.scheduled is not None else check.evaluate)(cdc)

        selected = {name: (lambda c=defined[key]: judge(c)) for name, key in sorted(keys.items())}
        for name, outcome in checks.side_by_side(selected):
            yield to_result(outcome, keys[name])

    return cdc_checks


def scheduled_checks(config: PlatformConfig) -> list[AssetCheckKey]:
    return [c.key for c in platform_checks(config) if c.key.name in SCHEDULED_CHECKS]
