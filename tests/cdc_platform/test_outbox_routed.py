"""The Event Router's routed records (`sources/outbox_routed.py`) land in the same event tables as the outbox
table's own change events: the same events, once each, in partition order per aggregate."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import yaml

from cdc_platform.config import load_config
from cdc_platform.parse import parse_spark
from cdc_platform.parse.envelope import KeySpec
from cdc_platform.run.ingest import IngestJob
from tests.cdc_platform.test_outbox import change, outbox_row

TOPIC = "outbox.event.Order"
KAFKA = {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9", "topics": [TOPIC, "pg.public.orders"]}
SCHEMA = "value string, source_file string, kafka_key string, kafka_topic string, kafka_partition int, kafka_offset bigint, " \
         "kafka_headers array<struct<key:string,value:binary>>, kafka_timestamp timestamp"


def wrapped(value: Any, kind: str = "string") -> str:
    """What the JSON converter with `schemas.enable=true` writes."""
    return json.dumps({"schema": {"type": kind, "optional": True}, "payload": value})


def record(offset: int, event_id: str | None, aggregate_id: str, type_: str | None, payload: Any, *, partition: int = 0,
           schemas_enable: bool = True) -> tuple[Any, ...]:
    key = wrapped(aggregate_id) if schemas_enable else json.dumps(aggregate_id)
    value = wrapped(payload) if schemas_enable else json.dumps(payload)
    headers = [(k, v.encode()) for k, v in (("id", event_id), ("eventType", type_)) if v is not None]
    return (value, f"kafka:{TOPIC}/{partition}@{offset}", key, TOPIC, partition, offset, headers,
            dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=offset))


def ingest(spark: Any, job: IngestJob, records: list[tuple[Any, ...]], batch: int) -> None:
    lines = spark.createDataFrame(records, SCHEMA).coalesce(1)
    parsed = parse_spark.parse_lines(lines, KeySpec({}), outbox=job.config.outbox)
    job.process_parsed(parsed, batch, "q")


def events(query: Any, cfg: Any) -> list[tuple[Any, ...]]:
    got = query(cfg, "SELECT event_id, aggregate_id, event_type, payload FROM order_events ORDER BY aggregate_id, source_position")
    return [tuple(r.values()) for r in got]


def test_routed_records_land_like_the_outbox_tables_own_events(make_config, spark, query, tmp_path) -> None:
    cfg = make_config(source=KAFKA, outbox={"topics": [TOPIC]})
    job = IngestJob(cfg)
    job.setup(spark)
    ingest(spark, job, [
        record(0, "e1", "1", "order_created", '{"total": 5, "id": 1}'),
        record(1, "e2", "2", "order_created", '{"id": 2}', schemas_enable=False),
        record(2, "e3", "1", "order_shipped", '{"id": 1}'),
        record(3, "e1", "1", "order_created", '{"total": 5, "id": 1}'),  # the connector sent it again (a restart)
    ], 0)
    ingest(spark, job, [record(4, "e1", "1", "order_created", '{"id":1,"total":5}'),  # again, later, its JSON spelled otherwise
                        record(5, None, "3", "order_created", "{}"), record(6, "e6", "3", None, "{}"), record(7, "e7", "3", "x", "not json")], 1)
    routed = events(query, cfg)
    assert routed == [("e1", "1", "order_created", '{"id":1,"total":5}'), ("e3", "1", "order_shipped", '{"id":1}'),
                      ("e2", "2", "order_created", '{"id":2}')]
    origin = query(cfg, "SELECT source_table, source_position, transaction_id, aggregate_type FROM order_events WHERE event_id = 'e3'")[0]
    assert origin == {"source_table": f"__outbox.{TOPIC}", "source_position": "0000000000/00000000000000000002", "transaction_id": None,
                      "aggregate_type": "Order"}
    codes = sorted(r["reason_code"] for r in query(cfg, "SELECT reason_code FROM dead_letter WHERE stage = 'outbox'"))
    assert codes == ["outbox_missing_id", "outbox_missing_type", "outbox_payload_not_json"]
    raw = query(cfg, f"SELECT count(*) AS n FROM raw_change_events WHERE table_id = '__outbox.{TOPIC}'")[0]["n"]
    assert raw == 7, "the record sent twice with the same bytes is one raw event; the copy spelled otherwise is another"

    # The same events through the outbox table's change events, in another lake: the same table.
    other = tmp_path / "other"
    (other / "landing").mkdir(parents=True)
    (other / "cdc.yaml").write_text(yaml.safe_dump({"landing": "landing", "lake": "lake", "outbox": {"table": "shop.outbox"}}), encoding="utf-8")
    (other / "landing" / "p.jsonl").write_text("\n".join([
        change("outbox", "c", 1, outbox_row("e1", "Order", "1", "order_created", '{"total": 5, "id": 1}')),
        change("outbox", "c", 2, outbox_row("e2", "Order", "2", "order_created", '{"id": 2}')),
        change("outbox", "c", 3, outbox_row("e3", "Order", "1", "order_shipped", '{"id": 1}')),
        change("outbox", "d", 4, outbox_row("e3", "Order", "1", "order_shipped", '{"id": 1}')),
    ]) + "\n", encoding="utf-8")
    table_cfg = load_config(other / "cdc.yaml")
    IngestJob(table_cfg).run_available_now(spark)
    assert events(query, table_cfg) == routed


def test_a_header_can_carry_the_aggregate_type(make_config, spark, query) -> None:
    cfg = make_config(source=KAFKA, outbox={"topics": [TOPIC], "router": {"aggregate_type_header": "aggregatetype"}})
    job = IngestJob(cfg)
    job.setup(spark)
    value, source, key, topic, partition, offset, headers, ts = record(0, "p1", "9", "paid", "{}")
    ingest(spark, job, [(value, source, key, topic, partition, offset, [*headers, ("aggregatetype", b"Payment")], ts)], 0)
    assert query(cfg, "SELECT event_id, aggregate_type FROM payment_events") == [{"event_id": "p1", "aggregate_type": "Payment"}]
