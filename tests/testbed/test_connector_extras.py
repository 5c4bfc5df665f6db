"""Issue 11 end to end: what the real Debezium connectors emit beyond row changes, through Kafka.

test_connector_events.py covers the same behaviours with hand-written events in the shapes Debezium
was seen to emit; these tests make the test bed's real connectors emit them, so a change in what a
connector sends (or in how the platform reads it off Kafka) shows up here:

* PostgreSQL: an UPDATE that leaves a TOAST-ed column unchanged (default REPLICA IDENTITY) arrives with
  Debezium's unavailable-value placeholder; the full and consistent views keep the previous value.
  Logical-decoding messages (transactional and not) land in the raw log as op m, and the transaction
  that carries one is complete. Heartbeats on a topic the subscribe pattern covers are counted, and
  are neither raw rows nor dead letters.
* MariaDB: the schema-change topic (named exactly the topic prefix) and the internal schema-history
  topic are covered by the pattern; an ALTER TABLE ADD COLUMN mid-stream gives schema-change records
  that are counted, not dead letters, and the full view follows the source with the new column.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.parse import control_records
from cdc_platform import lake
from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.testbed import Stack, consume_all
from cdc_platform.testbed.databases import DATABASE
from cdc_platform.stages.unavailable import PLACEHOLDER
from tests.testbed.streaming import Running

Rows = Callable[[str], list[dict[str, Any]]]

PG_PREFIX = "e2e_extra_pg"
TOAST = "x_toast"
HEARTBEAT_TOPIC = f"{PG_PREFIX}.heartbeat.{PG_PREFIX}"  # `topic.heartbeat.prefix` + "." + `topic.prefix`
MESSAGE_TOPIC = f"{PG_PREFIX}.message"
MARIA_PREFIX = "e2e_extra_mdb"
ITEMS = "mx_items"


def big_text(rng: random.Random) -> str:
    """8 KB of non-repeating text: with `storage external` PostgreSQL keeps it out of line, uncompressed."""
    return rng.randbytes(4_000).hex()


def lake_now(spark: Any, cfg: PlatformConfig) -> Rows:
    """SQL over the lake as it is now: registered (and pinned) once for several queries, which the
    `query` fixture would do per query (seconds each on a busy machine, while the stream competes)."""
    from cdc_platform.views import register_lake

    register_lake(spark, cfg.lake)
    return lambda sql: [r.asDict(recursive=True) for r in spark.sql(sql).collect()]


def raw_events(cfg: PlatformConfig) -> int:
    """Rows in the raw log, read with delta-rs (no Spark): the cheap gate before a wait's Spark queries,
    which on a busy machine take seconds each and would otherwise compete with the stream's first batch."""
    path = lake.table_path(cfg.lake, "raw_change_events")
    return lake.scan(lake.open_table(path), ["event_id"]).num_rows if lake.exists(path) else 0


def figure(sql: Rows, name: str) -> float:
    """A figure of the ingest's (`pipeline_metrics`) or a stage query's (`stage_progress`) `stage_figures`, summed over every batch so far."""
    table = "pipeline_metrics" if name.startswith("ingest.") else "stage_progress"
    return sum((r["stage_figures"] or {}).get(name, 0.0) for r in sql(f"select stage_figures from {table}"))


def rows_or_none(sql: Rows, text: str, columns: tuple[str, ...]) -> list[tuple[Any, ...]] | None:
    """The rows of `text` as tuples, or None while a view it reads is missing or lacks a column."""
    from pyspark.errors import AnalysisException

    try:
        return [tuple(r[c] for c in columns) for r in sql(text)]
    except AnalysisException:
        return None


def write_config(tmp_path: Path, doc: dict[str, Any]) -> PlatformConfig:
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    return load_config(tmp_path / "cdc.yaml")


# --- PostgreSQL: TOAST placeholders, logical-decoding messages, heartbeats ------------------------------

def pg_run(bed: Stack, statements: list[tuple[str, Any]]) -> None:
    with bed.postgres.connect(autocommit=False) as conn:
        for sql, params in statements:
            conn.execute(sql, params)
        conn.commit()


def pg_rows(bed: Stack) -> list[tuple[Any, ...]]:
    with bed.postgres.connect() as conn:
        return [tuple(r) for r in conn.execute(f"select id, small, big from {TOAST} order by id").fetchall()]


