"""Which of two stored changes to one key is the newer: source position, then first arrival.

Why a module: the rule is applied in three places that must agree, the compaction's fold of the delta
layer (`fold_latest`), the compaction's MERGE into the base (`MERGE_NEWER`), and the SQL view that folds
both layers at read time (`views.latest_state_sql`), and by the lookup that resolves Debezium's
unavailable-value placeholder (`unavailable`).

The rule (issue 11). The higher source position wins. Two *distinct* events of one key may carry the
same position (the `source_ts_fallback` position, or a tool that emits a constant one); then the later
arrival wins, within a batch (input order, see `latest_state.last_per_key`) and across batches alike
(`_seq`, the Delta version that appended the row, grows with every batch). An *identical* redelivery
(same `_event_id`) changes nothing: its arrival is that of its first copy, so it never overtakes an
event that arrived after that first copy, and against itself it is not newer.

Known limit: the first copy's arrival is known only while a row of it is stored. When compaction has
already replaced it by a later tied event B, a redelivery of the older event A (without B after it)
wins over B. A connector replays its log in order (A then B again), so this needs a partial, reordered
redelivery; `cdc rebuild` (which orders the raw log by first arrival) repairs it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

#: The compaction MERGE's condition for a delta row `s` to replace the base row `t` of its key. Base
#: rows were appended before every delta row present (compaction deletes what it folded), so a distinct
#: event at an equal position is a later arrival.
MERGE_NEWER = "s._position > t._position OR (s._position = t._position AND s._event_id <> t._event_id AND s._seq > t._seq)"

FIRST = "__first_seq"


def with_first_arrival(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """`rows` plus `FIRST`: the lowest `_seq` among rows of the same key, position and event id."""
    groups = [*key, "_position", "_event_id"]
    firsts = rows.select([*groups, "_seq"]).group_by(groups, use_threads=False).aggregate([("_seq", "min")])
    firsts = firsts.rename_columns([*groups, FIRST])
    idx = pa.table({"__i": pa.array(range(rows.num_rows), pa.int64()), **{c: rows.column(c) for c in groups}})
    joined = idx.join(firsts, keys=groups, join_type="left outer", use_threads=False).sort_by("__i")
    return rows.append_column(FIRST, joined.column(FIRST))


def fold_latest(rows: pa.Table, key: Sequence[str]) -> pa.Table:
    """One row per key: the highest `_position`; on a tie, the distinct event that arrived last (highest
    first arrival); copies of one event count as its first copy (the earliest stored row is kept)."""
    if rows.num_rows == 0:
        return rows
    ranked = with_first_arrival(rows, key)
    order = pc.sort_indices(ranked, sort_keys=[*((k, "ascending") for k in key), ("_position", "descending"),
                                               (FIRST, "descending"), ("_seq", "ascending")])
    s = rows.take(order)
    n = s.num_rows
    if n == 1:
        return s
    changed: pa.Array | None = None
    for k in key:
        col = s.column(k).combine_chunks()
        diff = pc.fill_null(pc.not_equal(col.slice(1), col.slice(0, n - 1)), True)
        changed = diff if changed is None else pc.or_(changed, diff)
    assert changed is not None
    return s.filter(pa.concat_arrays([pa.array([True]), changed]))
