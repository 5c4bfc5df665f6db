"""The parser against real connector output (peer data) and every dead-letter reason."""

from __future__ import annotations

import decimal
import json
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.parse import envelope, json_codec
from cdc_platform.parse.envelope import REASONS, KeySpec, normalise_transaction_id, parse_line
from cdc_platform.parse.parsed_batches import rows_to_batch
from cdc_platform.lake.schemas import PARSED

KEYS = KeySpec({"inventory.products": ["id"], "payments.customers": ["id"]})


def parse_file(path: Path, keys: KeySpec = KEYS) -> list[dict[str, Any]]:
    return [parse_line(line.rstrip("\n"), str(path), keys) for line in path.read_text(encoding="utf-8").splitlines()]


def change(**overrides: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "before": None,
        "after": {"id": 1, "email": "a@example.com"},
        "source": {"connector": "mysql", "name": "payments", "db": "payments", "table": "customers", "ts_ms": 1767225600000,
                   "file": "mysql-bin.000003", "pos": 4821, "row": 0, "snapshot": "false"},
        "op": "c",
        "ts_ms": 1767225600123,
        "transaction": {"id": "8c1f2e3a-0b1c-11ef-9a43-0242ac120002:17", "total_order": 1, "data_collection_order": 1},
    }
    event.update(overrides)
    return event


def test_schema_exclude_file_normalises_every_line(peer_files: dict[str, Path]) -> None:
    rows = parse_file(peer_files["schema_exclude"])
    assert [r["kind"] for r in rows] == ["change"] * 16
    snapshot = [r for r in rows if r["op"] == "r"]
    assert len(snapshot) == 9
    assert all(r["snapshot"] for r in snapshot)
    assert len({r["position"] for r in snapshot}) == 1, "snapshot reads share the snapshot's LSN"
    first = rows[0]
    assert first["table_id"] == "inventory.products"
    assert first["position_kind"] == "pg_lsn"
    assert first["position"] == f"{34078720:020d}"
    assert first["key"] == '{"id":101}'
    assert json.loads(first["after"]) == {"id": 101, "name": "scooter", "description": "Small 2-wheel scooter", "weight": 3.14}
    assert first["before"] is None
    assert first["source_ts"] == 1596001099434 * 1000
    assert first["transaction_id"] is None
    streamed = [r for r in rows if r["op"] != "r"]
    positions = [r["position"] for r in streamed]
    assert positions == sorted(positions), "later changes have higher LSNs"
    assert {r["op"] for r in streamed} == {"c", "u", "d"}
    delete = next(r for r in rows if r["op"] == "d")
    assert delete["key"] == '{"id":111}'
    assert delete["after"] is None and json.loads(delete["before"])["weight"] == 5.17
    assert len({r["event_id"] for r in rows}) == 16
    assert rows_to_batch(rows).schema == PARSED


def test_replica_identity_default_keeps_updates_and_dead_letters_the_keyless_delete(peer_files: dict[str, Path]) -> None:
    rows = parse_file(peer_files["replica_identity"])
    kinds = [r["kind"] for r in rows]
    assert kinds.count("change") == 15 and kinds.count("dead_letter") == 1
    updates = [r for r in rows if r.get("op") == "u"]
    assert updates and all(r["before"] is None and r["after"] for r in updates)
    dead = rows[-1]
    assert dead["kind"] == "dead_letter" and dead["reason_code"] == "delete_without_row"
    assert "REPLICA IDENTITY FULL" in dead["reason"] and "message key" in dead["reason"]
    assert dead["table_id"] == "inventory.products"
    assert dead["line"].startswith('{"before":null,"after":null')


