"""The outbox stage (`stages/outbox/`): outbox inserts land as `<aggregatetype>_events`, once per event id, in
source order per aggregate; housekeeping never changes an event; bad events and id conflicts are dead letters."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest

from cdc_platform import lake
from cdc_platform.run import stage_queries
from cdc_platform.stages.outbox import OutboxStage, event_tables, safe_name

T0 = 1_767_225_600_000
OUTBOX = {"table": "shop.outbox", "expectations": {"order_created": ["shop.orders"]}}


def change(table: str, op: str, pos: int, row: dict[str, Any], tx: str | None = None, order: int = 1) -> str:
    """A Debezium MySQL change event of `shop.<table>` at binlog position `pos`, in transaction `tx`."""
    image = {"before": row if op == "d" else None, "after": None if op == "d" else row}
    return json.dumps({
        **image,
        "source": {"version": "2.7.0.Final", "connector": "mysql", "name": "shop", "db": "shop", "table": table, "ts_ms": T0 + pos,
                   "snapshot": "false", "file": "mysql-bin.000001", "pos": pos, "row": 0},
        "op": op, "ts_ms": T0 + pos,
        "transaction": None if tx is None else {"id": tx, "total_order": order, "data_collection_order": order},
    })


def outbox_row(event_id: str | None, aggregate: str, aggregate_id: str, type_: str | None, payload: Any) -> dict[str, Any]:
    return {"id": event_id, "aggregatetype": aggregate, "aggregateid": aggregate_id, "type": type_,
            "payload": payload if isinstance(payload, str) or payload is None else json.dumps(payload)}


def event(pos: int, event_id: str | None, aggregate: str = "Order", aggregate_id: str = "1", type_: str | None = "order_created",
          payload: Any = None, op: str = "c", tx: str | None = None) -> str:
    return change("outbox", op, pos, outbox_row(event_id, aggregate, aggregate_id, type_, {"n": pos} if payload is None else payload), tx=tx)


def rows(query: Any, cfg: Any, table: str, cols: str = "event_id, aggregate_id, event_type, payload") -> list[dict[str, Any]]:
    return query(cfg, f"SELECT {cols} FROM {table} ORDER BY source_position")


def dead(query: Any, cfg: Any) -> list[tuple[str, str]]:
    return [(r["reason_code"], r["reason"]) for r in query(cfg, "SELECT reason_code, reason FROM dead_letter WHERE stage = 'outbox' ORDER BY reason_code")]


def test_safe_names() -> None:
    assert safe_name("Order") == "order_events"
    assert safe_name("purchase-order") == "purchase_order_events"
    assert safe_name("  Billing.Invoice!! ") == "billing_invoice_events"
    assert safe_name("3d") == "t_3d_events"
    assert safe_name("__") is None and safe_name("") is None


def test_inserts_land_per_aggregate_type_and_housekeeping_changes_nothing(make_config, land, run_pipeline, query) -> None:
    cfg = make_config({"shop.orders": {"key": ["id"]}}, outbox=OUTBOX)
    land(None, [
        change("orders", "c", 10, {"id": 1, "total": 5}, tx="t1", order=1),
        event(11, "e1", payload={"b": 2, "a": 1}, tx="t1"),
        event(12, "e1", op="d", tx="t2"),  # the service deletes its outbox row right after: housekeeping
        event(13, "e2", aggregate="Payment", aggregate_id="p9", type_="payment_made", payload={"x": [1, 2]}),
        event(14, "e3", aggregate_id="1", type_="order_shipped", payload={"s": True}),
        event(15, "e3", op="u", payload={"s": False}),  # an update of the outbox row: never changes the event
    ])
    run_pipeline(cfg)
    assert rows(query, cfg, "order_events") == [
        {"event_id": "e1", "aggregate_id": "1", "event_type": "order_created", "payload": '{"a":1,"b":2}'},
        {"event_id": "e3", "aggregate_id": "1", "event_type": "order_shipped", "payload": '{"s":true}'},
    ]
    assert rows(query, cfg, "payment_events") == [{"event_id": "e2", "aggregate_id": "p9", "event_type": "payment_made", "payload": '{"x":[1,2]}'}]
    first = query(cfg, "SELECT transaction_id, source_table, aggregate_type FROM order_events WHERE event_id = 'e1'")[0]
    assert first == {"transaction_id": "t1", "source_table": "shop.outbox", "aggregate_type": "Order"}
    assert sorted(event_tables(cfg.lake)) == ["order_events", "payment_events"]
    assert query(cfg, "SELECT event_id FROM order_events__latest_view") == [{"event_id": "e3"}]
    progress = query(cfg, "SELECT stage_figures FROM stage_progress WHERE query = 'outbox'")
    figures = progress[-1]["stage_figures"]
    assert figures["outbox.housekeeping"] == 2.0 and figures["outbox.events_landed"] == 3.0
    assert dead(query, cfg) == []


@pytest.mark.parametrize("listed", [True, False])
def test_a_redelivered_event_lands_once_and_a_reused_id_is_a_dead_letter(make_config, land, run_pipeline, query, monkeypatch, listed) -> None:
    """`listed`: the stored rows of the ids met again are read by an IN list; else (many ids) by a join."""
    from cdc_platform.stages.outbox import landing

    if not listed:
        monkeypatch.setattr(landing, "MAX_LISTED_IDS", 0)
    cfg = make_config(outbox=OUTBOX)
    land(None, [event(1, "e1", payload={"a": 1}), event(2, "e2", payload={"a": 2})])
    run_pipeline(cfg)
    # A later batch: e1 again (a snapshot re-read: another raw event, the same event, its JSON spelled otherwise),
    # e2 with other content (a different event reusing the id), and in the batch itself e4 twice, differently.
    land(None, [change("outbox", "r", 3, outbox_row("e1", "Order", "1", "order_created", '{ "a" : 1 }')),
                event(4, "e2", payload={"a": "changed"}),
                event(5, "e4", payload={"v": 1}), event(6, "e4", payload={"v": 2}), event(7, "e4", payload={"v": 1}),
                event(8, "e1", aggregate="Payment", payload={"a": 1})])  # an id of another event table: a conflict too
    run_pipeline(cfg)
    assert [(r["event_id"], r["payload"]) for r in rows(query, cfg, "order_events")] == [("e1", '{"a":1}'), ("e2", '{"a":2}'), ("e4", '{"v":1}')]
    assert "payment_events" not in lake.lake_tables(cfg.lake)
    letters = dead(query, cfg)
    assert [c for c, _ in letters] == ["outbox_id_conflict"] * 3
    assert sum("e1 is already taken in this batch" in r for _, r in letters) == 1, letters
    # A later batch: an id stored in another event table is a conflict too, and creates no table of its own.
    land(None, [event(9, "e2", aggregate="Payment", payload={"a": 2})])
    run_pipeline(cfg)
    assert "payment_events" not in lake.lake_tables(cfg.lake)
    letters = dead(query, cfg)
    assert len(letters) == 4 and sum("e2 is already stored in order_events" in r for _, r in letters) == 2, letters
    assert any("e2 is already stored in order_events" in r for _, r in letters), letters
    assert any("e4 is already taken in this batch" in r for _, r in letters), letters


def test_events_without_id_or_type_or_with_a_payload_that_is_not_json_are_dead_letters(make_config, land, run_pipeline, query) -> None:
    cfg = make_config(outbox=OUTBOX)
    land(None, [event(1, None), event(2, "e2", type_=None), event(3, "e3", payload="not {json"), event(4, "e4", aggregate="!!"),
                event(5, "e5", aggregate="raw_change"),  # its table would be the raw log
                change("outbox", "c", 6, {"id": "e6", "aggregatetype": "", "aggregateid": "1", "type": "t", "payload": None}),
                event(7, "ok")])
    run_pipeline(cfg)
    assert [r["event_id"] for r in rows(query, cfg, "order_events")] == ["ok"]
    codes = [c for c, _ in dead(query, cfg)]
    assert codes == ["outbox_missing_aggregate_type", "outbox_missing_id", "outbox_missing_type", "outbox_payload_not_json",
                     "outbox_unusable_aggregate_type", "outbox_unusable_aggregate_type"]
    reasons = dict(dead(query, cfg))
    assert "not {json" in reasons["outbox_payload_not_json"]
    line = query(cfg, "SELECT line, table_id FROM dead_letter WHERE reason_code = 'outbox_missing_id'")[0]
    assert line["table_id"] == "shop.outbox" and '"op": "c"' in line["line"]


def test_events_of_one_aggregate_keep_source_order_and_the_view_shows_the_latest(make_config, land, run_pipeline, query) -> None:
    cfg = make_config(outbox=OUTBOX)
    # Landed out of order across two batches: the table's position order and the latest view follow the source.
    land(None, [event(30, "c", aggregate_id="A", type_="t3"), event(10, "a", aggregate_id="A", type_="t1"), event(15, "x", aggregate_id="B")])
    run_pipeline(cfg)
    land(None, [event(20, "b", aggregate_id="A", type_="t2")])
    run_pipeline(cfg)
    got = query(cfg, "SELECT event_id FROM order_events WHERE aggregate_id = 'A' ORDER BY source_position")
    assert [r["event_id"] for r in got] == ["a", "b", "c"]
    latest = query(cfg, "SELECT aggregate_id, event_id, event_type FROM order_events__latest_view ORDER BY aggregate_id")
    assert latest == [{"aggregate_id": "A", "event_id": "c", "event_type": "t3"}, {"aggregate_id": "B", "event_id": "x", "event_type": "order_created"}]


def test_a_replay_after_a_crash_and_a_lost_checkpoint_land_nothing_twice(make_config, land, run_pipeline, query, monkeypatch) -> None:
    cfg = make_config(outbox=OUTBOX)
    land(None, [event(1, "e1"), event(2, "e2", aggregate="Payment"), event(3, None)])
    # The crash: the outbox stage dies after writing the first event table, before its dead letters and progress.
    calls = {"n": 0}
    real = stage_queries.StageQuery._write_dead

    def crash(self, result, ctx, landed):  # type: ignore[no-untyped-def]
        if self.name == "outbox" and calls["n"] == 0:
            calls["n"] += 1
            raise OSError("killed")
        return real(self, result, ctx, landed)

    monkeypatch.setattr(stage_queries.StageQuery, "_write_dead", crash)
    with pytest.raises(Exception):
        run_pipeline(cfg)
    run_pipeline(cfg)  # the stage query replays its batch
    assert [r["event_id"] for r in rows(query, cfg, "order_events")] == ["e1"]
    assert [r["event_id"] for r in rows(query, cfg, "payment_events")] == ["e2"]
    assert [c for c, _ in dead(query, cfg)] == ["outbox_missing_id"]
    # A lost checkpoint: the stage reads the whole raw log again; every event is found stored, nothing lands twice.
    shutil.rmtree(stage_queries.checkpoint_dir(cfg, "outbox"))
    land(None, [event(4, "e4")])
    run_pipeline(cfg)
    assert [r["event_id"] for r in rows(query, cfg, "order_events")] == ["e1", "e4"]
    assert [r["event_id"] for r in rows(query, cfg, "payment_events")] == ["e2"]


def test_payload_fields_become_columns_when_a_schema_is_declared(make_config, land, run_pipeline, query) -> None:
    cfg = make_config(outbox={**OUTBOX, "payload_schema": {"Order": "total double, items array<string>"},
                              "columns": {"additional": ["tenant"]}})
    land(None, [change("outbox", "c", 1, {**outbox_row("e1", "Order", "1", "order_created", json.dumps({"total": 2.5, "items": ["a"]})),
                                          "tenant": "acme"})])
    run_pipeline(cfg)
    assert query(cfg, "SELECT total, items, tenant FROM order_events") == [{"total": 2.5, "items": ["a"], "tenant": "acme"}]


def test_a_lake_without_outbox_config_runs_no_outbox_stage(make_config, land, run_pipeline) -> None:
    cfg = make_config()
    land(None, [event(1, "e1")])
    run_pipeline(cfg)
    assert not stage_queries.checkpoint_dir(cfg, "outbox").exists()
    assert event_tables(cfg.lake) == {}
    assert "order_events" not in lake.lake_tables(cfg.lake)


def test_a_payload_schema_spark_cannot_read_stops_setup(make_config) -> None:
    from cdc_platform.errors import ConfigError

    cfg = make_config(outbox={**OUTBOX, "payload_schema": {"Order": "total notatype"}})
    with pytest.raises(ConfigError, match="not a Spark DDL schema"):
        OutboxStage().setup(cfg)
    cfg = make_config(outbox={**OUTBOX, "payload_schema": {"Order": "event_id string"}})
    with pytest.raises(ConfigError, match="clash"):
        OutboxStage().setup(cfg)
    cfg = make_config(outbox={**OUTBOX, "columns": {"additional": ["source_ts"]}})
    with pytest.raises(ConfigError, match="outbox.columns.additional: source_ts would clash"):
        OutboxStage().setup(cfg)


def test_the_catalog_registers_the_latest_views_but_not_for_a_clean_server(make_config, land, run_pipeline, spark) -> None:
    """`cdc serve`'s catalog (`views.catalog`): each event table and its `__latest_view`; `expose: clean` shows neither."""
    from cdc_platform.views.catalog import register_catalog

    cfg = make_config(outbox=OUTBOX)
    land(None, [event(1, "a", aggregate_id="A", type_="t1"), event(2, "b", aggregate_id="A", type_="t2")])
    run_pipeline(cfg)
    names = register_catalog(spark, cfg.lake, "outboxcat")
    assert {"order_events", "order_events__latest_view"} <= set(names)
    rows = spark.sql("SELECT aggregate_id, event_id FROM outboxcat.order_events__latest_view").collect()
    assert [(r["aggregate_id"], r["event_id"]) for r in rows] == [("A", "b")]
    clean = register_catalog(spark, cfg.lake, "outboxclean", expose="clean")
    assert not any(n.startswith("order_events") for n in clean)
