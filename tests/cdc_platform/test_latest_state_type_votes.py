"""Deciding column types from votes (`latest_state.type_votes`, `rows.type_votes`): the parts of a history,
summarised apart and merged, decide what the whole history decides, and what `type_rows` decides."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from cdc_platform.config import TableConfig
from cdc_platform.stages.latest_state.rows import Events, change_rows, type_rows, type_votes
from cdc_platform.stages.latest_state.type_votes import Vote, decide_type, decide_types, merge_votes

TABLE = TableConfig("s.t", "t", ("id",))
DECLARED = {"int16": {"type": "int16"}, "int32": {"type": "int32"}, "string": {"type": "string"},
            "decimal": {"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2", "connect.decimal.precision": "6"}},
            "float64": {"type": "double"}}

values = st.one_of(st.none(), st.integers(-(2**40), 2**40), st.integers(-100, 100), st.floats(allow_nan=False, allow_infinity=False, width=32),
                   st.text(max_size=3), st.booleans())


@st.composite
def histories(draw: Any) -> list[dict[str, Any]]:
    """Events of one table: random values in a few columns (names that differ in case among them), some
    events with a Connect schema declaring some columns, positions out of arrival order."""
    names = draw(st.lists(st.sampled_from(["a", "b", "B", "c"]), min_size=1, max_size=3, unique=True))
    events = []
    for i in range(draw(st.integers(1, 25))):
        image: dict[str, Any] = {"id": i}
        for name in names:
            if draw(st.booleans()):
                image[name] = draw(values)
        declared = draw(st.dictionaries(st.sampled_from(names), st.sampled_from(sorted(DECLARED)), max_size=2))
        fields = [{"field": "id", "type": "int64"}] + [{"field": n, "optional": True, **DECLARED[t]} for n, t in declared.items()]
        if any(t == "decimal" for t in declared.values()):
            image.update({n: None for n, t in declared.items() if t == "decimal"})  # base64 bytes: left null here
        events.append({"op": "c", "key": json.dumps({"id": i}), "before": None, "after": json.dumps(image),
                       "row_schema": json.dumps({"fields": fields}) if declared else None,
                       "position": f"{draw(st.integers(0, 50)):020d}", "tx_total_order": None})
    return events


def _events(rows: list[dict[str, Any]]) -> Events:
    schema = pa.schema([(n, pa.int64() if n == "tx_total_order" else pa.string()) for n in rows[0]])
    return Events(pa.Table.from_pylist(rows, schema=schema))


@settings(max_examples=150, deadline=None)
@given(histories(), st.data())
def test_parts_merged_decide_what_the_whole_decides(history: list[dict[str, Any]], data: Any) -> None:
    whole = _events(history)
    changes, _ = change_rows(whole, TABLE.key)
    expected = decide_types(type_votes(changes, whole, TABLE))
    assert expected == type_rows(changes, whole, {}, TABLE, coerce=True).columns

    owner = data.draw(st.lists(st.integers(0, 2), min_size=len(history), max_size=len(history)))
    parts = []
    for p in range(3):
        mine = [i for i in range(len(history)) if owner[i] == p]
        if not mine:
            continue
        events = _events([history[i] for i in mine])
        rows, _ = change_rows(events, TABLE.key)
        parts.append(type_votes(rows, events, TABLE, arrival=mine))
    merged = decide_types(merge_votes(parts))
    assert list(merged.items()) == list(expected.items())


def test_the_newest_declared_type_wins_and_inferred_integers_widen_it_only_when_they_do_not_fit() -> None:
    older, newer = ("", -1, 1), ("", -1, 2)
    hard = {pa.int16(): Vote(newer, (0, 1, 0)), pa.string(): Vote(older, (0, 1, 1))}
    assert decide_type(None, {pa.int16(): hard[pa.int16()]}, {pa.int64(): Vote(older, (0, 1, 0), -5, 300)})[0] == pa.int16()
    assert decide_type(None, {pa.int16(): hard[pa.int16()]}, {pa.int64(): Vote(older, (0, 1, 0), -5, 70_000)})[0] == pa.int64()
    assert decide_type(None, {}, {pa.int64(): Vote(older, (0, 0, 0), 1, 2), pa.string(): Vote(newer, (1, 0, 0))})[0] == pa.string()
    merged = Vote(older, (3, 1, 0), -5, 7).merge(Vote(newer, (1, 1, 0), 2, 70_000))
    assert merged == Vote(newer, (1, 1, 0), -5, 70_000)


def test_a_column_seen_only_as_null_gets_no_type_and_the_first_spelling_names_a_column() -> None:
    history = [{"op": "c", "key": '{"id":1}', "before": None, "after": json.dumps({"id": 1, "Name": "x", "empty": None}),
                "row_schema": None, "position": "1", "tx_total_order": None},
               {"op": "c", "key": '{"id":2}', "before": None, "after": json.dumps({"id": 2, "name": "y"}),
                "row_schema": None, "position": "2", "tx_total_order": None}]
    events = _events(history)
    rows, _ = change_rows(events, TABLE.key)
    late = _events(history[1:])
    late_rows, _ = change_rows(late, TABLE.key)
    early = _events(history[:1])
    early_rows, _ = change_rows(early, TABLE.key)
    # the part holding the later spelling is merged first: the name still comes from the first event
    merged = merge_votes([type_votes(late_rows, late, TABLE, arrival=[1]), type_votes(early_rows, early, TABLE, arrival=[0])])
    assert list(decide_types(merged)) == list(decide_types(type_votes(rows, events, TABLE))) == ["id", "Name"]
