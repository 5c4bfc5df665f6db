"""Faults through the whole real stack (issue 11): while transactions run on PostgreSQL and `cdc stream`
reads Debezium's topics, the Kafka Connect worker is killed (SIGKILL: its connector replays from its last
committed offset, so events arrive twice), the broker restarts, and `cdc stream` itself is killed with
SIGKILL and started again. Afterwards the lake equals the database, every change event is in the raw
log once, every source transaction is in `transactions` once, and nothing is incomplete or dead.

`cdc stream` runs as a real subprocess: only a killed process shows what survives a crash."""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.config import load_config
from cdc_platform.parse.envelope import _PROCESSING_TIMES, KeySpec, parse_line
from cdc_platform.testbed import Record, Stack, consume_all
from tests.testbed.streaming import StreamProcess, rows_once_set_up

PREFIX = "faults_pg"
ACCOUNTS = "f_accounts"
MOVES = "f_moves"
REPO = Path(__file__).resolve().parents[2]
T0 = dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)


class Workload:
    """Multi-table transactions, two a second (what a stream on a loaded 2-core machine keeps up with), until stopped: a move inserted and its account's balance
    changed; every 7th also deletes an older move; every 11th opens an account."""

    def __init__(self, bed: Stack) -> None:
        self.bed, self.done, self.stop, self.error = bed, 0, threading.Event(), None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            with self.bed.postgres.connect(autocommit=False) as conn:
                n = 0
                while not self.stop.is_set():
                    n += 1
                    account = n % 5 + 1
                    conn.execute(f"insert into {MOVES} values (%s, %s, %s, %s)", (n, account, Decimal(n) / 100, T0 + dt.timedelta(seconds=n)))
                    conn.execute(f"update {ACCOUNTS} set balance = balance + %s, touched = touched + 1 where id = %s", (Decimal(n) / 100, account))
                    if n % 7 == 0:
                        conn.execute(f"delete from {MOVES} where id = %s", (n - 5,))
                    if n % 11 == 0:
                        conn.execute(f"insert into {ACCOUNTS} values (%s, %s, 0, 0)", (100 + n, f"owner {n}"))
                    conn.commit()
                    self.done = n
                    time.sleep(0.5)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def records_by_identity(changes: list[Record]) -> dict[str, list[Record]]:
    """The topics' change records by the event identity the parser gives them (the Python oracle's)."""
    keys = KeySpec({})
    out: dict[str, list[Record]] = {}
    for r in changes:
        row = parse_line(r.value.decode("utf-8"), None, keys)  # type: ignore[union-attr]
        assert row["kind"] == "change", f"{r.topic}@{r.offset} parsed as {row['kind']}: {row.get('reason')}"
        out.setdefault(row["event_id"], []).append(r)
    return out


def _payload_without_times(r: Record) -> dict[str, Any]:
    payload = dict(r.json_value()["payload"])
    for name in _PROCESSING_TIMES:  # what the identity leaves out, so the rest is what it hashes
        payload.pop(name, None)
    return payload


def records_by_change(changes: list[Record]) -> dict[tuple[Any, ...], list[Record]]:
    """The topics' change records by what the change is (table, LSN, op, row image): a redelivered copy joins
    its first delivery."""
    out: dict[tuple[Any, ...], list[Record]] = {}
    for r in changes:
        c = r.json_value()["payload"]
        out.setdefault((c["source"]["table"], c["source"]["lsn"], c["op"], json.dumps(c["after"] or c["before"], sort_keys=True)), []).append(r)
    return out


def identity_report(by_id: dict[str, list[Record]], by_change: dict[tuple[Any, ...], list[Record]]) -> str:
    """Which copies of one change got different identities, and how their envelopes differ: what a failure
    needs to say (an intermittent one is not seen twice)."""
    lines = [f"{len(by_id)} identities for {len(by_change)} distinct changes"]
    for key, copies in by_change.items():
        payloads = {json.dumps(_payload_without_times(r), sort_keys=True) for r in copies}
        if len(payloads) > 1:
            lines.append(f"{key[:3]} at offsets {[r.offset for r in copies]}:")
            lines.extend(f"  {p}" for p in sorted(payloads))
    return "\n".join(lines[:40])


def raw_report(raw: list[dict[str, Any]], by_id: dict[str, list[Record]], changes: list[Record]) -> str:
    """The raw log's identities that no topic record has, with the record each came from, and the reverse."""
    at = {(r.topic, r.partition, r.offset): r for r in changes}
    raw_ids = {row["event_id"] for row in raw}
    lines = [f"raw log {len(raw_ids)} identities, topics {len(by_id)}"]
    for row in raw:
        if row["event_id"] not in by_id:
            record = at.get((row["kafka_topic"], row["kafka_partition"], row["kafka_offset"]))
            lines.append(f"only in the raw log: {row}; the topic's record there: "
                         f"{None if record is None else record.value.decode('utf-8')[-700:]}")  # type: ignore[union-attr]
    for event_id, copies in by_id.items():
        if event_id not in raw_ids:
            lines.append(f"only in the topics: {event_id} at {[(r.topic, r.offset) for r in copies]}")
    return "\n".join(lines[:40])


def cdc_stream(config: Path, log: Path) -> StreamProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return StreamProcess([sys.executable, "-m", "cdc_platform", "stream", "--config", str(config), "--trigger-interval", "1 second"],
                         log, env=env, cwd=config.parent)


