"""End to end through Kafka: Debezium's PostgreSQL connector (JSON converter, transaction metadata on)
-> the test bed's broker -> `IngestJob` with `source: kafka` (a subscribe pattern that also covers the
transaction topic) -> the lake, compared with the database itself.

One scenario, in order, because each step builds on the lake of the one before:
1. snapshot (rows present when the connector starts), then multi-table transactions while the stream runs;
   every configured table's full view equals `SELECT *` of its source table, every transaction is in
   `transactions` exactly once with Debezium's per-table counts;
2. a table created while the stream runs gets a new topic, which the stream reads without a restart, and
   adding the table to the config onboards it without a restart (its past from the raw log, then what follows);
3. the stream stops and starts again on its checkpoint, more transactions run: nothing lands twice
   (one raw row per Kafka record, one `transactions` row per source transaction);
4. a lost checkpoint (everything read again from the earliest offsets) still lands nothing twice.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import uuid
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.run.ingest import IngestJob
from cdc_platform.testbed import Record, Stack, consume_all
from tests.testbed.streaming import Running

PREFIX = "e2e_pg"
CUSTOMERS = "e2e_customers"
ORDERS = "e2e_orders"
LATE = "e2e_late"  # created while the stream runs
UTC = dt.timezone.utc
T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)

DDL = [
    "create type e2e_status as enum ('new', 'paid', 'void')",
    f"""create table {CUSTOMERS} (id int primary key, name text not null, balance numeric(12,2), opened date,
        seen timestamptz, local_seen timestamp, active boolean, doc jsonb, ref uuid, bin_data bytea, note text)""",
    f"create table {ORDERS} (id bigint primary key, customer_id int, amount numeric(10,2), status e2e_status, placed timestamptz)",
    f"alter table {ORDERS} replica identity full",  # whole before images; customers keeps the default (the key only)
]
CUSTOMER_COLS = "id, name, balance, opened, seen, local_seen, active, doc, ref, bin_data, note"
INSERT_CUSTOMER = f"insert into {CUSTOMERS} ({CUSTOMER_COLS}) values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
INSERT_ORDER = f"insert into {ORDERS} (id, customer_id, amount, status, placed) values (%s, %s, %s, %s, %s)"


def customer(i: int, **changes: Any) -> tuple[Any, ...]:
    row = {
        "id": i, "name": f"c{i}", "balance": Decimal(f"{i * 10}.{i:02d}"), "opened": dt.date(2020, 1, i % 28 + 1),
        "seen": T0 + dt.timedelta(hours=i, microseconds=i), "local_seen": dt.datetime(2021, 2, 3, 4, 5, 6, i),
        "active": i % 2 == 0, "doc": f'{{"tier": {i}, "tags": ["a", "b"]}}', "ref": str(uuid.UUID(int=i)),
        "bin_data": bytes([i, 0, 255]), "note": None if i % 3 == 0 else f"note {i}",
    }
    row.update(changes)
    return tuple(row.values())


# Source transactions after the connector streams: lists of (sql, params), each run as one transaction.
WORKLOAD_1 = [
    [(INSERT_CUSTOMER, customer(4)), (INSERT_ORDER, (1, 4, Decimal("12.50"), "new", T0)), (INSERT_ORDER, (2, 1, Decimal("0.01"), "new", T0))],
    [(f"update {CUSTOMERS} set balance = balance - 12.50, note = null, doc = %s where id = %s", ('{"x": null}', 4)),
     (f"update {ORDERS} set status = 'paid' where id = %s", (1,))],
    [(f"delete from {ORDERS} where id = %s", (2,)), (f"delete from {CUSTOMERS} where id = %s", (2,))],
    [(f"update {CUSTOMERS} set id = 50 where id = %s", (3,)),  # a primary-key change: delete of 3, create of 50
     (INSERT_ORDER, (3, 50, Decimal("-7.00"), "void", None))],
    [(INSERT_CUSTOMER, customer(5, seen=None, local_seen=None, active=None, doc=None, ref=None, bin_data=None, balance=None, opened=None))],
]
WORKLOAD_2 = [
    [(INSERT_CUSTOMER, customer(6)), (f"update {ORDERS} set amount = amount + 1 where id = %s", (1,))],
    [(f"delete from {CUSTOMERS} where id = %s", (1,)), (INSERT_ORDER, (4, 6, Decimal("99.99"), "new", T0 + dt.timedelta(days=1)))],
    # Schema changes mid-stream: a column added, and a decimal widened past what the lake's column holds.
    [(f"alter table {CUSTOMERS} add column loyalty int", ()), (f"update {CUSTOMERS} set loyalty = 7 where id = %s", (6,))],
    [(f"alter table {ORDERS} alter column amount type numeric(14,2)", ()),
     (INSERT_ORDER, (5, 6, Decimal("123456789012.34"), "paid", T0)), (f"update {ORDERS} set amount = amount * 10000000 where id = %s", (4,))],
]


def run(bed: Stack, statements: list[tuple[str, Any]]) -> None:
    with bed.postgres.connect(autocommit=False) as conn:
        for sql, params in statements:
            conn.execute(sql, params)
        conn.commit()


def source_rows(bed: Stack, table: str) -> list[tuple[Any, ...]]:
    """SELECT * of a source table, ordered by key; timestamps as epoch microseconds, json/uuid/enum as text."""
    if table == CUSTOMERS:
        sql = (f"select id, name, balance, opened, (extract(epoch from seen) * 1000000)::bigint, "
               f"(extract(epoch from local_seen) * 1000000)::bigint, active, doc::text, ref::text, bin_data, note from {table} order by id")
    else:
        sql = f"select id, customer_id, amount, status::text, (extract(epoch from placed) * 1000000)::bigint from {table} order by id"
    with bed.postgres.connect() as conn:
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in conn.execute(sql).fetchall()]


def source_select(bed: Stack, sql: str) -> list[tuple[Any, ...]]:
    with bed.postgres.connect() as conn:
        return [tuple(row) for row in conn.execute(sql).fetchall()]


def lake_rows(query: Callable[..., list[dict[str, Any]]], cfg: PlatformConfig, table: str, view: str = "full_view") -> list[tuple[Any, ...]]:
    if table == CUSTOMERS:
        sql = (f"select id, name, balance, opened, unix_micros(seen), unix_micros(local_seen), active, doc, ref, bin_data, note "
               f"from {table}__{view} order by id")
    else:
        sql = f"select id, customer_id, amount, status, unix_micros(placed) from {table}__{view} order by id"
    return [tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in r.values()) for r in query(cfg, sql)]


def all_records(bed: Stack) -> list[Record]:
    """Every record the connector's topics hold now."""
    return consume_all(bed.broker.bootstrap, [f"{PREFIX}.public.{t}" for t in (CUSTOMERS, ORDERS, LATE)] + [f"{PREFIX}.transaction"])


