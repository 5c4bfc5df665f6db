"""Latest state end to end: the faults real CDC streams have, judged through the SQL views.

Most tests feed parsed batches straight into the ingest job's batch commit (`IngestJob.process_parsed`,
what `foreachBatch` calls), which is fast and lets a test choose batch boundaries; the peer-data and
two-run tests go through `cdc run` itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.cli import main
from cdc_platform.config import PlatformConfig
from cdc_platform.parse.envelope import KeySpec, parse_line
from cdc_platform.run.ingest import IngestJob
from cdc_platform.stages.latest_state import LatestStateStage, compact
from cdc_platform.parse.parsed_batches import rows_to_batch
from cdc_platform.run.run_reports import BatchReport
from tests.cdc_platform.test_spark_jobs import tagged_jobs

T0 = 1_767_225_600_000
ORDERS = "shop.orders"


def ev(
    op: str,
    *,
    pos: int,
    after: dict[str, Any] | None = None,
    before: dict[str, Any] | None = None,
    table: str = "orders",
    order: int | None = None,
    snapshot: bool = False,
    schema: dict[str, Any] | None = None,
) -> str:
    """A Debezium MySQL change event at binlog position `pos` (its ts_ms deliberately says nothing useful)."""
    envelope = {
        "before": before,
        "after": after,
        "source": {"version": "2.7.0.Final", "connector": "mysql", "name": "shop", "db": "shop", "table": table,
                   "ts_ms": T0 + pos, "snapshot": "true" if snapshot else "false", "file": "mysql-bin.000001", "pos": pos, "row": 0},
        "op": op,
        "ts_ms": T0 + 1000 - pos,  # processing time runs backwards here: ordering must not use it
        "transaction": None if order is None else {"id": f"tx{pos}", "total_order": order, "data_collection_order": order},
    }
    if schema is not None:
        return json.dumps({"schema": {"type": "struct", "fields": [
            {"type": "struct", "fields": schema["fields"], "optional": True, "field": "before"},
            {"type": "struct", "fields": schema["fields"], "optional": True, "field": "after"},
        ]}, "payload": envelope})
    return json.dumps(envelope)


def c(id_: int, pos: int, **cols: Any) -> str:
    return ev("c", pos=pos, after={"id": id_, **cols})


def u(id_: int, pos: int, **cols: Any) -> str:
    return ev("u", pos=pos, after={"id": id_, **cols})


def d(id_: int, pos: int) -> str:
    return ev("d", pos=pos, before={"id": id_})


def truncate(pos: int) -> str:
    return ev("t", pos=pos)


class Feed:
    """Commits batches of lines the way the stream does, one `process_parsed` call per batch, then lets the
    latest-state query fold them.

    With `tail_check` (the default) each batch is also judged before the fold takes it: every full view, read
    while the batch is only in the raw log (the views' tail, `views.tail`), must equal the same view once the
    fold has taken it. So every scenario here holds the tail's SQL to the stage's rules. Tests whose batches
    the fold dead-letters or retypes (the tail shows those events until the fold sets them aside) turn it off.
    """

    def __init__(self, config: PlatformConfig, stage: LatestStateStage | None = None, query_id: str = "test-query",
                 tail_check: bool = True) -> None:
        self.config = config
        self.job = IngestJob(config, stages=[stage or LatestStateStage()])
        self.job.setup()
        self.query_id = query_id
        self.next_batch = 0
        self.tail_check = tail_check

    def __call__(self, lines: Sequence[str], batch_id: int | None = None) -> BatchReport:
        keys = KeySpec(dict(self.config.keys_by_source))
        parsed = pa.Table.from_batches([rows_to_batch([parse_line(line, "test.jsonl", keys) for line in lines])])
        if batch_id is None:
            batch_id = self.next_batch
        self.next_batch = max(self.next_batch, batch_id + 1)
        if not self.tail_check:
            return self.job.process_parsed(parsed, batch_id, self.query_id)
        report = self.job.process_parsed(parsed, batch_id, self.query_id, drain=False)
        before = full_views(self.config)
        for stage_report in self.job.drain_stages(parsed.sparkSession if hasattr(parsed, "sparkSession") else _spark()):
            for k, v in stage_report.rows_landed.items():
                report.rows_landed[k] = report.rows_landed.get(k, 0) + v
            report.dead_letters += stage_report.dead_letters
        after = full_views(self.config, {name: list(rows[0]) if rows else None for name, rows in before.items()})
        for name in before:
            assert before[name] == after[name], f"{name}__full_view before the fold (its raw-log tail) differs from after it"
        return report


def _spark() -> Any:
    from cdc_platform.spark.session import get_spark

    return get_spark()


def full_views(config: PlatformConfig, columns: dict[str, list[str] | None] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every configured table's full view (rows sorted; `_ingested_at` left out), each limited to `columns`' names."""
    from cdc_platform.views import register_lake

    spark = _spark()
    register_lake(spark, config.lake)
    out: dict[str, list[dict[str, Any]]] = {}
    for table in config.tables:
        names = set(spark.table(f"`{table.name}__full_view`").columns) - {"_ingested_at"}
        wanted = (columns or {}).get(table.name)
        if wanted is not None:
            names &= set(wanted)
        rows = [{k: v for k, v in r.asDict(recursive=True).items() if k in names} for r in spark.table(f"`{table.name}__full_view`").collect()]
        out[table.name] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
    return out


def state(query: Callable[..., list[dict[str, Any]]], cfg: PlatformConfig, table: str = "orders", cols: str = "*") -> list[dict[str, Any]]:
    return query(cfg, f"SELECT {cols} FROM {table}__full_view ORDER BY id")


# --- peer data ------------------------------------------------------------------------------------

PEER_STATE = [
    (101, "scooter", "Small 2-wheel scooter", 3.14),
    (102, "car battery", "12V car battery", 8.1),
    (103, "12-pack drill bits", "12-pack of drill bits with sizes ranging from #40 to #3", 0.8),
    (104, "hammer", "12oz carpenter's hammer", 0.75),
    (105, "hammer", "14oz carpenter's hammer", 0.875),
    (106, "hammer", "18oz carpenter hammer", 1.0),
    (107, "rocks", "box of assorted rocks", 5.1),
    (108, "jacket", "water resistent black wind breaker", 0.1),
    (109, "spare tire", "24 inch spare tire", 22.2),
    (110, "jacket", "new water resistent white wind breaker", 0.5),
]


@pytest.mark.parametrize("which", ["schema_exclude", "replica_identity"])
def test_peer_data_full_view_is_the_readme_state(which, make_config, land, run_pipeline, query, peer_files) -> None:
    cfg = make_config({"inventory.products": {"key": ["id"]}})
    land("flink/products.jsonl", peer_files[which])
    run_pipeline(cfg)
    got = query(cfg, "SELECT id, name, description, weight FROM products__full_view ORDER BY id")
    expected = list(PEER_STATE)
    if which == "replica_identity":  # the keyless delete cannot apply: 111 stays, as the README says
        expected.append((111, "scooter", "Big 2-wheel scooter ", 5.17))
    assert [tuple(r.values()) for r in got] == expected
    types = {r["col_name"]: r["data_type"] for r in query(cfg, "DESCRIBE products__full_view")}
    assert (types["id"], types["name"], types["weight"]) == ("bigint", "string", "double")
    tomb = query(cfg, "SELECT id, _op, _deleted, _position FROM products WHERE _deleted")
    if which == "schema_exclude":
        assert tomb == [{"id": 111, "_op": "d", "_deleted": True, "_position": "00000000000034133800"}]
    else:
        assert tomb == []
        dead = query(cfg, "SELECT reason_code, reason FROM dead_letter")
        assert [r["reason_code"] for r in dead] == ["delete_without_row"]
        assert "REPLICA IDENTITY FULL" in dead[0]["reason"]


# --- ordering, duplicates, replays ------------------------------------------------------------------

def test_out_of_order_changes_across_two_cdc_runs(make_config, land, run_pipeline, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    dup = c(3, 320, amount=3)
    land("run1.jsonl", [c(1, 100, amount=1), c(2, 110, amount=2), u(1, 300, amount=30), d(2, 310), dup])
    run_pipeline(cfg)
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 30), (3, 3)]

    land("run2.jsonl", [
        u(1, 200, amount=20),  # older than the stored change: ignored
        u(2, 150, amount=15),  # a stale update after the delete: must not resurrect 2
        dup,  # an exact duplicate
        c(4, 50, amount=4),  # a late insert of a key never seen: applies
        u(3, 330, amount=33),
    ])
    run_pipeline(cfg)
    assert [(r["id"], r["amount"], r["_position"][-15:-10]) for r in state(query, cfg)] == [(1, 30, "00300"), (3, 33, "00330"), (4, 4, "00050")]
    tomb = query(cfg, "SELECT id, _op, _position FROM orders WHERE _deleted")
    assert [(r["id"], r["_op"]) for r in tomb] == [(2, "d")]
    cols = [r["col_name"] for r in query(cfg, "DESCRIBE orders__full_view")]
    assert cols == ["id", "amount", "_op", "_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id"]