def test_schema_payload_wrapper_is_unwrapped_and_its_schema_kept(peer_files: dict[str, Path]) -> None:
    plain_line = peer_files["schema_exclude"].read_text(encoding="utf-8").splitlines()[0]
    payload = json.loads(plain_line)
    schema = {"type": "struct", "name": "fullfillment.inventory.products.Envelope", "optional": False, "fields": [
        {"field": "before", "type": "struct", "optional": True, "fields": [{"field": "id", "type": "int32", "optional": False}]},
        {"field": "after", "type": "struct", "optional": True, "fields": [
            {"field": "id", "type": "int32", "optional": False}, {"field": "weight", "type": "double", "optional": True}]},
    ]}
    wrapped = parse_line(json.dumps({"schema": schema, "payload": payload}), "f", KEYS)
    plain = parse_line(plain_line, "f", KEYS)
    assert wrapped["kind"] == "change"
    assert json.loads(wrapped["row_schema"])["field"] == "after"
    assert plain["row_schema"] is None
    for column in ("event_id", "table_id", "op", "key", "after", "position", "source_ts"):
        assert wrapped[column] == plain[column], column


def test_identity_ignores_only_when_the_connector_processed_the_event() -> None:
    a = parse_line(json.dumps(change()), "f", KEYS)
    restarted = parse_line(json.dumps(change(ts_ms=1767225699999)), "g", KEYS)
    other = parse_line(json.dumps(change(after={"id": 1, "email": "b@example.com"})), "f", KEYS)
    assert a["event_id"] == restarted["event_id"]
    assert a["event_id"] != other["event_id"]
    # Debezium 2.x+ also sends ts_us and ts_ns; a replay after a connector crash changes all three.
    modern = change(ts_us=1767225600123456, ts_ns=1767225600123456789)
    replayed = change(ts_ms=1767225699999, ts_us=1767225699999001, ts_ns=1767225699999001002)
    assert parse_line(json.dumps(modern), "f", KEYS)["event_id"] == parse_line(json.dumps(replayed), "g", KEYS)["event_id"]
    # ... while the source's own times are what happened: a different commit time is a different event.
    later = change(source={**change()["source"], "ts_us": 1767225600000001})
    assert parse_line(json.dumps(later), "f", KEYS)["event_id"] != a["event_id"]


def test_mysql_binlog_position_orders_across_files() -> None:
    def pos(file: str, p: int, row: int = 0) -> str:
        src = change()["source"] | {"file": file, "pos": p, "row": row}
        return parse_line(json.dumps(change(source=src)), "f", KEYS)["position"]

    assert pos("mysql-bin.000003", 9999999) < pos("mysql-bin.000004", 4)
    assert pos("mysql-bin.000003", 100, 0) < pos("mysql-bin.000003", 100, 1) < pos("mysql-bin.000003", 101, 0)


def _pg(op: str, row_id: int, name: str, **source: Any) -> dict[str, Any]:
    src = {"connector": "postgresql", "db": "cdc", "schema": "public", "table": "acc", "ts_ms": 1767225600000, **source}
    return parse_line(json.dumps(change(op=op, after={"id": row_id, "name": name}, source=src, transaction=None)), "f",
                      KeySpec({"public.acc": ["id"]}))


def test_postgres_positions_follow_debezium_stream_not_the_lsn_alone() -> None:
    """What Debezium 3.5 sent on the test bed (issue 46): an incremental-snapshot read carries no `lsn`, only
    `sequence` at its window's close; a transaction that updated the row before the read and committed after the
    window closed comes later in the topic with an LSN below the close, and the last commit LSN before it above."""
    reread = _pg("r", 4, "n4", snapshot="incremental", sequence='["26389728","26389728"]')
    in_flight = _pg("u", 4, "t1", snapshot="false", lsn=26388900, txId=737, sequence='["26391320","26388900"]')
    earlier = _pg("u", 4, "n4", snapshot="false", lsn=26388000, txId=730, sequence='["26387000","26388000"]')
    assert (reread["position_kind"], reread["position"]) == ("pg_lsn", f"{26389728:020d}")
    assert in_flight["position"] == f"{26391320:020d}", "the last commit before its transaction places it, not its LSN"
    assert earlier["position"] < reread["position"] < in_flight["position"], "the stream's order: the read replaces the first, never the last"
    # The first transactions after a connector starts carry no last commit; an initial snapshot read neither.
    assert _pg("r", 1, "n1", snapshot="true", lsn=26388832, sequence='[null,"26388832"]')["position"] == f"{26388832:020d}"
    assert _pg("u", 1, "n1", lsn=26388832)["position"] == f"{26388832:020d}", "no sequence: the LSN, as before"