def ends(records: list[Record]) -> int:
    return sum(1 for r in records if r.topic == f"{PREFIX}.transaction" and r.json_value()["payload"]["status"] == "END")


def test_debezium_postgres_through_kafka_equals_the_database(testbed: Stack, spark: Any, tmp_path: Path, query) -> None:  # noqa: ANN001
    bed = testbed
    with bed.postgres.connect() as conn:
        for ddl in DDL:
            conn.execute(ddl)
    run(bed, [(INSERT_CUSTOMER, customer(i)) for i in (1, 2, 3)])  # read by the snapshot
    # FOR ALL TABLES (needs the superuser), so a table created later is published too; the include list is a regex.
    connector = bed.postgres_connector(PREFIX, [r"public\.e2e_.*"], publication_autocreate_mode="all_tables",
                                       database_user="postgres", database_password="postgres",
                                       skipped_operations="none")  # Debezium skips truncates unless told otherwise
    bed.connect.register(PREFIX, connector)
    doc = {
        "lake": "lake",
        "source": {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "subscribe_pattern": rf"{PREFIX}\..*",
                   "max_offsets_per_trigger": 50},
        "tables": {f"public.{CUSTOMERS}": {"key": ["id"]}, f"public.{ORDERS}": {"key": ["id"]}},
    }
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    cfg = load_config(tmp_path / "cdc.yaml")

    def matches() -> bool:
        from pyspark.errors import AnalysisException

        try:
            return all(lake_rows(query, cfg, t) == source_rows(bed, t) for t in (CUSTOMERS, ORDERS))
        except AnalysisException:  # before a table's first change lands its view has no source columns yet
            return False

    def late_rows() -> list[tuple[Any, ...]] | None:
        from pyspark.errors import AnalysisException

        try:
            return [(r["id"], r["v"]) for r in query(cfg, f"select id, v from {LATE}__full_view order by id")]
        except AnalysisException:  # not onboarded yet: no such view
            return None

    def tx_count() -> int:
        return query(cfg, "select count(*) as n from transactions")[0]["n"]

    try:
        bed.wait_streaming(connector)
        stream = Running(spark, cfg)
        try:
            for tx in WORKLOAD_1:
                run(bed, tx)
            stream.wait("full views equal the source tables", lambda: matches() and tx_count() >= len(WORKLOAD_1))
            # Every transaction settled: the consistent views, which type the raw log's images themselves, show the same.
            assert all(lake_rows(query, cfg, t, "consistent_view") == source_rows(bed, t) for t in (CUSTOMERS, ORDERS))

            # 2. A table created while the stream runs: a new topic matching the pattern, read without a restart.
            with bed.postgres.connect() as conn:
                conn.execute(f"create table {LATE} (id int primary key, v text)")
            run(bed, [(f"insert into {LATE} values (%s, %s)", (1, "late"))])
            late_topic = f"{PREFIX}.public.{LATE}"
            stream.wait("the late table's topic reaches the raw log", lambda: query(
                cfg, f"select count(*) as n from raw_change_events where kafka_topic = '{late_topic}'")[0]["n"] == 1)

            # ... and is onboarded by adding it to the config, without a restart: its past from the raw log, then what follows.
            doc["tables"][f"public.{LATE}"] = {"key": ["id"]}
            (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
            run(bed, [(f"insert into {LATE} values (%s, %s)", (2, "after onboarding")), (f"update {LATE} set v = %s where id = %s", ("late v2", 1))])
            stream.wait("the late table is onboarded and kept", lambda: late_rows() == [(1, "late v2"), (2, "after onboarding")])
        finally:
            stream.stop()
        first_txs = len(WORKLOAD_1) + 2

        # 3. Restart on the same checkpoint; more transactions, some while it was down.
        run(bed, WORKLOAD_2[0])
        cfg = load_config(tmp_path / "cdc.yaml")  # as `cdc stream` does at its start: the late table is configured now
        stream = Running(spark, cfg)
        try:
            for tx in WORKLOAD_2[1:]:
                run(bed, tx)
            expected_txs = first_txs + len(WORKLOAD_2)
            stream.wait("the lake catches up after the restart", lambda: matches() and tx_count() >= expected_txs)
            assert all(lake_rows(query, cfg, t, "consistent_view") == source_rows(bed, t) for t in (CUSTOMERS, ORDERS))
            # The added column, value for value (NULL where no change has carried it since), and the late table truncated.
            loyalty = f"select id, loyalty from {CUSTOMERS}"
            assert [tuple(r.values()) for r in query(cfg, loyalty + "__full_view order by id")] == source_select(bed, loyalty + " order by id")
            assert [r[0] for r in source_select(bed, f"select id from {ORDERS} where amount > 99999999.99 order by id")] == [4, 5], "past numeric(10,2)"
            run(bed, [(f"truncate {LATE}", ()), (f"insert into {LATE} values (%s, %s)", (3, "after truncate"))])
            stream.wait("the truncate reaches the late table", lambda: late_rows() == [(3, "after truncate")])
            stream.wait("... and its consistent view", lambda: [(r["id"], r["v"]) for r in query(
                cfg, f"select id, v from {LATE}__consistent_view order by id")] == [(3, "after truncate")])
        finally:
            stream.stop()
        expected_txs += 1

        # Not a comparison of two empty tables: snapshot rows, updates, deletes, the key change and NULLs are in.
        assert [r[0] for r in source_rows(bed, CUSTOMERS)] == [4, 5, 6, 50] and [r[0] for r in source_rows(bed, ORDERS)] == [1, 3, 4, 5]
        assert source_rows(bed, CUSTOMERS)[1][2:10] == (None,) * 8

        records = all_records(bed)
        changes = {(r.topic, r.partition, r.offset) for r in records if r.value is not None and not r.topic.endswith(".transaction")}
        raw = query(cfg, "select event_id, kafka_topic, kafka_partition, kafka_offset, transaction_id, table_id, source_file "
                         "from raw_change_events")
        origins = [(r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]) for r in raw]
        assert len(origins) == len(set(origins)) == len({r["event_id"] for r in raw}), "one raw row per Kafka record"
        assert set(origins) == changes, "every change record of every topic, and nothing else"
        assert all(r["source_file"] == f"kafka:{r['kafka_topic']}/{r['kafka_partition']}@{r['kafka_offset']}" for r in raw)

        txs = query(cfg, "select transaction_id, event_count, events_per_table from transactions")
        assert len(txs) == len({t["transaction_id"] for t in txs}) == expected_txs == ends(records), "each transaction once"
        in_raw: dict[str, dict[str, int]] = {}
        for r in raw:
            if r["transaction_id"] is not None:
                per = in_raw.setdefault(r["transaction_id"], {})
                per[r["table_id"]] = per.get(r["table_id"], 0) + 1
        assert {t["transaction_id"]: dict(t["events_per_table"]) for t in txs} == in_raw, "Debezium's per-table counts, all landed"
        markers = {r.json_value()["payload"]["id"].split(":")[0]: r.json_value()["payload"] for r in records
                   if r.topic.endswith(".transaction") and r.json_value()["payload"]["status"] == "END"}
        for t in txs:
            end = markers[t["transaction_id"]]
            assert t["event_count"] == end["event_count"]
            assert dict(t["events_per_table"]) == {c["data_collection"]: c["event_count"] for c in end["data_collections"]}
        assert query(cfg, "select count(*) as n from incomplete_transactions")[0]["n"] == 0
        # REPLICA IDENTITY FULL (orders) sends whole before images, the default (customers) the key alone; both land.
        befores = {r["table_id"]: json.loads(r["before"]) for r in query(cfg, "select table_id, before from raw_change_events where op = 'd'")
                   if r["table_id"] in (f"public.{CUSTOMERS}", f"public.{ORDERS}")}
        assert befores[f"public.{ORDERS}"]["status"] == "new" and befores[f"public.{ORDERS}"]["amount"] is not None
        # (Debezium fills a NOT NULL column it was not sent with its type's default, `name` = ''; a nullable one stays null.)
        assert befores[f"public.{CUSTOMERS}"]["id"] is not None and befores[f"public.{CUSTOMERS}"]["balance"] is None
        assert query(cfg, "select reason_code, reason from dead_letter") == []

        # 4. A lost checkpoint: everything is read again, nothing lands twice.
        before = {t: query(cfg, f"select count(*) as n from {t}")[0]["n"] for t in ("raw_change_events", "transaction_markers", "transactions")}
        shutil.rmtree(cfg.checkpoint_dir)
        report = IngestJob(cfg).run_available_now(spark)
        assert report.total("rows_read") >= len(records), "the whole topics were read again"
        after = {t: query(cfg, f"select count(*) as n from {t}")[0]["n"] for t in before}
        assert after == before
        assert matches()
    finally:
        bed.connect.delete(PREFIX)
        with bed.postgres.connect() as conn:
            for table in (LATE, ORDERS, CUSTOMERS):
                conn.execute(f"drop table if exists {table}")
            conn.execute("drop type if exists e2e_status")
            conn.execute(f"select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = '{PREFIX}_slot' and not active")
