"""Onboarding a source table by adding it to the config: while the stream runs (no restart), and while it
is stopped; either way its latest state holds its whole past from the raw log, then every later change."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from cdc_platform.config import load_config
from cdc_platform.parse.envelope import KeySpec, parse_line
from cdc_platform.run.ingest import IngestJob
from cdc_platform.stages.latest_state.rows import fill_keys
from cdc_platform.backfill.onboarding import ConfigWatch

CUSTOMERS = {"payments.customers": {"key": ["id"]}}
WITH_AUDITS = CUSTOMERS | {"payments.audits": {"key": ["id"]}}


def event(table: str, pos: int, op: str = "c", row_id: Any = 1, **cols: Any) -> str:
    image = {"id": row_id, **cols}
    return json.dumps({
        "before": image if op in ("d", "u") else None, "after": None if op == "d" else image,
        "source": {"connector": "mysql", "name": "payments", "db": "payments", "table": table, "ts_ms": 1767225600000 + pos,
                   "file": "mysql-bin.000003", "pos": pos, "row": 0},
        "op": op, "ts_ms": 1767225600500 + pos, "transaction": None,
    })


def test_filled_keys_are_the_keys_the_parser_gives_a_configured_table() -> None:
    lines = [
        event("t", 1, row_id=7), event("t", 2, "d", row_id=7), event("t", 3, row_id="Zoë ✓"),
        event("t", 4, "u", row_id=12345678901234567890123),  # a number no float holds
        json.dumps({"before": {"id": 1.5, "k2": "x"}, "after": None, "op": "d", "ts_ms": 1,
                    "source": {"connector": "mysql", "db": "d", "table": "t", "ts_ms": 1, "file": "f.1", "pos": 9, "row": 0}}),
    ]
    configured = [parse_line(line, None, KeySpec({"payments.t": ["id"], "d.t": ["id", "k2"]})) for line in lines]
    unconfigured = [parse_line(line, None, KeySpec({})) for line in lines]
    assert all(r["key"] is None for r in unconfigured) and all(r["key"] is not None for r in configured)
    cols = ("op", "before", "after", "key")
    raw = pa.table({c: pa.array([r[c] for r in unconfigured], pa.string()) for c in cols})
    filled = pa.concat_tables([fill_keys(raw.slice(0, 4), ["id"]), fill_keys(raw.slice(4), ["id", "k2"])])
    assert filled.column("key").to_pylist() == [r["key"] for r in configured]
    # an image without the key column keeps no key (the rebuild dead-letters it as missing_key)
    assert fill_keys(raw.slice(0, 1), ["uid"]).column("key").to_pylist() == [None]


def write_config(path: Path, tables: dict[str, Any], **extra: Any) -> None:
    path.write_text(yaml.safe_dump({"landing": "landing", "lake": "lake", "tables": tables, **extra}), encoding="utf-8")


def test_the_watch_applies_added_tables_and_says_what_waits_for_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "cdc.yaml"
    (tmp_path / "landing").mkdir()
    write_config(path, CUSTOMERS)
    said: list[str] = []
    watch = ConfigWatch(load_config(path), said.append)
    assert watch.poll() is None, "unchanged file"
    write_config(path, WITH_AUDITS, trigger_interval="9 seconds")
    updated = watch.poll()
    assert updated is not None and [t.name for t in updated.tables] == ["customers", "audits"]
    assert updated.trigger_interval == "5 seconds", "only tables apply while the stream runs"
    write_config(path, {"payments.customers": {"key": ["email"]}, "payments.audits": {"key": ["id"]}})
    assert watch.poll() is None
    write_config(path, {"payments.audits": {"key": ["id"]}})
    assert watch.poll() is None
    path.write_text("tables: [", encoding="utf-8")
    assert watch.poll() is None
    write_config(path, WITH_AUDITS | {"payments.customers": {"key": ["id"], "name": "clients"}, "billing.customers": {"key": ["id"]}})
    assert watch.poll() is None, "billing.customers would take the name `customers`, which the stream's table keeps"
    assert len(said) == len(set(said)), said
    for expected in ("the change to tables.payments.customers applies at the next start",
                     "tables.payments.customers was removed from the config; the stream keeps its latest state until the next start",
                     "the edited config is not used, the stream goes on with the one it started with",
                     "tables.billing.customers is not onboarded: its name 'customers' is taken by another table"):
        assert any(m.startswith(expected) for m in said), (expected, said)


def live(query: Any, cfg: Any, table: str) -> list[dict[str, Any]]:
    return query(cfg, f"SELECT id, note FROM {table}__full_view ORDER BY id")


def test_a_table_added_while_the_stream_runs_is_onboarded_with_its_past(spark: Any, make_config, land, query) -> None:  # noqa: ANN001
    cfg = make_config(CUSTOMERS)
    land("a.jsonl", [event("customers", 1), event("audits", 2, row_id=1, note="one"), event("audits", 3, row_id=2, note="two")])
    said: list[str] = []
    job = IngestJob(cfg, progress=said.append)
    running = job.start_streaming(spark, interval="500 milliseconds")
    try:
        def wait(what: str, condition: Any, timeout: float = 120.0) -> None:
            deadline = time.monotonic() + timeout
            while not condition():
                assert job._failure is None, job._failure
                assert time.monotonic() < deadline, what
                time.sleep(0.3)

        wait("the first file lands", lambda: sum(b.rows_read for b in list(job.reports)) >= 3)
        assert query(cfg, "SELECT count(*) AS n FROM raw_change_events WHERE table_id = 'payments.audits'") == [{"n": 2}]
        write_config(cfg.source_file, WITH_AUDITS)  # type: ignore[arg-type]
        land("b.jsonl", [event("audits", 4, "u", row_id=1, note="one v2"), event("audits", 5, "d", row_id=2), event("audits", 6, row_id=3, note="three")])
        wait("the later changes land", lambda: sum(b.rows_read for b in list(job.reports)) >= 6)
    finally:
        running.stop()
    assert job._failure is None and running.stage_failures() == {}
    assert any(m.startswith("onboarded payments.audits as audits") for m in said), said
    assert live(query, cfg, "audits") == [{"id": 1, "note": "one v2"}, {"id": 3, "note": "three"}]
    assert query(cfg, "SELECT count(*) AS n FROM dead_letter") == [{"n": 0}]
    assert [t.name for t in job.config.tables] == ["customers", "audits"]
