"""Lines a parser must take: Debezium envelopes and markers with any field any JSON value, damaged text,
and numbers spelled every way a producer spells them.

For holding two parsers to the same rows (tests/cdc_platform/test_jvm_parse.py), so the lines go
everywhere the rules branch: every connector's position fields, right and wrong types in each field the
parser reads, the schema wrapper and the key/value dump, both marker shapes, and text cut, spliced with
bytes that are not UTF-8, escapes of lone surrogates, numbers no float holds, byte-order marks.
Nothing here imports `cdc_platform`.
"""

from __future__ import annotations

import json
import math
import random
import struct
from typing import Any

from hypothesis import strategies as st

from tests.strategies import debezium_types as T

#: Key columns the lines' tables are configured with: one key, a composite key, a table without a key.
KEYS = {"d.t": ["id"], "s.t": ["id", "k"], "inventory.orders": ["id"], "public.orders": ["id"], "inventory.items": ["id"],
        "public.items": ["id"], "inventory.accounts": ["id"], "public.accounts": ["id"]}

_ODD_TEXT = ["", "0", "-12", " 42 ", "1.5", "false", "False", "true", "١٢", "12:34", "99:1\n", "mysql-bin.000018", "a\n",
             "x" * 130, "t$-1", "é", "\U0001F600", "\u3000"]
json_leaves = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8), st.sampled_from(_ODD_TEXT),
)
_KEY_NAMES = ["id", "k", "a", "é", "\U0001F600", "\ue000", "ts_ms", "op", "field", "after"]
json_values = st.recursive(
    json_leaves, lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(_KEY_NAMES), inner, max_size=3)),
    max_leaves=6,
)


def _sometimes(draw: st.DrawFn, usual: Any) -> Any:
    """The usual value most of the time, any JSON value now and then."""
    return draw(json_values) if draw(st.integers(0, 5)) == 0 else usual


@st.composite
def envelopes(draw: st.DrawFn) -> Any:
    connector = draw(st.sampled_from(["postgresql", "mysql", "mariadb", "sqlserver", "oracle", "mongodb", "other", None, 5, ""]))
    usual_source = [
        ("connector", connector), ("table", "t"), ("db", draw(st.sampled_from(["d", "s"]))), ("schema", draw(st.sampled_from([None, "s", "", 0]))),
        ("ts_ms", 1767225600000), ("lsn", 12345), ("file", "mysql-bin.000003"), ("pos", 77), ("row", 1), ("commit_lsn", "0000:1"),
        ("change_lsn", "0000:2"), ("event_serial_no", 1), ("scn", "123"), ("ord", 3), ("snapshot", "false"), ("name", "srv"),
    ]
    source = {k: _sometimes(draw, v) for k, v in usual_source if draw(st.integers(0, 9))}
    usual = [
        ("before", {"id": 1, "k": "x"}), ("after", {"id": 2, "k": 1.5}), ("source", source),
        ("op", draw(st.sampled_from(["c", "u", "d", "r", "t", "m", "x"]))), ("ts_ms", 1767225600123), ("ts_us", 1),
        ("transaction", {"id": "571:123", "total_order": 1, "data_collection_order": 1}), ("message", {"prefix": "p"}),
    ]
    env = {k: _sometimes(draw, v) for k, v in usual if draw(st.integers(0, 6))}
    shape = draw(st.integers(0, 9))
    if shape == 0:
        fields = draw(st.one_of(st.just([{"field": "after", "type": "struct", "b": 1.5, "a": [1, 2]}]), json_values))
        return {"schema": {"fields": fields, "name": draw(st.sampled_from(["x", "io.debezium.connector.common.Heartbeat"]))}, "payload": env}
    if shape == 1:
        return {"key": draw(st.one_of(st.just({"id": 9}), json_values)), "value": env}
    return env


