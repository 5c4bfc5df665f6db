"""`cdc rebuild` on the executors (`latest_state.rebuild`, `rebuild_parts`): it folds what the stream folded,
its buckets change nothing, and a failed write leaves the table as it was."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_platform.stages.latest_state import rebuild as rebuild_module
from cdc_platform.stages.latest_state import rebuild_table
from tests.cdc_platform.test_latest_state import ORDERS, Feed, c, d, ev, truncate, u

PLACEHOLDER = "__debezium_unavailable_value"


def key_change(old: int, new: int, pos: int, **cols: Any) -> str:
    return ev("u", pos=pos, before={"id": old, **cols}, after={"id": new, **cols})


def history_rows(query: Any, cfg: Any) -> list[dict[str, Any]]:
    return query(cfg, "SELECT id, amount, note, _op, _valid_from_position, _valid_to_position, _is_current, _event_id "
                      "FROM orders_history ORDER BY id, _valid_from_position")


def test_the_rebuild_folds_what_the_stream_folded(make_config, query) -> None:  # noqa: ANN001
    """Deletes, a re-insert, late and duplicate changes, key changes, a truncate and an unavailable value,
    over several batches: the rebuilt table and its history show what the stream's do."""
    cfg = make_config({ORDERS: {"key": ["id"], "history": True}})
    feed = Feed(cfg)
    feed([c(1, 100, amount=1, note="a"), c(2, 110, amount=2, note="b"), c(3, 120, amount=3, note="c")])
    feed([u(1, 300, amount=3, note="a"), u(1, 200, amount=2, note="a"), d(2, 310), c(4, 320, amount=4, note="d")])
    feed([truncate(400), c(5, 410, amount=5, note="e"), c(6, 420, amount=6, note="f"), c(2, 430, amount=20, note="b2")])
    feed([key_change(5, 50, 500, amount=5, note="e"), key_change(6, 60, 510, amount=6, note="f"), u(2, 520, amount=21, note=PLACEHOLDER)])
    feed([u(50, 600, amount=55, note="e2"), c(5, 610, amount=7, note="again"), u(1, 200, amount=2, note="a")])
    view = "SELECT id, amount, note, _op, _position FROM orders__full_view ORDER BY id"
    streamed, streamed_history = query(cfg, view), history_rows(query, cfg)
    assert [(r["id"], r["note"]) for r in streamed] == [(2, "b2"), (5, "again"), (50, "e2"), (60, "f")]

    report = rebuild_table(cfg, "orders", buckets=5)
    assert query(cfg, view) == streamed
    assert history_rows(query, cfg) == streamed_history
    assert report.dead_letters == 0 and report.events == 16
    layers = query(cfg, "SELECT DISTINCT _layer FROM orders__stored")
    assert layers == [{"_layer": "base"}], "the rebuilt table is all base: nothing left to compact"


def _dead(query: Any, cfg: Any) -> list[tuple[Any, ...]]:
    rows = query(cfg, "SELECT event_id, reason_code, reason, line FROM dead_letter WHERE stage = 'rebuild' ORDER BY event_id, dead_lettered_at")
    return [tuple(r.values()) for r in rows]


def test_buckets_change_nothing(make_config, query) -> None:  # noqa: ANN001
    """Types decided over the whole history (a declared type, widening, an inferred integer that fits,
    a value that cannot be cast, names equal but for case, a reserved name) and keys spread over many
    buckets, their key changes crossing buckets: one bucket and nine give the same tables and dead letters."""
    cfg = make_config({ORDERS: {"key": ["id"], "history": True}})
    small = {"fields": [{"type": "int32", "optional": False, "field": "id"}, {"type": "int16", "optional": True, "field": "qty"},
                        {"type": "string", "optional": True, "field": "code"}]}
    feed = Feed(cfg, tail_check=False)  # the fold retypes and dead-letters here, which the tail shows only once folded
    feed([c(i, 100 + i, qty=i, code=i) for i in range(1, 30)])  # qty and code inferred as integers
    feed([ev("u", pos=200 + i, after={"id": i, "qty": i + 1, "code": f"C{i}"}, schema=small) for i in range(1, 30, 3)])  # declared
    feed([key_change(i, 100 + i, 300 + i, qty=i, code=i) for i in range(2, 30, 4)])
    feed([u(7, 400, qty="lots", code="x"), u(8, 401, qty=1, Code="y"), u(9, 402, qty=1, code="z", CODE="w"), u(10, 403, qty=1, _op="no")])
    feed([d(11, 500), truncate(450), c(12, 510, qty=12, code="late")])
    tables = ("SELECT * EXCEPT (_ingested_at, _seq) FROM orders__stored ORDER BY id, _position",
              # `_batch_order` orders a bucket's rows (the views compare it within a key): not across buckets
              "SELECT * EXCEPT (_ingested_at, _seq, _batch_order) FROM orders_history__stored ORDER BY id, _position, _event_id, _deleted")

    one = rebuild_table(cfg, "orders", buckets=1)
    first = [query(cfg, sql) for sql in tables]
    first_dead = _dead(query, cfg)
    nine = rebuild_table(cfg, "orders", buckets=9)
    assert [query(cfg, sql) for sql in tables] == first
    assert (nine.rows, nine.history_rows, nine.dead_letters, nine.events) == (one.rows, one.history_rows, one.dead_letters, one.events)
    again = _dead(query, cfg)
    assert sorted(set(again)) == sorted(set(first_dead)) and len(again) == 2 * len(first_dead)
    codes = sorted(r[1] for r in first_dead)
    assert codes == ["ambiguous_columns", "incompatible_type", "reserved_column"], first_dead
    assert all(r[3] for r in first_dead), "every dead letter has its original line"
    types = {r["col_name"]: r["data_type"] for r in query(cfg, "DESCRIBE orders")}
    assert (types["id"], types["qty"], types["code"]) == ("int", "smallint", "string")


def test_a_failed_write_leaves_the_table_and_releases_the_staged_rows(make_config, query, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    from pyspark import StorageLevel

    cfg = make_config({ORDERS: {"key": ["id"]}})
    Feed(cfg)([c(1, 100, amount=1), c(2, 110, amount=2)])
    before = query(cfg, "SELECT id, amount FROM orders__full_view ORDER BY id")
    staged: list[Any] = []
    second_pass = rebuild_module._second_pass

    def spy(*args: Any) -> Any:
        staged.append(second_pass(*args))
        return staged[-1]

    def broken(*args: Any, **kwargs: Any) -> None:
        assert staged[0].storageLevel != StorageLevel.NONE  # held while the tables are written
        raise OSError("the object store said no")

    monkeypatch.setattr(rebuild_module, "_second_pass", spy)
    monkeypatch.setattr(rebuild_module, "_overwrite", broken)
    with pytest.raises(OSError, match="said no"):
        rebuild_table(cfg, "orders")
    assert staged[0].storageLevel == StorageLevel.NONE
    assert query(cfg, "SELECT id, amount FROM orders__full_view ORDER BY id") == before
