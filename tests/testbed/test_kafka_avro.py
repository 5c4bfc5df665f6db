"""End to end through Kafka in Avro: Debezium's connectors with Apicurio's Avro converter writing to the test
bed's schema registry -> `IngestJob` with `source: {kind: kafka, format: avro}` -> the lake, compared with
the database and with the lake the JSON converter gives for the same changes.

Each database runs two connectors over the same tables with the same topic prefix (so `source.name` and the
schema names agree): one with the worker's JSON converter, one with the Avro converter, whose records a
RegexRouter SMT puts on `avro.<topic>`. The workloads are the JSON tests' own (`test_kafka_ingest.py`,
`test_kafka_mariadb.py`). A streamed change is the same change event in both lakes, identity included; a
snapshot read differs only in when each connector read it.

PostgreSQL, in order: snapshot, then transactions while the Avro stream runs; the stream stops and the
second workload (a column added, a numeric widened: new schema ids beside the old ones in one batch)
runs; the registry stops, and a stream that starts then (knowing no schema yet) stops with a clear error
having committed nothing; the registry comes back (its schemas kept) and the stream catches up; a
truncate; then records no registry knows, cut short or not in the wire format are dead letters holding
their bytes. MariaDB: snapshot, workload, an `ALTER TABLE` mid-stream, heartbeats and the schema-change
topic, read in one run.
"""

from __future__ import annotations

import base64
import json
import struct
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.run.ingest import IngestJob
from cdc_platform.sources import avro_decode
from cdc_platform.sources.schema_registry import SchemaRegistryUnavailable
from cdc_platform.testbed import Stack, consume, consume_all
from cdc_platform.testbed.databases import DATABASE
from tests.testbed import test_kafka_ingest as pg
from tests.testbed import test_kafka_mariadb as maria
from tests.testbed.streaming import Running

AVRO = "avro."


def avro_twin(bed: Stack, config: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """The same connector writing Avro to the bed's registry, its records on `avro.<topic>`."""
    return {
        **config, **overrides, **bed.registry.avro_converter_config(),
        # Two connectors with one topic prefix register the same JMX metrics names unless tagged apart.
        "custom.metric.tags": "converter=avro",
        "transforms": "route", "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
        "transforms.route.regex": "(.*)", "transforms.route.replacement": AVRO + "$1",
    }


def lake_config(root: Path, bed: Stack, pattern: str, tables: dict[str, Any], *, avro: bool) -> PlatformConfig:
    source: dict[str, Any] = {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "subscribe_pattern": pattern,
                              "max_offsets_per_trigger": 60}
    if avro:
        source |= {"format": "avro", "schema_registry_url": bed.registry.url}
    root.mkdir(parents=True, exist_ok=True)
    (root / "cdc.yaml").write_text(yaml.safe_dump({"lake": "lake", "source": source, "tables": tables}), encoding="utf-8")
    return load_config(root / "cdc.yaml")


def raw_log(query: Any, cfg: PlatformConfig) -> list[dict[str, Any]]:
    return query(cfg, "select event_id, table_id, op, key, before, after, row_schema, position, position_kind, snapshot, transaction_id, "
                      "tx_total_order, kafka_topic, kafka_partition, kafka_offset from raw_change_events")


def same_lakes(query: Any, avro: PlatformConfig, json_lake: PlatformConfig, views: list[str]) -> None:
    """The two lakes hold the same change events (each Kafka record once, in the same place of its topic),
    the same transactions and the same full views."""
    theirs = {(r["kafka_topic"], r["kafka_offset"]): r for r in raw_log(query, json_lake)}
    ours = {(r["kafka_topic"].removeprefix(AVRO), r["kafka_offset"]): r for r in raw_log(query, avro)}
    assert ours.keys() == theirs.keys(), "one raw row per record, in both"
    streamed = 0
    for place, row in ours.items():
        twin = theirs[place]
        differ = {"kafka_topic"} | ({"event_id", "position", "transaction_id"} if row["snapshot"] else set())
        assert {k: v for k, v in row.items() if k not in differ} == {k: v for k, v in twin.items() if k not in differ}, place
        streamed += not row["snapshot"]
    assert streamed >= 10
    tx = "select transaction_id, event_count, events_per_table from transactions order by transaction_id"
    assert query(avro, tx) == query(json_lake, tx) and query(avro, tx)
    for view in views:
        sql = f"select * from {view}__full_view order by 1"
        assert [_comparable(r) for r in query(avro, sql)] == [_comparable(r) for r in query(json_lake, sql)], view


def _comparable(row: dict[str, Any]) -> dict[str, Any]:
    """A full view's row without when it was ingested, and without where a snapshot read it (each connector
    took its own snapshot)."""
    drop = {"_ingested_at"} | ({"_position", "_source_ts", "_transaction_id", "_event_id"} if row.get("_op") == "r" else set())
    return {k: v for k, v in row.items() if k not in drop}


def all_written(bed: Stack, topics: list[str], transactions: int) -> list[Any]:
    """The Avro topics' records once both connectors have written `transactions` transactions: the JSON
    connector's END markers counted, then as many Avro records as JSON ones on every topic."""
    tx_topic = next(t for t in topics if t.endswith(".transaction"))
    consume(bed.broker.bootstrap, [tx_topic], until=lambda recs: sum(
        1 for r in recs if r.value and json.loads(r.value)["payload"]["status"] == "END") >= transactions)
    counts = Counter(r.topic for r in consume_all(bed.broker.bootstrap, topics))
    return consume(bed.broker.bootstrap, [AVRO + t for t in topics],
                   until=lambda recs: all(Counter(r.topic for r in recs)[AVRO + t] >= n for t, n in counts.items()))


def produce(bed: Stack, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bed.broker.bootstrap})
    for key, value in records:
        producer.produce(topic, value=value, key=key)
    assert producer.flush(30) == 0, "every record delivered"