def test_replayed_batch_commits_nothing_and_duplicates_change_nothing(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    first = [c(1, 100, amount=1), u(1, 200, amount=2), c(2, 150, amount=5)]
    feed(first, batch_id=0)
    path = lake.table_path(cfg.lake, "orders")
    version = lake.open_table(path).version()
    report = feed(first, batch_id=0)  # the same batch again, as after a crash before the checkpoint
    assert lake.open_table(path).version() == version and "orders" not in report.rows_landed
    before = state(query, cfg)
    feed(first, batch_id=1)  # redelivered in a later batch: nothing changes, not even `_ingested_at`
    assert state(query, cfg) == before
    assert [(r["id"], r["amount"]) for r in before] == [(1, 2), (2, 5)]
    feed(first + [u(1, 200, amount=99)], batch_id=2)  # a distinct change at a stored position arrives later: it wins (issue 11)
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 99), (2, 5)]


def test_within_a_batch_the_last_change_per_key_wins_by_position_then_transaction_order(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    feed([
        ev("u", pos=500, after={"id": 1, "amount": 2}, order=2),
        ev("u", pos=500, after={"id": 1, "amount": 1}, order=1),  # same position, earlier in the transaction
        u(2, 700, amount=7), u(2, 600, amount=6),
    ])
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 2), (2, 7)]


