"""Coverage that heals itself: the keys a failed source coverage names are re-read by the connector itself.

The source coverage check (`checks.source_coverage`) names the keys whose lake rows are missing or differ
from the live source, still after its recheck. A repair asks the source's Debezium connector to re-read
exactly those rows, through an incremental snapshot filtered by their keys (`repair_signal`), sent on the
channel `repair:` names (`sources.signal_channel`). The rows come back as ordinary change events (op `r`,
placed in the stream by Debezium's watermarks) through whatever runs the ingest (`cdc stream`, the Dagster
pipeline): the repair never writes them itself, so they take the same path, the same position rule and the
same fold as every other change, and a row re-read while the stream delivers a newer change or a delete of
it never wins over that (README, "Repairing coverage from the source").

One repair, `repair_table`:

1. the coverage result (given by the check that failed, or computed now): the differing keys;
2. bounds: at most `max_repairs_per_hour` repairs that sent signals per table (counted in `source_repairs`),
   at most `max_keys` keys (the rest wait for the next repair);
3. without a channel: a clear message naming the keys and the backfill that fixes them, nothing sent;
4. the signals, split to fit the signalling table's `data` column (or `max_signal_chars`), sent in one go;
5. the wait: the asked keys are compared with the source again every `poll` seconds (`compare_in_spark` on
   those keys only: the lake read through its views, not through the stage's internals) until each has
   matched once, or changed after the read, or `wait` seconds passed;
6. rows the source no longer has (`extra_in_lake`) are removed only when asked (`absent_rows`);
7. the whole table's coverage again, and one row in the lake's `source_repairs`.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc_platform import lake
from cdc_platform.backfill import repair_log, snapshot_dir
from cdc_platform.backfill.repair_signal import KeyColumn, SignalPlan, plan_signals
from cdc_platform.checks import CheckOutcome, Severity
from cdc_platform.checks.source_coverage import KEY, CoverageResult, canonical, compare_in_spark, coverage_result, key_text, keyed_lake, lake_frame
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.errors import ConfigError
from cdc_platform.lake import lake_spark
from cdc_platform.parse.json_codec import canonical_json
from cdc_platform.sources import signal_channel
from cdc_platform.sources.source_connection import SourceConnection, column_types, current_position
from cdc_platform.stages.stage import RAW

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

UTC = dt.timezone.utc
#: Keys named in a message or in metadata (the lake's row keeps counts, and this many of each kind).
SHOWN = 20
REREAD = ("missing_in_lake", "different_values")


@dataclass
class RepairReport:
    """What one repair did; `as_row` is its row in `source_repairs`, `as_metadata` what Dagster shows."""

    repair_id: str
    table: str
    source_table: str
    outcome: str  # nothing_to_repair | repaired | partial | timed_out | removed | no_channel | not_sent | rate_limited | too_many | planned
    channel: str | None
    started_at: dt.datetime
    message: str = ""
    signalled_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    keys_differing: int = 0
    keys_asked: int = 0
    keys_landed: int = 0
    keys_deferred: int = 0  # past max_keys: left for the next repair
    keys_absent: int = 0
    keys_removed: int = 0
    unexpressible: list[tuple[str, str]] = field(default_factory=list)
    signals: list[str] = field(default_factory=list)  # ids
    signal_texts: list[str] = field(default_factory=list)  # the `data` of each (kept for a dry run's output)
    reread_events: int = 0
    coverage_before: float | None = None
    coverage_after: float | None = None
    after: CheckOutcome | None = None
    samples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def succeeded(self) -> bool:
        return self.outcome in ("nothing_to_repair", "repaired", "removed")

    def as_row(self) -> dict[str, Any]:
        return {"repair_id": self.repair_id, "table_name": self.table, "source_table": self.source_table, "outcome": self.outcome,
                "channel": self.channel, "started_at": self.started_at, "signalled_at": self.signalled_at,
                "finished_at": self.finished_at or self.started_at, "keys_differing": self.keys_differing, "keys_asked": self.keys_asked,
                "keys_landed": self.keys_landed, "keys_unexpressible": len(self.unexpressible), "keys_absent": self.keys_absent,
                "keys_removed": self.keys_removed, "signals": len(self.signals), "reread_events": self.reread_events,
                "coverage_before_percent": self.coverage_before, "coverage_after_percent": self.coverage_after,
                "detail": {"message": self.message, "keys": self.samples, "keys_deferred": self.keys_deferred,
                           "unexpressible": [{"key": k, "reason": r} for k, r in self.unexpressible[:SHOWN]], "signal_ids": self.signals}}

    def as_metadata(self) -> dict[str, Any]:
        row = self.as_row()
        meta = {k: v for k, v in row.items() if k not in ("detail", "started_at", "signalled_at", "finished_at") and v is not None}
        meta |= {"started_at": self.started_at.isoformat(), "keys_deferred": self.keys_deferred, "message": self.message}
        if self.finished_at is not None:
            meta["seconds"] = round((self.finished_at - self.started_at).total_seconds(), 1)
        if self.samples:
            meta["repaired_keys"] = self.samples
        if self.unexpressible:
            meta["unexpressible_keys"] = {k: r for k, r in self.unexpressible[:SHOWN]}
        return meta


def _shown(table: TableConfig, values: Sequence[Any]) -> str:
    return canonical_json({k: str(v) for k, v in zip(table.key, values)}) if len(values) == len(table.key) else str(values)


def _percent(outcome: CheckOutcome | None) -> float | None:
    value = None if outcome is None else outcome.metadata.get("live_coverage_percent")
    return None if value is None else float(value)


def no_channel_message(config: PlatformConfig, table: TableConfig, keys: Sequence[str], total: int) -> str:
    """What to do when no signal channel is configured: the keys, and the snapshot backfill that fixes them."""
    listed = ", ".join(keys[:SHOWN]) + (f" and {total - SHOWN:,} more" if total > SHOWN else "")
    return (f"{table.name}: {total:,} key(s) differ from the live {table.source} ({listed}), and no signal channel is configured "
            "(repair.signal_table or repair.signal_topic), so the platform cannot ask the connector to re-read them. Fix them with a "
            f"snapshot backfill: put those rows of {table.source} (Debezium JSON lines, or CSV/Parquet with as_of.json naming the "
            f"position of the read) in {snapshot_dir(config, table)}/ and run `cdc backfill --table {table.name}` (Dagster: "
            f"snapshot_load, partition {table.name}); or configure `repair:` with the connector's signal.data.collection")


def key_columns(connection: SourceConnection, table: TableConfig) -> list[KeyColumn]:
    """The table's key columns with their types as the source's catalog names them (MariaDB's `timestamp` matters)."""
    types = column_types(connection, table.source)
    return [KeyColumn(k, types.get(k, "")) for k in table.key]


def plan(connection: SourceConnection, config: PlatformConfig, table: TableConfig, keys: Sequence[tuple[Any, ...]]) -> SignalPlan:
    """The signals for `keys`, within the channel's size (the signalling table's `data` column, `max_signal_chars`)."""
    repair = config.repair
    limit = repair.max_signal_chars
    if repair.channel == "source":
        column = signal_channel.signal_table_limit(connection, repair)
        limit = min(limit, column) if column is not None else limit
    return plan_signals(table.source, key_columns(connection, table), keys, connection.kind, max_chars=limit,
                        max_keys=repair.keys_per_signal)


def reread_events(spark: SparkSession, lake_dir: Any, source_table: str, since: dt.datetime) -> int:
    """Snapshot reads (op `r`) of the table that reached the raw log since `since`: the re-read rows as they landed."""
    from pyspark.sql import functions as F

    path = lake.table_path(lake_dir, RAW)
    if not lake_spark.is_table(spark, path):
        return 0
    raw = lake_spark.read(spark, path)
    return int(raw.where((F.col("event_date") >= F.lit(since.date() - dt.timedelta(days=1))) & (F.col("table_id") == source_table)
                         & (F.col("op") == "r") & (F.col("ingested_at") >= F.lit(since))).count())


def lake_positions(spark: SparkSession, config: PlatformConfig, table: TableConfig, texts: Sequence[str]) -> dict[str, str]:
    """The position of the lake's row (live or tombstone) of each key text (`key_text`) it holds, read through the views."""
    from pyspark.sql import functions as F

    frame = lake_frame(spark, config.lake, table)
    if frame is None or not texts:
        return {}
    rows = keyed_lake(frame, table).where(F.col(KEY).isin(list(texts))).select(KEY, "_position").collect()
    return {r[KEY]: r["_position"] for r in rows if r["_position"] is not None}


def await_landing(spark: SparkSession, config: PlatformConfig, table: TableConfig, connection: SourceConnection,
                  asked: Sequence[tuple[Any, ...]], since: str, *, wait: float, poll: float, sleep: Callable[[float], None],
                  clock: Callable[[], float], progress: Callable[[str], None]) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Wait until every asked key has landed, or `wait` runs out; (landed, still pending).

    A key has landed when the lake holds it (live or deleted) at or above `since`, the source's position just before
    the signals were sent: its re-read row is placed above it, and so is any change the source made to it since
    (which Debezium emits instead of the re-read when both fall in one window). A key for which neither comes (deleted at
    the source before the re-read, say) has landed once the lake agrees with the source about it
    (`compare_in_spark` on the pending keys: equal, both without the row, or changed after the read). Everything
    is read from the lake's views, so it holds whatever writes the latest state."""
    pending = {key_text(tuple(canonical(v) for v in values)): tuple(values) for values in asked}
    landed: list[tuple[Any, ...]] = []
    deadline = clock() + wait
    while pending:
        at = lake_positions(spark, config, table, list(pending))
        for text in [t for t in pending if at.get(t, "") >= since]:
            landed.append(pending.pop(text))
        if pending:
            verdicts = compare_in_spark(spark, config.lake, table, connection, list(pending.values()),
                                        {tuple(canonical(v) for v in values) for values in pending.values()})
            if verdicts.differing is not None:
                still = {key_text(tuple(canonical(v) for v in values)) for _, _, values in verdicts.differing}
                for text in [t for t in pending if t not in still]:
                    landed.append(pending.pop(text))
        progress(f"{table.name}: {len(landed):,} of {len(asked):,} re-read key(s) landed")
        if not pending or clock() >= deadline:
            break
        sleep(min(poll, max(0.0, deadline - clock())))
    return landed, list(pending.values())


def repair_table(spark: SparkSession, config: PlatformConfig, table: TableConfig, *, result: CoverageResult | None = None,
                 dry_run: bool = False, remove_absent: bool | None = None, wait: float | None = None, record: bool = True,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], dt.datetime] = lambda: dt.datetime.now(UTC), progress: Callable[[str], None] | None = None) -> RepairReport:
    """Repair `table`'s source coverage (module docstring); `result` is the failed check's, else computed now."""
    say = progress or (lambda _m: None)
    connection = config.source_connection
    if connection is None:
        raise ConfigError("a repair compares the lake with the live source and asks its connector to re-read rows: "
                          "set `source_connection:` (and `repair:`) in the config")
    repair = config.repair
    report = RepairReport(f"{table.name}-{now().strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}", table.name, table.source,
                          "nothing_to_repair", repair.channel, now())
    result = result or coverage_result(spark, config.lake, table, connection, sleep=sleep)
    report.coverage_before = _percent(result.outcome)
    try:
        _repair(spark, config, table, connection, result, report, dry_run=dry_run,
                remove_absent=repair.remove_absent if remove_absent is None else remove_absent,
                wait=repair.wait if wait is None else wait, sleep=sleep, clock=clock, now=now, say=say)
    finally:
        report.finished_at = now()
        if record and not dry_run and report.outcome != "nothing_to_repair":
            repair_log.record(spark, config.lake, report.as_row())
    say(f"{table.name}: {report.outcome}: {report.message}")
    return report


