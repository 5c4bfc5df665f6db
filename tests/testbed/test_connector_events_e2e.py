"""Issue 11 end to end: what Debezium's PostgreSQL connector emits beyond row changes, through Kafka.

One scenario on the real test bed (PostgreSQL 15 -> Debezium 3.5 -> Kafka -> `IngestJob`, `source: kafka`),
with the subscribe pattern deliberately covering the heartbeat and message topics too:
* TOAST: rows whose text, bytea, text[], int[] and jsonb values are stored out of line (random, so
  they do not compress inline), then updates that leave them unchanged (Debezium sends its
  placeholder), in several batches, some in the same transaction as other changes: the full view keeps
  the values, equal to `SELECT *`;
* REPLICA IDENTITY FULL next to the default, and TRUNCATE (`skipped.operations=none`) then new rows;
* heartbeats (`heartbeat.interval.ms`) and logical-decoding messages (transactional and not):
  no dead letters, heartbeats counted, messages in the raw log, every transaction complete.
"""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import yaml

from cdc_platform import control_records
from cdc_platform.config import load_config
from cdc_platform.testbed import Stack
from tests.testbed.test_kafka_ingest import Running, run

PREFIX = "e2e_ev"
TOAST = "ev_toast"  # REPLICA IDENTITY DEFAULT: unchanged TOAST values arrive as the placeholder
FULL = "ev_full"  # REPLICA IDENTITY FULL
DDL = [
    f"create table {TOAST} (id int primary key, small text, big text, bin bytea, arr text[], iarr int[], doc jsonb)",
    f"create table {FULL} (id int primary key, big text, v int)",
    f"alter table {FULL} replica identity full",
]
SOURCE_SQL = {
    TOAST: f"select id, small, big, bin, to_json(arr)::text, to_json(iarr)::text, doc::text from {TOAST} order by id",
    FULL: f"select id, big, v from {FULL} order by id",
}
LAKE_SQL = {
    TOAST: f"select id, small, big, bin, arr, iarr, doc from {TOAST}__full_view order by id",
    FULL: f"select id, big, v from {FULL}__full_view order by id",
}


def big_values(rng: random.Random) -> tuple[Any, ...]:
    """Values PostgreSQL stores out of line: random text and bytes do not compress below the TOAST threshold."""
    hexed = os.urandom(3_000).hex()
    return (hexed, os.urandom(4_000), [os.urandom(500).hex() for _ in range(10)], [rng.randrange(-2**31, 2**31) for _ in range(1_000)],
            f'{{"k": "{os.urandom(2_000).hex()}"}}')


def source_rows(bed: Stack, table: str) -> list[tuple[Any, ...]]:
    with bed.postgres.connect() as conn:
        return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in conn.execute(SOURCE_SQL[table]).fetchall()]


def lake_rows(query: Any, cfg: Any, table: str) -> list[tuple[Any, ...]]:
    return [tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in r.values()) for r in query(cfg, LAKE_SQL[table])]


