"""The JVM parser (jvm/parser/, what `parse_spark.parse_lines` runs) gives the Python parser's rows, byte for byte.

The Python parser (`envelope`) is the reference of the rules and the oracle here: every test parses the same
lines with both, in Spark as the stream does (the Python one in its Arrow function on the executors), and
compares complete PARSED rows, `_seq` included - kinds, event identities, table ids, positions, row-image
texts, keys, times, transactions, markers, reason codes and reason texts. The lines: the bad-input corpus
(with its generated 10 MB lines), the peer data, the lines the envelope tests write out, Kafka records with
every kind of key, Hypothesis envelopes of every Connect type and of every field any JSON value (damaged too),
numbers spelled every way, and nesting at the depths where Python gives up.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_platform.errors import ConfigError, EnvironmentNotReadyError
from cdc_platform.parse import jvm_parse, parse_spark
from cdc_platform.parse.envelope import KeySpec
from cdc_platform.parse.json_codec import canonical_json
from tests.cdc_platform.test_bad_input import CORPUS, EXPECTED, _make_corpus
from tests.conftest import REPLICA_IDENTITY, SCHEMA_EXCLUDE
from tests.strategies import debezium_types as T
from tests.strategies import envelope_lines as L

KEYS = KeySpec(L.KEYS | {source: spec["key"] for source, spec in EXPECTED["tables"].items()} | {"inventory.products": ["id"]})


def kafka_frame(spark: Any, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None = None) -> Any:
    """Lines in `sources.py`'s column contract, values (and Kafka keys) given as bytes and cast to string as the
    sources cast them (no UTF-8 check), with the Kafka origin when there are keys; in two partitions."""
    from pyspark.sql import functions as F

    if keys is None:
        frame = spark.createDataFrame([(v, f"lines/{i}") for i, v in enumerate(values)], "value binary, source_file string")
        return frame.select(F.col("value").cast("string"), "source_file")
    rows = [(v, f"kafka:t/0@{i}", k, "t", i % 3, i) for i, (v, k) in enumerate(zip(values, keys, strict=True))]
    frame = spark.createDataFrame(rows, "value binary, source_file string, kafka_key binary, kafka_topic string, "
                                        "kafka_partition int, kafka_offset long")
    return frame.select(F.col("value").cast("string"), "source_file", F.col("kafka_key").cast("string"), "kafka_topic",
                        "kafka_partition", "kafka_offset")


def both(lines: Any, keys: KeySpec = KEYS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The rows each parser gives for `lines`, in input order (`_seq`)."""
    out = {}
    for parser in parse_spark.PARSERS:
        out[parser] = parse_spark.parse_lines(lines, keys, parser).toArrow().sort_by(parse_spark.SEQ).to_pylist()
    return out["jvm"], out["python"]


def assert_same_rows(lines: Any, keys: KeySpec = KEYS) -> list[dict[str, Any]]:
    jvm, python = both(lines, keys)
    assert len(jvm) == len(python)
    diffs = []
    for j, p in zip(jvm, python, strict=True):
        if j != p:
            fields = ", ".join(f"{k}: jvm {j[k]!r:.200} python {p[k]!r:.200}" for k in p if j[k] != p[k])
            diffs.append(f"{(p['line'] or '')[:160]!r}: {fields}")
    assert not diffs, f"{len(diffs)} of {len(python)} rows differ:\n" + "\n".join(diffs[:8])
    return python


def assert_same(spark: Any, lines: Sequence[bytes | str | None], keys: KeySpec = KEYS) -> list[dict[str, Any]]:
    data = [line.encode("utf-8", "surrogatepass") if isinstance(line, str) else line for line in lines]
    return assert_same_rows(kafka_frame(spark, data), keys)


# -- the corpus, the peer data, the envelope tests' lines ---------------------------------------------------

