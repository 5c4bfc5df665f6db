"""The repair's signal, built without a database: literals per dialect, the filter's shape, the chunks' bounds,
and the keys that cannot be written. `tests/testbed/test_repair_filters.py` runs the same filters on the real
databases."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdc_platform.backfill.repair_signal import (
    MARIADB, POSTGRESQL, KeyColumn, Unexpressible, collection_pattern, key_filter, literal, plan_signals, signal_data,
)

ID = KeyColumn("id")
UTC = dt.timezone.utc


def test_postgres_literals_are_escaped_untyped_strings_in_the_types_text_form() -> None:
    cases = {
        7: "E'7'", -(2**63): f"E'{-(2**63)}'", True: "E'true'", decimal.Decimal("10.50"): "E'10.50'",
        decimal.Decimal("1E+3"): "E'1000'", 0.1: "E'0.1'", float("nan"): "E'NaN'", float("-inf"): "E'-Infinity'",
        "it's": "E'it\\'s'", "back\\slash": "E'back\\\\slash'", "naïve ☃ 𝄞": "E'naïve ☃ 𝄞'",
        b"\x00\xff": "E'\\\\x00ff'", dt.date(2000, 2, 29): "E'2000-02-29'",
        dt.datetime(2024, 1, 2, 3, 4, 5, 6): "E'2024-01-02 03:04:05.000006'",
        dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC): "E'2024-01-02 03:04:05+00:00'",
        dt.time(1, 2, 3, 4): "E'01:02:03.000004'", dt.timedelta(days=1, microseconds=5): "E'86400000005 microseconds'",
        uuid.UUID(int=1): "E'00000000-0000-0000-0000-000000000001'",
    }
    for value, expected in cases.items():
        assert literal(value, ID, POSTGRESQL) == expected, value


def test_mariadb_literals_never_depend_on_sql_mode() -> None:
    assert literal("it's \\ ☃", ID, MARIADB) == "_utf8mb4 X'" + "it's \\ ☃".encode().hex() + "'"
    assert literal("", ID, MARIADB) == "''" and literal(b"", ID, MARIADB) == "X''"
    assert literal(b"\x00\x01", ID, MARIADB) == "X'0001'"
    assert literal(True, ID, MARIADB) == "1" and literal(12, ID, MARIADB) == "12"
    assert literal(decimal.Decimal("-0.001"), ID, MARIADB) == "-0.001"
    assert literal(dt.datetime(2024, 1, 2, 3, 4, 5, 6), ID, MARIADB) == "'2024-01-02 03:04:05.000006'"
    # A TIMESTAMP column holds an instant: the driver read it in UTC, the connector's session may be elsewhere.
    stamp = KeyColumn("seen", "timestamp")
    assert literal(dt.datetime(1970, 1, 2, 0, 0, 0, 5), stamp, MARIADB) == "FROM_UNIXTIME(86400.000005)"
    assert literal(dt.timedelta(hours=-1, microseconds=1), ID, MARIADB) == "'-00:59:59.999999'"
    assert literal(dt.timedelta(hours=838), ID, MARIADB) == "'838:00:00.000000'"


@pytest.mark.parametrize(("value", "dialect", "reason"), [
    (None, POSTGRESQL, "NULL"), (float("nan"), MARIADB, "nan"), (decimal.Decimal("NaN"), MARIADB, "NaN"),
    ({"a": 1}, POSTGRESQL, "dict"), ([1], MARIADB, "list"), ("nul\x00", POSTGRESQL, "NUL"),
])
def test_a_value_without_a_literal_is_refused_with_the_reason(value: object, dialect: str, reason: str) -> None:
    with pytest.raises(Unexpressible, match=reason):
        literal(value, ID, dialect)


@given(st.text())
def test_a_postgres_string_literal_reads_back_as_the_value(text: str) -> None:
    """E'...' read as PostgreSQL reads it: backslash escapes the next character, nothing else is special."""
    if "\x00" in text:
        return
    lit = literal(text, ID, POSTGRESQL)
    assert lit.startswith("E'") and lit.endswith("'")
    body = lit[2:-1]
    assert re.fullmatch(r"(?:[^'\\]|\\.)*", body, re.S), "no unescaped quote can end the literal early"
    assert re.sub(r"\\(.)", r"\1", body, flags=re.S) == text


def test_a_filter_quotes_identifiers_and_is_one_parenthesised_condition() -> None:
    assert key_filter([ID], [(1,), (2,)], POSTGRESQL) == "(\"id\" IN (E'1', E'2'))"
    two = [KeyColumn("tenant"), KeyColumn('we"ird')]
    assert key_filter(two, [("a", 1), ("b'", 2)], POSTGRESQL) == "((\"tenant\", \"we\"\"ird\") IN ((E'a', E'1'), (E'b\\'', E'2')))"
    assert key_filter([KeyColumn("x`y")], [(5,)], MARIADB) == "(`x``y` IN (5))"
    with pytest.raises(ValueError, match="2 column"):
        key_filter(two, [(1,)], POSTGRESQL)


def test_the_data_collection_is_an_exact_regex() -> None:
    assert collection_pattern("public.accounts") == "public\\.accounts"
    assert re.fullmatch(collection_pattern("a$b.t_1"), "a$b.t_1") and not re.fullmatch(collection_pattern("public.accounts"), "publicXaccounts")
    data = signal_data("cdc.acc", "(`id` IN (1))")
    assert data == {"type": "incremental", "data-collections": ["cdc\\.acc"],
                    "additional-conditions": [{"data-collection": "cdc\\.acc", "filter": "(`id` IN (1))"}]}


@pytest.mark.parametrize("dialect", [POSTGRESQL, MARIADB])
def test_signals_cover_every_key_once_in_order_within_their_bounds(dialect: str) -> None:
    keys = [(i, f"k'{i}\\☃" * (i % 7)) for i in range(2_000)]
    columns = [KeyColumn("id"), KeyColumn("name")]
    plan = plan_signals("public.t", columns, keys, dialect, max_chars=4_000, max_keys=150)
    assert not plan.unexpressible
    assert [k for s in plan.signals for k in s.keys] == keys
    assert all(len(s.text) <= 4_000 and 0 < len(s.keys) <= 150 for s in plan.signals)
    assert max(len(s.text) for s in plan.signals) > 3_500, "chunks are filled, not cut short"
    assert len({s.id for s in plan.signals}) == len(plan.signals)
    for s in plan.signals:
        assert json.loads(s.text) == s.data and s.data["additional-conditions"][0]["filter"] == key_filter(columns, s.keys, dialect)


def test_unwritable_keys_are_reported_and_the_rest_still_signalled() -> None:
    columns = [KeyColumn("id"), KeyColumn("doc")]
    keys = [(1, "a"), (2, None), (3, {"x": 1}), (4, "b" * 500)]
    plan = plan_signals("public.t", columns, keys, POSTGRESQL, max_chars=400)
    assert [k for s in plan.signals for k in s.keys] == [(1, "a")]
    reasons = dict((k[0], why) for k, why in plan.unexpressible)
    assert reasons[2] == "doc is NULL, which no key filter can match"
    assert reasons[3].startswith("doc is a dict")
    assert reasons[4] == "its filter alone is longer than a signal may be (400 characters)"