@st.composite
def markers(draw: st.DrawFn) -> Any:
    if draw(st.booleans()):
        usual = [
            ("status", draw(st.sampled_from(["BEGIN", "END", "x"]))), ("id", "571:99"), ("event_count", 3),
            ("data_collections", [{"data_collection": "s.t", "event_count": 2},
                                  {"data_collection": "io.debezium.connector.postgresql.LogicalDecodingMessageMonitor$LogicalDecodingMessageId@1a",
                                   "event_count": 1},
                                  {"data_collection": "s.t", "event_count": draw(st.sampled_from([1, 2**62, 2**63 - 1]))}]),
            ("ts_ms", 1767225600000),
        ]
    else:
        counts = draw(st.sampled_from([{"a": 1, "b": "2"}, [{"source": "a", "count": 1}, {"data_collection": "a", "event_count": 2}, 5], "x"]))
        usual = [
            ("marker", draw(st.sampled_from(["BEGIN", "COMMIT", "END", "y"]))), ("transaction_id", "t1"), ("id", "t2"), ("txn_id", "t3"),
            ("total_events", 3), ("per_source_event_counts", counts), ("ts_ms", 5), ("timestamp_ms", 6),
        ]
    return {k: _sometimes(draw, v) for k, v in usual if draw(st.integers(0, 6))}


#: Text spliced into a line: escapes, numbers, JSON punctuation, bytes that are not UTF-8, a byte-order mark.
SPLICES = [b"\\ud800", b"\\udc00", b"\\ud83d\\ude00", b"1e400", b"NaN", b"-Infinity", b",", b"]", b"}", b"\xef\xbb\xbf", b"\\u12", b'"',
           b"1.12345678901234567", b"123456789012345678901", b"-1234567890123456789", b" \t\n", b"\x00", b"\\", b"12345678e-5",
           b"1.5e-400", b"\xff", b"\xed\xa0\x80", b"\xe2\x82", b"\xf0\x9f\x98\x80", b"\xc2\xa0", b"null"]


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """One line: an envelope, a marker, any JSON, or a generated table's event, written and maybe damaged."""
    kind = draw(st.integers(0, 4))
    if kind == 3:
        families = draw(st.sampled_from([T.WRAPPED, T.PLAIN]))
        case = draw(T.table_cases(list(families)))
        text = case.line(draw(st.integers(0, len(case.events) - 1)))
    else:
        obj = draw(envelopes()) if kind in (0, 4) else draw(markers()) if kind == 1 else draw(json_values)
        text = json.dumps(obj, ensure_ascii=draw(st.booleans()), separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    data = text.encode("utf-8", "surrogatepass")
    damage = draw(st.integers(0, 8))
    if damage == 0 and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif damage == 1:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=3)) + data[at:]
    elif damage == 2:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.sampled_from(SPLICES)) + data[at:]
    elif damage == 3:
        data = b"\xef\xbb\xbf" + data
    return data


def number_texts(seed: int, count: int) -> list[str]:
    """JSON numbers: random 64-bit floats as Python and Java print them, random digit strings with and without
    exponents (many with more digits than a float holds), powers of ten and the edges of the float range."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        if math.isfinite(x):
            out += [repr(x), T.java_double_text(x)]
        digits = "".join(rng.choice("0123456789") for _ in range(rng.randint(1, 25))).lstrip("0") or "0"
        point = rng.randint(0, len(digits))
        text = (digits[:point] or "0") + "." + (digits[point:] or "0")
        if rng.random() < 0.5:
            text += rng.choice("eE") + rng.choice(["", "+", "-"]) + str(rng.randint(0, 330))
        out.append(("-" if rng.random() < 0.3 else "") + text)
    for e in range(-330, 310, 7):
        out += [f"1e{e}", f"9.999999999999999e{e}", f"5E{e}", f"2.2250738585072014e{e}"]
    out += ["5e-324", "2.5e-324", "2.4703282292062328e-324", "1.7976931348623157e308", "1.7976931348623159e308", "0.1",
            "0.30000000000000004", "123456789012345678e-5", "12345678901234567e3", "1e16", "1e15", "9007199254740993.0",
            "-0.0", "0.0e-500", "1E-7", "100.0", "1E2", "-0", "0.000001", "0.0000001", "1234567890123456789.5"]
    return out