def test_snapshot_rows_sharing_one_position_all_land(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    snap = [ev("r", pos=4, after={"id": i, "amount": i}, snapshot=True) for i in (1, 2, 3)]
    feed(snap[:2])
    feed([snap[2], u(2, 90, amount=20)])
    assert [(r["id"], r["amount"], r["_op"]) for r in state(query, cfg)] == [(1, 1, "r"), (2, 20, "u"), (3, 3, "r")]


def test_delete_keeps_a_tombstone_that_blocks_stale_updates_even_after_compaction(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    feed([c(1, 100, amount=1), c(2, 100, amount=2)])
    feed([d(1, 300)])
    compact(lake.table_path(cfg.lake, "orders"), cfg.tables[0])
    feed([u(1, 200, amount=10)])  # stale: older than the delete
    assert [r["id"] for r in state(query, cfg)] == [2]
    compact(lake.table_path(cfg.lake, "orders"), cfg.tables[0])
    assert [r["id"] for r in state(query, cfg)] == [2]
    feed([c(1, 400, amount=40)])  # a real re-insert after the delete
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 40), (2, 2)]


def test_truncate_tombstones_older_rows_and_later_events_apply(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    feed([c(1, 100, amount=1), c(2, 110, amount=2), u(1, 190, amount=19), truncate(200), c(3, 210, amount=3)])
    assert [r["id"] for r in state(query, cfg)] == [3]
    gone = query(cfg, "SELECT id, amount, _op, _position FROM orders WHERE _deleted ORDER BY id")
    assert [(r["id"], r["amount"], r["_op"], r["_position"][-15:-10]) for r in gone] == [(1, None, "t", "00200"), (2, None, "t", "00200")]
    feed([u(2, 150, amount=15), c(4, 220, amount=4)])  # a stale change below the truncate, a new row above it
    assert [r["id"] for r in state(query, cfg)] == [3, 4]
    path = lake.table_path(cfg.lake, "orders")
    compact(path, cfg.tables[0])
    feed([u(1, 180, amount=18)])
    assert [r["id"] for r in state(query, cfg)] == [3, 4]
    base = lake.open_table(path).to_pyarrow_table().to_pylist()
    assert sorted((r["id"], r["_op"], r["_deleted"]) for r in base if r["_layer"] == "base" and r["id"] is not None) == [
        (1, "t", True), (2, "t", True), (3, "c", False), (4, "c", False)]


def test_key_change_deletes_the_old_key(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    feed([c(1, 100, amount=5), c(7, 100, amount=7)])
    feed([ev("u", pos=200, before={"id": 1, "amount": 5}, after={"id": 2, "amount": 5})])
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(2, 5), (7, 7)]
    old = query(cfg, "SELECT id, _op, _deleted FROM orders WHERE id = 1")
    assert old == [{"id": 1, "_op": "u", "_deleted": True}]
    feed([u(1, 150, amount=6)])  # stale change to the old key
    assert [r["id"] for r in state(query, cfg)] == [2, 7]


def test_composite_keys(make_config, query) -> None:
    cfg = make_config({"shop.lines": {"key": ["order_id", "line"]}})
    feed = Feed(cfg)
    line = lambda op, pos, o, n, qty: ev(op, pos=pos, table="lines", after={"order_id": o, "line": n, "qty": qty})  # noqa: E731
    feed([line("c", 1, 1, 1, 1), line("c", 2, 1, 2, 1), line("c", 3, 2, 1, 1)])
    feed([line("u", 4, 1, 2, 5), ev("d", pos=5, table="lines", before={"order_id": 2, "line": 1})])
    got = query(cfg, "SELECT order_id, line, qty FROM lines__full_view ORDER BY order_id, line")
    assert [tuple(r.values()) for r in got] == [(1, 1, 1), (1, 2, 5)]


# --- schema evolution -------------------------------------------------------------------------------

def test_new_column_mid_stream_and_numeric_widening(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg, tail_check=False)  # the fold dead-letters or retypes what the tail shows until then
    feed([c(1, 100, amount=1), c(2, 110, amount=2)])
    feed([u(2, 200, amount=2.5, note="gift")])  # amount widens bigint -> double, note is new
    report = feed([c(3, 300, amount=3, note=None)])
    assert report.dead_letters == 0
    got = state(query, cfg, cols="id, amount, note")
    assert got == [{"id": 1, "amount": 1.0, "note": None}, {"id": 2, "amount": 2.5, "note": "gift"}, {"id": 3, "amount": 3.0, "note": None}]
    types = {r["col_name"]: r["data_type"] for r in query(cfg, "DESCRIBE orders__full_view")}
    assert (types["amount"], types["note"]) == ("double", "string")


def test_incompatible_type_change_is_dead_lettered_then_rebuilt_from_the_raw_log(make_config, query, tmp_path) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg, tail_check=False)  # the fold dead-letters or retypes what the tail shows until then
    feed([c(1, 100, code=7), c(2, 110, code=8)])
    report = feed([u(1, 200, code="A7")])
    assert report.dead_letters == 1
    dead = query(cfg, "SELECT reason_code, reason, stage, event_id FROM dead_letter")
    assert [(r["reason_code"], r["stage"]) for r in dead] == [("incompatible_type", "latest_state")]
    assert "`code`" in dead[0]["reason"] and "bigint" in dead[0]["reason"] and "string" in dead[0]["reason"]
    assert "cdc rebuild --table orders" in dead[0]["reason"]
    assert state(query, cfg, cols="id, code") == [{"id": 1, "code": 7}, {"id": 2, "code": 8}]  # not corrupted

    labelled = tagged_jobs(lake_spark.session(), "rebuild")
    assert main(["rebuild", "--config", str(tmp_path / "cdc.yaml"), "--table", "orders"]) == 0
    assert tagged_jobs(lake_spark.session(), "rebuild") - labelled, "its Spark jobs are named in the Spark UI"
    assert state(query, cfg, cols="id, code") == [{"id": 1, "code": "A7"}, {"id": 2, "code": "8"}]
    feed([u(2, 300, code="B8")])  # the stream carries on with the new type
    assert state(query, cfg, cols="id, code") == [{"id": 1, "code": "A7"}, {"id": 2, "code": "B8"}]


