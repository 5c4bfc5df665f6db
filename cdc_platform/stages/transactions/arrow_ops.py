"""Small pyarrow and numpy helpers the aggregation is built from, knowing nothing of transactions.

Conforming a table to a schema, gathering rows by index, taking map and list arrays apart and putting
them back together, comparing count maps as strings, and matching END's table names to the streams'
table ids. Apart so the step, its judgement, its outcomes and the watermark share one copy and each
of them reads as what it decides rather than as Arrow plumbing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.lake.schemas import TS, conform


_conform = conform  # the name the package's modules use


def _arr(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _us(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    return pc.cast(_arr(col), pa.int64())


def _ts(values: Sequence[int | None]) -> pa.Array:
    return pa.array(values, pa.int64()).cast(TS)


def _take(col: pa.ChunkedArray | pa.Array, indices: pa.Array) -> pa.Array:
    """Gather rows by index; a null index gives a null (a left join by position)."""
    return _arr(col).take(indices)


def _map_parts(maps: pa.Array) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """(offsets from 0, keys, items) of a MapArray, robust to slices (pyarrow's compute kernels are not)."""
    m = _arr(maps)
    offsets = m.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    return offsets - start, m.keys.slice(start, end - start), m.items.slice(start, end - start)


def _parents(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))


def _offsets_from_counts(counts: np.ndarray) -> pa.Array:
    return pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32), pa.int32())


def _signature(parents: np.ndarray, keys: pa.Array, items: pa.Array, n: int, null_mask: pa.Array | None) -> pa.Array:
    """One canonical string per row, `table=count;…` sorted by table, so two count maps compare as strings."""
    if len(keys):
        t = pa.table({"p": pa.array(parents, pa.int64()), "k": keys, "v": pc.cast(items, pa.string())})
        t = t.sort_by([("p", "ascending"), ("k", "ascending")])
        text = pc.binary_join_element_wise(t.column("k"), t.column("v"), "=")
        counts = np.bincount(t.column("p").to_numpy(), minlength=n)
    else:
        text = pa.array([], pa.string())
        counts = np.zeros(n, dtype=np.int64)
    lists = pa.ListArray.from_arrays(_offsets_from_counts(counts), _arr(text), mask=null_mask)
    return pc.binary_join(lists, ";")


def _grouped_map(parents: np.ndarray, keys: pa.Array, counts: pa.Array, n: int) -> pa.Array:
    """Build a map per row from (row, key, value) triples sorted by row."""
    per_row = np.bincount(parents, minlength=n) if len(parents) else np.zeros(n, dtype=np.int64)
    return pa.MapArray.from_arrays(_offsets_from_counts(per_row), _arr(keys), _arr(counts))


def _table_matcher(known_tables: Iterable[str]) -> Any:
    """Map an END marker's table name to a stream's table id.

    Debezium names tables `<db-or-schema>.<table>` like the events do; Stripe-shaped markers may use
    the bare table or the topic (`<prefix>.<db>.<table>`). An unmatched name stays as it is.
    """
    known = sorted(set(known_tables))

    def match(name: str) -> str:
        if name in known:
            return name
        hits = [t for t in known if name.endswith("." + t)] or [t for t in known if t.endswith("." + name)]
        return hits[0] if len(hits) == 1 else name

    return match