def test_postgres_unreadable_sequence_is_a_dead_letter_only_when_it_is_all_there_is() -> None:
    assert _pg("u", 1, "x", lsn=500, sequence="garbage")["position"] == f"{500:020d}"
    dead = _pg("r", 1, "x", snapshot="incremental", sequence='["12", 13]')
    assert dead["kind"] == "dead_letter" and dead["reason_code"] == "invalid_field" and "source.sequence" in dead["reason"]
    huge = _pg("r", 1, "x", snapshot="incremental", sequence=f'["{2**64 - 1}", null]')
    assert huge["kind"] == "dead_letter" and huge["reason_code"] == "out_of_range"
    assert _pg("r", 1, "x", snapshot="incremental", sequence="[null,null]")["position_kind"] == "source_ts_fallback"


@pytest.mark.parametrize(
    ("connector", "source", "kind"),
    [
        ("sqlserver", {"commit_lsn": "0000002b:00000420:0003", "change_lsn": "0000002b:00000420:0002", "event_serial_no": 1}, "sqlserver_lsn"),
        ("oracle", {"scn": "1234567"}, "oracle_scn"),
        ("mongodb", {"ord": 3}, "mongodb_oplog"),
        ("mariadb", {"file": "testbed-bin.000001", "pos": 1563, "row": 0, "gtid": "0-1-6"}, "mysql_binlog"),
        ("db2", {}, "source_ts_fallback"),
    ],
)
def test_other_connectors_get_a_documented_position(connector: str, source: dict[str, Any], kind: str) -> None:
    src = {"connector": connector, "db": "payments", "table": "customers", "ts_ms": 1767225600000, **source}
    row = parse_line(json.dumps(change(source=src)), "f", KEYS)
    assert row["kind"] == "change" and row["position_kind"] == kind and row["position"]


def test_transaction_ids_normalise_only_the_postgres_form() -> None:
    assert normalise_transaction_id("571:53195829") == "571"
    gtid = "8c1f2e3a-0b1c-11ef-9a43-0242ac120002:17"
    assert normalise_transaction_id(gtid) == gtid
    assert normalise_transaction_id("file=mysql-bin.000003,pos=154") == "file=mysql-bin.000003,pos=154"
    pg = change(transaction={"id": "571:53195832", "total_order": 2, "data_collection_order": 1})
    row = parse_line(json.dumps(pg), "f", KEYS)
    assert row["transaction_id"] == "571" and row["transaction_raw_id"] == "571:53195832" and row["tx_total_order"] == 2


def test_debezium_and_stripe_markers_normalise_to_one_shape() -> None:
    begin = parse_line('{"status":"BEGIN","id":"571:53195829","ts_ms":1486500577125,"event_count":null,"data_collections":null}', "f", KEYS)
    end = parse_line(json.dumps({"status": "END", "id": "571:53195832", "ts_ms": 1486500577691, "event_count": 2,
                                 "data_collections": [{"data_collection": "s1.a", "event_count": 1}, {"data_collection": "s1.b", "event_count": 1}]}), "f", KEYS)
    assert (begin["kind"], begin["status"], begin["transaction_id"], begin["marker_id"]) == ("marker", "BEGIN", "571", "571|BEGIN")
    assert (end["status"], end["event_count"], end["data_collections"]) == ("END", 2, [("s1.a", 1), ("s1.b", 1)])
    stripe = parse_line(json.dumps({"marker": "COMMIT", "transaction_id": "tx-9", "ts_ms": 5, "total_events": 3,
                                    "per_source_event_counts": {"payments.charges": 2, "payments.audits": 1}}), "f", KEYS)
    assert (stripe["status"], stripe["marker_shape"], stripe["event_count"], stripe["transaction_id"]) == ("END", "stripe", 3, "tx-9")
    assert dict(stripe["data_collections"]) == {"payments.charges": 2, "payments.audits": 1}


