"""Smoke tests of the real test bed: Debezium's PostgreSQL and MariaDB connectors capture a table through
Kafka Connect into a real Kafka broker, with transaction metadata, and the file pipeline lands what they
emitted (the bridge until the platform reads Kafka itself).

Per database, one module-scoped capture: a table with a few column types and three rows (snapshot), the
connector started and streaming, then two multi-statement transactions; the topics are read back with a
Kafka consumer. The tests check that capture and then feed it to `IngestJob` as JSON lines."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.parse.envelope import normalise_transaction_id
from cdc_platform.testbed import Record, Stack, consume

UTC = dt.timezone.utc
SEEN = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)

# Rows present before the connector starts (they arrive as snapshot reads, op r).
INITIAL = [
    (1, "ann", Decimal("10.50"), dt.date(2024, 1, 1), SEEN, True, '{"tier": "gold"}', b"\x00\x01", "first"),
    (2, "bob", Decimal("-3.25"), dt.date(1999, 12, 31), SEEN + dt.timedelta(days=1), False, '{"tier": null}', b"", None),
    (3, "cy", Decimal("0.00"), dt.date(2000, 2, 29), SEEN - dt.timedelta(days=400), True, "[1, 2, 3]", b"\xff", "third"),
]
# Two transactions after the connector streams: (statement, params) lists, and the ops Debezium emits.
TX_A = [
    ("insert into {t} values (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
     (4, "dee", Decimal("7.00"), dt.date(2024, 3, 1), SEEN, False, '{"a": [1, {"b": 2}]}', b"\x10\x20", "fourth")),
    ("insert into {t} values (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
     (5, "eve", Decimal("123456.78"), dt.date(2024, 3, 2), SEEN, True, "{}", b"abc", "fifth")),
    ("update {t} set balance = balance + 1, name = %s where id = %s", ("ann v2", 1)),
    ("delete from {t} where id = %s", (2,)),
    ("update {t} set note = null where id = %s", (5,)),
]
TX_A_OPS = ["c", "c", "u", "d", "u"]
TX_B = [
    ("update {t} set active = %s, seen = %s where id = %s", (False, SEEN + dt.timedelta(microseconds=1), 3)),
    ("delete from {t} where id = %s", (4,)),
]
TX_B_OPS = ["u", "d"]
COLUMNS = "id, name, balance, opened, seen, active, doc, bin_data, note"


@dataclass
class Source:
    """One database of the bed, seen the same way by the tests."""

    kind: str
    bed: Stack
    table: str  # table name in the database
    table_id: str  # as the connector names it: schema.table (PostgreSQL) or db.table (MariaDB)
    prefix: str  # topic prefix

    @property
    def topic(self) -> str:
        return f"{self.prefix}.{self.table_id}"

    @property
    def tx_topic(self) -> str:
        return f"{self.prefix}.transaction"

    def ddl(self) -> str:
        if self.kind == "postgres":
            return (f"create table {self.table} (id int primary key, name text not null, balance numeric(12,2), "
                    "opened date, seen timestamptz, active boolean, doc jsonb, bin_data bytea, note text)")
        return (f"create table {self.table} (id int primary key, name varchar(40) not null, balance decimal(12,2), "
                "opened date, seen datetime(6), active boolean, doc json, bin_data blob, note text)")

    def _param(self, value: Any) -> Any:
        # MariaDB's DATETIME has no zone: the bed runs it in UTC and Debezium reads it as UTC.
        if self.kind == "mariadb" and isinstance(value, dt.datetime):
            return value.astimezone(UTC).replace(tzinfo=None)
        return value

    def transaction(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Run the statements as one transaction."""
        if self.kind == "postgres":
            with self.bed.postgres.connect(autocommit=False) as conn:
                for sql, params in statements:
                    conn.execute(sql.format(t=self.table), params)
                conn.commit()
            return
        conn = self.bed.mariadb.connect(autocommit=False)
        try:
            with conn.cursor() as cur:
                for sql, params in statements:
                    cur.execute(sql.format(t=self.table), tuple(self._param(p) for p in params))
            conn.commit()
        finally:
            conn.close()

    def execute(self, sql: str) -> None:
        self.transaction([(sql, ())])

    def rows(self) -> list[tuple[Any, ...]]:
        """SELECT * of the source table, timestamps as UTC epoch microseconds, JSON as text."""
        if self.kind == "postgres":
            sql = (f"select id, name, balance, opened, (extract(epoch from seen) * 1000000)::bigint, active, "
                   f"doc::text, bin_data, note from {self.table} order by id")
            with self.bed.postgres.connect() as conn:
                return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in conn.execute(sql).fetchall()]
        sql = (f"select id, name, balance, opened, timestampdiff(microsecond, '1970-01-01', seen), active, doc, bin_data, note "
               f"from {self.table} order by id")
        with self.bed.mariadb.connect() as conn, conn.cursor() as cur:
            cur.execute(sql)
            return [tuple(row) for row in cur.fetchall()]

    def connector(self) -> dict[str, Any]:
        if self.kind == "postgres":
            return self.bed.postgres_connector(self.prefix, [self.table_id])
        return self.bed.mariadb_connector(self.prefix, [self.table_id])


