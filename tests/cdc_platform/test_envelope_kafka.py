"""The parser on Kafka records: extra input columns (record key, origin) beside (value, source_file)."""

from __future__ import annotations

import json

import pyarrow as pa

from cdc_platform.parse.envelope import KeySpec, parse_line
from cdc_platform.parse.parsed_batches import parse_arrow_batches
from cdc_platform.lake.schemas import KAFKA_ORIGIN_COLUMNS, PARSED

KEYS = KeySpec({"public.accounts": ("id",)})


def change(op: str, before: dict | None, after: dict | None, lsn: int) -> str:
    return json.dumps({
        "before": before, "after": after, "op": op, "ts_ms": 1,
        "source": {"connector": "postgresql", "schema": "public", "table": "accounts", "lsn": lsn, "ts_ms": 1_700_000_000_000},
    })


def wrapped_key(id_: int) -> str:
    return json.dumps({"schema": {"type": "struct", "fields": [{"field": "id", "type": "int32"}]}, "payload": {"id": id_}})


def kafka_batch(values: list[str | None], keys: list[str | None], offsets: list[int]) -> pa.RecordBatch:
    n = len(values)
    return pa.RecordBatch.from_pydict({
        "value": pa.array(values, pa.string()),
        "source_file": [f"kafka:pg.public.accounts/0@{o}" for o in offsets],
        "kafka_key": pa.array(keys, pa.string()),
        "kafka_topic": ["pg.public.accounts"] * n,
        "kafka_partition": pa.array([0] * n, pa.int32()),
        "kafka_offset": pa.array(offsets, pa.int64()),
    })


def test_origin_columns_are_carried_and_a_null_value_is_a_tombstone() -> None:
    values = [change("c", None, {"id": 1, "v": "a"}, 10), None, "not json"]
    out = list(parse_arrow_batches(iter([kafka_batch(values, [wrapped_key(1), wrapped_key(1), None], [5, 6, 7])]), KEYS))
    assert len(out) == 1 and out[0].schema == PARSED
    rows = out[0].to_pylist()
    assert [r["kind"] for r in rows] == ["change", "tombstone", "dead_letter"]
    assert [(r["kafka_topic"], r["kafka_partition"], r["kafka_offset"]) for r in rows] == [("pg.public.accounts", 0, o) for o in (5, 6, 7)]
    assert rows[0]["source_file"] == "kafka:pg.public.accounts/0@5"


def test_the_record_key_names_the_row_of_a_delete_without_before() -> None:
    keyless = change("d", None, None, 20)
    batch = kafka_batch([keyless, keyless, keyless], [wrapped_key(7), None, "[1]"], [1, 2, 3])
    rows = next(parse_arrow_batches(iter([batch]), KEYS)).to_pylist()
    assert rows[0]["kind"] == "change" and rows[0]["key"] == '{"id":7}' and json.loads(rows[0]["before"]) == {"id": 7}
    assert [r["reason_code"] for r in rows[1:]] == ["delete_without_row", "delete_without_row"], "no key, or a key that names no row"
    # The same as a file dump of the record, {"key": ..., "value": ...}: same event, same identity.
    dumped = parse_line(json.dumps({"key": json.loads(wrapped_key(7)), "value": json.loads(keyless)}), "f", KEYS)
    assert dumped["event_id"] == rows[0]["event_id"] and dumped["key"] == rows[0]["key"]


def test_a_before_image_wins_over_the_record_key() -> None:
    rows = next(parse_arrow_batches(iter([kafka_batch([change("d", {"id": 3}, None, 30)], [wrapped_key(99)], [1])]), KEYS)).to_pylist()
    assert rows[0]["key"] == '{"id":3}'


def test_file_lines_have_null_origin_and_non_utf8_kafka_values_dead_letter() -> None:
    files = pa.RecordBatch.from_pydict({"value": [change("c", None, {"id": 1}, 1)], "source_file": ["/l/a.jsonl"]})
    row = next(parse_arrow_batches(iter([files]), KEYS)).to_pylist()[0]
    assert all(row[c] is None for c in KAFKA_ORIGIN_COLUMNS)
    bad = kafka_batch(["x"], [None], [9])
    bad = bad.set_column(0, "value", pa.array([b"\xff{}"], pa.binary()).view(pa.string()))
    row = next(parse_arrow_batches(iter([bad]), KEYS)).to_pylist()[0]
    assert row["reason_code"] == "not_utf8" and row["kafka_offset"] == 9


def test_the_executors_carry_the_kafka_columns_like_the_parser_in_the_driver(spark) -> None:  # noqa: ANN001
    from cdc_platform.parse import parse_spark
    from cdc_platform.lake import schemas

    n = 40
    values = [change("c", None, {"id": i}, 100 + i) if i % 5 else None for i in range(n)]
    batch = kafka_batch(values, [wrapped_key(i) for i in range(n)], list(range(n)))
    lines = pa.Table.from_batches([batch]).append_column("ignored", pa.array(["x"] * n))  # other columns are dropped
    in_driver = pa.Table.from_batches(list(parse_arrow_batches(iter([batch]), KEYS)), schemas.PARSED)
    parsed = parse_spark.parse_lines(spark.createDataFrame(lines).coalesce(1), KEYS)
    out = parsed.orderBy(parse_spark.SEQ).drop(parse_spark.SEQ).toArrow()
    assert sorted(out.column_names) == sorted(schemas.PARSED.names)
    on_executors = schemas.conform(out, schemas.PARSED)
    assert on_executors.equals(in_driver)
    assert on_executors.column("kafka_offset").to_pylist() == list(range(n))