def test_postgres_toast_placeholders_messages_and_heartbeats(testbed: Stack, spark: Any, tmp_path: Path) -> None:
    bed = testbed
    rng = random.Random(11)
    with bed.postgres.connect() as conn:
        conn.execute(f"create table {TOAST} (id int primary key, small text, big text)")  # REPLICA IDENTITY DEFAULT
        conn.execute(f"alter table {TOAST} alter column big set storage external")  # out of line, never compressed inline
    pg_run(bed, [(f"insert into {TOAST} values (%s, %s, %s)", (i, f"s{i}", big_text(rng))) for i in (1, 2)])  # the snapshot's
    connector = bed.postgres_connector(PG_PREFIX, [rf"public\.{TOAST}"], **{
        "heartbeat.interval.ms": 500, "topic.heartbeat.prefix": f"{PG_PREFIX}.heartbeat"})
    cfg = write_config(tmp_path, {
        "lake": "lake",
        "source": {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "subscribe_pattern": rf"{PG_PREFIX}\..*"},
        "tables": {f"public.{TOAST}": {"key": ["id"]}},
    })

    def caught_up() -> bool:
        if raw_events(cfg) < 10:  # 2 snapshot reads, 6 row changes of the workload, 2 messages
            return False
        sql = lake_now(spark, cfg)
        views = [rows_or_none(sql, f"select id, small, big from {TOAST}__{v} order by id", ("id", "small", "big"))
                 for v in ("full_view", "consistent_view")]
        return (views == [source, source] and sql("select count(*) as n from transactions")[0]["n"] >= len(workload)
                and figure(sql, "ingest.heartbeats") > 0)

    workload = [
        # Unchanged `big` in both updates: the placeholder; the transaction also carries a message.
        [(f"update {TOAST} set small = small || '+' where id in (1, 2)", None),
         ("select pg_logical_emit_message(true, 'cdc-test', 'hello')", None)],
        [(f"insert into {TOAST} values (3, 's3', %s)", (big_text(rng),)),
         (f"update {TOAST} set small = 's3+' where id = 3", None)],  # placeholder after an insert in the same transaction
        [(f"update {TOAST} set big = %s where id = 2", (big_text(rng),))],  # a new value ...
        [(f"update {TOAST} set small = 'after' where id = 2", None)],  # ... which a later placeholder must keep
    ]
    try:
        bed.connect.register(PG_PREFIX, connector)
        bed.wait_streaming(connector)
        stream = Running(spark, cfg)
        try:
            pg_run(bed, workload[0])
            with bed.postgres.connect() as conn:  # non-transactional: written to the WAL at once, no transaction block
                conn.execute("select pg_logical_emit_message(false, 'cdc-test', 'ping')")
            for tx in workload[1:]:
                pg_run(bed, tx)
            source = pg_rows(bed)
            stream.wait("full and consistent views equal the source, heartbeats read", caught_up)
        finally:
            stream.stop()
        sql = lake_now(spark, cfg)

        assert [r[0] for r in source] == [1, 2, 3] and all(len(r[2]) == 8_000 for r in source)
        # The path is exercised: the connector really sent the placeholder for the unchanged column.
        sent = sql(f"select get_json_object(after, '$.id') as id, get_json_object(after, '$.big') as big "
                   f"from raw_change_events where table_id = 'public.{TOAST}' and op = 'u'")
        assert sorted(int(r["id"]) for r in sent if r["big"] == PLACEHOLDER) == [1, 2, 2, 3]
        stored = sql(f"select big from {TOAST}")  # the latest-state table itself, every layer
        assert stored and all(r["big"] is not None and PLACEHOLDER not in r["big"] for r in stored)
        assert (figure(sql, "latest_state.unavailable_filled"), figure(sql, "latest_state.unavailable_unresolved")) == (4, 0)

        messages = sql("select op, table_id, key, transaction_id, kafka_topic, position from raw_change_events "
                       f"where table_id = '{control_records.MESSAGES}'")
        assert sorted((m["op"], m["kafka_topic"], m["transaction_id"] is None) for m in messages) == [
            ("m", MESSAGE_TOPIC, False), ("m", MESSAGE_TOPIC, True)], "one transactional message, one not"
        assert all(m["key"] is None and m["position"] for m in messages)
        with_message = next(m["transaction_id"] for m in messages if m["transaction_id"] is not None)
        txs = {t["transaction_id"]: dict(t["events_per_table"])
               for t in sql("select transaction_id, events_per_table from transactions")}
        assert len(txs) == len(workload)
        assert txs[with_message] == {f"public.{TOAST}": 2, control_records.MESSAGES: 1}
        assert sql("select count(*) as n from incomplete_transactions")[0]["n"] == 0

        heartbeats = consume_all(bed.broker.bootstrap, [HEARTBEAT_TOPIC])
        assert heartbeats and all(set(r.json_value()["payload"]) == {"ts_ms"} for r in heartbeats), "Debezium's heartbeat shape"
        assert sql(f"select count(*) as n from raw_change_events where kafka_topic = '{HEARTBEAT_TOPIC}'")[0]["n"] == 0
        assert sql("select reason_code, reason from dead_letter") == []
    finally:
        bed.connect.delete(PG_PREFIX)
        with bed.postgres.connect() as conn:
            conn.execute(f"drop table if exists {TOAST}")
            conn.execute(f"select pg_drop_replication_slot(slot_name) from pg_replication_slots "
                         f"where slot_name = '{PG_PREFIX}_slot' and not active")


