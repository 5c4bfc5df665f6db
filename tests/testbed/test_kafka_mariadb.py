"""End to end through Kafka on MariaDB: Debezium's MariaDB connector (binlog positions file/pos/row,
GTID transaction ids, transaction metadata on) -> the broker -> `IngestJob` with `source: kafka` -> the
lake, compared with the database itself: snapshot rows, then multi-table transactions with inserts,
updates, deletes, a primary-key change, NULLs and MariaDB's types; every full view equals `SELECT *`,
every transaction is in `transactions` once with Debezium's per-table counts, and coverage against the
live source passes."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.config import load_config
from cdc_platform.testbed import Stack, consume_all
from cdc_platform.testbed.databases import DATABASE, PASSWORD, USER
from tests.testbed.streaming import Running

PREFIX = "e2e_maria"
CUSTOMERS = "m_customers"
ORDERS = "m_orders"
T0 = dt.datetime(2024, 5, 6, 7, 8, 9, 123456)

DDL = [
    f"""create table {CUSTOMERS} (id int primary key, name varchar(40) not null, balance decimal(12,2), opened date,
        seen timestamp(6) null, local_seen datetime(6), active boolean, doc json, bin_data blob, note text)""",
    f"create table {ORDERS} (id bigint primary key, customer_id int, amount decimal(10,2), status enum('new','paid','void'), placed datetime(6))",
]
CUSTOMER_COLS = "id, name, balance, opened, seen, local_seen, active, doc, bin_data, note"
INSERT_CUSTOMER = f"insert into {CUSTOMERS} ({CUSTOMER_COLS}) values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
INSERT_ORDER = f"insert into {ORDERS} (id, customer_id, amount, status, placed) values (%s, %s, %s, %s, %s)"


def customer(i: int, **changes: Any) -> tuple[Any, ...]:
    row = {
        "id": i, "name": f"c{i}", "balance": Decimal(f"{i * 10}.{i:02d}"), "opened": dt.date(2020, 1, i % 28 + 1),
        "seen": T0 + dt.timedelta(hours=i, microseconds=i), "local_seen": dt.datetime(2021, 2, 3, 4, 5, 6, i),
        "active": i % 2 == 0, "doc": f'{{"tier": {i}, "tags": ["a", "b"]}}', "bin_data": bytes([i, 0, 255]),
        "note": None if i % 3 == 0 else f"note {i}",
    }
    row.update(changes)
    return tuple(row.values())


WORKLOAD = [
    [(INSERT_CUSTOMER, customer(4)), (INSERT_ORDER, (1, 4, Decimal("12.50"), "new", T0)), (INSERT_ORDER, (2, 1, Decimal("0.01"), "new", T0))],
    [(f"update {CUSTOMERS} set balance = balance - 12.50, note = null, doc = %s where id = %s", ('{"x": null}', 4)),
     (f"update {ORDERS} set status = 'paid' where id = %s", (1,))],
    [(f"delete from {ORDERS} where id = %s", (2,)), (f"delete from {CUSTOMERS} where id = %s", (2,))],
    [(f"update {CUSTOMERS} set id = 50 where id = %s", (3,)), (INSERT_ORDER, (3, 50, Decimal("-7.00"), "void", None))],
    [(INSERT_CUSTOMER, customer(5, seen=None, local_seen=None, active=None, doc=None, bin_data=None, balance=None, opened=None))],
]


def run(bed: Stack, statements: list[tuple[str, Any]]) -> None:
    conn = bed.mariadb.connect(autocommit=False)
    try:
        with conn.cursor() as cur:
            for sql, params in statements:
                cur.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def source_rows(bed: Stack, table: str) -> list[tuple[Any, ...]]:
    """SELECT * of a source table, ordered by key; timestamps as epoch microseconds (the bed runs in UTC)."""
    micros = "timestampdiff(microsecond, '1970-01-01', {})".format
    if table == CUSTOMERS:
        sql = (f"select id, name, balance, opened, {micros('seen')}, {micros('local_seen')}, active, doc, bin_data, note "
               f"from {table} order by id")
    else:
        sql = f"select id, customer_id, amount, status, {micros('placed')} from {table} order by id"
    with bed.mariadb.connect() as conn, conn.cursor() as cur:
        cur.execute(sql)
        return [tuple(row) for row in cur.fetchall()]


def lake_rows(query: Any, cfg: Any, table: str) -> list[tuple[Any, ...]]:
    if table == CUSTOMERS:
        sql = (f"select id, name, balance, opened, unix_micros(seen), unix_micros(local_seen), active, doc, bin_data, note "
               f"from {table}__full_view order by id")
    else:
        sql = f"select id, customer_id, amount, status, unix_micros(placed) from {table}__full_view order by id"
    return [tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in r.values()) for r in query(cfg, sql)]


def test_debezium_mariadb_through_kafka_equals_the_database(testbed: Stack, spark: Any, tmp_path: Path, query) -> None:  # noqa: ANN001
    from cdc_platform.sources.source_connection import SourceConnection
    from cdc_platform.checks.source_coverage import source_coverage

    bed = testbed
    for ddl in DDL:
        run(bed, [(ddl, ())])
    run(bed, [(INSERT_CUSTOMER, customer(i)) for i in (1, 2, 3)])  # read by the snapshot
    connector = bed.mariadb_connector(PREFIX, [f"{DATABASE}.{CUSTOMERS}", f"{DATABASE}.{ORDERS}"])
    doc = {
        "lake": "lake",
        "source": {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "subscribe_pattern": rf"{PREFIX}\.(cdc\..*|transaction)"},
        "tables": {f"{DATABASE}.{CUSTOMERS}": {"key": ["id"]}, f"{DATABASE}.{ORDERS}": {"key": ["id"]}},
    }
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    cfg = load_config(tmp_path / "cdc.yaml")

    def matches() -> bool:
        from pyspark.errors import AnalysisException

        try:
            return all(lake_rows(query, cfg, t) == source_rows(bed, t) for t in (CUSTOMERS, ORDERS))
        except AnalysisException:  # before a table's first change lands its view has no source columns yet
            return False

    bed.connect.register(PREFIX, connector)
    try:
        bed.wait_streaming(connector)
        stream = Running(spark, cfg)
        try:
            for tx in WORKLOAD:
                run(bed, tx)
            stream.wait("full views equal the source tables", lambda: matches() and query(
                cfg, "select count(*) as n from transactions")[0]["n"] >= len(WORKLOAD))
        finally:
            stream.stop()

        assert [r[0] for r in source_rows(bed, CUSTOMERS)] == [1, 4, 5, 50] and [r[0] for r in source_rows(bed, ORDERS)] == [1, 3]
        assert source_rows(bed, CUSTOMERS)[2][2:9] == (None,) * 7, "the NULLs are in the comparison"

        raw = query(cfg, "select table_id, position_kind, position, transaction_id, op from raw_change_events")
        assert {r["position_kind"] for r in raw} == {"mysql_binlog"}
        streamed = [r for r in raw if r["op"] != "r"]
        assert all(r["transaction_id"] and r["transaction_id"].count("-") == 2 for r in streamed), "MariaDB GTIDs: domain-server-sequence"
        records = consume_all(bed.broker.bootstrap, [f"{PREFIX}.transaction"])
        ends = {r.json_value()["payload"]["id"]: r.json_value()["payload"] for r in records if r.json_value()["payload"]["status"] == "END"}
        txs = query(cfg, "select transaction_id, event_count, events_per_table from transactions")
        assert len(txs) == len({t["transaction_id"] for t in txs}) == len(ends) == len(WORKLOAD), "each transaction once"
        for t in txs:
            end = ends[t["transaction_id"]]
            assert t["event_count"] == end["event_count"]
            assert dict(t["events_per_table"]) == {c["data_collection"]: c["event_count"] for c in end["data_collections"]}
        assert query(cfg, "select count(*) as n from incomplete_transactions")[0]["n"] == 0
        assert query(cfg, "select reason_code, reason from dead_letter") == []

        live = SourceConnection("mariadb", "127.0.0.1", bed.mariadb.port, DATABASE, USER, PASSWORD, recheck_after=0)
        for table in cfg.tables:
            outcome = source_coverage(spark, cfg.lake, table, live)
            assert outcome.passed and outcome.metadata["matched"] == outcome.metadata["source_rows"], outcome.description
    finally:
        bed.connect.delete(PREFIX)
        run(bed, [(f"drop table if exists {t}", ()) for t in (ORDERS, CUSTOMERS)])
