"""`outbox:` in cdc.yaml (config_outbox.py): Debezium's names by default, overrides, and rejections naming the entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform.config import load_config
from cdc_platform.config_outbox import OutboxColumns, RouterHeaders
from cdc_platform.errors import ConfigError

KAFKA = {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9092", "topics": ["pg.public.orders", "outbox.event.order"]}


def load(tmp_path: Path, outbox: Any, **extra: Any) -> Any:
    path = tmp_path / "cdc.yaml"
    path.write_text(yaml.safe_dump({"landing": "landing", "lake": "lake", "outbox": outbox, **extra}), encoding="utf-8")
    return load_config(path)


def test_defaults_are_debeziums_names(tmp_path: Path) -> None:
    cfg = load(tmp_path, {"table": "public.outbox"})
    assert cfg.outbox.columns == OutboxColumns() and cfg.outbox.router == RouterHeaders()
    assert (cfg.outbox.columns.id, cfg.outbox.columns.aggregate_type, cfg.outbox.columns.aggregate_id, cfg.outbox.columns.type,
            cfg.outbox.columns.payload) == ("id", "aggregatetype", "aggregateid", "type", "payload")
    assert cfg.outbox.source_table_ids == ("public.outbox",)
    assert load(tmp_path, None).outbox is None


def test_overrides_topics_schemas_and_expectations(tmp_path: Path) -> None:
    cfg = load(tmp_path, {
        "table": "public.events", "topics": ["outbox.event.order"],
        "columns": {"id": "event_id", "aggregate_id": "order_id", "timestamp": "created_at", "additional": ["tenant"]},
        "router": {"type_header": "kind", "aggregate_type_header": "aggregatetype"},
        "payload_schema": {"order": "total double"},
        "expectations": {"order_created": ["public.orders"], "order_paid": {"public.payments": ["c"], "public.orders": "u"}},
    }, source=KAFKA)
    ob = cfg.outbox
    assert (ob.columns.id, ob.columns.aggregate_id, ob.columns.type, ob.columns.timestamp, ob.columns.additional) == \
        ("event_id", "order_id", "type", "created_at", ("tenant",))
    assert ob.router == RouterHeaders(id_header="id", type_header="kind", aggregate_type_header="aggregatetype")
    assert ob.source_table_ids == ("public.events", "__outbox.outbox.event.order")
    assert ob.schema_for("order") == "total double"
    assert dict(ob.expectations) == {"order_created": (("public.orders", ()),),
                                     "order_paid": (("public.orders", ("u",)), ("public.payments", ("c",)))}


@pytest.mark.parametrize(("outbox", "extra", "message"), [
    ("yes", {}, "outbox must be a mapping"),
    ({}, {}, "name the outbox table's change events"),
    ({"table": "outbox"}, {}, "outbox.table must be '<db-or-schema>.<table>'"),
    ({"table": "public.outbox", "colums": {}}, {}, "unknown key(s) colums"),
    ({"table": "public.outbox", "columns": {"id": "my id"}}, {}, "outbox.columns.id must be a column name"),
    ({"table": "public.outbox", "columns": {"idd": "x"}}, {}, "outbox.columns: unknown key(s) idd"),
    ({"table": "public.outbox", "columns": {"type": "id"}}, {}, "a column is named twice"),
    ({"table": "public.outbox", "router": {"id_header": "has space"}}, {}, "outbox.router.id_header must be a Kafka header name"),
    ({"table": "public.outbox", "payload_schema": {"order": 3}}, {}, "outbox.payload_schema must map aggregate types"),
    ({"table": "public.outbox", "expectations": {"order_created": []}}, {}, "outbox.expectations.order_created must be a non-empty list"),
    ({"table": "public.outbox", "expectations": {"order_created": ["orders"]}}, {}, "'orders' is not a source table id"),
    ({"table": "public.outbox", "expectations": {"order_created": {"public.orders": ["x"]}}}, {}, "must list ops among c, u, d, r, t"),
    ({"topics": ["outbox.event.order"]}, {}, "only a Kafka source reads"),
    ({"topics": ["outbox.event.payment"]}, {"source": KAFKA}, "outbox.topics outbox.event.payment are not read by the Kafka source"),
    ({"topics": ["outbox.event.order"]}, {"source": {**KAFKA, "topics": None, "subscribe_pattern": r"pg\..*"}}, "widen `source.subscribe_pattern`"),
    ({"topics": ["outbox.event.order"]}, {"source": {**KAFKA, "format": "avro", "schema_registry_url": "http://127.0.0.1:1"}},
     "`format: avro` is not supported for routed topics"),
    ({"topics": ["a b"]}, {"source": KAFKA}, "outbox.topics must be a list of Kafka topic names"),
])
def test_rejections_name_the_entry(tmp_path: Path, outbox: Any, extra: dict[str, Any], message: str) -> None:
    if "source" in extra and extra["source"].get("topics") is None:
        extra = {"source": {k: v for k, v in extra["source"].items() if k != "topics"}}
    with pytest.raises(ConfigError) as err:
        load(tmp_path, outbox, **extra)
    assert message in str(err.value)
    assert "cdc.yaml" in str(err.value)


def test_a_pattern_that_covers_the_routed_topics_is_enough(tmp_path: Path) -> None:
    source = {k: v for k, v in KAFKA.items() if k != "topics"} | {"subscribe_pattern": r"(pg|outbox)\..*"}
    assert load(tmp_path, {"topics": ["outbox.event.order"]}, source=source).outbox.topics == ("outbox.event.order",)