# --- MariaDB: the schema-change topic ------------------------------------------------------------------

def maria_run(bed: Stack, statements: list[tuple[str, Any]]) -> None:
    conn = bed.mariadb.connect(autocommit=False)
    try:
        with conn.cursor() as cur:
            for sql, params in statements:
                cur.execute(sql, params)
        conn.commit()
    finally:
        conn.close()


def maria_rows(bed: Stack) -> list[tuple[Any, ...]]:
    with bed.mariadb.connect() as conn, conn.cursor() as cur:
        cur.execute(f"select id, name, qty from {ITEMS} order by id")
        return [tuple(r) for r in cur.fetchall()]


def test_mariadb_schema_change_topic_is_counted_not_dead_lettered(testbed: Stack, spark: Any, tmp_path: Path) -> None:
    bed = testbed
    maria_run(bed, [(f"create table {ITEMS} (id int primary key, name varchar(20))", ())])
    maria_run(bed, [(f"insert into {ITEMS} values (1, 'one'), (2, 'two')", ())])  # the snapshot's
    connector = bed.mariadb_connector(MARIA_PREFIX, [f"{DATABASE}.{ITEMS}"], **{"include.schema.changes": "true"})
    history_topic = connector["schema.history.internal.kafka.topic"]
    # The schema-change topic is the prefix itself; the pattern covers it, the schema history and the transaction topic.
    cfg = write_config(tmp_path, {
        "lake": "lake",
        "source": {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "subscribe_pattern": rf"{MARIA_PREFIX}(\..*)?"},
        "tables": {f"{DATABASE}.{ITEMS}": {"key": ["id"]}},
    })

    def lake_rows() -> list[tuple[Any, ...]] | None:  # None until a change carries `qty` (no such column before)
        if raw_events(cfg) < 5:  # 2 snapshot reads, 3 row changes
            return None
        return rows_or_none(lake_now(spark, cfg), f"select id, name, qty from {ITEMS}__full_view order by id", ("id", "name", "qty"))

    try:
        bed.connect.register(MARIA_PREFIX, connector)
        bed.wait_streaming(connector)
        stream = Running(spark, cfg)
        try:
            maria_run(bed, [(f"insert into {ITEMS} (id, name) values (3, 'three')", ())])
            maria_run(bed, [(f"alter table {ITEMS} add column qty int", ())])
            maria_run(bed, [(f"update {ITEMS} set qty = 7 where id = 1", ()), (f"insert into {ITEMS} values (4, 'four', 4)", ())])
            source = maria_rows(bed)
            stream.wait("the full view equals the source, added column included", lambda: lake_rows() == source)
        finally:
            stream.stop()
        sql = lake_now(spark, cfg)

        assert source == [(1, "one", 7), (2, "two", None), (3, "three", None), (4, "four", 4)]
        ddl = consume_all(bed.broker.bootstrap, [MARIA_PREFIX, history_topic])
        alters = [r for r in ddl if r.topic == MARIA_PREFIX and "add column qty" in r.json_value()["payload"]["ddl"].lower()]
        assert len(alters) == 1, "the connector wrote the ALTER to the schema-change topic"
        assert figure(sql, "ingest.schema_changes") == len(ddl), "every schema-change and history record, once"
        origins = {r["kafka_topic"] for r in sql("select kafka_topic from raw_change_events")}
        assert origins == {f"{MARIA_PREFIX}.{DATABASE}.{ITEMS}"}, "no schema-change record is a raw row"
        assert sql("select reason_code, reason from dead_letter") == []
        assert sql("select count(*) as n from incomplete_transactions")[0]["n"] == 0
    finally:
        bed.connect.delete(MARIA_PREFIX)
        maria_run(bed, [(f"drop table if exists {ITEMS}", ())])
