"""The batch's one aggregate (`parse_spark.split` -> `figures_of`): its figures and the stream clocks it carries.

The aggregate is grouped by kind and source table so that the same job gives each table's clock; the
transaction stage takes the clocks from it instead of running its own aggregate over the batch. Both
are checked against independent answers on one batch that mixes everything a batch can hold.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.parse import parse_spark
from cdc_platform.config import PlatformConfig
from cdc_platform.parse.envelope import KeySpec
from cdc_platform.stages.stage import SparkBatch
from cdc_platform.stages.transactions import spark_stage as S
from tests.cdc_platform.test_transactions import ev
from tests.cdc_platform.test_transactions_buckets import random_batches
from tests.conftest import REPLICA_IDENTITY

TABLES = {"shop.charges": {"key": ["id"]}, "shop.audits": {"key": ["id"]}, "public.accounts": {"key": ["id"]}}
CORPUS = Path(__file__).resolve().parents[1] / "data" / "bad_input"
AT = dt.datetime(2026, 12, 1, 9, 30, tzinfo=dt.timezone.utc)


def land_mixed(folder: Path) -> None:
    """Files of one batch: transactions over three tables with repeats and markers-only ones, events outside any
    transaction, an event without a source time, the peer data's PostgreSQL events and the bad-input corpus."""
    folder.mkdir(parents=True)
    for i, (batch, _) in enumerate(random_batches(5)):
        (folder / f"tx-{i:02d}.jsonl").write_text("\n".join(batch) + "\n", encoding="utf-8")
    untimed = [json.loads(ev(None, table, 9000 + i, 1.0, row=9000 + i)) for i, table in enumerate(("charges", "untimed"))]
    for event in untimed:  # one in a table with timed events, one alone in its table: no clock for that one
        del event["source"]["ts_ms"]
    (folder / "untimed.jsonl").write_text("".join(json.dumps(event) + "\n" for event in untimed), encoding="utf-8")
    (folder / "peer.jsonl").write_text("\n".join(REPLICA_IDENTITY.read_text(encoding="utf-8").splitlines()[:400]) + "\n", encoding="utf-8")
    for path in sorted(CORPUS.glob("*.jsonl")):
        (folder / f"corpus-{path.name}").write_bytes(b"\n".join(path.read_bytes().split(b"\n")[:50]))


def parsed_batch(spark: Any, folder: Path, keys: KeySpec) -> Any:
    """The folder's lines parsed on the executors, as the stream reads and parses them (persisted, as the job does)."""
    from pyspark.sql import functions as F

    lines = spark.read.text(str(folder)).select(F.col("value"), F.col("_metadata.file_path").alias("source_file"))
    return parse_spark.parse_lines(lines.repartition(3), keys).persist()


def spark_batch(split: parse_spark.SplitBatch) -> SparkBatch:
    figures = split.figures
    return SparkBatch(0, split.events, split.markers, frozenset(figures.table_ids), AT,
                      table_clocks=figures.table_clocks, marker_clock=figures.marker_clock)


