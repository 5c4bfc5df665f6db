"""`avro_decode`: Avro records in a registry's wire format become the JSON converter's lines on the executors,
and the parser gives them the rows it gives the JSON converter's records; what cannot be read is a dead
letter holding the record's bytes, and a registry that does not answer stops the batch before it commits.

The records are real: Debezium's PostgreSQL and MariaDB connectors with Apicurio's Avro converter, each
beside the JSON converter's text of the same record (`tests/data/avro/capture.py`); the registry is a stub
serving the schemas captured with them (the test bed's own registry is in `tests/testbed/test_kafka_avro.py`)."""

from __future__ import annotations

import base64
import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform.config import load_config
from cdc_platform.lake.schemas import LINES_INCOMPLETE, RECORD_KEY_COLUMN, REJECT_CODE
from cdc_platform.parse import parse_spark
from cdc_platform.parse.envelope import KeySpec, parse_line
from cdc_platform.sources import avro_decode
from cdc_platform.sources.avro_decode import AvroLines
from cdc_platform.sources.schema_registry import SchemaRegistry, SchemaRegistryUnavailable
from tests.cdc_platform.registry_stub import stub_registry
from tests.cdc_platform.test_connect_schema import captured

KEYS = KeySpec({"public.types": ("id",), "cdc.mtypes": ("id",)})
COLUMNS = f"value binary, source_file string, {RECORD_KEY_COLUMN} binary, kafka_topic string, kafka_partition int, kafka_offset long"
_PROCESSED_AT = re.compile(r'"ts_(ms|us|ns)":\d+')


def frame(spark: Any, records: list[tuple[bytes | None, bytes | None]], topic: str = "avro.t") -> Any:
    rows = [(v, f"kafka:{topic}/0@{i}", k, topic, 0, i) for i, (k, v) in enumerate(records)]
    return spark.createDataFrame(rows, COLUMNS).coalesce(1)


def raw(b64: str | None) -> bytes | None:
    return None if b64 is None else base64.b64decode(b64)