def test_the_bad_input_corpus_and_the_peer_data(spark: Any, tmp_path: Path) -> None:
    """Read as the stream reads files (Spark's text source splits the lines), the generated 10 MB lines too."""
    from pyspark.sql import functions as F

    folder = tmp_path / "landing"
    folder.mkdir()
    for path in sorted(CORPUS.glob("*.jsonl")) + [SCHEMA_EXCLUDE, REPLICA_IDENTITY]:
        (folder / path.name).write_bytes(path.read_bytes())
    _make_corpus().write_generated(folder)
    lines = spark.read.text(str(folder)).select("value", F.col("_metadata.file_path").alias("source_file"))
    rows = assert_same_rows(lines)
    kinds = {r["kind"] for r in rows}
    codes = {r["reason_code"] for r in rows if r["kind"] == "dead_letter"}
    assert kinds >= {"change", "marker", "tombstone", "dead_letter"}
    assert codes >= {"not_json", "not_utf8", "invalid_field", "missing_key", "unsafe_table_name", "out_of_range", "too_deep",
                     "lone_surrogate", "delete_without_row", "not_object"}
    assert any(len(r["line"]) > 10 * 1024 * 1024 and r["kind"] == "change" for r in rows)


def _looks_like_a_line(text: str) -> bool:
    return text.strip()[:1] in ("{", "[") or text.strip() in ("", "null")