def reference(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures and clocks computed on the driver from the parser's rows, one by one."""
    changes = [r for r in rows if r["kind"] == "change"]
    markers = [r for r in rows if r["kind"] == "marker"]

    def micros(ts: dt.datetime | None) -> int | None:
        return None if ts is None else (ts - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)) // dt.timedelta(microseconds=1)

    clocks: dict[str, list[Any]] = {}
    for r in changes:
        if r.get("transaction_id") is None and r.get("source_ts") is None:
            continue
        stream = r["table_id"] or ""
        ts, source = micros(r.get("source_ts")), r.get("source_name") or ""
        clock = clocks.setdefault(stream, [stream, ts, source, 0])
        clock[1] = max((t for t in (clock[1], ts) if t is not None), default=None)
        clock[2] = min(clock[2], source)
        clock[3] += r.get("transaction_id") is not None
    tx_markers = [r for r in markers if r.get("transaction_id") is not None]
    times = [r["source_ts"] for r in changes if r.get("source_ts") is not None]
    return {
        "rows_read": len(rows),
        "change_events": len(changes),
        "distinct_events": len({r["event_id"] for r in changes}),
        "markers": len(markers),
        "distinct_markers": len({r["marker_id"] for r in markers}),
        "tombstones": sum(r["kind"] == "tombstone" for r in rows),
        "dead_letters": sum(r["kind"] == "dead_letter" for r in rows),
        "newest_source_ts": max(times) if times else None,
        "table_ids": tuple(sorted({r["table_id"] for r in changes if r["table_id"] is not None})),
        "table_clocks": tuple(tuple(clocks[k]) for k in sorted(clocks)),
        "marker_clock": (max((micros(r.get("marker_ts")) for r in tx_markers if r.get("marker_ts")), default=None), len(tx_markers)),
        "events_rows": len(changes),
        "events_parts": tuple(sorted({r.get("event_date") or AT.date() for r in changes})),
        "events_range": (min(r["position"] for r in changes), max(r["position"] for r in changes)),
        "markers_range": (min(r["transaction_id"] for r in markers), max(r["transaction_id"] for r in markers)),
    }


def test_the_batch_aggregate_gives_the_figures_and_the_clocks_the_stage_would_count(
    make_config: Callable[..., PlatformConfig], spark: Any, tmp_path: Path
) -> None:
    keys = KeySpec(dict(make_config(TABLES).keys_by_source))
    land_mixed(tmp_path / "batch")
    parsed = parsed_batch(spark, tmp_path / "batch", keys)
    try:
        want = reference(parsed.drop(parse_spark.SEQ).toArrow().to_pylist())  # the parser's rows, one by one on the driver
        assert len(want["table_clocks"]) >= 4 and want["marker_clock"][1] and want["dead_letters"] and want["tombstones"], "every part is exercised"
        assert "shop.untimed" in want["table_ids"] and "shop.untimed" not in [c[0] for c in want["table_clocks"]]
        assert want["distinct_events"] < want["change_events"], "repeats are in the batch"
        split = parse_spark.split(parsed, 0, AT)
        got = split.figures
        assert {k: getattr(got, k) for k in want if hasattr(got, k)} == {k: v for k, v in want.items() if hasattr(got, k)}
        assert (got.events_footprint.rows, got.events_footprint.parts) == (want["events_rows"], want["events_parts"])
        assert (got.events_footprint.lo, got.events_footprint.hi) == want["events_range"]
        assert (got.markers_footprint.lo, got.markers_footprint.hi) == want["markers_range"]
        assert got.events_footprint.complete_range and not got.events_footprint.null_part

        # The stage's own aggregate over the split frames, which a batch built without the figures still runs.
        batch = spark_batch(split)
        own, own_transactional = S._clock(*S._inputs(spark, batch))
        given, given_transactional = S._given_clock(batch)
        assert sorted(given.to_pylist(), key=lambda r: r["stream"]) == sorted(own.to_pylist(), key=lambda r: r["stream"])
        assert given_transactional is own_transactional is True
        split.release()
    finally:
        parsed.unpersist()