def _repair(spark: SparkSession, config: PlatformConfig, table: TableConfig, connection: SourceConnection, result: CoverageResult,
            report: RepairReport, *, dry_run: bool, remove_absent: bool, wait: float, sleep: Callable[[float], None],
            clock: Callable[[], float], now: Callable[[], dt.datetime], say: Callable[[str], None]) -> None:
    repair = config.repair
    if result.outcome.passed:
        report.message = f"{table.name} matches the live {table.source}: nothing to repair"
        report.after = result.outcome
        report.coverage_after = report.coverage_before
        return
    if result.differing is None:
        report.outcome = "too_many"
        report.message = (f"more keys of {table.name} differ than a repair names (coverage keeps at most 10,000): re-read the whole table "
                          f"instead, with an incremental snapshot of {table.source} without additional-conditions, or `cdc rebuild --table "
                          f"{table.name}` when the raw log has the rows")
        return
    reread, absent = result.keys(*REREAD), result.keys("extra_in_lake")
    report.keys_differing, report.keys_absent = len(result.differing), len(absent)
    if absent:
        report.samples["absent"] = [_shown(table, v) for v in absent[:SHOWN]]
    since = now() - dt.timedelta(hours=1)
    if reread and not dry_run and repair.channel is not None and repair_log.sent_since(config.lake, table.name, since) >= repair.max_repairs_per_hour:
        report.outcome = "rate_limited"
        report.message = (f"{table.name} was repaired {repair.max_repairs_per_hour} time(s) in the last hour (repair.max_repairs_per_hour): "
                          f"{len(reread):,} key(s) wait for the next hour")
        return
    asked, report.keys_deferred = reread[:repair.max_keys], max(0, len(reread) - repair.max_keys)
    if asked and repair.channel is None:
        report.outcome = "no_channel"
        report.samples["asked"] = [_shown(table, v) for v in asked[:SHOWN]]
        report.message = no_channel_message(config, table, [_shown(table, v) for v in reread], len(reread))
        return
    if asked:
        signals = plan(connection, config, table, asked)
        report.unexpressible = [(_shown(table, k), why) for k, why in signals.unexpressible]
        report.signals = [s.id for s in signals.signals]
        report.signal_texts = [s.text for s in signals.signals]
        expressed = [k for s in signals.signals for k in s.keys]
        report.keys_asked = len(expressed)
        report.samples["asked"] = [_shown(table, v) for v in expressed[:SHOWN]]
        if dry_run:
            report.outcome = "planned"
            report.message = (f"would send {len(signals.signals)} signal(s) on the {repair.describe()} re-reading {len(expressed):,} key(s) "
                              f"of {table.source}" + (f"; {len(signals.unexpressible):,} key(s) cannot be written" if signals.unexpressible else ""))
            return
        if signals.signals:
            say(f"{table.name}: asking the connector to re-read {len(expressed):,} key(s) in {len(signals.signals)} signal(s) on the {repair.describe()}")
            since = current_position(connection)  # before the signals: every re-read row is placed above it
            try:
                signal_channel.send(connection, repair, [(s.id, s.text) for s in signals.signals])
            except signal_channel.SignalChannelError as e:
                report.outcome, report.message = "not_sent", str(e)
                raise
            report.signalled_at = now()
            landed, pending = await_landing(spark, config, table, connection, expressed, since, wait=wait, poll=repair.poll, sleep=sleep,
                                            clock=clock, progress=say)
            report.keys_landed = len(landed)
            if pending:
                report.samples["not_landed"] = [_shown(table, v) for v in pending[:SHOWN]]
            report.reread_events = reread_events(spark, config.lake, table.source, report.signalled_at)
    if absent and remove_absent and not dry_run:
        from cdc_platform.backfill.absent_rows import remove_absent as remove

        removal = remove(spark, config, table, absent, report.repair_id, int(now().timestamp() * 1000), progress=say)
        report.keys_removed = removal.removed
        if removal.kept:
            report.samples["absent_kept"] = [f"{k}: {why}" for k, why in removal.kept[:SHOWN]]
    after = coverage_result(spark, config.lake, table, connection, sleep=sleep)
    report.after, report.coverage_after = after.outcome, _percent(after.outcome)
    report.outcome = _outcome(report, after.outcome.passed)
    report.message = _message(report, table, remove_absent, after.outcome)


