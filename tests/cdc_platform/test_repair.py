"""A repair's decisions without a database or a connector: the bounds, the message without a channel, the dry run,
the wait for the re-read keys, the record in `source_repairs`, and the scheduled check that repairs by itself.
The real thing runs in tests/testbed/test_repair.py."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.backfill import repair, repair_log
from cdc_platform.checks import CheckOutcome, Severity
from cdc_platform.checks.source_coverage import CoverageResult, Verdicts
from cdc_platform.config import PlatformConfig, parse_config
from cdc_platform.errors import ConfigError
from cdc_platform.sources import signal_channel

UTC = dt.timezone.utc
NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _config(tmp_path: Path, repair_settings: dict[str, Any] | None, *, connection: bool = True) -> PlatformConfig:
    raw: dict[str, Any] = {"landing": "landing", "lake": "lake", "tables": {"public.acc": {"key": ["tenant", "id"]}}}
    if connection:
        raw["source_connection"] = {"kind": "postgresql", "host": "127.0.0.1", "database": "app", "user": "${U}", "password": "${P}"}
    if repair_settings is not None:
        raw["repair"] = repair_settings
    import os

    os.environ.setdefault("U", "reader")
    os.environ.setdefault("P", "pw")
    (tmp_path / "lake").mkdir(exist_ok=True)
    return parse_config(raw, base=tmp_path)


def _failed(differing: list[tuple[str, str, tuple[Any, ...]]] | None) -> CoverageResult:
    meta = {"live_coverage_percent": 75.0, "missing_in_lake": 1}
    return CoverageResult(CheckOutcome(False, Severity.ERROR, "acc vs the live public.acc: 75.00% covered", meta), "00000000000000000100", differing)


DIFFERING = [("missing_in_lake", '{"id": 1, "tenant": "a"}', ("a", 1)), ("different_values", '{"id": 2, "tenant": "it\'s"}', ("it's", 2)),
             ("missing_in_lake", '{"id": 3, "tenant": "☃"}', ("☃", 3)), ("extra_in_lake", '{"id": 9, "tenant": "z"}', ("z", 9))]


@pytest.fixture
def no_source(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The source and the channel as fakes: the key columns' types, the signal table's size, the position, the sends."""
    sent: list[Any] = []
    monkeypatch.setattr(repair, "column_types", lambda connection, source: {"tenant": "text", "id": "integer"})
    monkeypatch.setattr(signal_channel, "signal_table_limit", lambda connection, settings: 2048)
    monkeypatch.setattr(repair, "current_position", lambda connection: "00000000000000000200")
    monkeypatch.setattr(signal_channel, "send", lambda connection, settings, signals: sent.append(list(signals)))
    return sent


def test_a_repair_needs_the_live_source(tmp_path: Path, spark: Any) -> None:
    config = _config(tmp_path, None, connection=False)
    with pytest.raises(ConfigError, match="set `source_connection:`"):
        repair.repair_table(spark, config, config.tables[0], result=_failed(DIFFERING))


def test_a_table_that_matches_is_left_alone_and_not_recorded(tmp_path: Path, spark: Any) -> None:
    config = _config(tmp_path, {"signal_table": "public.debezium_signal"})
    whole = CoverageResult(CheckOutcome(True, Severity.ERROR, "100.00% covered", {"live_coverage_percent": 100.0}), "1", [])
    report = repair.repair_table(spark, config, config.tables[0], result=whole)
    assert (report.outcome, report.succeeded, report.coverage_after) == ("nothing_to_repair", True, 100.0)
    assert repair_log.repairs(config.lake) == []


def test_without_a_channel_the_keys_and_the_backfill_are_named(tmp_path: Path, spark: Any, no_source: list[Any]) -> None:
    config = _config(tmp_path, None)
    report = repair.repair_table(spark, config, config.tables[0], result=_failed(DIFFERING), now=lambda: NOW)
    assert report.outcome == "no_channel" and no_source == []
    assert '{"id":"1","tenant":"a"}' in report.message and '{"id":"2","tenant":"it\'s"}' in report.message
    assert "no signal channel is configured" in report.message and "`cdc backfill --table acc`" in report.message
    assert str(tmp_path / "snapshots" / "acc") in report.message
    (row,) = repair_log.repairs(config.lake, "acc")
    assert (row["outcome"], row["keys_differing"], row["keys_absent"], row["channel"]) == ("no_channel", 4, 1, None)


