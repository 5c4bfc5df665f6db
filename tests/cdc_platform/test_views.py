"""The latest-state views: masking never shows a masked value, quoting survives odd names, `cdc sql` works
from the lake alone.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
from decimal import Decimal as D
from typing import Any

import pytest

from cdc_platform.cli import main
from cdc_platform import views
from cdc_platform.stages.unavailable import PLACEHOLDER
from cdc_platform.views.latest_state_sql import clean_view_sql, full_view_sql, latest_state_sql, masked_expression
from tests.cdc_platform.test_latest_state import Feed, c, ev, u

PEOPLE = "shop.people"
EMAILS = ["ann@example.com", "bob@example.com", "ann@example.com"]


def people(n: int = 3) -> list[str]:
    return [ev("c", pos=10 + i, table="people", after={"id": i, "Email": EMAILS[i], "phone": f"+31 6 {i:08d}", "city": "Utrecht"}) for i in range(n)]


def all_cells(rows: list[dict[str, Any]]) -> str:
    """The source columns' cells as text, to search for a masked value. The metadata columns (`_position`,
    `_ingested_at`, `_event_id`, ...) are left out: they hold no source value, and a wall-clock time such as
    `10:08:42.155000` holds "5500" by chance (CI saw the test below fail on it)."""
    return json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], default=str)


def test_clean_view_hashes_masked_columns_with_the_salt(make_config, query, monkeypatch) -> None:
    monkeypatch.setenv("PEOPLE_SALT", "pepper")
    cfg = make_config({PEOPLE: {"key": ["id"], "mask": ["email", "phone"], "mask_salt_env": "PEOPLE_SALT"}})
    Feed(cfg)(people())
    clean = query(cfg, "SELECT * FROM people__clean_view ORDER BY id")
    text = all_cells(clean)
    for secret in [*EMAILS, "+31 6"]:
        assert secret not in text
    salted = hashlib.sha256(b"pepper" + EMAILS[0].encode()).hexdigest()
    assert [r["Email"] for r in clean] == [salted, hashlib.sha256(b"pepper" + EMAILS[1].encode()).hexdigest(), salted]  # joins still work
    assert salted != hashlib.sha256(EMAILS[0].encode()).hexdigest()
    assert [r["city"] for r in clean] == ["Utrecht"] * 3
    # The registry records where the salt comes from, never the salt.
    registry = (cfg.lake / "_cdc_registry.json").read_text()
    assert "PEOPLE_SALT" in registry and "pepper" not in registry


def test_clean_view_without_the_salt_shows_removal(make_config, query, monkeypatch) -> None:
    monkeypatch.delenv("CDC_MASK_SALT", raising=False)
    cfg = make_config({PEOPLE: {"key": ["id"], "mask": ["email"]}})
    Feed(cfg)(people())
    clean = query(cfg, "SELECT id, Email FROM people__clean_view ORDER BY id")
    assert [r["Email"] for r in clean] == [None, None, None]


def test_clean_view_remove_mode_drops_the_columns(make_config, query, monkeypatch) -> None:
    monkeypatch.setenv("CDC_MASK_SALT", "pepper")
    cfg = make_config({PEOPLE: {"key": ["id"], "mask": ["email", "phone"], "mask_mode": "remove"}})
    Feed(cfg)(people())
    clean = query(cfg, "SELECT * FROM people__clean_view ORDER BY id")
    assert list(clean[0]) == ["id", "city", "_op", "_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id"]
    assert not any(secret in all_cells(clean) for secret in EMAILS)
    full = query(cfg, "SELECT Email FROM people__full_view ORDER BY id")
    assert [r["Email"] for r in full] == EMAILS  # the full view is the unmasked one


def test_cdc_sql_needs_only_the_lake(make_config, capsys, monkeypatch) -> None:
    monkeypatch.setenv("CDC_MASK_SALT", "pepper")
    cfg = make_config({PEOPLE: {"key": ["id"], "mask": ["email"]}})
    Feed(cfg)(people(2))
    assert main(["sql", "--lake", str(cfg.lake), "--format", "json", "SELECT id, Email, city FROM people__clean_view ORDER BY id"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in out] == [0, 1] and all(len(r["Email"]) == 64 for r in out)


def test_odd_identifiers_are_quoted_everywhere(make_config, query) -> None:
    from cdc_platform import lake
    from cdc_platform.stages.latest_state import compact

    cfg = make_config({"shop.odd": {"key": ["order$no"], "mask": ["select"]}})
    feed = Feed(cfg)
    odd = lambda op, pos, k, **cols: ev(op, pos=pos, table="odd", after={"order$no": k, **cols})  # noqa: E731
    weird = 'x") --`'
    feed([odd("c", 1, 1, **{"select": "x", "my col": 1, weird: 1}), odd("c", 2, 2, **{"select": "y", "my col": 2}),
          odd("c", 3, 3, **{"select": "w", "my col": 9})])
    feed([odd("u", 4, 1, **{"select": "z", "my col": 3}), ev("t", pos=5, table="odd"), odd("c", 6, 2, **{"select": "y", "my col": 2})])
    expected = [{"order$no": 1, "select": None, "my col": None}, {"order$no": 2, "select": "y", "my col": 2}]
    sql = "SELECT `order$no`, `select`, `my col` FROM odd ORDER BY `order$no`"
    assert query(cfg, sql)[:2] == expected  # 1 is below the truncate: a tombstone without values
    compact(lake.table_path(cfg.lake, "odd"), cfg.tables[0])  # delta-rs MERGE and UPDATE with the same names
    assert query(cfg, sql)[:2] == expected
    got = query(cfg, "SELECT `order$no`, `select`, `my col`, `x\") --``` FROM odd__full_view ORDER BY `order$no`")
    assert got == [{"order$no": 2, "select": "y", "my col": 2, weird: None}]
    assert [r["select"] for r in query(cfg, "SELECT * FROM odd__clean_view")] in ([None], [hashlib.sha256(b"pepper" + b"y").hexdigest()])


def test_view_sql_is_generated_from_one_place() -> None:
    sql = latest_state_sql("t__stored", ["id", "x"], ["id"])
    assert "row_number() OVER (PARTITION BY `id`" in sql and "JOIN" not in sql.split("`__truncate`")[0]  # one window, both layers
    assert full_view_sql("t", ["id", "x"]).endswith("FROM `t` WHERE NOT `_deleted`")
    assert masked_expression("e", False, "remove", b"s") is None
    assert masked_expression("e", False, "hash", None) == "CAST(NULL AS STRING) AS `e`"
    assert "unhex('73')" in (masked_expression("e", True, "hash", b"s") or "")
    assert "`E`" not in clean_view_sql("f", [("id", False), ("E", False)], ["e"], "remove", None)
    empty = latest_state_sql("t__stored", [], ["id"])
    assert "WHERE false" in empty
    compacted = latest_state_sql("t__stored", ["id", "x"], ["id"], pending=False, truncates=False)
    assert "JOIN" not in compacted and "`_layer` = 'base'" in compacted  # nothing to fold: a plain scan
    assert "CROSS JOIN" in latest_state_sql("t__stored", ["id", "x"], ["id"], pending=False)


def test_a_lookup_by_key_on_a_view_with_the_raw_logs_tail_reaches_the_stored_tables_files(make_config, query, spark) -> None:
    """The full view folds the stored rows with the raw log's not-yet-folded tail; a filter on the key must reach
    the stored table's scan (Delta skips the files that cannot hold the key), or a lookup folds every key of the
    table. A CTE read twice is kept by Spark and no filter passes into it, which the view once did."""
    from cdc_platform.views.catalog import register_catalog

    cfg = make_config({PEOPLE: {"key": ["id"]}})
    Feed(cfg)(people())
    for temp in [t.name for t in spark.catalog.listTables() if t.isTemporary]:  # Feed's session views would shadow the catalog's
        spark.catalog.dropTempView(temp)
    register_catalog(spark, cfg.lake, "lookup_probe")  # as `cdc serve` does: every view reads the tail
    lookup = spark.sql("SELECT * FROM lookup_probe.people__full_view WHERE id = 2")
    assert [r["id"] for r in lookup.collect()] == [2]
    plan = lookup._jdf.queryExecution().executedPlan().toString()
    assert "raw_change_events" in plan, "the view reads the raw log's tail"
    assert "EqualTo(id,2)" in plan, plan


@pytest.mark.parametrize("mode", ["hash", "remove"])
def test_masked_value_never_visible_after_updates_and_compaction(mode, make_config, query, monkeypatch) -> None:
    from cdc_platform import lake
    from cdc_platform.stages.latest_state import compact

    monkeypatch.setenv("CDC_MASK_SALT", "pepper")
    cfg = make_config({"shop.orders": {"key": ["id"], "mask": ["card"], "mask_mode": mode}})
    feed = Feed(cfg)
    feed([c(1, 1, card="4111-1111"), c(2, 2, card="5500-0000")])
    compact(lake.table_path(cfg.lake, "orders"), cfg.tables[0])
    feed([u(1, 3, card="4111-2222")])
    text = all_cells(query(cfg, "SELECT * FROM orders__clean_view"))
    assert "4111" not in text and "5500" not in text


DECIMAL = "org.apache.kafka.connect.data.Decimal"


def payments_schema(scale: int = 2, precision: int = 10) -> dict[str, Any]:
    """The Connect schema of a payments row: a Decimal, a VariableScaleDecimal, three time types, bytes, text."""
    return {"fields": [
        {"field": "id", "type": "int32", "optional": False},
        {"field": "amount", "type": "bytes", "name": DECIMAL, "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)},
         "optional": True},
        {"field": "rate", "type": "struct", "name": "io.debezium.data.VariableScaleDecimal", "optional": True,
         "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}]},
        {"field": "paid_at", "type": "int64", "name": "io.debezium.time.MicroTimestamp", "optional": True},
        {"field": "booked", "type": "string", "name": "io.debezium.time.ZonedTimestamp", "optional": True},
        {"field": "day", "type": "int32", "name": "io.debezium.time.Date", "optional": True},
        {"field": "receipt", "type": "bytes", "optional": True},
        {"field": "note", "type": "string", "optional": True},
    ]}


def unscaled(value: int) -> str:
    """A Connect Decimal's bytes as the JSON converter writes them: base64 of the two's complement."""
    return base64.b64encode(value.to_bytes(max(1, (value.bit_length() + 8) // 8), "big", signed=True)).decode()


def payment(op: str, pos: int, id_: int, cents: int, *, day: int = 20_000, receipt: str | None = None, scale: int = 2) -> str:
    row = {"id": id_, "amount": unscaled(cents), "rate": {"scale": 3, "value": unscaled(-125 * id_)},
           "paid_at": 1_767_225_600_123_456 + id_, "booked": f"2026-01-0{id_}T10:00:00.5+02:00", "day": day,
           "receipt": receipt if receipt is not None else base64.b64encode(bytes([id_, 0, 255])).decode(), "note": f"n{id_}"}
    schema = payments_schema(scale, 10 + scale - 2)
    if op == "d":
        return ev("d", pos=pos, table="payments", before={"id": id_}, schema=schema)
    return ev(op, pos=pos, table="payments", after=row, schema=schema)


def test_consistent_view_types_values_from_the_connect_schema_as_the_full_view_does(make_config, land, run_pipeline, query, spark) -> None:
    """Decimal bytes, VariableScaleDecimal, micro/zoned timestamps, dates and bytes: the consistent view
    shows what the full view shows, key for key and type for type (it once showed base64 text and integers)."""
    cfg = make_config({"shop.payments": {"key": ["id"]}})
    placeholder = base64.b64encode(PLACEHOLDER.encode()).decode()
    land("shop.payments/part-1.jsonl", [
        payment("c", 10, 1, 1250), payment("c", 11, 2, -99), payment("c", 12, 3, 0),
        payment("u", 13, 1, 1300, receipt=placeholder),  # a TOAST value left out: the receipt stays b"\x01\x00\xff"
        payment("u", 14, 2, 7777, day=2**31 - 1),  # a date past the year 9999: dead-lettered, so row 2 keeps -0.99
        payment("d", 15, 3, 0),
        payment("c", 16, 4, 123456, scale=4),  # the source widened the column: older events keep their own scale
    ])
    run_pipeline(cfg)
    consistent = query(cfg, "SELECT * FROM payments__consistent_view ORDER BY id")
    full = query(cfg, "SELECT * FROM payments__clean_view ORDER BY id")  # no masks: the full view's rows and columns
    assert consistent == full
    assert [(r["id"], r["amount"], r["rate"], r["receipt"], r["day"]) for r in consistent] == [
        (1, D("13.0000"), "-0.125", bytearray(b"\x01\x00\xff"), dt.date(2024, 10, 4)),
        (2, D("-0.9900"), "-0.250", bytearray(b"\x02\x00\xff"), dt.date(2024, 10, 4)),
        (4, D("12.3456"), "-0.500", bytearray(b"\x04\x00\xff"), dt.date(2024, 10, 4)),
    ]
    assert consistent[0]["booked"] == full[0]["booked"] and consistent[0]["paid_at"] == full[0]["paid_at"] is not None
    described = {v: [(r["col_name"], r["data_type"]) for r in query(cfg, f"DESCRIBE {v}")] for v in ("payments__consistent_view", "payments__full_view")}
    assert described["payments__consistent_view"] == described["payments__full_view"]
    assert dict(described["payments__full_view"])["amount"] == "decimal(12,4)"
    (dead,) = query(cfg, "SELECT stage, reason_code FROM dead_letter")
    assert dead == {"stage": "latest_state", "reason_code": "out_of_range"}


def test_consistent_view_applies_a_truncate_as_the_full_view_does(make_config, land, run_pipeline, query) -> None:
    """A TRUNCATE hides every row it came after, in the full view as in the consistent view (which once ignored it)."""
    cfg = make_config({"shop.payments": {"key": ["id"]}})
    land("shop.payments/part-1.jsonl", [payment("c", 10, 1, 100), payment("c", 11, 2, 200), ev("t", pos=12, table="payments"),
                                        payment("c", 13, 3, 300), payment("u", 14, 1, 150)])
    run_pipeline(cfg)
    consistent = query(cfg, "SELECT * FROM payments__consistent_view ORDER BY id")
    assert [(r["id"], r["amount"]) for r in consistent] == [(1, D("1.50")), (3, D("3.00"))]
    assert consistent == query(cfg, "SELECT * FROM payments__clean_view ORDER BY id")


def test_a_table_without_latest_state_is_typed_from_a_sample_as_the_latest_state_would(make_config, land, run_pipeline, query, spark) -> None:
    cfg = make_config({"shop.payments": {"key": ["id"]}})
    land("shop.payments/part-1.jsonl", [payment("c", 10, 1, 1250), payment("c", 11, 2, -99), payment("c", 12, 4, 5, scale=4)])
    run_pipeline(cfg)
    query(cfg, "SELECT 1")  # registers the lake
    stored = views.stored_types(spark.table("`payments__stored`").schema.fields)
    assert views.sampled_types(spark, "`raw_change_events`", cfg.tables[0]) == stored
    assert stored["amount"] == "decimal(12,4)" and stored["paid_at"] == "timestamp" and stored["receipt"] == "binary"
    # Without its latest-state table the consistent view is still typed so.
    spark.catalog.dropTempView("payments__stored")
    views.register_consistent_views(spark, cfg.lake)
    types = {f.name: f.dataType.simpleString() for f in spark.table("payments__consistent_view").schema.fields if not f.name.startswith("_")}
    assert types == stored


def test_one_table_reads_as_a_check_reads_it_without_the_rest_of_the_lake(make_config, spark) -> None:
    cfg = make_config({PEOPLE: {"key": ["id"]}, "shop.orders": {"key": ["id"]}})
    Feed(cfg)([*people(), ev("d", pos=20, table="people", before={"id": 1}), ev("c", pos=21, table="orders", after={"id": 7})])
    for name in ("people", "people__full_view", "orders", "orders__full_view"):
        spark.catalog.dropTempView(name)
    folded = views.table_frame(spark, cfg.lake, "people")
    assert sorted((r["id"], r["_deleted"]) for r in folded.select("id", "_deleted").collect()) == [(0, False), (1, True), (2, False)]
    assert not spark.catalog.tableExists("orders")  # only the checked table's views were registered
    raw = views.table_frame(spark, cfg.lake, "raw_change_events")
    assert raw.count() == 5
    assert views.live_rows(spark, cfg.lake, ["people", "orders"]) == {"people": 2, "orders": 1}


def test_a_statement_gets_the_views_of_the_tables_it_names_and_the_same_rows(make_config, spark) -> None:
    cfg = make_config({PEOPLE: {"key": ["id"]}, "shop.orders": {"key": ["id"]}})
    Feed(cfg)([*people(), ev("c", pos=21, table="orders", after={"id": 7})])
    sql = "SELECT id FROM People__Full_View ORDER BY id"
    for name in ("people__full_view", "orders__full_view", "orders__clean_view"):
        spark.catalog.dropTempView(name)
    names = views.register_lake(spark, cfg.lake, query=sql)
    assert {"people__full_view", "people__clean_view", "orders", "raw_change_events"} <= set(names)  # every table is pinned
    assert not {"orders__full_view", "orders__clean_view"} & set(names)
    assert not spark.catalog.tableExists("orders__full_view")
    narrow = [r["id"] for r in spark.sql(sql).collect()]
    everything = views.register_lake(spark, cfg.lake)
    assert "orders__full_view" in everything and [r["id"] for r in spark.sql(sql).collect()] == narrow == [0, 1, 2]
    # A statement that names no table, or lists the catalog, gets every view.
    assert views.named_tables(cfg.lake, "SELECT 1") is None
    assert views.named_tables(cfg.lake, "SHOW VIEWS LIKE 'people*'") is None
    assert views.named_tables(cfg.lake, "SELECT * FROM orders_history JOIN people USING (id)") == {"orders", "people"}


def test_a_views_sql_is_read_back_from_the_session(make_config, query, spark) -> None:
    cfg = make_config({PEOPLE: {"key": ["id"]}})
    Feed(cfg)(people())
    query(cfg, "SELECT 1")
    text = views.view_text(spark, "people__full_view")
    assert text is not None and text.lstrip().upper().startswith(("SELECT", "WITH")) and "`people`" in text
    assert views.view_text(spark, "raw_change_events") is None  # a table registered from a DataFrame has no SQL
    assert views.view_text(spark, "no_such_view") is None


def test_a_point_lookup_reads_only_its_key(make_config, query, spark) -> None:
    """The key filter of a lookup on a full view reaches the scan of both layers (and so Delta's file skipping
    on a big table, Parquet's row-group statistics on one listed from its checksum), below the fold: the
    lookup's cost does not grow with the table."""
    cfg = make_config({PEOPLE: {"key": ["id"]}})
    feed = Feed(cfg)
    feed(people())
    views.register_lake(spark, cfg.lake)
    plan = spark.sql("EXPLAIN SELECT * FROM people__full_view WHERE id = 1").collect()[0][0]
    scans = [line for line in plan.splitlines() if "FileScan parquet" in line]
    assert scans, plan
    folded = [s for s in scans if "IsNull(id)" not in s]  # the truncate check reads markers, whose key is null
    assert folded and all("EqualTo(id,1)" in s for s in folded), plan
    assert query(cfg, "SELECT id, city FROM people__full_view WHERE id = 1") == [{"id": 1, "city": "Utrecht"}]


def test_view_counts_count_a_full_and_its_clean_view_once(make_config, query, spark) -> None:
    cfg = make_config({PEOPLE: {"key": ["id"], "mask": ["email"]}})
    Feed(cfg)([*people(), ev("d", pos=20, table="people", before={"id": 1})])
    query(cfg, "SELECT 1")
    names = ["people__full_view", "people__clean_view", "people"]
    expected = {n: spark.table(f"`{n}`").count() for n in names}
    assert expected["people__full_view"] == 2 and expected["people"] == 3  # the folded table keeps the tombstone
    assert views.count_views(spark, names) == expected
    assert views.rows_of("people__clean_view") == "people__full_view" and views.rows_of("people") == "people"
    assert views.count_views(spark, []) == {}


def test_a_configured_table_without_events_has_a_consistent_view_of_metadata_columns(make_config, land, run_pipeline, query) -> None:
    """A configured table nothing has landed for yet (no latest-state columns, no raw-log sample) still gets its
    consistent view, with only the metadata columns; its SQL once began `SELECT ,` and every query of the lake failed."""
    cfg = make_config({"shop.payments": {"key": ["id"]}, "shop.refunds": {"key": ["id"]}})
    land("shop.payments/part-1.jsonl", [payment("c", 10, 1, 100)])
    run_pipeline(cfg)
    assert query(cfg, "SELECT * FROM refunds__consistent_view") == []
    assert [r["col_name"] for r in query(cfg, "DESCRIBE refunds__consistent_view")] == list(views.VIEW_META)
    assert [r["id"] for r in query(cfg, "SELECT id FROM payments__consistent_view")] == [1]