@pytest.mark.parametrize("literal_repeats", [1_000, 1])  # few repeats: a literal set; more than the limit: a broadcast join
def test_the_split_keeps_each_id_once_however_it_drops_the_repeats(
    make_config: Callable[..., PlatformConfig], spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, literal_repeats: int
) -> None:
    monkeypatch.setattr(parse_spark, "LITERAL_REPEATS", literal_repeats)
    keys = KeySpec(dict(make_config(TABLES).keys_by_source))
    land_mixed(tmp_path / "batch")
    parsed = parsed_batch(spark, tmp_path / "batch", keys)
    try:
        rows = parsed.toArrow().to_pylist()
        firsts: dict[tuple[str, str], int] = {}
        for r in sorted(rows, key=lambda r: r[parse_spark.SEQ]):
            if r["kind"] in ("change", "marker"):
                firsts.setdefault((r["kind"], r["event_id"] if r["kind"] == "change" else r["marker_id"]), r[parse_spark.SEQ])
        split = parse_spark.split(parsed, 0, AT)
        assert (split.figures.in_batch_duplicates > literal_repeats) is (literal_repeats == 1)
        events = {(r["event_id"], r[parse_spark.SEQ]) for r in split.events.select("event_id", parse_spark.SEQ).collect()}
        markers = {(r["marker_id"], r[parse_spark.SEQ]) for r in split.markers.select("marker_id", parse_spark.SEQ).collect()}
        assert events == {(i, seq) for (kind, i), seq in firsts.items() if kind == "change"}  # the first copy of each, in input order
        assert markers == {(i, seq) for (kind, i), seq in firsts.items() if kind == "marker"}
        split.release()
    finally:
        parsed.unpersist()


def test_a_batch_without_repeats_is_taken_as_it_is(make_config: Callable[..., PlatformConfig], spark: Any, tmp_path: Path) -> None:
    """No repeats, no filter: the raw log's lookup and append read the parsed rows without a join or a set."""
    folder = tmp_path / "batch"
    folder.mkdir()
    (folder / "peer.jsonl").write_text("\n".join(REPLICA_IDENTITY.read_text(encoding="utf-8").splitlines()[:50]) + "\n", encoding="utf-8")
    parsed = parsed_batch(spark, folder, KeySpec(dict(make_config(TABLES).keys_by_source)))
    try:
        figures, found = parse_spark.figures_of(parsed, AT, parse_spark.repeats(parsed))
        assert figures.in_batch_duplicates == 0 and figures.change_events > 0
        assert found.dropped_from(parsed, parse_spark.repeats(parsed)) is parsed
    finally:
        parsed.unpersist()


def test_an_empty_or_heartbeat_only_batch_has_no_clock(spark: Any, tmp_path: Path) -> None:
    heartbeat = json.dumps({"schema": {"name": "io.debezium.connector.common.Heartbeat"}, "payload": {"ts_ms": 1764581400000}})
    for i, lines in enumerate(([], [heartbeat, "null"])):
        folder = tmp_path / f"batch-{i}"
        folder.mkdir()
        (folder / "part.jsonl").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        parsed = parsed_batch(spark, folder, KeySpec({}))
        try:
            split = parse_spark.split(parsed, 0, AT)
            got = split.figures
            assert (got.rows_read, got.change_events, got.markers, got.table_ids, got.heartbeats) == (len(lines), 0, 0, (), len(lines) // 2)
            assert (got.table_clocks, got.marker_clock, got.events_footprint.rows) == ((), (None, 0), 0)
            given, transactional = S._given_clock(spark_batch(split))
            assert (given.num_rows, transactional) == (0, False)
            split.release()
        finally:
            parsed.unpersist()
    idle, transactional = S._given_clock(None)  # an idle tick
    assert (idle.num_rows, transactional) == (0, False)


def test_the_stream_runs_no_clock_aggregate_of_its_own(
    make_config: Callable[..., PlatformConfig], land: Callable[..., Path], run_pipeline: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pipeline hands the stage the batch's clocks: the stage's own aggregate never runs, and what lands is
    what the stage's aggregate gave (the Spark stage against the driver stage: test_transactions_spark.py)."""
    def refuse(*args: Any) -> Any:
        raise AssertionError("the transaction stage ran its own clock aggregate over a batch that carries its clocks")

    monkeypatch.setattr(S, "_clock", refuse)
    cfg = make_config(TABLES)
    land(None, [line for batch, _ in random_batches(5)[:3] for line in batch])
    report = run_pipeline(cfg)
    assert report.batches and sum(b.rows_landed.get("transactions", 0) for b in report.stage_batches) > 0
