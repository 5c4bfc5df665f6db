"""Typing and folding rules of the latest-state stage, without Spark."""

from __future__ import annotations

import datetime as dt
import json
import decimal
from pathlib import Path

import pyarrow as pa
import pytest

from cdc_platform.config import ConfigError, parse_config
from cdc_platform.stages.latest_state import BadValue, connect_type, fold_latest, infer_type, join_types, type_name

TS = pa.timestamp("us", tz="UTC")


@pytest.mark.parametrize(
    ("a", "b", "joined"),
    [
        (pa.int32(), pa.int64(), pa.int64()),
        (pa.int8(), pa.int16(), pa.int16()),
        (pa.int64(), pa.float64(), pa.float64()),
        (pa.float32(), pa.float64(), pa.float64()),
        (pa.int16(), pa.float32(), pa.float32()),
        (pa.int32(), pa.float32(), pa.float64()),
        (pa.decimal128(10, 2), pa.decimal128(8, 4), pa.decimal128(12, 4)),
        (pa.int64(), pa.decimal128(10, 2), pa.decimal128(21, 2)),
        (pa.int64(), pa.string(), None),
        (pa.bool_(), pa.int64(), None),
        (pa.string(), pa.binary(), None),
        (pa.date32(), TS, None),
        (pa.float64(), pa.decimal128(10, 2), None),
        (pa.large_string(), pa.string(), pa.string()),
    ],
)
def test_widening_lattice(a: pa.DataType, b: pa.DataType, joined: pa.DataType | None) -> None:
    assert join_types(a, b) == joined
    assert join_types(b, a) == joined


def test_json_inference_follows_what_json_says() -> None:
    assert infer_type(1.0).dtype == pa.float64()  # `1.0` in JSON is a float: weight 1.0 stays double
    assert infer_type(1).dtype == pa.int64()
    assert infer_type(True).dtype == pa.bool_()
    assert infer_type(None) is None
    nested = infer_type({"a": [1, 2]})
    assert nested.dtype == pa.string() and nested.convert({"a": [1, 2]}) == '{"a":[1,2]}'