def test_killed_connect_restarted_broker_and_killed_stream_lose_and_double_nothing(testbed: Stack, tmp_path: Path, query) -> None:  # noqa: ANN001
    bed = testbed
    with bed.postgres.connect() as conn:
        conn.execute(f"create table {ACCOUNTS} (id int primary key, owner text, balance numeric(14,2), touched int)")
        conn.execute(f"create table {MOVES} (id bigint primary key, account_id int, amount numeric(12,2), at timestamptz)")
        conn.execute(f"insert into {ACCOUNTS} select i, 'owner ' || i, 0, 0 from generate_series(1, 5) i")
    connector = bed.postgres_connector(PREFIX, [f"public.{ACCOUNTS}", f"public.{MOVES}"])
    doc = {
        "lake": "lake", "transaction_timeout": 3600,  # nothing may expire while the stream is down: it must complete
        "source": {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "subscribe_pattern": rf"{PREFIX}\..*",
                   "max_offsets_per_trigger": 5000},
        "tables": {f"public.{ACCOUNTS}": {"key": ["id"]}, f"public.{MOVES}": {"key": ["id"]}},
    }
    config_path = tmp_path / "cdc.yaml"
    config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    cfg = load_config(config_path)
    stream = cdc_stream(config_path, tmp_path / "stream.log")
    workload = Workload(bed)

    def source_rows(table: str) -> list[tuple[Any, ...]]:
        cols = "id, owner, balance, touched" if table == ACCOUNTS else "id, account_id, amount, (extract(epoch from at) * 1000000)::bigint"
        with bed.postgres.connect() as conn:
            return [tuple(r) for r in conn.execute(f"select {cols} from {table} order by id").fetchall()]

    def lake_rows(table: str) -> list[tuple[Any, ...]] | None:
        from pyspark.errors import AnalysisException

        cols = "id, owner, balance, touched" if table == ACCOUNTS else "id, account_id, amount, unix_micros(at)"
        try:
            return [tuple(r.values()) for r in query(cfg, f"select {cols} from {table}__full_view order by id")]
        except AnalysisException:
            return None

    def wait(what: str, condition: Callable[[], bool], timeout: float = 240.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert workload.error is None, workload.error
            assert stream.alive(), f"cdc stream exited while {what}:\n{stream.tail()}"
            assert time.monotonic() < deadline, f"{what}: not reached after {timeout:.0f} s\n{stream.tail()}"
            time.sleep(1.0)

    def raw_count() -> int:
        rows = rows_once_set_up(query, cfg, "select count(*) as n from raw_change_events")
        return 0 if rows is None else rows[0]["n"]

    bed.connect.register(PREFIX, connector)
    try:
        bed.wait_streaming(connector)
        stream.start()
        workload.thread.start()
        wait("the first events land", lambda: raw_count() > 20)

        at = workload.done
        bed.restart("connect", kill=True)  # a crashed worker: offsets not flushed since its last commit replay
        bed.connect.wait_running(PREFIX)
        wait("events flow again after Connect's crash", lambda: workload.done > at + 20 and raw_count() > 2 * at)

        at = workload.done
        bed.restart("broker")
        wait("events flow again after the broker's restart", lambda: workload.done > at + 20 and raw_count() > 2 * at)

        stream.kill()  # SIGKILL mid-stream, then a restart on the same checkpoint
        time.sleep(2.0)
        stream.start()
        at = workload.done
        wait("the restarted stream lands new events", lambda: workload.done > at + 20 and raw_count() > 2 * at)
        workload.stop.set()
        workload.thread.join(timeout=30)
        assert workload.error is None, workload.error
        wait("the lake equals the database", lambda: all(lake_rows(t) == source_rows(t) for t in (ACCOUNTS, MOVES)), timeout=300)
        n_tx = workload.done
        wait("every transaction is in the lake", lambda: query(cfg, "select count(*) as n from transactions")[0]["n"] >= n_tx)
    finally:
        workload.stop.set()
        stream.stop()
        bed.connect.delete(PREFIX)

    try:
        # Every change record the topics hold, redelivered copies included, against the raw log.
        topics = [f"{PREFIX}.public.{t}" for t in (ACCOUNTS, MOVES)]
        records = consume_all(bed.broker.bootstrap, topics + [f"{PREFIX}.transaction"])
        changes = [r for r in records if r.topic in topics and r.value is not None]
        by_id = records_by_identity(changes)
        by_change = records_by_change(changes)
        # A redelivered copy must carry the identity of its first delivery: one identity per distinct change.
        assert len(by_id) == len(by_change), identity_report(by_id, by_change)
        raw = query(cfg, "select event_id, kafka_topic, kafka_partition, kafka_offset from raw_change_events")
        assert len(raw) == len({r["event_id"] for r in raw}), "a change event twice in the raw log"
        assert {r["event_id"] for r in raw} == set(by_id), raw_report(raw, by_id, changes)
        ends = {r.json_value()["payload"]["id"].split(":")[0] for r in records
                if r.topic.endswith(".transaction") and r.json_value()["payload"]["status"] == "END"}
        txs = query(cfg, "select transaction_id from transactions")
        assert len(txs) == len({t["transaction_id"] for t in txs}) == len(ends) >= n_tx, "every source transaction once"
        assert query(cfg, "select count(*) as n from incomplete_transactions")[0]["n"] == 0
        assert query(cfg, "select reason_code, reason from dead_letter") == []
        redelivered = len(changes) - len(by_id)
        print(f"{n_tx} transactions, {len(changes)} change records in Kafka, {redelivered} of them redelivered copies; "
              f"raw log {len(raw)} events")
    finally:
        with bed.postgres.connect() as conn:
            for table in (MOVES, ACCOUNTS):
                conn.execute(f"drop table if exists {table}")
            conn.execute(f"select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = '{PREFIX}_slot' and not active")