@pytest.mark.parametrize("line", ["", "   ", "null", "\r", '{"schema": {"type": "struct"}, "payload": null}'])
def test_tombstones(line: str) -> None:
    assert parse_line(line, "f", KEYS)["kind"] == "tombstone"


DEAD_CASES: dict[str, str] = {
    "not_json": '{"before": null, "after": {"id": 1',
    "not_object": "[1, 2, 3]",
    "missing_op": json.dumps({k: v for k, v in change().items() if k != "op"}),
    "unknown_op": json.dumps(change(op="x")),
    "missing_table": json.dumps(change(source={"connector": "mysql", "db": "payments"})),
    "unsafe_table_name": json.dumps(change(source=change()["source"] | {"table": "../x"})),
    "missing_after": json.dumps(change(op="u", after=None, before={"id": 1})),
    "delete_without_row": json.dumps(change(op="d", after=None, before=None)),
    "missing_key": json.dumps(change(after={"email": "no-id@example.com"})),
    "invalid_field": json.dumps(change(after=[1, 2])),
    "invalid_marker": '{"status": "ABORT", "id": "1:2"}',
    "unrecognised_shape": '{"hello": "world"}',
    "lone_surrogate": json.dumps(change(after={"id": 1, "name": "\ud800"})),
    "out_of_range": json.dumps(change(ts_ms=10**20)),
    "too_deep": '{"after": ' + "[" * 100_000 + "]" * 100_000 + "}",
}


def test_every_reason_has_a_case() -> None:
    assert set(DEAD_CASES) | {"line_too_long", "not_utf8"} == set(REASONS)


@pytest.mark.parametrize(("code", "line"), sorted(DEAD_CASES.items()))
def test_dead_letter_reasons(code: str, line: str) -> None:
    row = parse_line(line, "landing/x.jsonl", KEYS)
    assert row["kind"] == "dead_letter", row
    assert row["reason_code"] == code
    assert row["reason"] and "{" not in row["reason"].split(";")[0][:3]
    assert row["line"] == line and row["source_file"] == "landing/x.jsonl"


def test_line_too_long(monkeypatch: pytest.MonkeyPatch) -> None:
    import cdc_platform.parse.envelope as envelope

    monkeypatch.setattr(envelope, "MAX_LINE_CHARS", 100)
    row = parse_line(json.dumps(change()), "f", KEYS)
    assert row["reason_code"] == "line_too_long" and "bytes" in row["reason"]


def test_unsafe_names_are_rejected_in_every_part() -> None:
    for src in ({"db": "../etc", "table": "x"}, {"db": "payments", "table": "a b"}, {"schema": "x/y", "table": "t"}, {"db": "p", "table": "t.u"}):
        line = json.dumps(change(source={"connector": "mysql", **src}))
        assert parse_line(line, "f", KEYS)["reason_code"] == "unsafe_table_name", src


def test_keyless_delete_with_message_key_is_kept() -> None:
    envelope = change(op="d", after=None, before=None)
    row = parse_line(json.dumps({"key": {"id": 7}, "value": envelope}), "f", KEYS)
    assert row["kind"] == "change" and row["key"] == '{"id":7}' and json.loads(row["before"]) == {"id": 7}


def test_numbers_as_strings_are_accepted_for_positions() -> None:
    src = change()["source"] | {"pos": "4821", "ts_ms": "1767225600000"}
    row = parse_line(json.dumps(change(source=src)), "f", KEYS)
    assert row["kind"] == "change" and row["source_ts"] == 1767225600000 * 1000
    bad = change()["source"] | {"pos": "lots"}
    assert parse_line(json.dumps(change(source=bad)), "f", KEYS)["reason_code"] == "invalid_field"