def test_an_event_the_rebuild_cannot_type_is_a_dead_letter_with_its_original_line(make_config, query, tmp_path) -> None:
    """The rebuild reads the raw log without its original lines (the widest column); the events it dead-letters
    get theirs back, so nothing of them is lost."""
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg, tail_check=False)  # the fold dead-letters or retypes what the tail shows until then
    old = c(1, 100, code="A7")
    feed([old])
    feed([c(2, 200, code=8)])  # the newest type of `code` is now an integer, which "A7" is not
    assert main(["rebuild", "--config", str(tmp_path / "cdc.yaml"), "--table", "orders"]) == 0
    dead = query(cfg, "SELECT stage, line, event_id FROM dead_letter WHERE stage = 'rebuild'")
    assert [(r["stage"], r["line"]) for r in dead] == [("rebuild", old)] and dead[0]["event_id"]
    assert state(query, cfg, cols="id, code") == [{"id": 2, "code": 8}]


def test_schema_wrapper_gives_exact_types(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    fields = [
        {"type": "int32", "optional": False, "field": "id"},
        {"type": "int16", "optional": True, "field": "qty"},
        {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
         "parameters": {"scale": "2", "connect.decimal.precision": "10"}, "field": "price"},
        {"type": "int32", "optional": True, "name": "io.debezium.time.Date", "field": "day"},
        {"type": "int64", "optional": True, "name": "io.debezium.time.Timestamp", "field": "at"},
        {"type": "string", "optional": True, "name": "io.debezium.time.ZonedTimestamp", "field": "zoned"},
        {"type": "string", "optional": True, "name": "io.debezium.data.Json", "field": "doc"},
        {"type": "float32", "optional": True, "field": "ratio"},
        {"type": "string", "optional": True, "field": "empty"},
    ]
    price = "MDk="  # base64 of 0x3039 = 12345 -> 123.45
    feed = Feed(cfg)
    feed([ev("c", pos=1, schema={"fields": fields}, after={
        "id": 1, "qty": 3, "price": price, "day": 20_454, "at": 1_767_225_600_123, "zoned": "2026-01-01T01:00:00+01:00",
        "doc": '{"a": 1}', "ratio": 0.5, "empty": None})])
    types = {r["col_name"]: r["data_type"] for r in query(cfg, "DESCRIBE orders__full_view")}
    assert [types[k] for k in ("id", "qty", "price", "day", "at", "zoned", "doc", "ratio", "empty")] == [
        "int", "smallint", "decimal(10,2)", "date", "timestamp", "timestamp", "string", "float", "string"]
    (row,) = query(cfg, "SELECT CAST(price AS STRING) AS price, CAST(day AS STRING) AS day, CAST(at AS STRING) AS at, "
                        "CAST(zoned AS STRING) AS zoned, doc FROM orders__full_view")
    assert row == {"price": "123.45", "day": "2026-01-01", "at": "2026-01-01 00:00:00.123", "zoned": "2026-01-01 00:00:00", "doc": '{"a": 1}'}


def test_reserved_column_name_is_dead_lettered(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    report = Feed(cfg, tail_check=False)([c(1, 100, _op="x"), c(2, 100, amount=1)])
    assert report.dead_letters == 1
    assert [r["id"] for r in state(query, cfg)] == [2]


# --- history ---------------------------------------------------------------------------------------

def test_scd2_history_over_a_sequence_of_changes(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"], "history": True}})
    feed = Feed(cfg)
    feed([c(1, 100, amount=1), u(1, 300, amount=3)])
    feed([u(1, 200, amount=2), d(1, 400), c(1, 500, amount=5), c(2, 600, amount=6), u(1, 300, amount=3)])  # late, delete, re-insert, duplicate
    feed([truncate(700), c(2, 800, amount=8)])
    got = query(cfg, "SELECT id, amount, _valid_from_position AS f, _valid_to_position AS t, _is_current AS cur, "
                     "_valid_from_ts, _valid_to_ts FROM orders_history ORDER BY id, f")
    pos = lambda p: None if p is None else int(p[10:30])  # noqa: E731  binlog pos part of the position
    assert [(r["id"], r["amount"], pos(r["f"]), pos(r["t"]), r["cur"]) for r in got] == [
        (1, 1, 100, 200, False), (1, 2, 200, 300, False), (1, 3, 300, 400, False), (1, 5, 500, 700, False),
        (2, 6, 600, 700, False), (2, 8, 800, None, True),
    ]
    first = got[0]
    assert (first["_valid_to_ts"] - first["_valid_from_ts"]).total_seconds() == pytest.approx(0.1)
    current = query(cfg, "SELECT id, amount FROM orders_history WHERE _is_current ORDER BY id")
    assert current == [{"id": 2, "amount": 8}] == state(query, cfg, cols="id, amount")


def test_rebuild_needs_a_configured_table(make_config, tmp_path, capsys) -> None:
    make_config({ORDERS: {"key": ["id"]}})
    assert main(["rebuild", "--config", str(tmp_path / "cdc.yaml"), "--table", "nope"]) == 2
    assert "no configured table is named 'nope'" in capsys.readouterr().err


# --- exact decimals (issue 13) ------------------------------------------------------------------------

def _decimal_field(name: str, precision: int, scale: int) -> dict[str, Any]:
    return {"type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal", "version": 1,
            "parameters": {"scale": str(scale), "connect.decimal.precision": str(precision)}, "field": name}


def _base64_unscaled(value: str, scale: int) -> str:
    import base64
    import decimal

    unscaled = int(decimal.Decimal(value).scaleb(scale, decimal.Context(prec=100)))
    return base64.b64encode(unscaled.to_bytes((unscaled.bit_length() + 8) // 8, "big", signed=True)).decode()


#: MySQL's full-type fixtures: DECIMAL(40,3), DECIMAL(38,10) and DECIMAL(20,3) values that once
#: failed the whole lake (beyond 28 digits) or lost digits through a binary float.
WIDE = "123456789876543212345678987654321.110"
NARROW_38 = "1234567890123456789012345678.1234567891"
NARROW = "12345678901234567.891"


@pytest.mark.parametrize("form", ["numeric", "base64"])
def test_decimals_land_exactly_as_json_numbers_and_as_base64(form: str, make_config, query) -> None:
    import decimal

    cfg = make_config({ORDERS: {"key": ["id"]}})
    fields = [{"type": "int64", "optional": False, "field": "id"}, _decimal_field("wide", 40, 3),
              _decimal_field("narrow38", 38, 10), _decimal_field("narrow", 20, 3)]
    values = {"wide": (WIDE, 3), "narrow38": (NARROW_38, 10), "narrow": (NARROW, 3)}
    line = ev("c", pos=10, after={"id": 1, **{k: f"@{k}@" for k in values}}, schema={"fields": fields})
    for k, (text, scale) in values.items():  # JSON numbers keep their digits only as raw text
        line = line.replace(f'"@{k}@"', text if form == "numeric" else json.dumps(_base64_unscaled(text, scale)))
    report = Feed(cfg)([line])
    assert report.dead_letters == 0
    (row,) = state(query, cfg)
    assert row["wide"] == WIDE  # 40 digits: Spark and Delta stop at 38, so exact text
    assert row["narrow38"] == decimal.Decimal(NARROW_38) and row["narrow"] == decimal.Decimal(NARROW)
    types = {r["col_name"]: r["data_type"] for r in query(cfg, "DESCRIBE orders__full_view")}
    assert types["wide"] == "string" and types["narrow38"] == "decimal(38,10)" and types["narrow"] == "decimal(20,3)"
    raw = query(cfg, "SELECT after FROM raw_change_events")
    if form == "numeric":
        assert WIDE in raw[0]["after"] and NARROW in raw[0]["after"]  # the raw log keeps every digit too


def test_a_decimal_with_more_fractional_digits_than_its_scale_is_a_dead_letter_not_a_rounding(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    fields = [{"type": "int64", "optional": False, "field": "id"}, _decimal_field("amount", 10, 2)]
    lines = [ev("c", pos=10, after={"id": 1, "amount": "@"}, schema={"fields": fields}).replace('"@"', "1.005"),
             ev("c", pos=11, after={"id": 2, "amount": "@"}, schema={"fields": fields}).replace('"@"', "12345678901.5"),
             ev("c", pos=12, after={"id": 3, "amount": "@"}, schema={"fields": fields}).replace('"@"', "2.50")]
    Feed(cfg, tail_check=False)(lines)  # dead-lettered by the fold: the tail shows it until then
    dead = query(cfg, "SELECT reason_code, reason FROM dead_letter ORDER BY reason")
    assert [r["reason_code"] for r in dead] == ["out_of_range", "out_of_range"]
    assert "more than 2 digits after the point" in dead[0]["reason"] and "more than 10 digits" in dead[1]["reason"]
    assert [(r["id"], str(r["amount"])) for r in state(query, cfg)] == [(3, "2.50")]