def test_toast_placeholders_heartbeats_messages_and_truncate_through_kafka(testbed: Stack, spark: Any, tmp_path: Path, query) -> None:  # noqa: ANN001
    bed = testbed
    rng = random.Random(11)
    with bed.postgres.connect() as conn:
        for ddl in DDL:
            conn.execute(ddl)
        for i in (1, 2, 3):
            conn.execute(f"insert into {TOAST} values (%s, %s, %s, %s, %s, %s, %s)", (i, f"s{i}", *big_values(rng)))
            conn.execute(f"insert into {FULL} values (%s, %s, %s)", (i, os.urandom(3_000).hex(), i))
    connector = bed.postgres_connector(PREFIX, [rf"public\.{TOAST}", rf"public\.{FULL}"], **{
        "heartbeat.interval.ms": 500, "skipped.operations": "none"})
    bed.connect.register(PREFIX, connector)
    doc = {
        "lake": "lake",
        "source": {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "max_offsets_per_trigger": 20,
                   "subscribe_pattern": rf"{PREFIX}\..*|__debezium-heartbeat\.{PREFIX}"},
        "tables": {f"public.{TOAST}": {"key": ["id"]}, f"public.{FULL}": {"key": ["id"]}},
    }
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    cfg = load_config(tmp_path / "cdc.yaml")

    def matches() -> bool:
        from pyspark.errors import AnalysisException

        try:
            return all(lake_rows(query, cfg, t) == source_rows(bed, t) for t in (TOAST, FULL))
        except AnalysisException:
            return False

    timings: dict[str, float] = {}
    try:
        bed.wait_streaming(connector)
        t0 = time.monotonic()
        stream = Running(spark, cfg)
        try:
            stream.wait("the snapshot lands", matches)
            timings["snapshot"] = time.monotonic() - t0
            transactions = 0
            for step in range(4):  # unchanged TOAST values in every update, over several batches
                run(bed, [(f"update {TOAST} set small = %s where id = %s", (f"s{i}-{step}", i)) for i in (1, 2, 3)])
                run(bed, [(f"update {FULL} set v = v + 1 where id = %s", (1 + step % 3,)),
                          (f"update {TOAST} set small = small || '!' where id = %s", (1 + step % 3,)),
                          ("select pg_logical_emit_message(true, 'audit', %s)", (f"step {step}",))])
                transactions += 2
                time.sleep(1.0)
            with bed.postgres.connect() as conn:  # a non-transactional message, a changed TOAST value, a delete
                conn.execute("select pg_logical_emit_message(false, 'ping', 'pong')")
            run(bed, [(f"update {TOAST} set big = %s, small = 'new big' where id = 2", (os.urandom(3_000).hex(),))])
            run(bed, [(f"delete from {TOAST} where id = 3", None)])
            run(bed, [(f"truncate {FULL}", None)])
            run(bed, [(f"insert into {FULL} values (7, %s, 7)", (os.urandom(3_000).hex(),)),
                      (f"update {TOAST} set small = 'after truncate' where id = 1", None)])
            transactions += 4
            t1 = time.monotonic()
            stream.wait("full views equal the source tables", lambda: matches() and query(
                cfg, "select count(*) as n from transactions")[0]["n"] >= transactions)
            timings["workload"] = time.monotonic() - t1
        finally:
            stream.stop()

        assert [r[0] for r in source_rows(bed, TOAST)] == [1, 2] and [r[0] for r in source_rows(bed, FULL)] == [7]
        stored = query(cfg, f"select big, doc, arr, bin from {TOAST}")
        assert all(control_records.MESSAGES != r["big"] and "__debezium_unavailable_value" not in (r["big"] or "") + (r["doc"] or "") + (r["arr"] or "")
                   for r in stored), "the placeholder never lands"
        raw_placeholders = query(cfg, "select count(*) as n from raw_change_events where after like '%__debezium_unavailable_value%'")[0]["n"]
        assert raw_placeholders > 0, "the connector really sent placeholders (the raw log keeps them as sent)"
        assert query(cfg, "select reason_code, reason from dead_letter") == []
        assert query(cfg, "select count(*) as n from incomplete_transactions")[0]["n"] == 0
        messages = query(cfg, f"select count(*) as n from raw_change_events where op = 'm' and table_id = '{control_records.MESSAGES}'")[0]["n"]
        assert messages == 5
        figures = query(cfg, "select stage_figures from pipeline_metrics")
        assert sum(f["stage_figures"].get("ingest.heartbeats", 0) for f in figures) > 0
        assert sum(f["stage_figures"].get("latest_state.unavailable_filled", 0) for f in figures) > 0
        assert sum(f["stage_figures"].get("latest_state.unavailable_unresolved", 0) for f in figures) == 0
        print(f"timings: {timings}")
    finally:
        bed.connect.delete(PREFIX)
        with bed.postgres.connect() as conn:
            for table in (TOAST, FULL):
                conn.execute(f"drop table if exists {table}")
            conn.execute(f"select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = '{PREFIX}_slot' and not active")