@dataclass
class Capture:
    source: Source
    records: list[Record]
    source_rows: list[tuple[Any, ...]]

    def changes(self) -> list[dict[str, Any]]:
        """Payloads of the change events (not tombstones), in topic order."""
        return [r.json_value()["payload"] for r in self.records if r.topic == self.source.topic and r.value is not None]

    def markers(self) -> list[dict[str, Any]]:
        return [r.json_value()["payload"] for r in self.records if r.topic == self.source.tx_topic]


def _tx_id(change: dict[str, Any]) -> str | None:
    tx = change.get("transaction")
    return None if tx is None else normalise_transaction_id(tx["id"])


def _done(source: Source) -> Callable[[list[Record]], bool]:
    expected_changes = len(INITIAL) + len(TX_A) + len(TX_B)

    expected_tombstones = sum(op == "d" for op in TX_A_OPS + TX_B_OPS)

    def done(records: list[Record]) -> bool:
        # Every kind counted: the last delete's tombstone may arrive after the last END marker, which
        # travels on another topic.
        changes = [r for r in records if r.topic == source.topic and r.value is not None]
        tombstones = [r for r in records if r.topic == source.topic and r.value is None]
        ends = [r for r in records if r.topic == source.tx_topic and r.json_value()["payload"]["status"] == "END"]
        return len(changes) >= expected_changes and len(tombstones) >= expected_tombstones and len(ends) >= 2

    return done


@pytest.fixture(scope="module", params=["postgres", "mariadb"])
def capture(request: pytest.FixtureRequest, testbed: Stack) -> Iterator[Capture]:
    kind = request.param
    prefix = f"smoke_{kind}"
    source = Source(kind, testbed, "accounts", f"{'public' if kind == 'postgres' else 'cdc'}.accounts", prefix)
    source.execute(source.ddl())
    source.transaction([(f"insert into {{t}} ({COLUMNS}) values (%s, %s, %s, %s, %s, %s, %s, %s, %s)", row) for row in INITIAL])
    config = source.connector()
    testbed.connect.register(prefix, config)
    try:
        testbed.wait_streaming(config)
        source.transaction(TX_A)
        source.transaction(TX_B)
        records = consume(testbed.broker.bootstrap, [source.topic, source.tx_topic], until=_done(source), timeout=90)
        yield Capture(source, records, source.rows())
    finally:
        testbed.connect.delete(prefix)
        source.execute(f"drop table {source.table}")