def wire(schema_id: int, body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + body


def schema_ids(data: dict[str, Any]) -> dict[int, str]:
    return {int(i): text for i, text in data["schemas"].items()}


def test_every_captured_record_parses_as_its_json_converter_twin(spark: Any) -> None:
    data = captured()
    records = data["records"]
    with stub_registry(schema_ids(data)) as reg:
        lines = AvroLines(SchemaRegistry(reg.url))(
            spark.createDataFrame([(raw(r["value"]), f"kafka:{r['topic']}/0@{r['offset']}", raw(r["key"]), r["topic"], 0, r["offset"])
                                   for r in records], COLUMNS).coalesce(1)).collect()
        assert sorted(reg.requests) == sorted(f"/schemas/ids/{i}" for i in data["schemas"]), "each id once"
    assert len(lines) == len(records)
    kinds = set()
    for record, line in zip(records, lines):
        assert line[REJECT_CODE] is None
        where = (record["topic"], record["offset"])
        if record["json_value"] is None:
            assert line["value"] is None, where  # a tombstone stays one
            continue
        ours = parse_line(line["value"], "f", KEYS, line[RECORD_KEY_COLUMN])
        theirs = parse_line(record["json_value"], "f", KEYS, record["json_key"])
        kinds.add(ours["kind"])
        snapshot = ours.get("snapshot") is True
        different = {"line", "envelope_ts"} | ({"event_id", "source_ts", "position", "transaction_id", "transaction_raw_id"} if snapshot else set())
        if "heartbeat" in record["topic"]:
            different |= {"source_ts"}  # each connector's own heartbeat time
        assert {k: v for k, v in ours.items() if k not in different} == {k: v for k, v in theirs.items() if k not in different}, where
        if not snapshot and "heartbeat" not in record["topic"]:  # the very text, but when each connector processed it
            assert _PROCESSED_AT.sub("", line["value"]) == _PROCESSED_AT.sub("", record["json_value"]), where
        if record["json_key"] is not None:
            assert json.loads(line[RECORD_KEY_COLUMN]) == json.loads(record["json_key"]), where
    assert kinds == {"change", "marker", "control"}, "row changes, transaction markers, heartbeats and schema changes"


def test_records_it_cannot_read_are_dead_letters_holding_their_bytes(spark: Any) -> None:
    data = captured()
    good = next(r for r in data["records"] if r["topic"] == "avro.pg.public.types" and r["value"] and r["key"])
    value, key = raw(good["value"]), raw(good["key"])
    assert value is not None and key is not None
    proto_id = 9_001
    cases = {
        "unknown id": (key, wire(424_242, b"\x02\x04")),
        "truncated": (key, value[: len(value) // 2]),
        "not the wire format": (key, b'{"op":"c"}'),
        "a protobuf schema": (key, wire(proto_id, b"\x00")),
        "its key's id unknown": (wire(777, b"\x02"), value),
        "its key not Avro": (b"plain-key", value),
        "a tombstone": (key, None),
        "empty": (key, b""),
    }
    schemas: dict[int, Any] = {**schema_ids(data), proto_id: {"schema": "syntax = \"proto3\";", "schemaType": "PROTOBUF"}}
    with stub_registry(schemas) as reg:
        lines = AvroLines(SchemaRegistry(reg.url))(frame(spark, list(cases.values())))
        parsed = {row["source_file"]: row for row in parse_spark.parse_lines(lines, KEYS).collect()}
    got = {name: parsed[f"kafka:avro.t/0@{i}"] for i, name in enumerate(cases)}
    codes = {name: row["reason_code"] for name, row in got.items()}
    assert codes == {
        "unknown id": avro_decode.UNKNOWN_SCHEMA_ID, "truncated": avro_decode.NOT_DECODABLE,
        "not the wire format": avro_decode.NOT_WIRE_FORMAT, "a protobuf schema": avro_decode.UNSUPPORTED_SCHEMA,
        "its key's id unknown": avro_decode.UNKNOWN_SCHEMA_ID, "its key not Avro": None, "a tombstone": None,
        "empty": avro_decode.NOT_WIRE_FORMAT,
    }
    for name, (k, v) in cases.items():
        row = got[name]
        if row["kind"] == "dead_letter":
            assert base64.b64decode(row["line"]) == v, f"{name}: the record's value bytes, whole"
    assert "schema id 424242 (the record's value) is unknown to the schema registry at " + reg.url in got["unknown id"]["reason"]
    assert "starts with 0x7b226f70" in got["not the wire format"]["reason"] and "format: json" in got["not the wire format"]["reason"]
    assert "PROTOBUF" in got["a protobuf schema"]["reason"]
    assert "(the record's key)" in got["its key's id unknown"]["reason"] and base64.b64encode(wire(777, b"\x02")).decode() in got["its key's id unknown"]["reason"]
    assert got["its key not Avro"]["kind"] == "change", "a key in another format passes as text, as with format: json"
    assert got["a tombstone"]["kind"] == "tombstone"


def test_reasons_are_whole_sentences_whatever_the_registry_url_holds(spark: Any) -> None:
    """Each reject's reason, word for word (`avro_decode._reason` fills a template per code with `printf`), with a
    registry URL holding `%` signs (a percent-encoded path), which a template must keep as they are."""
    from cdc_platform.sources.schema_registry import RegistrySchema

    data = captured()
    good = next(r for r in data["records"] if r["topic"] == "avro.pg.public.types" and r["value"] and r["key"])
    value, key = raw(good["value"]), raw(good["key"])
    assert value is not None and key is not None
    key_id, value_id = struct.unpack(">I", key[1:5])[0], struct.unpack(">I", value[1:5])[0]
    decoders = {i: avro_decode.Decoder(RegistrySchema(i, text, "AVRO", ())) for i, text in schema_ids(data).items() if i in (key_id, value_id)}
    decoders[9] = avro_decode.Decoder(RegistrySchema(9, "syntax = \"proto3\";", "PROTOBUF", ()))
    url = "http://registry/a%20b%s%1$s"
    rows = avro_decode.lines(frame(spark, [(key, wire(424_242, b"\x02")), (key, b"{x"), (key, wire(9, b"\x00")), (key, value[: len(value) // 2]),
                                           (wire(777, b"\x02"), value), (wire(9, b""), value), (key[:5], value)]), decoders, url).collect()
    note = "the line holds the record's value bytes in base64"
    problem = "is a PROTOBUF schema; `format: avro` reads Avro only"
    unknown_key, proto_key, cut_key = (base64.b64encode(k).decode() for k in (wire(777, b"\x02"), wire(9, b""), key[:5]))
    assert [(r[REJECT_CODE], r["reject_reason"]) for r in rows] == [
        (avro_decode.UNKNOWN_SCHEMA_ID, f"schema id 424242 (the record's value) is unknown to the schema registry at {url} (HTTP 404): "
                                        f"written against another registry, or the schema was deleted; {note}"),
        (avro_decode.NOT_WIRE_FORMAT, "the record's value is not in the schema registry's wire format (magic byte 0, a 4-byte schema id, "
                                      "then Avro); it starts with 0x7b78: is the topic written by another converter? (`format: json` reads "
                                      f"the JSON converter's); {note}"),
        (avro_decode.UNSUPPORTED_SCHEMA, f"schema id 9 (the record's value) {problem}; {note}"),
        (avro_decode.NOT_DECODABLE, f"the record's value does not decode as Avro with schema id {value_id} (truncated or corrupt bytes, or "
                                    f"written with another schema); {note}"),
        (avro_decode.UNKNOWN_SCHEMA_ID, f"schema id 777 (the record's key) is unknown to the schema registry at {url} (HTTP 404): written "
                                        f"against another registry, or the schema was deleted; {note}; the key's bytes in base64: "
                                        f"{unknown_key}"),
        (avro_decode.UNSUPPORTED_SCHEMA, f"schema id 9 (the record's key) {problem}; {note}; the key's bytes in base64: {proto_key}"),
        (avro_decode.NOT_DECODABLE, f"the record's key does not decode as Avro with schema id {key_id} (truncated or corrupt bytes, or "
                                    f"written with another schema); {note}; the key's bytes in base64: {cut_key}"),
    ]
    incomplete = avro_decode.lines(frame(spark, [(key, wire(424_242, b"\x02"))]), decoders, url, unknown=LINES_INCOMPLETE).collect()
    assert [(r[REJECT_CODE], r["reject_reason"]) for r in incomplete] == [
        (LINES_INCOMPLETE, "schema id 424242 (the record's value) was not read from the registry yet: the batch is decoded again with it")]


def write_config(tmp_path: Path, registry_url: str) -> Any:
    doc = {"lake": "lake", "tables": {"public.types": {"key": ["id"]}},
           "source": {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9", "topics": ["avro.pg.public.types"], "format": "avro",
                      "schema_registry_url": registry_url}}
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    cfg = load_config(tmp_path / "cdc.yaml")
    cfg.checkpoint_dir.mkdir(parents=True)
    (cfg.checkpoint_dir / "metadata").write_text('{"id": "avro-test-query"}\n', encoding="utf-8")
    return cfg


def test_the_ingest_job_lands_avro_batches_and_replays_one_the_registry_did_not_answer(spark: Any, tmp_path: Path, query) -> None:  # noqa: ANN001
    from cdc_platform.run.ingest import IngestJob

    data = captured()
    records = [(raw(r["key"]), raw(r["value"])) for r in data["records"] if r["topic"] == "avro.pg.public.types"]
    records.append((None, wire(55_555, b"\x00")))  # one the registry does not know
    with stub_registry(schema_ids(data)) as reg:
        cfg = write_config(tmp_path, reg.url)
        job = IngestJob(cfg)
        job.setup(spark)
        reg.fail_next = [503] * 4
        with pytest.raises(SchemaRegistryUnavailable, match="nothing of this micro-batch was committed"):
            job.foreach_batch(frame(spark, records, "avro.pg.public.types"), 0)
        assert query(cfg, "select count(*) as n from raw_change_events")[0]["n"] == 0
        job.foreach_batch(frame(spark, records, "avro.pg.public.types"), 0)  # the same batch, replayed
    raw_rows = query(cfg, "select op, table_id, kafka_offset from raw_change_events order by kafka_offset")
    changes = sum(1 for r in data["records"] if r["topic"] == "avro.pg.public.types" and r["value"])
    assert len(raw_rows) == changes and {r["table_id"] for r in raw_rows} == {"public.types"}
    dead = query(cfg, "select reason_code, line, source_file from dead_letter")
    assert [(d["reason_code"], base64.b64decode(d["line"])) for d in dead] == [(avro_decode.UNKNOWN_SCHEMA_ID, wire(55_555, b"\x00"))]
    assert dead[0]["source_file"] == f"kafka:avro.pg.public.types/0@{len(records) - 1}"
    # The view holds what the source held at the end of the capture (the table was truncated last).
    assert query(cfg, "select count(*) as n from types__full_view")[0]["n"] == 0


def test_a_record_of_nulls_is_told_from_bytes_that_do_not_decode(spark: Any) -> None:
    """`from_avro`'s PERMISSIVE mode answers undecodable bytes with a record of nulls: only the one encoding of
    a record that is all null (each field's null branch) is that record; anything else is a dead letter."""
    optional = '{"type":"record","name":"O","fields":[{"name":"a","type":["null","int"],"default":null},{"name":"b","type":["string","null"]}]}'
    required = '{"type":"record","name":"R","fields":[{"name":"a","type":"int"}]}'
    scalar = '["null","string"]'
    records = [(None, wire(1, b"\x00\x02")), (None, wire(1, b"\x00")), (None, wire(1, b"\x02\x02\x02")),
               (None, wire(2, b"\x04")), (None, wire(2, b"")), (None, wire(3, b"\x00")), (None, wire(3, b"\x02\x04hi")), (None, wire(3, b"\x02"))]
    with stub_registry({1: optional, 2: required, 3: scalar}) as reg:
        lines = AvroLines(SchemaRegistry(reg.url))(frame(spark, records)).collect()
    payloads = [None if r[REJECT_CODE] else json.loads(r["value"])["payload"] for r in lines]
    assert payloads == [{"a": None, "b": None}, None, {"a": 1, "b": None}, {"a": 2}, None, None, "hi", None]
    assert [r[REJECT_CODE] for r in lines] == [None, avro_decode.NOT_DECODABLE, None, None, avro_decode.NOT_DECODABLE,
                                               None, None, avro_decode.NOT_DECODABLE]
    assert json.loads(lines[5]["value"]) == {"schema": {"type": "string", "optional": True}, "payload": None}


def test_a_batchs_records_are_held_for_the_batch_and_let_go_after(spark: Any) -> None:
    """Learning, the ids' job and the decode read the batch's records once (held), and `release` lets them go: a
    held frame per batch would otherwise pile up in the executors' memory over a long stream."""
    data = captured()
    records = [(raw(r["key"]), raw(r["value"])) for r in data["records"][:5]]
    with stub_registry(schema_ids(data)) as reg:
        decode = AvroLines(SchemaRegistry(reg.url))
        first = decode(frame(spark, records))  # nothing known yet: it learns
        held = decode._held
        assert held is not None and held.is_cached
        expected = first.collect()
        second = decode(frame(spark, records), learn=True)  # the next batch lets the last one's go
        assert not held.is_cached and decode._held is not None and decode._held.is_cached
        assert second.collect() == expected
        decode.release()
        decode.release()  # idempotent
        assert decode._held is None
        assert second.collect() == expected  # recomputed from the source once let go
        third = decode(frame(spark, records))  # every id known: no ids' job, nothing held
        assert decode._held is None and third.collect() == expected


TYPES_TOPIC = "avro.pg.public.types"


def test_known_schemas_decode_a_batch_once_and_a_new_id_is_left_for_the_second_pass(spark: Any) -> None:
    """The topic's subjects, read before the first batch, give the schemas a batch is decoded with, without its
    ids' job; a record naming an id not among them (here the column added mid-capture: value schema 17) is marked
    `LINES_INCOMPLETE`, and decoding again, learning, makes every line as learning from the start makes them."""
    data = captured()
    records = [(raw(r["key"]), raw(r["value"])) for r in data["records"] if r["topic"] == TYPES_TOPIC]
    subjects = {f"{TYPES_TOPIC}-key": [1], f"{TYPES_TOPIC}-value": [2]}
    with stub_registry(schema_ids(data), subjects=subjects) as reg:
        decode = AvroLines(SchemaRegistry(reg.url), avro_decode.subjects_of([TYPES_TOPIC]))
        first = decode(frame(spark, records, TYPES_TOPIC)).collect()
        assert decode._held is None, "no ids' pass"
        assert sorted(p for p in reg.requests if p.startswith("/schemas/ids/")) == ["/schemas/ids/1", "/schemas/ids/2"], "the subjects' ids"
        asked = len(reg.requests)
        learned = decode(frame(spark, records, TYPES_TOPIC), learn=True).collect()
        assert reg.requests[asked:] == ["/schemas/ids/17"], "only the new id is read"
        with stub_registry(schema_ids(data)) as fresh:
            assert learned == AvroLines(SchemaRegistry(fresh.url))(frame(spark, records, TYPES_TOPIC)).collect()
        again = decode(frame(spark, records, TYPES_TOPIC)).collect()
    assert again == learned, "with the new id known, a batch is decoded once and whole"
    incomplete = [i for i, line in enumerate(first) if line[REJECT_CODE] == LINES_INCOMPLETE]
    assert incomplete == [i for i, (_, v) in enumerate(records) if v is not None and struct.unpack(">I", v[1:5])[0] == 17]
    assert len(incomplete) == 3 and all("not read from the registry yet" in first[i]["reject_reason"] for i in incomplete)
    assert [line for i, line in enumerate(first) if i not in incomplete] == [line for i, line in enumerate(learned) if i not in incomplete]


def test_the_ingest_decodes_a_batch_again_when_it_names_a_schema_not_read_yet(spark: Any, tmp_path: Path, query) -> None:  # noqa: ANN001
    """The batch's aggregate counts the records left for a second pass before anything is committed; the job
    decodes the batch again, learning, and commits it once: the lake is the one learning from the start gives."""
    from cdc_platform.run.ingest import IngestJob

    data = captured()
    records = [(raw(r["key"]), raw(r["value"])) for r in data["records"] if r["topic"] == TYPES_TOPIC]
    messages: list[str] = []
    with stub_registry(schema_ids(data), subjects={f"{TYPES_TOPIC}-key": [1], f"{TYPES_TOPIC}-value": [2]}) as reg:
        cfg = write_config(tmp_path, reg.url)
        job = IngestJob(cfg, progress=messages.append)
        job.setup(spark)
        job.foreach_batch(frame(spark, records, TYPES_TOPIC), 0)
        assert any("name a schema not read yet; decoding the batch again" in m for m in messages)
        asked = list(reg.requests)
        job.foreach_batch(frame(spark, records, TYPES_TOPIC), 1)  # redelivered: every id known now, one pass
        assert reg.requests == asked and sum("decoding the batch again" in m for m in messages) == 1
    changes = sum(1 for r in data["records"] if r["topic"] == TYPES_TOPIC and r["value"])
    assert query(cfg, "select count(*) as n from raw_change_events")[0]["n"] == changes
    assert query(cfg, "select count(*) as n from dead_letter")[0]["n"] == 0
    metrics = query(cfg, "select dead_letters, change_events from pipeline_metrics order by batch_id")
    assert [m["dead_letters"] for m in metrics] == [0, 0] and metrics[0]["change_events"] == changes