def test_unconfigured_tables_land_without_a_key() -> None:
    src = change()["source"] | {"table": "audits"}
    row = parse_line(json.dumps(change(source=src)), "f", KEYS)
    assert row["kind"] == "change" and row["table_id"] == "payments.audits" and row["key"] is None


def test_truncate_needs_no_row_image() -> None:
    row = parse_line(json.dumps(change(op="t", after=None)), "f", KEYS)
    assert row["kind"] == "change" and row["op"] == "t" and row["key"] is None


# --- the optional orjson fast path must give the stdlib's output byte for byte ------------------------

def _random_value(rng: Any, depth: int = 0) -> Any:
    roll = rng.random()
    if depth < 3 and roll < 0.15:
        suffixes = ["", "é", "😀", "\uffff", " "]
        return {"k" + str(rng.randrange(50)) + rng.choice(suffixes): _random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    if depth < 3 and roll < 0.25:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if roll < 0.45:
        exp = rng.randint(-12, 25)
        return rng.choice([1, -1]) * rng.random() * 10.0**exp
    if roll < 0.6:
        return rng.choice([0, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 10**30, rng.randrange(-10**12, 10**12)])
    if roll < 0.8:
        return "".join(rng.choice(["a", "\x00", "\x1f", "\x7f", '"', "\\", "\u2028", "é", "😀", "1e-5", ":1e5", "/"]) for _ in range(rng.randrange(6)))
    return rng.choice([None, True, False, 0.0, -0.0, 1e16, 1.5e-5, 1e-7, 0.0001, 123456789012345678.0])


def test_orjson_fast_path_matches_the_stdlib_byte_for_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    import cdc_platform.parse.envelope as envelope

    if envelope._orjson is None:
        pytest.skip("orjson is not installed: only the stdlib path exists")
    rng = random.Random(20260101)
    lines = [json.dumps(change(after={"id": i, "v": _random_value(rng)}, before={"id": i, "w": _random_value(rng)})) for i in range(3000)]
    lines += [json.dumps(change(after={"id": i, "v": _random_value(rng)}), ensure_ascii=True, indent=1).replace("\n", " ") for i in range(500)]
    lines += ['{"status":"END","id":"7:1","ts_ms":1,"event_count":18446744073709551615}', '{"after": {"id": 1e400}}', "[1, 2", "NaN"]
    fast = [parse_line(line, "f", KEYS) for line in lines]
    monkeypatch.setattr(envelope, "_orjson", None)
    monkeypatch.setattr(json_codec, "_orjson", None)
    slow = [parse_line(line, "f", KEYS) for line in lines]
    for line, a, b in zip(lines, fast, slow):
        assert a == b, line


def test_not_utf8_keeps_the_bad_bytes_visible_and_the_rest_of_the_batch() -> None:
    import pyarrow as pa

    from cdc_platform.parse.envelope import parse_bytes
    from cdc_platform.parse.parsed_batches import parse_arrow_batches

    row = parse_bytes(b'{"a": "caf\xe9"}', "f", KEYS)
    assert row["reason_code"] == "not_utf8" and "byte 0xe9 at offset 10" in row["reason"]
    assert row["line"] == '{"a": "caf\\xe9"}'
    good = json.dumps(change()).encode()
    batch = pa.RecordBatch.from_arrays(
        [pa.array([b"\xff\xfe garbage", good, None], pa.binary()).cast(pa.string(), safe=False), pa.array(["f"] * 3)],
        names=["value", "source_file"],
    )
    (out,) = list(parse_arrow_batches(iter([batch]), KEYS))
    assert out.column("kind").to_pylist() == ["dead_letter", "change", "tombstone"]


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"ts_ms": 2**64}, "out_of_range"),
        ({"ts_ms": 10**15}, "out_of_range"),  # year 33658: no date column can hold it
        ({"transaction": {"id": "t", "total_order": 2**63, "data_collection_order": 1}}, "out_of_range"),
        ({"source": change()["source"] | {"ts_ms": "9" * 30}}, "out_of_range"),
        ({"source": change()["source"] | {"ts_ms": "9" * 5000}}, "invalid_field"),
        ({"ts_ms": -1}, "change"),  # 1969: odd, but a valid time
    ],
)
def test_numbers_that_would_break_the_batch_are_dead_letters(overrides: dict[str, Any], code: str) -> None:
    row = parse_line(json.dumps(change(**overrides)), "f", KEYS)
    assert (row.get("reason_code") or row["kind"]) == code
    rows_to_batch([row])  # whatever the outcome, the batch can be built


