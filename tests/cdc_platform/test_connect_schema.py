"""`connect_schema`: an Avro schema from a registry read back as the Connect schema it was written from, as
the JSON converter lays it out, and the reader schema `from_avro` decodes with.

The first test holds it to real output: the records `tests/data/avro/capture.py` took from Debezium's
PostgreSQL and MariaDB connectors with Apicurio's Avro converter, each beside the JSON converter's text of
the same record (every PostgreSQL and MariaDB type of that capture, keys, transaction markers, heartbeats,
schema-change records, a column added mid-stream)."""

from __future__ import annotations

import base64
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.sources import connect_schema as cs

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "avro" / "connectors.json"


def captured() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def schema_id(b64: str) -> int:
    raw = base64.b64decode(b64)
    assert raw[0] == 0
    return int(struct.unpack(">I", raw[1:5])[0])


def test_the_connectors_schemas_read_back_as_the_json_converter_writes_them() -> None:
    data = captured()
    compared = 0
    for record in data["records"]:
        for side in ("key", "value"):
            if record[side] is None:
                continue
            avro = cs.parse(data["schemas"][str(schema_id(record[side]))])
            json_text = record[f"json_{side}"]
            assert json_text.startswith('{"schema":')
            expected = json_text[len('{"schema":'):json_text.index(',"payload":')]
            assert cs.to_json(cs.connect_schema(avro)) == expected, (record["topic"], record["offset"], side)
            compared += 1
    assert compared >= 60
    names = {r["topic"] for r in data["records"]}
    assert {"avro.pg.public.types", "avro.pg.transaction", "avro.mdb", "avro.__debezium-heartbeat.pg", "avro.pg.message"} <= names


def test_a_column_added_mid_stream_is_a_new_schema_id() -> None:
    data = captured()
    ids = {schema_id(r["value"]) for r in data["records"] if r["topic"] == "avro.pg.public.types" and r["value"]}
    fields = [{f["field"] for f in cs.connect_schema(cs.parse(data["schemas"][str(i)]))["fields"][1]["fields"]} for i in ids]
    assert len(ids) == 2 and sum("extra" in f for f in fields) == 1


def test_the_reader_schema_has_no_logical_types_anywhere() -> None:
    avro = {"type": "record", "name": "R", "fields": [
        {"name": "d", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
        {"name": "a", "type": {"type": "array", "items": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 2}}},
        {"name": "m", "type": {"type": "map", "values": {"type": "long", "logicalType": "timestamp-millis"}}},
    ]}
    text = json.dumps(cs.reader_schema(avro))
    assert "logicalType" not in text and '"precision": 4' in text  # the rest is kept
    assert "logicalType" in json.dumps(avro), "the original is not changed"


def test_a_schema_without_connect_properties_reads_as_confluents_converter_reads_it() -> None:
    avro = {"type": "record", "name": "Order", "namespace": "shop", "doc": "an order", "fields": [
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "at", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None},
        {"name": "micros", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "small", "type": {"type": "int", "connect.type": "int16"}},
        {"name": "state", "type": {"type": "enum", "name": "State", "symbols": ["A", "B"]}},
        {"name": "hash", "type": {"type": "fixed", "name": "Hash", "size": 2}},
        {"name": "tags", "type": {"type": "map", "values": "string"}},
        {"name": "lines", "type": {"type": "array", "items": {"type": "record", "name": "Line", "fields": [{"name": "n", "type": "int"}]}}},
        {"name": "again", "type": ["null", "Line"], "default": None},
        {"name": "either", "type": ["null", "int", "string"], "default": None},
        {"name": "blob", "type": "bytes", "default": "\u00ff\u0000"},
    ]}
    got = cs.connect_schema(avro)
    fields = {f["field"]: f for f in got["fields"]}
    assert (got["name"], got["doc"], got["optional"]) == ("shop.Order", "an order", False)
    assert fields["amount"] == {"type": "bytes", "optional": False, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
                                "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "amount"}
    assert fields["day"]["name"] == "org.apache.kafka.connect.data.Date" and fields["day"]["type"] == "int32"
    assert fields["at"]["name"] == "org.apache.kafka.connect.data.Timestamp" and fields["at"]["optional"] is True
    assert fields["micros"] == {"type": "int64", "optional": False, "field": "micros"}, "no Connect type for it: the long itself"
    assert fields["small"]["type"] == "int16"
    assert (fields["state"]["type"], fields["hash"]["type"]) == ("string", "bytes")
    assert fields["tags"] == {"type": "map", "keys": {"type": "string", "optional": False}, "values": {"type": "string", "optional": False},
                              "optional": False, "field": "tags"}
    assert fields["lines"]["items"]["name"] == "shop.Line", "a nested record takes its enclosing namespace"
    assert fields["again"]["name"] == "shop.Line" and fields["again"]["optional"] is True, "a named type referred to by name"
    assert fields["either"]["name"] == cs.UNION_NAME and [f["field"] for f in fields["either"]["fields"]] == ["member0", "member1"]
    assert fields["blob"]["default"] == base64.b64encode(b"\xff\x00").decode(), "Avro's bytes default, as the JSON converter writes bytes"
    assert list(fields["amount"]) == ["type", "optional", "name", "version", "parameters", "field"], "JsonConverter's key order"


@pytest.mark.parametrize("bad", [
    "not json",
    '{"type": "record", "fields": []}',
    '{"type": "record", "name": "R", "fields": [{"name": "x", "type": "Unknown"}]}',
    '{"type": "record", "name": "R", "fields": [{"type": "int"}]}',
    '[1, 2]',
])
def test_what_is_no_avro_schema_is_an_error_naming_it(bad: str) -> None:
    with pytest.raises(cs.SchemaTranslationError):
        cs.connect_schema(cs.parse(bad))