def _outcome(report: RepairReport, passes: bool) -> str:
    """Repaired: every key asked for landed and none was left out; the coverage after is reported beside it (a stream
    behind a busy source fails it for keys no repair asked for, which the next check judges again)."""
    if not report.keys_asked:
        return "removed" if passes and report.keys_removed else "partial"
    if report.keys_landed < report.keys_asked:
        return "timed_out" if report.keys_landed == 0 else "partial"
    whole = not report.unexpressible and not report.keys_deferred and (not report.keys_absent or report.keys_removed == report.keys_absent)
    return "repaired" if whole else "partial"


def _message(report: RepairReport, table: TableConfig, remove_absent: bool, after: CheckOutcome) -> str:
    parts = []
    if report.keys_asked:
        parts.append(f"{report.keys_landed:,} of {report.keys_asked:,} re-read key(s) landed ({report.reread_events:,} re-read row(s) in the raw log)")
    if report.unexpressible:
        parts.append(f"{len(report.unexpressible):,} key(s) cannot be written in a signal (e.g. {report.unexpressible[0][0]}: "
                     f"{report.unexpressible[0][1]})")
    if report.keys_deferred:
        parts.append(f"{report.keys_deferred:,} more key(s) past repair.max_keys wait for the next repair")
    if report.keys_absent:
        if remove_absent:
            parts.append(f"{report.keys_removed:,} of {report.keys_absent:,} row(s) the source no longer has removed")
        else:
            parts.append(f"{report.keys_absent:,} lake row(s) the source no longer has (e.g. {report.samples['absent'][0]}) stay: "
                         f"`cdc repair --table {table.name} --remove-absent` removes them")
    if report.samples.get("not_landed"):
        parts.append(f"not landed: {', '.join(report.samples['not_landed'][:5])} (is the stream running, and does the connector "
                     "read the signal? its log says why a snapshot chunk failed)")
    parts.append(f"coverage now: {after.description}")
    return "; ".join(parts)


