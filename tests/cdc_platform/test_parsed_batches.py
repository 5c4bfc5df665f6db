"""The parser's rows as Arrow: `rows_to_batch` builds what `from_pylist` would, and `split_parsed` shapes a parsed
table into the raw log's, the markers' and the dead letters' rows, first of each identity kept."""

from __future__ import annotations

import datetime as dt
import json
import random
from typing import Any

import pyarrow as pa

from cdc_platform.parse.envelope import parse_line
from cdc_platform.parse.parsed_batches import rows_to_batch, split_parsed
from cdc_platform.lake.schemas import DEAD_LETTER, PARSED, RAW_CHANGE_EVENTS, TRANSACTION_MARKERS
from tests.cdc_platform.test_envelope import KEYS, _random_value, change

END = '{"status":"END","id":"571:9","ts_ms":1,"event_count":1,"data_collections":[{"data_collection":"a.b","event_count":1}]}'


def _mixed_rows() -> list[dict[str, Any]]:
    rng = random.Random(7)
    lines = [json.dumps(change(after={"id": i, "v": _random_value(rng)})) for i in range(60)]
    lines += [END] * 5
    lines += ["", "null", "[1]", "{", json.dumps(change(op="x")), json.dumps(change(source=change()["source"] | {"table": "a b"}))]
    rng.shuffle(lines)
    return [parse_line(line, "f", KEYS) for line in lines]


def test_rows_to_batch_is_from_pylist_for_any_mix_of_rows() -> None:
    rows = _mixed_rows()
    rng = random.Random(3)
    odd = [{"kind": "change"}, {"line": "no kind"}, {"kind": "marker", "status": "BEGIN"}, {"kind": ["unhashable"]}]
    for trial in range(200):
        sample = rng.sample(rows, rng.randrange(len(rows)))
        if trial % 3 == 0:
            edited = dict(rng.choice(rows))
            edited[rng.choice(["status", "reason", "unknown", "event_id"])] = None if trial % 2 else "x"
            sample.append(edited)
        if trial % 5 == 0:
            sample.append(rng.choice(odd))
        try:
            want = pa.RecordBatch.from_pylist(sample, schema=PARSED)
        except (pa.ArrowException, TypeError):
            continue
        assert rows_to_batch(sample).equals(want), sample
    assert rows_to_batch([]).equals(pa.RecordBatch.from_pylist([], schema=PARSED))


def test_split_parsed_shapes_each_kind_to_its_table_and_keeps_the_first_of_each_identity() -> None:
    first, second = json.dumps(change(after={"id": 1, "v": "a"})), json.dumps(change(after={"id": 2, "v": "b"}))
    lines = [first, END, second, first, "{", "null", END]
    at = dt.datetime(2026, 11, 28, 1, 2, 3, tzinfo=dt.timezone.utc)
    batch = split_parsed(pa.Table.from_batches([rows_to_batch([parse_line(line, f"f{i}", KEYS) for i, line in enumerate(lines)])]), 7, at)

    assert (batch.events.schema, batch.markers.schema, batch.dead_letters.schema) == (RAW_CHANGE_EVENTS, TRANSACTION_MARKERS, DEAD_LETTER)
    assert batch.events.column("source_file").to_pylist() == ["f0", "f2"]  # the repeat of `first` (f3) dropped, input order kept
    assert batch.markers.column("source_file").to_pylist() == ["f1"]
    assert (batch.rows_read, batch.tombstones, batch.in_batch_duplicates, batch.batch_id) == (7, 1, 2, 7)
    assert set(batch.events.column("ingested_at").to_pylist()) == {at} == set(batch.markers.column("ingested_at").to_pylist())
    dead = batch.dead_letters.to_pylist()
    assert [(d["line"], d["stage"], d["batch_id"], d["reason_code"]) for d in dead] == [("{", "ingest", 7, "not_json")]


def test_a_record_the_source_rejected_is_a_dead_letter_with_its_code_and_bytes() -> None:
    """`reject_code`/`reject_reason` (an Avro record that did not decode): not parsed, dead-lettered as the
    source says, also in a batch whose other lines take the non-UTF-8 path."""
    from cdc_platform.lake.schemas import REJECT_CODE, REJECT_REASON
    from cdc_platform.parse.parsed_batches import parse_arrow_batches

    good = json.dumps(change(after={"id": 1, "v": "x"}))
    for bad_utf8 in (False, True):
        values = [good.encode(), b"AAAAAAE=", b"\xff not utf-8" if bad_utf8 else b"null"]
        batch = pa.RecordBatch.from_arrays(
            [pa.array(values, pa.binary()).view(pa.string()),  # unchecked, as Spark hands a Kafka value cast to string
             pa.array(["f0", "f1", "f2"]), pa.array([None, "unknown_schema_id", None]), pa.array([None, "schema id 1 is unknown", None])],
            names=["value", "source_file", REJECT_CODE, REJECT_REASON])
        out = next(parse_arrow_batches(iter([batch]), KEYS)).to_pylist()
        assert [r["kind"] for r in out] == ["change", "dead_letter", "dead_letter" if bad_utf8 else "tombstone"]
        assert (out[1]["reason_code"], out[1]["reason"], out[1]["line"], out[1]["source_file"]) == (
            "unknown_schema_id", "schema id 1 is unknown", "AAAAAAE=", "f1")
