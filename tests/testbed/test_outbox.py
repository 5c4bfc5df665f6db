"""Issue 47: outbox events from a real PostgreSQL through Debezium, both ways, land as event tables once each.

A service-like workload writes business rows (`ob_orders`, `ob_payments`) and outbox events (`ob_outbox`,
Debezium's layout) in the same transactions, and deletes its outbox rows right after. Two connectors read it:
one captures the three tables with transaction metadata (the table input), one captures the outbox alone
through Debezium's Outbox Event Router SMT (the routed input: topics `ob.event.<aggregatetype>`, event id in
the `id` header, type in the `eventType` header). A stream in this process lands the table input into one lake
while the workload runs, across a Kafka Connect worker killed and a stream restarted on a lost checkpoint (every
record read again); a second lake lands the routed input the same way (`cdc run`, twice, the second time
after losing its checkpoints). Then: each event table holds each event once, in the workload's order per
aggregate, equal to what the workload wrote, and equal between the two lakes; the consistency check passes,
and fails naming the transaction once one is made to lack its business change.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.checks.outbox import outbox_consistency
from cdc_platform.config import load_config
from cdc_platform.run import stage_queries
from cdc_platform.run.ingest import IngestJob
from cdc_platform.testbed import Stack
from tests.testbed.streaming import rows_once_set_up

PREFIX = "ob_pg"
ROUTER = "ob_router"
ORDERS, PAYMENTS, OUTBOX = "ob_orders", "ob_payments", "ob_outbox"
EXPECTATIONS = {"order_created": [f"public.{ORDERS}"], "order_paid": {f"public.{PAYMENTS}": ["c"]},
                "payment_made": [f"public.{PAYMENTS}"]}
#: Service calls, one transaction each, two a second; every third order is paid in the same transaction.
CALLS, PAUSE = 18, 0.5


class Streaming:
    """`cdc stream` in this process: the ingest and every stage query (`IngestJob.run_continuously`), in a thread,
    with a wait for a lake condition that fails at once when the stream does. (`streaming.Running` starts the
    ingest query alone; the event tables are written by the outbox stage query.)"""

    def __init__(self, spark: Any, cfg: Any) -> None:
        self.said: list[str] = []
        self.job = IngestJob(cfg, progress=self.said.append)
        self.halt = threading.Event()
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(spark,), daemon=True)
        self.thread.start()

    def _run(self, spark: Any) -> None:
        try:
            self.job.run_continuously(spark, interval="1 second", stop=self.halt)
        except BaseException as exc:  # noqa: BLE001 - raised by `wait` and `stop`
            self.failure = exc

    def wait(self, what: str, condition: Any, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.failure is not None:
                raise self.failure
            assert self.thread.is_alive(), "the stream stopped"
            if condition():
                return
            assert time.monotonic() < deadline, f"{what}: not reached after {timeout:.0f} s; last lines: {self.said[-8:]}"
            time.sleep(2.0)

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(180)
        if self.failure is not None:
            raise self.failure


class Service:
    """The workload: per call one transaction inserting an order and its `order_created` event (every third also
    a payment, `payment_made` and `order_paid`), deleting the outbox rows before it commits. Records what it wrote."""

    def __init__(self, bed: Stack, first: int, calls: int) -> None:
        self.bed, self.first, self.calls = bed, first, calls
        self.written: list[dict[str, Any]] = []  # the events, in commit order
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        try:
            with self.bed.postgres.connect(autocommit=False) as conn:
                for n in range(self.first, self.first + self.calls):
                    events = [emit(conn, "order", n, "order_created", {"id": n, "total_cents": n * 150})]
                    conn.execute(f"insert into {ORDERS} values (%s, %s)", (n, n * 1.5))
                    if n % 3 == 0:
                        conn.execute(f"insert into {PAYMENTS} values (%s, %s, %s)", (n, n, n * 1.5))
                        events.append(emit(conn, "payment", n, "payment_made", {"payment": n, "order": n}))
                        events.append(emit(conn, "order", n, "order_paid", {"id": n, "paid": True}))
                    conn.execute(f"delete from {OUTBOX} where id = any(%s)", ([uuid.UUID(e["event_id"]) for e in events],))
                    conn.commit()
                    self.written += events
                    time.sleep(PAUSE)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def emit(conn: Any, aggregate: str, aggregate_id: int, type_: str, payload: dict[str, Any]) -> dict[str, Any]:
    event_id = str(uuid.uuid4())
    conn.execute(f"insert into {OUTBOX} values (%s, %s, %s, %s, %s)", (uuid.UUID(event_id), aggregate, str(aggregate_id), type_, json.dumps(payload)))
    return {"event_id": event_id, "aggregate_type": aggregate, "aggregate_id": str(aggregate_id), "event_type": type_,
            "payload": json.dumps(payload, sort_keys=True, separators=(",", ":"))}


def landed(query: Any, cfg: Any, table: str) -> list[dict[str, Any]]:
    return query(cfg, f"SELECT event_id, aggregate_type, aggregate_id, event_type, payload FROM {table} "
                      "ORDER BY aggregate_id, source_position, source_order, ingested_at, arrival")


def expected(written: list[dict[str, Any]], aggregate: str) -> list[dict[str, Any]]:
    """What the workload wrote of one aggregate type, in its order per aggregate (commit order within one)."""
    mine = [e for e in written if e["aggregate_type"] == aggregate]
    return sorted(mine, key=lambda e: e["aggregate_id"])  # a stable sort keeps commit order within an aggregate


def test_outbox_events_land_once_in_order_through_both_inputs(testbed: Stack, spark: Any, tmp_path: Path, query) -> None:  # noqa: ANN001
    bed = testbed
    with bed.postgres.connect() as conn:
        conn.execute(f"create table {ORDERS} (id int primary key, total numeric(12,2))")
        conn.execute(f"create table {PAYMENTS} (id int primary key, order_id int, amount numeric(12,2))")
        conn.execute(f"create table {OUTBOX} (id uuid primary key, aggregatetype varchar(255) not null, aggregateid varchar(255) not null, "
                     "type varchar(255) not null, payload jsonb)")
    tables = bed.postgres_connector(PREFIX, [f"public.{ORDERS}", f"public.{PAYMENTS}", f"public.{OUTBOX}"])
    router = bed.postgres_connector(ROUTER, [f"public.{OUTBOX}"], provide_transaction_metadata="false", **{
        "transforms": "outbox", "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
        "transforms.outbox.route.topic.replacement": "ob.event.${routedByValue}",
        "transforms.outbox.table.fields.additional.placement": "type:header:eventType"})
    kafka = {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap}
    table_doc = {"lake": "lake", "transaction_timeout": 3600, "source": {**kafka, "subscribe_pattern": rf"{PREFIX}\..*"},
                 "outbox": {"table": f"public.{OUTBOX}", "expectations": EXPECTATIONS}}
    routed_doc = {"lake": "lake", "source": {**kafka, "topics": ["ob.event.order", "ob.event.payment"]},
                  "outbox": {"topics": ["ob.event.order", "ob.event.payment"]}}
    for name, doc in (("table", table_doc), ("routed", routed_doc)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cdc.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    cfg, routed_cfg = load_config(tmp_path / "table" / "cdc.yaml"), load_config(tmp_path / "routed" / "cdc.yaml")

    bed.connect.register(PREFIX, tables)
    bed.connect.register(ROUTER, router)
    stream = None
    written: list[dict[str, Any]] = []
    try:
        bed.wait_streaming(tables)
        bed.wait_streaming(router)
        stream = Streaming(spark, cfg)
        first = Service(bed, 1, CALLS)
        first.thread.start()
        time.sleep(CALLS * PAUSE / 2)
        bed.restart("connect", kill=True)  # the connectors replay from their last committed offsets: records arrive twice
        first.thread.join(timeout=120)
        assert first.error is None, first.error
        written += first.written

        def all_landed() -> bool:
            rows = rows_once_set_up(query, cfg, "SELECT count(*) AS n FROM order_events")
            return rows is not None and rows[0]["n"] == sum(e["aggregate_type"] == "order" for e in written)

        stream.wait("every order event landed", all_landed, timeout=300)
        # A restart on a lost checkpoint: every record of the topics is read again, and nothing lands twice.
        stream.stop()
        for checkpoint in (cfg.checkpoint_dir, stage_queries.checkpoint_dir(cfg, "outbox")):
            shutil.rmtree(checkpoint)
        stream = Streaming(spark, cfg)
        more = Service(bed, 100, 3)
        more.run()
        assert more.error is None, more.error
        written += more.written
        stream.wait("the later events landed too", all_landed, timeout=300)
        stream.wait("the payments landed", lambda: len(landed(query, cfg, "payment_events")) == sum(e["aggregate_type"] == "payment" for e in written))

        for aggregate in ("order", "payment"):
            assert landed(query, cfg, f"{aggregate}_events") == expected(written, aggregate), aggregate
        assert query(cfg, "SELECT count(*) AS n FROM dead_letter")[0]["n"] == 0
        raw = query(cfg, f"SELECT count(*) AS n FROM raw_change_events WHERE table_id = 'public.{OUTBOX}' AND op = 'd'")[0]["n"]
        assert raw == len(written), "every outbox row's delete reached the raw log, and changed no event"
        latest = query(cfg, "SELECT aggregate_id, event_type FROM order_events__latest_view WHERE aggregate_id = '3'")
        assert latest == [{"aggregate_id": "3", "event_type": "order_paid"}]

        # The consistency check passes; then a transaction publishes an order it never makes.
        stream.wait("the transactions completed", lambda: query(cfg, "SELECT count(*) AS n FROM transactions")[0]["n"] >= CALLS + 3)
        outcome = outbox_consistency(spark, cfg)
        assert outcome.passed, outcome.description
        assert outcome.metadata["transactions_checked"] == CALLS + 3
        with bed.postgres.connect(autocommit=False) as conn:
            txid = str(conn.execute("select txid_current()").fetchone()[0])
            ghost = emit(conn, "order", 999, "order_created", {"id": 999})
            conn.execute(f"update {PAYMENTS} set amount = amount where id = 3")  # a business change, but not the expected one
            conn.commit()
        written.append(ghost)
        stream.wait("the ghost transaction completed",
                    lambda: query(cfg, f"SELECT count(*) AS n FROM transactions WHERE transaction_id = '{txid}'")[0]["n"] == 1)
        stream.wait("the ghost event landed", all_landed)
        outcome = outbox_consistency(spark, cfg)
        assert not outcome.passed
        assert f"transaction {txid}" in outcome.description
        assert outcome.metadata["failing_transactions"] == [{"transaction_id": txid, "events": [ghost["event_id"]], "missing": [f"public.{ORDERS}"]}]
        stream.stop()
        stream = None

        # The routed input, in a lake of its own: the same tables, whatever the router re-sent.
        IngestJob(routed_cfg).run_available_now(spark)
        for checkpoint in (routed_cfg.checkpoint_dir, stage_queries.checkpoint_dir(routed_cfg, "outbox")):
            shutil.rmtree(checkpoint)
        IngestJob(routed_cfg).run_available_now(spark)  # a lost checkpoint: every routed record again
        for aggregate in ("order", "payment"):
            assert landed(query, routed_cfg, f"{aggregate}_events") == expected(written, aggregate), aggregate
            assert landed(query, routed_cfg, f"{aggregate}_events") == landed(query, cfg, f"{aggregate}_events"), aggregate
        assert query(routed_cfg, "SELECT count(*) AS n FROM dead_letter")[0]["n"] == 0
    finally:
        if stream is not None:
            stream.stop()
        for name in (PREFIX, ROUTER):
            bed.connect.delete(name)
        with bed.postgres.connect() as conn:
            for table in (OUTBOX, PAYMENTS, ORDERS):
                conn.execute(f"drop table if exists {table}")
            for name in (PREFIX, ROUTER):
                conn.execute(f"select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = '{name}_slot' and not active")