def schema_ids(records: list[Any]) -> set[int]:
    return {struct.unpack(">I", r.value[1:5])[0] for r in records if r.value and r.value[:1] == b"\x00"}


def test_postgres_in_avro_equals_json_and_the_database(testbed: Stack, spark: Any, tmp_path: Path, query) -> None:  # noqa: ANN001
    bed = testbed
    prefix, tables = "e2e_av", [f"public.{pg.CUSTOMERS}", f"public.{pg.ORDERS}"]
    with bed.postgres.connect() as conn:
        for ddl in pg.DDL:
            conn.execute(ddl)
    pg.run(bed, [(pg.INSERT_CUSTOMER, pg.customer(i)) for i in (1, 2, 3)])  # read by the snapshots
    json_connector = bed.postgres_connector(prefix, tables, skipped_operations="none")
    avro_connector = avro_twin(bed, json_connector, **{"slot.name": f"{prefix}_avro_slot", "publication.name": f"{prefix}_avro_pub"})
    keys = {t: {"key": ["id"]} for t in tables}
    cfg = lake_config(tmp_path / "avro", bed, rf"avro\.{prefix}\..*", keys, avro=True)
    json_cfg = lake_config(tmp_path / "json", bed, rf"{prefix}\..*", keys, avro=False)
    topics = [f"{prefix}.public.{pg.CUSTOMERS}", f"{prefix}.public.{pg.ORDERS}", f"{prefix}.transaction"]

    def matches() -> bool:
        from pyspark.errors import AnalysisException

        try:
            return all(pg.lake_rows(query, cfg, t) == pg.source_rows(bed, t) for t in (pg.CUSTOMERS, pg.ORDERS))
        except AnalysisException:
            return False

    def tx_count() -> int:
        return query(cfg, "select count(*) as n from transactions")[0]["n"]

    def raw_count() -> int:
        return query(cfg, "select count(*) as n from raw_change_events")[0]["n"]

    try:
        for name, connector in (("e2e_av_json", json_connector), ("e2e_av_avro", avro_connector)):
            bed.connect.register(name, connector)
            bed.wait_streaming(connector)
        stream = Running(spark, cfg)
        try:
            for tx in pg.WORKLOAD_1:
                pg.run(bed, tx)
            stream.wait("the Avro lake's full views equal the source tables", lambda: matches() and tx_count() >= len(pg.WORKLOAD_1))
        finally:
            stream.stop()

        # A column added and a numeric widened while the stream is down: the topics carry old and new schema ids.
        for tx in pg.WORKLOAD_2:
            pg.run(bed, tx)
        done = len(pg.WORKLOAD_1) + len(pg.WORKLOAD_2)
        written = all_written(bed, topics, done)
        customers = [r for r in written if r.topic == f"{AVRO}{prefix}.public.{pg.CUSTOMERS}"]
        assert len(schema_ids(customers)) >= 2, "the added column is a new schema id"

        # The registry stops: a stream starting now knows no schema, stops with a clear error, commits nothing.
        landed = raw_count()
        assert bed.registry.service is not None
        bed.registry.service.stop()
        try:
            with pytest.raises(SchemaRegistryUnavailable, match="nothing of this micro-batch was committed"):
                IngestJob(cfg).run_available_now(spark)
            assert raw_count() == landed
        finally:
            bed.registry.launch()
            bed.registry.wait_ready()

        stream = Running(spark, cfg)
        try:
            stream.wait("the lake catches up once the registry is back", lambda: matches() and tx_count() >= done)
            loyalty = f"select id, loyalty from {pg.CUSTOMERS}"
            assert [tuple(r.values()) for r in query(cfg, loyalty + "__full_view order by id")] == pg.source_select(bed, loyalty + " order by id")
            pg.run(bed, [(f"truncate {pg.ORDERS}", ()), (pg.INSERT_ORDER, (9, 6, Decimal("1.00"), "new", pg.T0))])
            stream.wait("the truncate lands", lambda: matches() and tx_count() >= done + 1)
            assert all(pg.lake_rows(query, cfg, t, "consistent_view") == pg.source_rows(bed, t) for t in (pg.CUSTOMERS, pg.ORDERS))
        finally:
            stream.stop()
        assert [r[0] for r in pg.source_rows(bed, pg.ORDERS)] == [9], "not a comparison of two empty tables"
        assert query(cfg, "select count(*) as n from incomplete_transactions")[0]["n"] == 0
        assert query(cfg, "select reason_code from dead_letter") == []

        IngestJob(json_cfg).run_available_now(spark)
        same_lakes(query, cfg, json_cfg, [pg.CUSTOMERS, pg.ORDERS])

        # Records no one can read: an id the registry does not know, bytes cut short, JSON on an Avro topic.
        real = next(r for r in written if r.topic == f"{AVRO}{prefix}.public.{pg.ORDERS}" and r.value)
        bad = [b"\x00" + struct.pack(">I", 987_654) + b"\x02", real.value[: len(real.value) // 2], b'{"op": "c"}']
        produce(bed, f"{AVRO}{prefix}.public.{pg.ORDERS}", [(real.key, value) for value in bad])
        before = raw_count()
        IngestJob(cfg).run_available_now(spark)
        dead = sorted(query(cfg, "select reason_code, line, source_file from dead_letter"), key=lambda d: int(d["source_file"].rsplit("@", 1)[1]))
        assert [(d["reason_code"], base64.b64decode(d["line"])) for d in dead] == list(zip(
            [avro_decode.UNKNOWN_SCHEMA_ID, avro_decode.NOT_DECODABLE, avro_decode.NOT_WIRE_FORMAT], bad))
        assert raw_count() == before and matches()
    finally:
        for name in ("e2e_av_avro", "e2e_av_json"):
            bed.connect.delete(name)
        with bed.postgres.connect() as conn:
            for table in (pg.ORDERS, pg.CUSTOMERS):
                conn.execute(f"drop table if exists {table}")
            conn.execute("drop type if exists e2e_status")
        with bed.postgres.connect() as conn:
            conn.execute(f"select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name like '{prefix}%' and not active")


def test_mariadb_in_avro_equals_json_and_the_database(testbed: Stack, spark: Any, tmp_path: Path, query) -> None:  # noqa: ANN001
    bed = testbed
    prefix = "e2e_mav"
    for ddl in maria.DDL:
        maria.run(bed, [(ddl, ())])
    maria.run(bed, [(maria.INSERT_CUSTOMER, maria.customer(i)) for i in (1, 2, 3)])
    tables = [f"{DATABASE}.{maria.CUSTOMERS}", f"{DATABASE}.{maria.ORDERS}"]
    json_connector = bed.mariadb_connector(prefix, tables, heartbeat_interval_ms=500)
    avro_connector = avro_twin(bed, json_connector, **{"schema.history.internal.kafka.topic": f"{prefix}.schema-history.avro",
                                                       "database.server.id": int(json_connector["database.server.id"]) + 1})
    keys = {t: {"key": ["id"]} for t in tables}
    # The prefix's own topic (schema changes) and the heartbeat topic too: counted, never dead letters.
    cfg = lake_config(tmp_path / "avro", bed, rf"avro\.({prefix}(\..*)?|__debezium-heartbeat\.{prefix})", keys, avro=True)
    json_cfg = lake_config(tmp_path / "json", bed, rf"{prefix}\.(cdc\..*|transaction)", keys, avro=False)
    try:
        bed.connect.register("e2e_mav_json", json_connector)
        bed.wait_streaming(json_connector)
        bed.connect.register("e2e_mav_avro", avro_connector)
        assert bed.mariadb.service is not None
        bed.mariadb.service.wait_until(lambda: _binlog_readers(bed) >= 2, "waiting for both binlog readers", 60)
        for tx in maria.WORKLOAD[:3]:
            maria.run(bed, tx)
        maria.run(bed, [(f"alter table {maria.CUSTOMERS} add column tier int", ()),
                        (f"update {maria.CUSTOMERS} set tier = 2 where id = %s", (4,))])
        for tx in maria.WORKLOAD[3:]:
            maria.run(bed, tx)
        transactions = len(maria.WORKLOAD) + 1
        consume_all_ends = lambda topic: [r for r in consume_all(bed.broker.bootstrap, [topic]) if b"END" in (r.value or b"")]  # noqa: E731
        for topic in (f"{prefix}.transaction", f"{AVRO}{prefix}.transaction"):
            assert bed.mariadb.service is not None
            bed.mariadb.service.wait_until(lambda t=topic: len(consume_all_ends(t)) >= transactions, f"{topic}: every END", 60)
        IngestJob(cfg).run_available_now(spark)
        figures = query(cfg, "select stage_figures from pipeline_metrics")
        for name in ("ingest.schema_changes", "ingest.heartbeats"):  # counted, never raw rows or dead letters
            assert sum((r["stage_figures"] or {}).get(name, 0.0) for r in figures) > 0, name
        IngestJob(json_cfg).run_available_now(spark)

        for table in (maria.CUSTOMERS, maria.ORDERS):
            assert maria.lake_rows(query, cfg, table) == maria.source_rows(bed, table)
        tier = f"select id, tier from {maria.CUSTOMERS}"
        with bed.mariadb.connect() as conn, conn.cursor() as cur:
            cur.execute(tier + " order by id")
            assert [tuple(r.values()) for r in query(cfg, tier + "__full_view order by id")] == [tuple(r) for r in cur.fetchall()]
        assert query(cfg, "select reason_code from dead_letter") == []
        assert query(cfg, "select count(*) as n from incomplete_transactions")[0]["n"] == 0
        same_lakes(query, cfg, json_cfg, [maria.CUSTOMERS, maria.ORDERS])
    finally:
        for name in ("e2e_mav_avro", "e2e_mav_json"):
            bed.connect.delete(name)
        maria.run(bed, [(f"drop table if exists {t}", ()) for t in (maria.ORDERS, maria.CUSTOMERS)])


def _binlog_readers(bed: Stack) -> int:
    with bed.mariadb._root() as conn, conn.cursor() as cur:
        cur.execute("select count(*) from information_schema.processlist where command like 'Binlog Dump%'")
        row = cur.fetchone()
    return int(row[0]) if row else 0