def test_more_keys_than_coverage_names_are_not_guessed(tmp_path: Path, spark: Any, no_source: list[Any]) -> None:
    config = _config(tmp_path, {"signal_table": "public.debezium_signal"})
    report = repair.repair_table(spark, config, config.tables[0], result=_failed(None), now=lambda: NOW)
    assert report.outcome == "too_many" and no_source == [] and "without additional-conditions" in report.message


def test_a_dry_run_plans_the_signals_within_max_keys_and_sends_nothing(tmp_path: Path, spark: Any, no_source: list[Any]) -> None:
    config = _config(tmp_path, {"signal_table": "public.debezium_signal", "max_keys": 2, "keys_per_signal": 1})
    report = repair.repair_table(spark, config, config.tables[0], result=_failed(DIFFERING), dry_run=True, now=lambda: NOW)
    assert (report.outcome, report.keys_asked, report.keys_deferred, len(report.signal_texts)) == ("planned", 2, 1, 2)
    assert no_source == [] and repair_log.repairs(config.lake) == []
    assert "(\\\"tenant\\\", \\\"id\\\") IN ((E'a', E'1'))" in report.signal_texts[0]
    assert "would send 2 signal(s) on the signalling table public.debezium_signal" in report.message


def test_the_hourly_bound_counts_repairs_that_sent_signals(tmp_path: Path, spark: Any, no_source: list[Any]) -> None:
    config = _config(tmp_path, {"signal_table": "public.debezium_signal", "max_repairs_per_hour": 2})
    base = {"table_name": "acc", "started_at": NOW - dt.timedelta(minutes=30), "finished_at": NOW - dt.timedelta(minutes=29)}
    for i, outcome in enumerate(("repaired", "no_channel", "timed_out")):
        repair_log.record(spark, config.lake, {**base, "repair_id": f"r{i}", "outcome": outcome})
    repair_log.record(spark, config.lake, {**base, "repair_id": "old", "outcome": "repaired", "started_at": NOW - dt.timedelta(hours=2)})
    assert repair_log.sent_since(config.lake, "acc", NOW - dt.timedelta(hours=1)) == 2
    report = repair.repair_table(spark, config, config.tables[0], result=_failed(DIFFERING), now=lambda: NOW)
    assert report.outcome == "rate_limited" and no_source == [] and "max_repairs_per_hour" in report.message
    assert repair_log.repairs(config.lake, "acc")[-1]["outcome"] == "rate_limited"


def test_a_repair_sends_waits_checks_again_and_records(tmp_path: Path, spark: Any, no_source: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, {"signal_table": "public.debezium_signal", "wait": 30})
    waited: list[Any] = []

    def landing(spark: Any, config: Any, table: Any, connection: Any, asked: list[Any], since: str, **_: Any) -> tuple[list[Any], list[Any]]:
        waited.append((list(asked), since))
        return list(asked[:2]), list(asked[2:])

    after = CoverageResult(CheckOutcome(False, Severity.ERROR, "99.00% covered", {"live_coverage_percent": 99.0}), "2", [])
    monkeypatch.setattr(repair, "await_landing", landing)
    monkeypatch.setattr(repair, "coverage_result", lambda *a, **k: after)
    monkeypatch.setattr(repair, "reread_events", lambda *a, **k: 2)
    report = repair.repair_table(spark, config, config.tables[0], result=_failed(DIFFERING), now=lambda: NOW)
    assert waited == [([("a", 1), ("it's", 2), ("☃", 3)], "00000000000000000200")], "the position is read before the signals go"
    assert len(no_source) == 1 and len(no_source[0]) == 1, "one signal in one send"
    (signal_id, text) = no_source[0][0]
    assert signal_id.startswith("cdc-repair-") and '"data-collections":["public\\\\.acc"]' in text
    assert (report.outcome, report.keys_asked, report.keys_landed, report.coverage_before, report.coverage_after) == ("partial", 3, 2, 75.0, 99.0)
    assert '{"id":"3","tenant":"☃"}' in report.message and "1 lake row(s) the source no longer has" in report.message
    assert "--remove-absent" in report.message
    (row,) = repair_log.repairs(config.lake, "acc")
    assert (row["outcome"], row["keys_asked"], row["keys_landed"], row["signals"], row["reread_events"]) == ("partial", 3, 2, 1, 2)
    meta = report.as_metadata()
    assert meta["repaired_keys"]["not_landed"] == ['{"id":"3","tenant":"☃"}'] and meta["keys_absent"] == 1