def test_marker_counts_beyond_int64_are_dead_letters() -> None:
    row = parse_line('{"status":"END","id":"7:1","ts_ms":1,"event_count":18446744073709551615}', "f", KEYS)
    assert row["reason_code"] == "out_of_range"


@pytest.mark.parametrize("line", ['{"after": {"id": NaN}}', '{"a": Infinity}', '[-Infinity]'])
def test_non_standard_constants_are_not_json(line: str) -> None:
    row = parse_line(line, "f", KEYS)
    assert row["reason_code"] == "not_json" and "non-standard constant" in row["reason"]


def test_float_overflow_in_a_row_image_is_out_of_range() -> None:
    line = json.dumps(change(after={"id": 1, "w": 1.0})).replace('"w": 1.0', '"w": 1e400')
    assert parse_line(line, "f", KEYS)["reason_code"] == "out_of_range"


def test_deep_nesting_that_the_reader_accepts_still_ends_as_a_dead_letter_or_a_row() -> None:
    for depth in (200, 600, 900, 990, 1200):
        nested = "[" * depth + "]" * depth
        row = parse_line(json.dumps(change()).replace('"email": "a@example.com"', f'"deep": {nested}'), "f", KEYS)
        assert row["kind"] == "change" or row["reason_code"] in ("too_deep", "not_json"), depth
        rows_to_batch([row])


def test_byte_order_mark_is_skipped_for_parsing_and_kept_in_the_line() -> None:
    line = "\ufeff" + json.dumps(change())
    row = parse_line(line, "f", KEYS)
    assert row["kind"] == "change" and row["line"] == line
    assert row["event_id"] == parse_line(line[1:], "f", KEYS)["event_id"]


def test_duplicate_json_keys_take_the_last_value_like_jackson() -> None:
    line = json.dumps(change(op="c")).replace('"op": "c"', '"op": "c", "op": "r"')
    row = parse_line(line, "f", KEYS)
    assert row["kind"] == "change" and row["op"] == "r"


# --- the speed-ups keep the output: the input pre-check, shortcuts vouched by the identity (columnar batches: test_parsed_batches) ---

def test_input_precheck_decides_as_the_regex() -> None:
    import random

    rng = random.Random(11)
    alphabet = ["1", "9", "0", "-", ":", ",", "[", " ", "\t", "a", '"', "\u0663", "\uff11", "."]
    lines = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(60))) for _ in range(5000)]
    lines += [f'{{"a":{"9" * n}}}' for n in range(15, 25)] + [f'{{"a":-{"9" * n}}}' for n in range(15, 25)]
    lines += ['{"a": "\u0663' * 20 + '"}', '{"a":' + "\u0663" * 20 + "}"]
    for line in lines:
        assert json_codec._orjson_may_misread(line) == bool(json_codec._ORJSON_UNSAFE_INPUT.search(line)), line