def coverage_with_repair(spark: SparkSession, config: PlatformConfig, table: TableConfig, *, sleep: Callable[[float], None] = time.sleep,
                         progress: Callable[[str], None] | None = None) -> CheckOutcome:
    """The scheduled source coverage check when `repair.auto` is on: a failure is repaired at once, within the
    bounds, and the check reports the coverage after the repair, the repair itself in its metadata (`repair`)."""
    assert config.source_connection is not None
    result = coverage_result(spark, config.lake, table, config.source_connection, sleep=sleep)
    if result.outcome.passed:
        return result.outcome
    report = repair_table(spark, config, table, result=result, sleep=sleep, progress=progress)
    after = report.after or result.outcome
    meta = {**after.metadata, "repair": report.as_metadata(),
            "before_repair": {k: result.outcome.metadata[k] for k in ("live_coverage_percent", "missing_in_lake", "different_values",
                                                                      "extra_in_lake", "live_mismatched_keys") if k in result.outcome.metadata}}
    if after.passed:
        return CheckOutcome(True, Severity.ERROR, f"{after.description}; repaired after the check found {report.keys_differing:,} key(s) "
                            f"differing ({report.outcome}: {report.message})", meta)
    return CheckOutcome(False, Severity.ERROR, f"{result.outcome.description}; automatic repair: {report.outcome}: {report.message}", meta)