def envelope_test_lines() -> list[str]:
    """The lines the envelope tests write out: string literals that are lines, literal dicts that are envelopes
    or markers, their parametrized cases, and (test_envelope) `change(**overrides)` for each case's overrides."""
    found: list[str] = []

    def collect(value: Any, change: Any = None) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            if change is not None and value and all(isinstance(k, str) for k in value):
                try:
                    found.append(json.dumps(change(**value)))
                except (TypeError, ValueError):
                    pass
            for v in value.values():
                collect(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                collect(v, change)

    for name in ("test_envelope", "test_envelope_kafka", "test_connector_events"):
        module = importlib.import_module(f"tests.cdc_platform.{name}")
        change = getattr(module, "change", None)
        takes_overrides = change is not None and any(p.kind is p.VAR_KEYWORD for p in inspect.signature(change).parameters.values())
        if takes_overrides:
            found.append(json.dumps(change()))
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _looks_like_a_line(node.value):
                found.append(node.value)
            elif isinstance(node, ast.Dict):
                try:
                    value = ast.literal_eval(node)
                except ValueError:
                    continue
                if value.keys() & {"op", "source", "status", "marker", "payload", "ts_ms", "after", "before", "key"}:
                    found.append(json.dumps(value))
        for value in vars(module).values():
            if isinstance(value, dict) and all(isinstance(v, str) for v in value.values()):
                collect(list(value.values()))  # DEAD_CASES and the like
            for mark in getattr(value, "pytestmark", []):
                if mark.name == "parametrize":
                    collect(list(mark.args[1]), change if takes_overrides else None)
    return list(dict.fromkeys(found))


def test_the_lines_the_envelope_tests_write(spark: Any) -> None:
    lines = envelope_test_lines()
    assert len(lines) > 60
    assert_same(spark, lines)


def test_lines_that_failed_a_whole_batch_of_the_python_parser(spark: Any) -> None:
    """Found while porting: each raised in Python and stopped the batch; now each is one dead letter (or a row)."""
    base = {"op": "c", "after": {"id": 1}, "source": {"connector": "mysql", "db": "d", "table": "t", "pos": 4, "file": "mysql-bin.000001"}}
    digits = dict(base, source=dict(base["source"], file="mysql-bin." + "1" * 4301))
    schema = {"schema": {"fields": 5}, "payload": base}
    counts = {"status": "END", "id": "7:1", "event_count": 2,
              "data_collections": [{"data_collection": "d.t", "event_count": 2**63 - 1}, {"data_collection": "d.t", "event_count": 1}]}
    rows = assert_same(spark, [json.dumps(digits), json.dumps(schema), json.dumps(counts)])
    assert [(r["kind"], r["reason_code"]) for r in rows] == [("dead_letter", "out_of_range"), ("change", None), ("dead_letter", "out_of_range")]


def test_postgresql_positions_from_the_sequence(spark: Any) -> None:
    """Debezium PostgreSQL's `source.sequence` ([last commit LSN, LSN]) places an event that has no `lsn` (an
    incremental snapshot's re-read row) and one whose transaction committed after an earlier one's commit."""
    def pg(sequence: Any, lsn: Any = None) -> str:
        source = {"connector": "postgresql", "name": "p", "db": "d", "schema": "public", "table": "t", "ts_ms": 1767225600000,
                  "snapshot": "incremental", **({} if lsn is None else {"lsn": lsn}), **({} if sequence is None else {"sequence": sequence})}
        return json.dumps({"op": "r", "after": {"id": 1}, "source": source, "ts_ms": 1})

    sequences = ['["26389728","26389728"]', '[null,"26388832"]', '["26391320","26388900"]', '[null,null]', ' [ "1" , "2" ] ',
                 '\u00a0["3","4"]\u2003', '["9223372036854775808","1"]', '["12", 13]', "garbage", '["1","2"]x', '["","1"]',
                 '["123456789012345678901","1"]', 5, None, '["0001","0"]']
    lines = [pg(s) for s in sequences] + [pg(s, lsn=26388000) for s in sequences] + [pg(s, lsn="77") for s in sequences]
    rows = assert_same(spark, lines)
    assert rows[0]["position"] == f"{26389728:020d}" and rows[2]["position"] == f"{26391320:020d}"
    assert {r["reason_code"] for r in rows[: len(sequences)]} >= {"invalid_field", "out_of_range", None}


# -- Kafka records -------------------------------------------------------------------------------------------

def test_kafka_keys_values_and_origin(spark: Any) -> None:
    """A delete without `before` takes its row from the record key (plain, schema-wrapped, not UTF-8, not JSON,
    absent); a null value is a tombstone; the origin columns come through."""
    delete = json.dumps({"op": "d", "before": None, "after": None, "source": {"connector": "postgresql", "schema": "d", "table": "t", "lsn": 7}})
    keys: list[bytes | None] = [b'{"id": 5}', b'{"schema": {"type": "struct"}, "payload": {"id": 6, "x": 1.12345678901234567}}',
                                b'{"id": "\xff"}', b"not json", None, b"[1]", b'{"id": 1e400}', b"{}", b'{"id": "\\ud800"}']
    values: list[bytes | None] = [delete.encode()] * len(keys) + [None, b"\xff\xfe", b'{"ts_ms": 5}']
    rows = assert_same_rows(kafka_frame(spark, values, keys + [b'{"id": 1}', None, None]))
    assert [r["kind"] for r in rows[:4]] == ["change", "change", "change", "dead_letter"]
    assert rows[0]["before"] == '{"id":5}' and rows[1]["before"] == '{"id":6,"x":1.12345678901234567}'
    assert (rows[len(keys)]["kind"], rows[len(keys)]["line"], rows[len(keys)]["kafka_offset"]) == ("tombstone", "", len(keys))


# -- numbers, identities, depth --------------------------------------------------------------------------------

def test_numbers_every_way_they_are_spelled(spark: Any) -> None:
    """Python's float text (shortest round trip, its exponent form), the digits no float holds, and which of its two
    readers a line takes (orjson, or the stdlib's exact one when a number might lose digits) decide the row images."""
    lines = []
    for text in L.number_texts(seed=3, count=2500):
        lines.append('{"op":"c","source":{"table":"t","db":"d"},"after":{"id":1,"v":%s}}' % text)
        lines.append('{"op":"c","source":{"table":"t","db":"d"},"after":{"id":2,"v":%s,"w":1.12345678901234567}}' % text)
        lines.append('{"op":"c","source":{"table":"t","db":"d","pos":%s,"connector":"mysql"},"after":{"id":%s}}' % (text, text))
    assert_same(spark, lines)


def test_event_ids_are_blake2b_of_the_canonical_identity(spark: Any) -> None:
    """BLAKE2b-128 in Java against Python's hashlib, over identity texts of every length up to four blocks, non-ASCII and
    astral keys sorted by code point (not by UTF-16 unit)."""
    events = [{"op": "c", "after": {"id": n, "pad": "é" * (n % 7) + "x" * n, "\U0001F600": 1, "\ue000": 2}, "source": {"table": "t", "db": "d"},
               "ts_ms": n} for n in range(0, 520, 3)]
    rows = assert_same(spark, [json.dumps(e, ensure_ascii=False) for e in events])
    for event, row in zip(events, rows, strict=True):
        identity = {k: v for k, v in event.items() if k != "ts_ms"}
        assert row["event_id"] == hashlib.blake2b(canonical_json(identity).encode("utf-8"), digest_size=16).hexdigest()


def _nest(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


_CHANGE = '{"op":"c","source":{"table":"t","db":"d"%s},"after":{"x":%s%s}%s}'
#: Lines nested right at the depths where Python stops reading or writing (see jvm/parser's Limits): each shape
#: takes another of its paths - orjson's reader, the stdlib's (a number no float holds), a Decimal deep or shallow,
#: a float call at the deepest level, a key, a Connect schema, a record key's row, a lone surrogate, a transaction id.
DEEP_SHAPES = {
    "plain": lambda d: _CHANGE % ("", _nest(d), "", ""),
    "exact": lambda d: _CHANGE % ("", _nest(d), ',"y":1e-400', ""),
    "decimal": lambda d: _CHANGE % ("", _nest(d), ',"y":1.123456789012345678', ""),
    "decimal-deep": lambda d: _CHANGE % ("", _nest(d, "1.123456789012345678"), "", ""),
    "float-deep": lambda d: _CHANGE % ("", _nest(d, "1.5"), ',"y":1e-400', ""),
    "float-long-deep": lambda d: _CHANGE % ("", _nest(d, "0.30000000000000004"), ',"y":1e-400', ""),
    "nan-deep": lambda d: _CHANGE % ("", _nest(d, "NaN"), ',"y":1e-400', ""),
    "key": lambda d: '{"op":"c","source":{"table":"t","db":"k"},"after":{"id":%s},"ts_ms":"bad"}' % _nest(d),
    "schema": lambda d: '{"schema":{"fields":[{"field":"after","x":%s}]},"payload":%s}' % (_nest(d), _CHANGE % ("", "1", "", "")),
    "record-key": lambda d: '{"key":{"id":%s},"value":{"op":"d","source":{"table":"t","db":"d"},"before":null}}' % _nest(d),
    "surrogate": lambda d: _CHANGE % ("", _nest(d), ',"s":"\\ud800"', ""),
    "surrogate-exact": lambda d: _CHANGE % ("", _nest(d), ',"s":"\\ud800","y":1e-400', ""),
    "transaction-id": lambda d: _CHANGE % ("", "1", "", ',"transaction":{"id":%s}' % _nest(d)),
    "source-name": lambda d: _CHANGE % (',"name":%s' % _nest(d), "1", "", ""),
}


def test_nesting_where_python_gives_up(spark: Any) -> None:
    lines = [shape(d) for shape in DEEP_SHAPES.values() for d in (*range(962, 976), *range(1019, 1027))]
    rows = assert_same(spark, lines, KeySpec({"k.t": ["id"]}))
    assert {r["reason_code"] for r in rows} >= {None, "too_deep", "lone_surrogate"}


def _schema(extra: str = "", fields: str = '{"field":"after","type":"struct","fields":[{"field":"id","type":"int64"}]}') -> str:
    """A Connect schema text over the memo's 128-byte floor (the JVM parser reads each schema text once per task)."""
    return '{"type":"struct","name":"k.t.Envelope","doc":"%s","fields":[%s]%s}' % ("x" * 120, fields, extra)


def test_a_schema_read_once_per_task_gives_the_rows_of_reading_it_every_time(spark: Any) -> None:
    """Each line of a task whose schema bytes it has read before takes that schema: the rows must be the ones of
    reading every line whole, whatever the schema set while it was read (a float, a number no float holds, a lone
    surrogate, nesting near the limit) and whatever follows it. Each shape repeats, interleaved, so every task
    meets each again."""
    change = '{"op":"c","source":{"table":"t","db":"k"},"after":{"id":%s}}'
    schemas = {
        "plain": _schema(),
        "float": _schema(',"default":1.5'),
        "exact": _schema(',"default":1e-400'),
        "long-float": _schema(',"default":1.12345678901234567'),
        "surrogate": _schema(',"doc2":"\\ud800"'),
        "deep": _schema(',"x":%s' % _nest(1015)),
    }
    lines = []
    for n in range(6):
        for schema in schemas.values():
            lines += [
                '{"schema":%s,"payload":%s}' % (schema, change % n),
                '{"schema":%s,"payload":%s}' % (schema, change % f"{n}.5"),  # a float after the schema: the line's path changes
                '{"schema":%s,"payload":%s}' % (schema, change % _nest(n + 8)),
                '{"schema":%s,"payload":%s}' % (schema, change % "[" * 3),  # broken after the schema
                '{"schema":%s' % schema[:-1],  # the schema's bytes but its last
                '{"schema":%s,"payload":%s}x' % (schema, change % n),
                '{"key":{"schema":%s,"payload":{"id":%d}},"value":{"schema":%s,"payload":%s}}' % (schema, n, schema, change % n),
                '{"payload":%s,"schema":%s}' % (change % n, schema),
                '{"schema":%s,"payload":%s,"other":1}' % (schema, change % n),
            ]
    rows = assert_same(spark, lines, KeySpec({"k.t": ["id"]}))
    assert {r["reason_code"] for r in rows} >= {None, "not_json", "lone_surrogate", "too_deep"}


# -- property tests -------------------------------------------------------------------------------------------

@settings(max_examples=12)
@given(st.lists(L.lines(), min_size=1, max_size=40))
def test_any_line(spark: Any, lines: list[bytes]) -> None:
    assert_same(spark, lines)


@settings(max_examples=6)
@given(T.table_cases(list(T.WRAPPED), min_columns=len(T.WRAPPED), max_columns=len(T.WRAPPED), every_family=True),
       T.table_cases(list(T.PLAIN), min_columns=len(T.PLAIN), max_columns=len(T.PLAIN), every_family=True))
def test_envelopes_of_every_connect_type(spark: Any, wrapped: T.TableCase, plain: T.TableCase) -> None:
    keys = KeySpec({wrapped.source: ["id"], plain.source: ["id"]})
    assert_same(spark, wrapped.lines() + plain.lines(), keys)


# -- how it fails ---------------------------------------------------------------------------------------------

def test_a_session_without_the_parser_stops_with_one_line(spark: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from cdc_platform.spark import session

    lines = kafka_frame(spark, [b"{}"])
    monkeypatch.setattr(jvm_parse, "ENTRY", "cdc.platform.parse.NoSuchParser")
    with pytest.raises(EnvironmentNotReadyError, match=r"not loaded in this Spark session: run `make setup`$"):
        parse_spark.parse_lines(lines, KEYS, "jvm")
    with pytest.raises(EnvironmentNotReadyError, match=r"run `make setup`$") as info:
        session.platform_jars(tmp_path / "parser" / "jars")
    assert "\n" not in str(info.value)


def test_the_parser_setting(spark: Any) -> None:
    lines = kafka_frame(spark, [b'{"ts_ms": 1}'])
    spark.conf.set(parse_spark.PARSER_CONF, "rust")
    try:
        with pytest.raises(ConfigError, match=r"spark\.cdc\.parser is 'rust'; it must be one of jvm, python"):
            parse_spark.parse_lines(lines, KEYS)
        spark.conf.set(parse_spark.PARSER_CONF, "python")
        assert "MapInArrow" in parse_spark.parse_lines(lines, KEYS)._jdf.queryExecution().optimizedPlan().toString()
    finally:
        spark.conf.unset(parse_spark.PARSER_CONF)
    assert "cdc_parse_envelope" in parse_spark.parse_lines(lines, KEYS)._jdf.queryExecution().optimizedPlan().toString()


def test_records_the_source_rejected_are_the_same_dead_letters(spark: Any) -> None:
    """An Avro record the source could not decode (`reject_code`) is not parsed by either parser: a dead letter
    with the source's code and reason, its value as the line."""
    from pyspark.sql import functions as F

    data = [b'{"op": "c"}', b"AAAA", b"QkJC", None]
    frame = kafka_frame(spark, data)
    codes = F.when(F.col("value") == "AAAA", F.lit("unknown_schema_id")).when(F.col("value") == "QkJC", F.lit("avro_decode_error"))
    reasons = F.when(codes == "unknown_schema_id", F.lit("schema id 9 is unknown to the registry"))
    rows = assert_same_rows(frame.withColumn("reject_code", codes).withColumn("reject_reason", reasons))
    assert [(r["kind"], r["reason_code"], r["reason"], r["line"]) for r in rows[1:3]] == [
        ("dead_letter", "unknown_schema_id", "schema id 9 is unknown to the registry", "AAAA"),
        ("dead_letter", "avro_decode_error", "avro_decode_error", "QkJC")]