def test_a_channel_that_fails_is_recorded_and_raised(tmp_path: Path, spark: Any, no_source: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, {"signal_table": "public.debezium_signal"})

    def refuse(*_: Any) -> None:
        raise signal_channel.SignalChannelError("the signalling table public.debezium_signal cannot be written: permission denied")

    monkeypatch.setattr(signal_channel, "send", refuse)
    with pytest.raises(signal_channel.SignalChannelError, match="permission denied"):
        repair.repair_table(spark, config, config.tables[0], result=_failed(DIFFERING), now=lambda: NOW)
    (row,) = repair_log.repairs(config.lake, "acc")
    assert row["outcome"] == "not_sent" and "permission denied" in row["detail"]


def test_the_wait_ends_when_every_key_landed_or_time_is_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Landed: the lake holds the key at or above the position from before the signals, or agrees with the source."""
    config = _config(tmp_path, {"signal_table": "public.debezium_signal"})
    keys = [("a", 1), ("b", 2), ("c", 3)]
    texts = {k: repair.key_text(tuple(repair.canonical(v) for v in k)) for k in keys}
    polls = iter([({texts[("a", 1)]: "00000000000000000300", texts[("b", 2)]: "00000000000000000100"}, [("b", 2), ("c", 3)]),
                  ({texts[("b", 2)]: "00000000000000000100"}, [("c", 3)])])
    compared: list[Any] = []

    def positions(*_: Any) -> dict[str, str]:
        return current[0]

    def compare(spark: Any, lake: Any, table: Any, connection: Any, values: list[Any], wanted: Any) -> Verdicts:
        compared.append(sorted(values))
        return Verdicts("1", (), (), 0, 0, {}, {}, [("missing_in_lake", "", v) for v in current[1]], {})

    monkeypatch.setattr(repair, "lake_positions", positions)
    monkeypatch.setattr(repair, "compare_in_spark", compare)
    clock = iter([0.0, 1.0, 2.0, 11.0])
    current = next(polls)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        nonlocal current
        slept.append(seconds)
        current = next(polls, current)

    landed, pending = repair.await_landing(None, config, config.tables[0], None, keys, "00000000000000000200", wait=10, poll=2,  # type: ignore[arg-type]
                                           sleep=sleep, clock=lambda: next(clock), progress=lambda _m: None)
    assert landed == [("a", 1), ("b", 2)] and pending == [("c", 3)]
    assert compared == [[("b", 2), ("c", 3)], [("b", 2), ("c", 3)]], "only keys not yet placed are compared"
    assert slept == [2.0]


def test_the_scheduled_check_repairs_and_reports_the_coverage_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path, {"signal_table": "public.debezium_signal", "auto": True})
    healed = CheckOutcome(True, Severity.ERROR, "acc vs the live public.acc: 100.00% covered", {"live_coverage_percent": 100.0})
    report = repair.RepairReport("r1", "acc", "public.acc", "repaired", "source", NOW, message="3 of 3 re-read key(s) landed",
                                 keys_differing=3, keys_asked=3, keys_landed=3, after=healed)
    monkeypatch.setattr(repair, "coverage_result", lambda *a, **k: _failed(DIFFERING))
    monkeypatch.setattr(repair, "repair_table", lambda *a, **k: report)
    outcome = repair.coverage_with_repair(None, config, config.tables[0])  # type: ignore[arg-type]
    assert outcome.passed and "repaired after the check found 3 key(s) differing (repaired: 3 of 3" in outcome.description
    assert outcome.metadata["before_repair"] == {"live_coverage_percent": 75.0, "missing_in_lake": 1}
    assert outcome.metadata["repair"]["keys_landed"] == 3
    report.outcome, report.after = "timed_out", CheckOutcome(False, Severity.ERROR, "75.00% covered", {})
    failed = repair.coverage_with_repair(None, config, config.tables[0])  # type: ignore[arg-type]
    assert not failed.passed and "automatic repair: timed_out" in failed.description