def test_connect_types() -> None:
    dec = connect_type({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2", "connect.decimal.precision": "6"}})
    assert dec.dtype == pa.decimal128(6, 2) and dec.convert("/48=") == decimal.Decimal("-1.13")  # 0xFF8F = -113 unscaled
    with pytest.raises(BadValue):
        dec.convert(True)
    ts = connect_type({"type": "int64", "name": "io.debezium.time.MicroTimestamp"})
    assert ts.dtype == TS and ts.convert(1_000_001) == dt.datetime(1970, 1, 1, 0, 0, 1, 1, tzinfo=dt.timezone.utc)
    nano = connect_type({"type": "int64", "name": "io.debezium.time.NanoTimestamp"})
    assert nano.convert(2_000_000_000) == dt.datetime(1970, 1, 1, 0, 0, 2, tzinfo=dt.timezone.utc)
    assert connect_type({"type": "int64", "name": "io.debezium.time.MicroTime"}).dtype == pa.int64()  # kept in its unit
    assert connect_type({"type": "struct", "fields": []}).dtype == pa.string()
    assert connect_type({"type": "float"}) is None
    assert connect_type({"type": "bytes"}).convert("AAE=") == b"\x00\x01"
    with pytest.raises(BadValue):
        connect_type({"type": "int32"}).convert("12")
    assert type_name(pa.decimal128(6, 2)) == "decimal(6,2)" and type_name(pa.int16()) == "smallint"


def test_fold_latest_prefers_higher_position_then_the_later_distinct_arrival() -> None:
    """Issue 11: at an equal position the distinct event appended later wins; copies of one event count
    as its first copy, so a redelivery (same `_event_id`, higher `_seq`) never overtakes."""
    rows = pa.table({
        "k": [1, 1, 1, 2, 2, 3, 3, 3],
        "_position": ["b", "c", "c", "a", "a", "d", "d", "d"],
        "_seq": [1, 3, 2, 5, 4, 6, 7, 8],
        "_event_id": ["e1", "e3", "e2", "e4", "e4", "A", "B", "A"],
        "v": ["old", "c3", "c2", "a5", "a4", "A6", "B7", "A8"],
    })
    assert fold_latest(rows, ["k"]).column("v").to_pylist() == ["c3", "a4", "B7"]


def test_table_config_keys() -> None:
    cfg = parse_config({"landing": "l", "lake": "k", "tables": {"s.t": {"key": ["id"], "history": True, "tombstone_retention": "2 days",
                                                                        "mask": ["e"], "mask_mode": "remove"}}}, base=Path("/tmp"))
    (t,) = cfg.tables
    assert (t.history, t.tombstone_retention, t.mask_mode, t.history_name) == (True, 172_800.0, "remove", "t_history")
    assert type(t).from_registry(t.to_registry()) == t
    with pytest.raises(ConfigError, match="mask_mode"):
        parse_config({"landing": "l", "lake": "k", "tables": {"s.t": {"key": ["id"], "mask_mode": "blur"}}}, base=Path("/tmp"))
    with pytest.raises(ConfigError, match="tombstone_retention"):
        parse_config({"landing": "l", "lake": "k", "tables": {"s.t": {"key": ["id"], "tombstone_retention": "soon"}}}, base=Path("/tmp"))
    with pytest.raises(ConfigError, match="t_history"):
        parse_config({"landing": "l", "lake": "k", "tables": {"s.t": {"key": ["id"], "history": True}, "s.t_history": {"key": ["id"]}}},
                     base=Path("/tmp"))


def typed(afters: list[dict], declared: list[dict] | None = None, stored: dict | None = None, coerce: bool = False):  # type: ignore[no-untyped-def]
    """Run the stage's typing on `c` events with these row images (optionally with Connect fields)."""
    from cdc_platform.config import TableConfig
    from cdc_platform.stages.latest_state import Events, change_rows, type_rows
    from cdc_platform.lake.schemas import RAW_CHANGE_EVENTS

    n = len(afters)
    schema_text = [None if not declared or declared[i] is None else json.dumps({"type": "struct", "fields": declared[i], "field": "after"}) for i in range(n)]
    cols = {f.name: pa.nulls(n, f.type) for f in RAW_CHANGE_EVENTS}
    cols |= {"op": pa.array(["c"] * n), "key": pa.array([json.dumps({"id": a["id"]}) for a in afters]),
             "after": pa.array([json.dumps(a) for a in afters]), "row_schema": pa.array(schema_text, pa.string()),
             "position": pa.array([f"{i:05d}" for i in range(n)])}
    events = Events(pa.table(cols, schema=RAW_CHANGE_EVENTS))
    rows, _ = change_rows(events, ["id"])
    return type_rows(rows, events, stored or {}, TableConfig("s.t", "t", ("id",)), coerce=coerce)


INT32 = [{"type": "int32", "optional": False, "field": "id"}, {"type": "float", "optional": True, "field": "f"}]


def test_inferred_values_fit_a_narrower_declared_column() -> None:
    t = typed([{"id": 1, "f": 0.5}, {"id": 2, "f": 1.5}], declared=[INT32, None])
    assert t.columns == {"id": pa.int32(), "f": pa.float64()}  # `float` is no Connect type: inferred double
    t = typed([{"id": 3}], stored={"id": pa.int32()})
    assert (t.columns, t.widened, t.dead) == ({"id": pa.int32()}, {}, {})
    t = typed([{"id": 2**40}], stored={"id": pa.int32()})
    assert t.widened == {"id": (pa.int32(), pa.int64())}
    t = typed([{"id": 1, "r": 0.25}], stored={"id": pa.int64(), "r": pa.float32()})
    assert t.columns["r"] == pa.float32() and not t.widened


def test_incompatible_values_are_dead_and_coercion_casts_to_the_newest_type() -> None:
    t = typed([{"id": 1, "code": "A"}], stored={"id": pa.int64(), "code": pa.int64()})
    ((code, reason),) = t.dead.values()
    assert code == "incompatible_type" and "`code`" in reason and "bigint" in reason and "string" in reason
    t = typed([{"id": 1, "code": 7}, {"id": 2, "code": "B"}], coerce=True)
    assert t.columns["code"] == pa.string() and t.values["code"] == ["7", "B"] and not t.dead
    t = typed([{"id": 1, "code": "x"}, {"id": 2, "code": 8}], coerce=True)
    assert t.columns["code"] == pa.int64() and list(t.dead) == [0]  # 'x' cannot become the newest type


def test_column_names_are_case_insensitive_like_spark_and_delta() -> None:
    t = typed([{"id": 1, "email": "a@x", "Email": "b@x"}, {"id": 2, "email": "c@x"}])
    ((code, reason),) = t.dead.values()
    assert code == "ambiguous_columns" and "`Email`, `email`" in reason and list(t.dead) == [0]
    t = typed([{"id": 1, "EMAIL": "x@y"}], stored={"id": pa.int64(), "email": pa.string()})
    assert list(t.columns) == ["id", "email"] and t.values["email"] == ["x@y"] and not t.dead
    t = typed([{"id": 1, "_OP": "x"}])
    assert [c for c, _ in t.dead.values()] == ["reserved_column"]


def test_integers_beyond_64_bits_are_exact_decimals_and_beyond_38_digits_dead_letters() -> None:
    t = typed([{"id": 1, "n": 2**64 - 1}, {"id": 2, "n": 5}])  # an unsigned BIGINT at its top
    assert t.columns["n"] == pa.decimal128(20, 0) and t.values["n"] == [decimal.Decimal(2**64 - 1), decimal.Decimal(5)] and not t.dead
    t = typed([{"id": 1, "n": 2**70}])
    assert t.columns["n"] == pa.decimal128(38, 0) and t.values["n"] == [decimal.Decimal(2**70)]
    t = typed([{"id": 1, "n": 10**40}, {"id": 2, "n": 5}])
    assert [c for c, _ in t.dead.values()] == ["out_of_range"] and list(t.dead) == [0]
    t = typed([{"id": 2**31}], declared=[INT32])
    assert [c for c, _ in t.dead.values()] == ["out_of_range"]