def test_change_events_carry_schema_and_arrive_in_order(capture: Capture) -> None:
    for record in capture.records:
        if record.value is not None:
            envelope = record.json_value()
            assert set(envelope) == {"schema", "payload"}, "JSON converter with schemas.enable=true"
        assert set(record.json_key()) == {"schema", "payload"}
    changes = capture.changes()
    assert [c["op"] for c in changes] == ["r"] * len(INITIAL) + TX_A_OPS + TX_B_OPS
    snapshot, streamed = changes[: len(INITIAL)], changes[len(INITIAL):]
    assert sorted(c["after"]["id"] for c in snapshot) == [1, 2, 3]
    assert all(c["source"]["snapshot"] != "false" and c["transaction"] is None for c in snapshot)
    assert all(c["source"]["snapshot"] == "false" for c in streamed)
    assert {c["source"]["connector"] for c in changes} == {"postgresql" if capture.source.kind == "postgres" else "mariadb"}
    if capture.source.kind == "postgres":
        lsns = [c["source"]["lsn"] for c in streamed]
        assert lsns == sorted(lsns) and len(set(lsns)) == len(lsns), "LSNs increase within and across transactions"
    else:
        positions = [(c["source"]["file"], c["source"]["pos"], c["source"]["row"]) for c in streamed]
        assert positions == sorted(positions), "binlog file/pos/row increase"
        assert all(c["source"]["gtid"] for c in streamed), "MariaDB GTIDs on every streamed event"


def test_every_delete_is_followed_by_a_tombstone(capture: Capture) -> None:
    on_topic = [r for r in capture.records if r.topic == capture.source.topic]
    deletes = [i for i, r in enumerate(on_topic) if r.value is not None and r.json_value()["payload"]["op"] == "d"]
    assert len(deletes) == 2
    for i in deletes:
        tombstone = on_topic[i + 1]
        assert tombstone.value is None and tombstone.json_key() == on_topic[i].json_key()


def test_transaction_markers_match_the_transactions(capture: Capture) -> None:
    changes = capture.changes()[len(INITIAL):]
    tx_ids = list(dict.fromkeys(_tx_id(c) for c in changes))
    assert len(tx_ids) == 2 and None not in tx_ids, "two source transactions, every streamed event in one"
    table = capture.source.table_id
    for tx_id, ops in zip(tx_ids, (TX_A_OPS, TX_B_OPS)):
        events = [c for c in changes if _tx_id(c) == tx_id]
        assert [c["op"] for c in events] == ops
        assert [c["transaction"]["total_order"] for c in events] == list(range(1, len(ops) + 1))
        assert [c["transaction"]["data_collection_order"] for c in events] == list(range(1, len(ops) + 1))
        markers = [m for m in capture.markers() if normalise_transaction_id(m["id"]) == tx_id]
        assert [m["status"] for m in markers] == ["BEGIN", "END"], "one BEGIN, then one END, per transaction"
        end = markers[1]
        assert end["event_count"] == len(ops)
        assert end["data_collections"] == [{"data_collection": table, "event_count": len(ops)}]


def _land(capture: Capture, cfg: Any, land: Callable[..., Path], run_pipeline: Callable[[Any], Any]) -> Any:
    for topic in (capture.source.topic, capture.source.tx_topic):
        lines = [r.dump_line() for r in capture.records if r.topic == topic]
        land(f"{topic}/part-00000.jsonl", lines)
    return run_pipeline(cfg)


