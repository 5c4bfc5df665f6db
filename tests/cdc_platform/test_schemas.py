"""`schemas.conform`: the one function that shapes an Arrow table to a table's schema (the stages' rows, the
latest-state parts decoded on the executors, Spark's Arrow output)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cdc_platform.lake.schemas import conform


def test_columns_are_reordered_cast_and_the_missing_ones_null() -> None:
    data = pa.table({"b": pa.array([1, 2], pa.int32()), "extra": ["x", "y"], "a": ["p", None]})
    target = pa.schema([pa.field("a", pa.string()), pa.field("b", pa.int64()), pa.field("c", pa.float64())])
    got = conform(data, target)
    assert got.schema == target
    assert got.to_pydict() == {"a": ["p", None], "b": [1, 2], "c": [None, None]}


def test_constants_fill_every_row_whether_or_not_the_column_is_there() -> None:
    data = pa.table({"id": [1, 2, 3], "batch": [7, 7, 7]})
    target = pa.schema([pa.field("id", pa.int64()), pa.field("batch", pa.int64()), pa.field("tag", pa.string())])
    got = conform(data, target, constants={"batch": 9, "tag": "t"})
    assert got.to_pydict() == {"id": [1, 2, 3], "batch": [9, 9, 9], "tag": ["t", "t", "t"]}


def test_a_lossy_cast_is_refused_unless_asked_for() -> None:
    data = pa.table({"n": pa.array([300], pa.int64())})
    target = pa.schema([pa.field("n", pa.int8())])
    with pytest.raises(pa.ArrowInvalid):
        conform(data, target)
    assert conform(data, target, safe=False).schema == target


def test_a_wide_row_keeps_every_column_in_place() -> None:
    """The shape of tests/data/bad_input/35_very_wide_row.jsonl (5,001 columns), which once cost a batch
    21 s here (a name lookup per column that rebuilt the list of names)."""
    n = 5_001
    data = pa.table({f"c{i}": [i] for i in reversed(range(n))})
    target = pa.schema([pa.field(f"c{i}", pa.int64()) for i in range(n)] + [pa.field("missing", pa.string())])
    got = conform(data, target)
    assert got.column_names == target.names
    assert [got.column(i)[0].as_py() for i in range(n)] == list(range(n))
    assert got.column("missing").null_count == 1


def test_a_column_named_twice_is_refused_when_the_schema_asks_for_it() -> None:
    data = pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array(["x"])], names=["n", "n", "s"])
    assert conform(data, pa.schema([pa.field("s", pa.string())])).to_pydict() == {"s": ["x"]}
    with pytest.raises(KeyError, match="n"):
        conform(data, pa.schema([pa.field("n", pa.int64())]))