def test_keys_and_row_images_match_the_stdlib_path_whatever_the_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity's orjson text vouches for the key and row images: check that on keys made of awkward numbers."""
    import random


    if envelope._orjson is None:
        pytest.skip("orjson is not installed: only the stdlib path exists")
    rng = random.Random(5)
    lines = [json.dumps(change(after={"id": _random_value(rng), "v": _random_value(rng)})) for _ in range(1500)]
    lines += [json.dumps(change(op="d", before={"id": _random_value(rng)}, after=None)) for _ in range(500)]
    lines += [json.dumps({"key": {"id": _random_value(rng)}, "value": change(op="d", before=None, after={"v": _random_value(rng)})})
              for _ in range(500)]
    fast = [parse_line(line, "f", KEYS) for line in lines]
    monkeypatch.setattr(envelope, "_orjson", None)
    monkeypatch.setattr(json_codec, "_orjson", None)
    slow = [parse_line(line, "f", KEYS) for line in lines]
    assert sum(r["kind"] == "change" for r in fast) > 1000
    for line, a, b in zip(lines, fast, slow):
        assert a == b, line


def test_memoised_table_ids_keep_every_name_check() -> None:
    src = change()["source"]
    assert parse_line(json.dumps(change()), "f", KEYS)["table_id"] == "payments.customers"
    cases = [
        (src | {"db": "pay ments"}, "unsafe_table_name"),
        (src | {"db": 7}, "unsafe_table_name"),
        (src | {"table": ["customers"]}, "invalid_field"),
        (src | {"table": ""}, "missing_table"),
        (src | {"schema": "public"}, "public.customers"),
        (src | {"db": None}, "customers"),
    ]
    for _ in range(2):  # the second round finds the first round's names memoised
        for source, want in cases:
            row = parse_line(json.dumps(change(source=source)), "f", KEYS)
            assert row.get("reason_code", row.get("table_id")) == want, source


# --- numbers keep every digit (issue 13) -----------------------------------------------------------------

_NUMBER_LINE = ('{"op":"c","ts_ms":1,"source":{"connector":"mysql","db":"db","table":"t","ts_ms":1000,'
                '"file":"mysql-bin.000001","pos":4,"row":0},"after":{"id":1,"amt":%s}}')


@pytest.mark.parametrize(
    ("written", "kept"),
    [
        ("123456789876543212345678987654321.110", "123456789876543212345678987654321.110"),  # DECIMAL(40,3)
        ("12345678901234567.891", "12345678901234567.891"),  # once 12345678901234568.0
        ("0.1000000000000000055511151231257827", "0.1000000000000000055511151231257827"),
        ("1.2345678901234567e-5", "0.000012345678901234567"),
        ("1E-400", "1E-400"),  # once 0.0
        ("1e-400", "1E-400"),
        ("2.5", "2.5"),  # a float holds these: written as before, so event ids do not change
        ("1e-05", "1e-05"),
    ],
)
def test_numbers_no_float_holds_keep_their_digits_in_the_raw_row_image(written: str, kept: str) -> None:
    row = envelope.parse_line(_NUMBER_LINE % written, None, envelope.KeySpec({"db.t": ["id"]}))
    assert row["kind"] == "change" and json.loads(row["after"], parse_float=str)["amt"] == kept


def test_the_fast_path_stays_for_lines_whose_numbers_a_float_holds() -> None:
    for ordinary in ("12.5", "1e-05", '"Date-1970"', "1700000000000000", "-3.25"):
        assert not json_codec._orjson_may_misread(_NUMBER_LINE % ordinary), ordinary
    for long_ in ("12345678.9", "0.123456789", "1E-400", "12345678901234567890"):
        assert json_codec._orjson_may_misread(_NUMBER_LINE % long_), long_


def test_loads_json_and_json_text_round_trip_exact_numbers() -> None:
    text = '{"a":12345678901234567.891,"b":0.5,"c":[1,2E-500]}'
    value = envelope.loads_json(text)
    assert value["a"] == decimal.Decimal("12345678901234567.891") and value["b"] == 0.5
    assert json_codec.json_text(value) == text