def test_captured_output_lands_and_the_full_view_equals_the_source_table(
    capture: Capture, tmp_path: Path, make_config, land, run_pipeline, query  # noqa: ANN001
) -> None:
    """The bridge: the connector's real records, dumped as {"key", "value"} lines one folder per topic
    (as a sink connector writes them), go through `cdc run`'s IngestJob; the full view must be the
    source table, value for value."""
    source = capture.source
    name = f"accounts_{source.kind}"
    cfg = make_config({source.table_id: {"key": ["id"], "name": name}})
    report = _land(capture, cfg, land, run_pipeline)
    assert report.batches, "the run read the landing"
    dead = query(cfg, "SELECT reason_code, reason FROM dead_letter")
    assert dead == [], f"nothing dead-lettered: {dead}"
    view = query(cfg, f"SELECT id, name, balance, opened, unix_micros(seen) AS seen, active, doc, bin_data, note "
                      f"FROM {name}__full_view ORDER BY id")
    got = [tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in row.values()) for row in view]
    assert got == capture.source_rows
    # Both transactions are complete in the lake, with the connector's per-table counts.
    txs = query(cfg, "SELECT * FROM transactions")
    assert len(txs) == 2, txs
    assert sorted(t.get("event_count") for t in txs) == [len(TX_B_OPS), len(TX_A_OPS)]
    raw = query(cfg, f"SELECT op, position_kind FROM raw_change_events WHERE table_id = '{source.table_id}'")
    assert len(raw) == len(INITIAL) + len(TX_A_OPS) + len(TX_B_OPS)
    expected_kind = "pg_lsn" if source.kind == "postgres" else "mysql_binlog"
    assert {r["position_kind"] for r in raw} == {expected_kind}


def test_coverage_against_the_live_source_names_a_lost_row_and_a_lagging_one(
    capture: Capture, make_config, land, run_pipeline, spark: Any  # noqa: ANN001
) -> None:
    """Coverage against the database itself (`source_connection`): the captured lake equals the source
    table; a row the lake loses on purpose is named as missing, and a source change the lake never
    receives is named as different, still after the recheck."""
    from cdc_platform.sources.source_connection import parse_source_connection
    from cdc_platform.checks.source_coverage import source_coverage
    from cdc_platform.testbed.databases import DATABASE

    source = capture.source
    name = f"live_{source.kind}"
    cfg = make_config({source.table_id: {"key": ["id"], "name": name}})
    _land(capture, cfg, land, run_pipeline)
    server = source.bed.postgres if source.kind == "postgres" else source.bed.mariadb
    connection = parse_source_connection(
        {"kind": "postgresql" if source.kind == "postgres" else "mariadb", "host": "127.0.0.1", "port": server.port,
         "database": DATABASE, "user": "${SRC_USER}", "password": "${SRC_PASSWORD}", "recheck_after": 0.5},
        "test", environ={"SRC_USER": "cdc", "SRC_PASSWORD": "cdc"})
    assert connection is not None
    table = cfg.table(name)
    slept: list[float] = []

    first = source_coverage(spark, cfg.lake, table, connection, sleep=slept.append)
    assert first.passed, first.description
    assert first.metadata["matched"] == len(capture.source_rows) == first.metadata["source_rows"]
    assert first.metadata["live_coverage_percent"] == 100.0 and slept == [], "nothing to recheck"

    # The lake loses key 3 (every stored version of it), and the source changes key 1 behind the lake's back.
    spark.sql(f"DELETE FROM delta.`{cfg.lake / name}` WHERE id = 3")
    source.transaction([("update {t} set name = %s where id = %s", ("ann v3", 1))])
    lost = source_coverage(spark, cfg.lake, table, connection, sleep=slept.append)
    assert not lost.passed
    assert slept == [0.5], "the differing keys were read again after recheck_after"
    assert lost.metadata["missing_in_lake"] == 1 and lost.metadata["different_values"] == 1, lost.metadata
    assert lost.metadata["live_mismatched_keys"] == {"missing_in_lake": ['{"id": 3}'], "different_values": ['{"id": 1}']}
    assert lost.metadata["different_columns"] == {"name": 1}
    assert lost.metadata["rechecked_keys"] == 2
    assert '{"id": 3}' in lost.description and "cdc rebuild" in lost.description
    expected_kind = 20 if source.kind == "postgres" else 40
    assert len(lost.metadata["source_position"]) == expected_kind, "the read's position is in the lake's format"
