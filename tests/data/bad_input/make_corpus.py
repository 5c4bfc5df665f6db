"""Writes the bad-input corpus: one file per kind of bad input, and `expected.json` with each line's fate.

Run it to regenerate the committed files (`python tests/data/bad_input/make_corpus.py`); the output is
deterministic. The 10 MB line is not committed: `write_generated(landing)` writes it at test time.

Every line of every file ends as exactly one of these outcomes, listed in file order as Spark's text
source splits lines (on \\n, \\r\\n and \\r):

* `raw`          - a change event that lands in `raw_change_events`
* `marker`       - a transaction marker that lands in `transaction_markers`
* `duplicate`    - a redelivery of something already landed (counted in `duplicates_skipped`)
* `tombstone`    - a Kafka tombstone or blank line (counted in `tombstones`)
* `dead:<code>`  - a `dead_letter` row with that `reason_code`
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXPECTED = HERE / "expected.json"

TABLES: dict[str, dict[str, list[str]]] = {
    "payments.customers": {"key": ["id"]},
    "payments.charges": {"key": ["id"]},
    "shop.order_items": {"key": ["order_id", "line_no"]},
}

_pos = [1000]


def event(op: str = "c", table: str = "customers", db: str = "payments", row: dict[str, Any] | None = None, **overrides: Any) -> dict[str, Any]:
    """A MySQL change event; each call gets its own binlog position, so no two are duplicates by accident."""
    _pos[0] += 137
    image = row if row is not None else {"id": _pos[0], "email": f"u{_pos[0]}@example.com"}
    env: dict[str, Any] = {
        "before": image if op in ("u", "d") else None,
        "after": None if op == "d" else image,
        "source": {"version": "2.7.3.Final", "connector": "mysql", "name": "payments", "ts_ms": 1767225600000 + _pos[0],
                   "snapshot": "false", "db": db, "table": table, "server_id": 223344, "file": "mysql-bin.000003",
                   "pos": _pos[0], "row": 0},
        "op": op,
        "ts_ms": 1767225600400 + _pos[0],
        "transaction": None,
    }
    env.update(overrides)
    return env


def line(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False)


def source(**changes: Any) -> dict[str, Any]:
    src = event()["source"]
    src.update(changes)
    return src


def marker(status: str = "BEGIN", tx: str = "8c1f2e3a-0b1c-11ef-9a43-0242ac120002:1", **extra: Any) -> str:
    body: dict[str, Any] = {"status": status, "id": tx, "ts_ms": 1767225600000, "event_count": None, "data_collections": None}
    if status == "END":
        body.update(event_count=1, data_collections=[{"data_collection": "payments.customers", "event_count": 1}])
    body.update(extra)
    return line(body)


Kind = tuple[str, str, list[tuple[bytes | str, str]], str]  # file, description, [(line, outcome)], terminator


def kinds() -> list[Kind]:
    """Every kind of bad input: (file name, what it is, [(line, expected outcome)], line terminator)."""
    rng = random.Random(6)
    good = lambda: line(event())  # noqa: E731 - a fresh, unique, valid change event
    full = good()
    ks: list[Kind] = []

    ks.append(("01_truncated_json.jsonl", "truncated JSON (partial writes)", [
        (full, "raw"),
        (full[: len(full) // 2], "dead:not_json"),
        ("{", "dead:not_json"),
        (full[: full.index('"email"') + 12], "dead:not_json"),
        ('{"before": null, "after": {"id": 1}, "op":', "dead:not_json"),
    ], "\n"))

    garbage_bytes = bytes(rng.choice([b for b in range(256) if b not in (10, 13)]) for _ in range(300))
    printable = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789{}[]:,\"' ") for _ in range(200))
    ks.append(("02_binary_garbage.jsonl", "binary garbage (invalid UTF-8, a gzip header, random text)", [
        (b"\xff\xfe\x00\x01" + garbage_bytes, "dead:not_utf8"),
        (printable, "dead:not_json"),
        (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xcb\x48\xcd\xc9\xc9\x07\x00", "dead:not_utf8"),
        (good().replace("example.com", "exa\udcffmple.com").encode("utf-8", "surrogateescape"), "dead:not_utf8"),
        (good(), "raw"),
    ], "\n"))

    nul_event = event()
    nul_event["after"]["note"] = "a\u0000b"
    ks.append(("03_nul_bytes.jsonl", "NUL bytes (raw, escaped, alone, trailing)", [
        (good().replace("@example", "@exa\x00mple"), "dead:not_json"),
        (line(nul_event), "raw"),
        ("\x00\x00\x00\x00", "dead:not_json"),
        (good() + "\x00", "dead:not_json"),
    ], "\n"))

    wrong = [
        (line(event(after="{\"id\": 1}")), "dead:invalid_field"),
        (line(event(source=[source()])), "dead:invalid_field"),
        (line(event(source=source(table=42))), "dead:invalid_field"),
        (line(event(transaction="8c1f2e3a:1")), "dead:invalid_field"),
        (line(event(op="d", before=17, after=None)), "dead:invalid_field"),
        (line(event(source=source(ts_ms="soon"))), "dead:invalid_field"),
        (line(event(ts_ms=True)), "dead:invalid_field"),
        (line(event(op=1)), "dead:unknown_op"),
    ]
    ks.append(("05_wrong_types.jsonl", "wrong types for known fields", wrong, "\n"))

    ks.append(("06_unknown_op.jsonl", "unknown or missing op", [
        (line(event(op="x")), "dead:unknown_op"),
        (line(event(op="m")), "dead:unknown_op"),
        (line(event(op="")), "dead:unknown_op"),
        (line(event(op="C")), "dead:unknown_op"),
        (line(event(op=None)), "dead:missing_op"),
    ], "\n"))

    ks.append(("07_missing_key_columns.jsonl", "missing key columns (configured tables), keyless unconfigured table", [
        (line(event(row={"email": "no-id@example.com"})), "dead:missing_key"),
        (line(event(table="order_items", db="shop", row={"order_id": 7, "sku": "A-1"})), "dead:missing_key"),
        (line(event(op="d", row={"email": "gone@example.com"})), "dead:missing_key"),
        (line(event(table="audits", row={"what": "login"})), "raw"),
        (line(event(table="order_items", db="shop", row={"order_id": 7, "line_no": 1, "sku": "A-1"})), "raw"),
    ], "\n"))

    ks.append(("08_key_change_to_null.jsonl", "key column changed to null", [
        (line(event(op="u", before={"id": 5, "email": "a@example.com"}, after={"id": None, "email": "a@example.com"})), "dead:missing_key"),
        (line(event(row={"id": None, "email": "b@example.com"})), "dead:missing_key"),
        (line(event(op="u", table="order_items", db="shop", before={"order_id": 7, "line_no": 1}, after={"order_id": 7, "line_no": None})), "dead:missing_key"),
    ], "\n"))

    ks.append(("09_arrays_where_objects_belong.jsonl", "nested arrays where objects belong", [
        (line(event(after=[{"id": 1}])), "dead:invalid_field"),
        (line(event(source=[])), "dead:invalid_field"),
        (line(event(transaction=[])), "dead:invalid_field"),
        (line([event(), event()]), "dead:not_object"),
        (line({"schema": {"type": "struct"}, "payload": [event()]}), "dead:not_object"),
        (marker("END", data_collections={"payments.customers": 1}), "dead:invalid_marker"),
    ], "\n"))

    dup_op = line(event(op="c")).replace('"op": "c"', '"op": "c", "op": "r"')
    dup_email = line(event(row={"id": 9001, "email": "first@example.com"})).replace('"email": "first@example.com"}', '"email": "first@example.com", "email": "last@example.com"}', 1)
    dup_id = line(event(row={"id": None, "email": "x@example.com"})).replace('"id": null', '"id": null, "id": 9002', 1)
    ks.append(("10_duplicate_json_keys.jsonl", "duplicate JSON keys (last one wins, as in Jackson)", [
        (dup_op, "raw"),
        (dup_email, "raw"),
        (dup_id, "raw"),
    ], "\n"))

    ks.append(("11_numbers_as_strings.jsonl", "numbers as strings", [
        (line(event(source=source(pos="4821"))), "raw"),
        (line(event(source=source(ts_ms="1767225600000"))), "raw"),
        (line(event(transaction={"id": "8c1f2e3a:2", "total_order": "2", "data_collection_order": "1"})), "raw"),
        (line(event(row={"id": "42", "email": "s@example.com"})), "raw"),
        (line(event(source=source(pos="lots"))), "dead:invalid_field"),
        (line(event(source=source(ts_ms="1.7e12"))), "dead:invalid_field"),
        (marker("END", tx="8c1f2e3a:77", event_count="3"), "marker"),
    ], "\n"))

    uni = event(row={"id": 501, "name": "Zoë 😀 שלום e\u0301 \u2028 \uffff", "ключ": "значение"})
    ks.append(("12_unicode_edge_cases.jsonl", "unicode edge cases (astral, RTL, combining, U+2028, BOM, lone surrogate)", [
        (line(uni), "raw"),
        (json.dumps(event(row={"id": 502, "name": "😀 escaped"}), ensure_ascii=True), "raw"),
        (json.dumps(event(row={"id": 503, "name": "x"})).replace('"x"', '"\\ud800 lone"'), "dead:lone_surrogate"),
        ("\ufeff" + good(), "raw"),
        (line(event(table="kündigung")), "dead:unsafe_table_name"),
    ], "\n"))

    ks.append(("13_unsafe_table_names.jsonl", "unsafe table names (path traversal, SQL, spaces, overlong)", [
        (line(event(table="../x")), "dead:unsafe_table_name"),
        (line(event(table="a b")), "dead:unsafe_table_name"),
        (line(event(table="orders;DROP TABLE x")), "dead:unsafe_table_name"),
        (line(event(table="x/../../y")), "dead:unsafe_table_name"),
        (line(event(db="..", table="t")), "dead:unsafe_table_name"),
        (line(event(table="t" * 200)), "dead:unsafe_table_name"),
        (line(event(table="`t`")), "dead:unsafe_table_name"),
        (line(event(table="")), "dead:missing_table"),
    ], "\n"))

    injection = {"id": 777, "id; DROP TABLE customers;--": 1, "`name`": "x", "a' OR '1'='1": 2, 'x") --': 3,
                 "email": "'; DROP TABLE raw_change_events; --"}
    ks.append(("14_sql_injection_column_names.jsonl", "column names (and values) that try SQL injection", [
        (line(event(row=injection)), "raw"),
        (line(event(op="u", row=injection | {"email": "changed@example.com"})), "raw"),
    ], "\n"))

    ks.append(("15_empty_file.jsonl", "empty file", [], "\n"))

    ks.append(("16_crlf_line_ends.jsonl", "CRLF line ends", [(good(), "raw"), (good(), "raw"), ("", "tombstone"), (good(), "raw")], "\r\n"))
    ks.append(("17_cr_only_line_ends.jsonl", "CR-only line ends (classic Mac)", [(good(), "raw"), (good(), "raw")], "\r"))
    ks.append(("18_no_trailing_newline.jsonl", "no newline after the last line", [(good(), "raw"), (good(), "raw")], ""))

    ks.append(("19_blank_and_whitespace_lines.jsonl", "blank and whitespace-only lines", [
        ("", "tombstone"), ("   ", "tombstone"), ("\t", "tombstone"), (good(), "raw"),
    ], "\n"))

    ks.append(("20_null_and_tombstone_variants.jsonl", "tombstones and look-alikes", [
        ("null", "tombstone"),
        ("  null  ", "tombstone"),
        ('{"schema": {"type": "struct"}, "payload": null}', "tombstone"),
        ('{"key": {"id": 1}, "value": null}', "tombstone"),
        ("NULL", "dead:not_json"),
        ("None", "dead:not_json"),
    ], "\n"))

    ks.append(("21_not_objects.jsonl", "JSON that is not an object", [
        ("42", "dead:not_object"), ('"text"', "dead:not_object"), ("true", "dead:not_object"), ("[]", "dead:not_object"),
    ], "\n"))

    no_op = event()
    del no_op["op"]
    ks.append(("22_missing_op.jsonl", "change event without op", [(line(no_op), "dead:missing_op")], "\n"))

    ks.append(("23_missing_after.jsonl", "insert, update or read without an after image", [
        (line(event(op="c", after=None)), "dead:missing_after"),
        (line(event(op="u", after=None)), "dead:missing_after"),
        (line(event(op="r", after=None)), "dead:missing_after"),
    ], "\n"))

    keyless_delete = event(op="d", before=None, after=None)
    ks.append(("24_deletes.jsonl", "deletes without a row, with a message key, with a before image", [
        (line(keyless_delete), "dead:delete_without_row"),
        (line({"key": {"id": 4242}, "value": event(op="d", before=None, after=None)}), "raw"),
        (line(event(op="d")), "raw"),
    ], "\n"))

    no_source = event()
    del no_source["source"]
    ks.append(("25_missing_source.jsonl", "no source block or no source.table", [
        (line(no_source), "dead:missing_table"),
        (line(event(source={"connector": "mysql", "db": "payments"})), "dead:missing_table"),
        (line(event(source=None)), "dead:missing_table"),
    ], "\n"))

    ks.append(("26_unrecognised_shapes.jsonl", "objects that are neither events nor markers", [
        ('{"hello": "world"}', "dead:unrecognised_shape"),
        ("{}", "dead:unrecognised_shape"),
        (line({"schema": {"type": "struct"}, "payload": event(), "extra": 1}), "dead:unrecognised_shape"),
    ], "\n"))

    ks.append(("27_transaction_markers.jsonl", "transaction markers, valid and broken", [
        (marker("BEGIN", tx="8c1f2e3a:90"), "marker"),
        (marker("END", tx="8c1f2e3a:90"), "marker"),
        (marker("ABORT", tx="8c1f2e3a:91"), "dead:invalid_marker"),
        (marker("END", tx="8c1f2e3a:92", event_count=None), "dead:invalid_marker"),
        (line({"status": "BEGIN", "id": None, "ts_ms": 1}), "dead:invalid_marker"),
        (line({"status": "BEGIN", "id": {"tx": 1}, "ts_ms": 1}), "dead:invalid_marker"),
        (line({"marker": "COMMIT", "transaction_id": "tx-1", "ts_ms": 1}), "dead:invalid_marker"),
    ], "\n"))

    big_after = json.dumps(event(row={"id": 880, "w": 1.0})).replace('"w": 1.0', '"w": 1e400')
    ks.append(("28_out_of_range_numbers.jsonl", "numbers beyond int64 / float64 / the calendar", [
        (line(event(ts_ms=2**64)), "dead:out_of_range"),
        (line(event(source=source(ts_ms=10**15))), "dead:out_of_range"),
        (line(event(transaction={"id": "t", "total_order": 2**63, "data_collection_order": 1})), "dead:out_of_range"),
        (marker("END", tx="8c1f2e3a:93", event_count=2**64), "dead:out_of_range"),
        (big_after, "dead:out_of_range"),
        (line(event(row={"id": 881, "balance": 10**30})), "raw"),
    ], "\n"))

    nan = json.dumps(event(row={"id": 890, "w": 1.0}))
    ks.append(("29_nan_and_infinity.jsonl", "NaN and Infinity (not JSON)", [
        (nan.replace('"w": 1.0', '"w": NaN'), "dead:not_json"),
        (nan.replace('"w": 1.0', '"w": Infinity'), "dead:not_json"),
        (nan.replace('"w": 1.0', '"w": -Infinity'), "dead:not_json"),
        (nan.replace('"w": 1.0', '"w": "NaN"'), "raw"),
    ], "\n"))

    deep_ok = json.dumps(event(row={"id": 895, "x": 1})).replace('"x": 1', '"x": ' + "[" * 200 + "]" * 200)
    ks.append(("30_deep_nesting.jsonl", "deeply nested JSON", [
        ("[" * 100_000 + "]" * 100_000, "dead:too_deep"),
        ('{"after": ' + "{\"a\": " * 5000 + "1" + "}" * 5001, "dead:too_deep"),
        (deep_ok, "raw"),
    ], "\n"))

    ks.append(("31_control_characters.jsonl", "raw control characters inside strings", [
        (good().replace("@example", "@exa\tmple"), "dead:not_json"),
        (good().replace("@example", "@exa\\tmple"), "raw"),
        (good().replace("@example", "@exa\x01mple"), "dead:not_json"),
        (good().replace("@example", "@exa\x7fmple"), "raw"),
    ], "\n"))

    ks.append(("32_trailing_garbage.jsonl", "trailing garbage, two objects on a line, surrounding whitespace", [
        (good() + " xyz", "dead:not_json"),
        (good() + good(), "dead:not_json"),
        (good() + ",", "dead:not_json"),
        ("  \t" + good() + "  ", "raw"),
    ], "\n"))

    once = event()
    again = dict(once, ts_ms=once["ts_ms"] + 60_000)  # a connector restart re-emits with a new ts_ms
    ks.append(("33_redelivered_duplicates.jsonl", "redelivered events and markers", [
        (line(once), "raw"),
        (line(once), "duplicate"),
        (line(again), "duplicate"),
        (marker("BEGIN", tx="8c1f2e3a:95"), "marker"),
        (marker("BEGIN", tx="8c1f2e3a:95"), "duplicate"),
    ], "\n"))

    ks.append(("34_schema_wrapped.jsonl", "schema/payload wrapper variants", [
        (line({"schema": {"type": "struct", "fields": []}, "payload": event()}), "raw"),
        (line({"schema": None, "payload": event()}), "raw"),
        (line({"schema": {"type": "struct"}, "payload": "event"}), "dead:not_object"),
    ], "\n"))

    wide = {"id": 950} | {f"c{i}": i for i in range(5000)}
    ks.append(("35_very_wide_row.jsonl", "a 5,000-column row image", [(line(event(row=wide)), "raw")], "\n"))

    ks.append(("36_string_split_across_lines.jsonl", "a string with a raw newline, split into two lines", [
        ('{"before": null, "after": {"id": 960, "note": "first half', "dead:not_json"),
        ('second half"}, "op": "c"}', "dead:not_json"),
    ], "\n"))

    ks.append(("37_unknown_connector_and_odd_metadata.jsonl", "unknown connector, odd snapshot flag, extra fields", [
        (line(event(source=source(connector="db2", snapshot="maybe"))), "raw"),
        (line(event(extra={"nested": [1, 2]}, source=source(extra_field=True))), "raw"),
    ], "\n"))
    ks.append(("38_column_names_differing_in_case.jsonl", "column names that differ only in case (Spark and Delta fold case)", [
        (line(event(row={"id": 970, "email": "a@example.com", "Email": "b@example.com"})), "raw"),
    ], "\n"))

    # Found by fuzzing the parser: each of these once raised inside the parser and failed the whole batch.
    ks.append(("39_values_that_once_failed_a_batch.jsonl", "values that once failed a whole batch (unhashable snapshot flag, digits int() refuses)", [
        (line(event(source=source(snapshot=["true"]))), "dead:invalid_field"),
        (line(event(source=source(snapshot={"last": True}))), "dead:invalid_field"),
        (line(event(source=source(pos="\u00b2"))), "dead:invalid_field"),  # superscript two: str.isdigit() says yes
        (line(event(source=source(pos="--5"))), "dead:invalid_field"),
        (line(event(source=source(pos="\u0661\u0662"))), "dead:invalid_field"),  # Arabic-Indic digits: no JSON reader takes them
        (line(event(transaction={"id": "8c1f2e3a:9", "total_order": "\u00b2", "data_collection_order": 1})), "dead:invalid_field"),
        (line(event(row={"id": 971, "email": "still-fine@example.com"})), "raw"),
    ], "\n"))
    return ks


def generated() -> list[Kind]:
    """Kinds too large to commit; `write_generated` writes them at test time."""
    ten_mb = event(row={"id": 990, "note": "x" * (10 * 1024 * 1024)})
    return [("04_ten_mb_line.jsonl", "a 10 MB line (valid) and a 10 MB non-JSON line", [
        (line(ten_mb), "raw"),
        ("y" * (10 * 1024 * 1024), "dead:not_json"),
        (line(event(row={"id": 991, "email": "after-big@example.com"})), "raw"),
    ], "\n")]


def _write(directory: Path, kind: Kind) -> None:
    name, _, lines, term = kind
    data = bytearray()
    for i, (text, _) in enumerate(lines):
        data += text if isinstance(text, bytes) else text.encode("utf-8")
        if term or i < len(lines) - 1:
            data += (term or "\n").encode()
    (directory / name).write_bytes(bytes(data))


def write_generated(directory: Path) -> dict[str, dict[str, Any]]:
    directory.mkdir(parents=True, exist_ok=True)
    kinds_ = generated()
    for kind in kinds_:
        _write(directory, kind)
    return {k[0]: {"kind": k[1], "outcomes": [o for _, o in k[2]], "generated": True} for k in kinds_}


def main() -> None:
    for old in HERE.glob("*.jsonl"):
        old.unlink()
    expected: dict[str, Any] = {"tables": TABLES, "files": {}}
    for kind in kinds():
        _write(HERE, kind)
        expected["files"][kind[0]] = {"kind": kind[1], "outcomes": [o for _, o in kind[2]]}
    for kind in generated():
        expected["files"][kind[0]] = {"kind": kind[1], "outcomes": [o for _, o in kind[2]], "generated": True}
    expected["files"] = dict(sorted(expected["files"].items()))
    EXPECTED.write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
