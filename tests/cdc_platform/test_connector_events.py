"""Issue 11: what real connectors emit beyond row changes, and ties at one source position.

Crafted lines in the shapes Debezium 3.5 was seen to emit on the test bed (see control_records.py and
unavailable.py). The real connectors emit them through Kafka in tests/testbed/test_connector_extras.py;
the cases here are the ones a live connector cannot be made to produce on demand (every placeholder shape,
ties, a placeholder after a delete).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from cdc_platform.parse import control_records
from cdc_platform import lake
from cdc_platform.parse.envelope import KeySpec, parse_line
from cdc_platform.stages.latest_state import compact
from cdc_platform.parse.parsed_batches import rows_to_batch
from cdc_platform.stages.unavailable import PLACEHOLDER, DEFAULT, placeholder_forms
from tests.cdc_platform.test_latest_state import ORDERS, Feed, c, ev, state, u

PH = PLACEHOLDER
PH_B64 = base64.b64encode(PH.encode()).decode()
PH_INTS = list(PH.encode())
KEYS = KeySpec({ORDERS: ["id"]})


def parsed(line: str) -> dict[str, Any]:
    return parse_line(line, "t.jsonl", KEYS)


# --- control records ---------------------------------------------------------------------------------

def test_heartbeats_plain_and_wrapped_are_control_records_not_dead_letters() -> None:
    plain = parsed('{"ts_ms": 1795458812614}')
    wrapped = parsed(json.dumps({"schema": {"type": "struct", "name": "io.debezium.connector.common.Heartbeat",
                                            "fields": [{"type": "int64", "field": "ts_ms"}]}, "payload": {"ts_ms": 1}}))
    assert (plain["kind"], plain["reason_code"]) == ("control", "heartbeat") == (wrapped["kind"], wrapped["reason_code"])
    assert parsed("{}")["reason_code"] == "unrecognised_shape"  # an empty object is still nothing known
    # its time (how far an idle source was read, for the freshness checks), in the raw log's microseconds
    assert (plain["source_ts"], wrapped["source_ts"]) == (1795458812614000, 1000)


@pytest.mark.parametrize("ts", ['"1795458812614"', "1.5", "253402300800000", "null", "true"])
def test_a_heartbeat_with_an_unusable_time_is_still_a_heartbeat_without_one(ts: str) -> None:
    """A heartbeat carries no data: a bad `ts_ms` is no dead letter, only no time."""
    row = parsed(f'{{"ts_ms": {ts}}}')
    assert (row["kind"], row["reason_code"], row["source_ts"]) == ("control", "heartbeat", None)


def test_schema_change_records_are_control_records() -> None:
    ddl = {"source": {"server": "mdb"}, "position": {"file": "mysql-bin.000001", "pos": 4}, "ts_ms": 1, "databaseName": "cdc",
           "ddl": "ALTER TABLE t ADD COLUMN c INT", "tableChanges": []}
    row = parsed(json.dumps(ddl))
    assert (row["kind"], row["reason_code"], row["source_ts"]) == ("control", "schema_change", None)
    assert rows_to_batch([row, parsed(c(1, 10, amount=1))]).num_rows == 2  # the row shape rows_to_batch accepts


def _message(transactional: bool) -> str:
    src = {"version": "3.5.0.Final", "connector": "postgresql", "name": "pg", "ts_ms": 1795458813019, "snapshot": "false",
           "db": "cdc", "schema": "", "table": "", "txId": 738 if transactional else None, "lsn": 26638536}
    return json.dumps({"op": "m", "ts_ms": 1795458813572, "source": src,
                       "transaction": {"id": "738:26638536", "total_order": 1, "data_collection_order": 1} if transactional else None,
                       "message": {"prefix": "myprefix", "content": "aGVsbG8="}})


def test_logical_decoding_messages_go_to_the_raw_log_under_their_own_table_id() -> None:
    row = parsed(_message(True))
    assert (row["kind"], row["op"], row["table_id"], row["key"]) == ("change", "m", control_records.MESSAGES, None)
    assert row["position_kind"] == "pg_lsn" and row["transaction_id"] == "738"
    assert parsed(ev("m", pos=5, after={"id": 1}))["reason_code"] == "unknown_op"  # op m without a message block


def test_end_marker_names_the_message_collection_as_messages() -> None:
    end = {"status": "END", "id": "739:26638888", "event_count": 3, "ts_ms": 1, "data_collections": [
        {"data_collection": "io.debezium.connector.postgresql.LogicalDecodingMessageMonitor$LogicalDecodingMessageId@448c851", "event_count": 1},
        {"data_collection": "io.debezium.connector.postgresql.LogicalDecodingMessageMonitor$LogicalDecodingMessageId@1f", "event_count": 1},
        {"data_collection": "public.tf", "event_count": 1}]}
    row = parsed(json.dumps(end))
    assert row["kind"] == "marker" and dict(row["data_collections"]) == {control_records.MESSAGES: 2, "public.tf": 1}


def test_control_records_and_messages_through_a_batch(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    Feed(cfg)(['{"ts_ms": 1}', '{"ts_ms": 2}', _message(False), c(1, 10, amount=1),
               json.dumps({"source": {}, "ts_ms": 1, "ddl": "CREATE TABLE x (i INT)", "tableChanges": []})])
    assert query(cfg, "SELECT * FROM dead_letter") == []
    assert sorted(r["op"] for r in query(cfg, "SELECT op FROM raw_change_events")) == ["c", "m"]
    figures = query(cfg, "SELECT stage_figures FROM pipeline_metrics")[0]["stage_figures"]
    assert (figures["ingest.heartbeats"], figures["ingest.schema_changes"]) == (2.0, 1.0)
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 1)]


def test_heartbeat_only_batches_fold_their_metrics_rows_into_the_next(make_config, query) -> None:
    """An idle source with Debezium heartbeats runs a batch every trigger; each would cost a metrics commit."""
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    feed.job.idle_metrics_interval = 3600.0
    feed(['{"ts_ms": 1}'])  # 0: idle, but no row written yet: written
    feed([c(1, 10, amount=1)])  # 1: data: written
    feed(['{"ts_ms": 2}'])  # 2: idle within the interval: folded
    feed(['{"ts_ms": 3}', '{"ts_ms": 4}'])  # 3: folded
    feed([c(2, 11, amount=2), '{"ts_ms": 5}'])  # 4: data: written, carrying 2 and 3
    feed.job.idle_metrics_interval = 0.0
    feed(['{"ts_ms": 6}'])  # 5: idle, the interval passed: written
    feed.job.idle_metrics_interval = 3600.0
    feed(['{"ts_ms": 7}'])  # 6: folded
    feed(['{"ts_ms": 8}', '{"ts_ms": 9}'])  # 7: folded, then written by the flush at the end of a run, carrying 6
    feed.job.flush_folded_metrics()
    feed.job.flush_folded_metrics()  # nothing left to write
    rows = query(cfg, "SELECT batch_id, rows_read, stage_figures FROM pipeline_metrics ORDER BY batch_id")
    assert [r["batch_id"] for r in rows] == [0, 1, 4, 5, 7]
    assert [{k: v for k, v in r["stage_figures"].items() if k.startswith("ingest.")} for r in rows] == [
        {"ingest.heartbeats": 1.0}, {}, {"ingest.heartbeats": 4.0, "ingest.idle_batches_folded": 2.0}, {"ingest.heartbeats": 1.0},
        {"ingest.heartbeats": 3.0, "ingest.idle_batches_folded": 1.0}]
    assert [r["rows_read"] for r in rows] == [1, 1, 2 + 3, 1, 2 + 1]  # a row's own lines and those of the batches folded into it
    # each row keeps the newest heartbeat time of its own batch and of those folded into it (ts_ms above)
    beats = query(cfg, "SELECT unix_millis(newest_heartbeat_ts) AS ms FROM pipeline_metrics ORDER BY batch_id")
    assert [r["ms"] for r in beats] == [1, None, 5, 6, 9]
    assert query(cfg, "SELECT * FROM dead_letter") == []
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 1), (2, 2)]


# --- the unavailable-value placeholder -----------------------------------------------------------------

def test_every_placeholder_shape_is_recognised_and_ordinary_values_are_not() -> None:
    scalars, _ = placeholder_forms()
    uuid_form = next(s for s in scalars if len(s) == 36 and s.count("-") == 4)
    for value in (PH, PH_B64, [PH], [PH_B64], PH_INTS, {PH: PH}, json.dumps({PH: PH}, separators=(",", ":")), uuid_form):
        assert DEFAULT.matches(value), value
    for value in ("x", [], [1, 2], PH_INTS[:3], {"a": PH}, 95, None, [PH, PH]):
        assert not DEFAULT.matches(value), value


FIELDS = [{"type": "int32", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "small"},
          {"type": "string", "optional": True, "field": "big"}, {"type": "bytes", "optional": True, "field": "bin"},
          {"type": "array", "items": {"type": "int32"}, "optional": True, "field": "iarr"},
          {"type": "string", "optional": True, "name": "io.debezium.data.Json", "field": "doc"}]
BIG = "v" * 3000
BIN = base64.b64encode(bytes(range(256))).decode()


def row(id_: int, pos: int, op: str = "c", before: dict[str, Any] | None = None, **cols: Any) -> str:
    return ev(op, pos=pos, after={"id": id_, **cols}, before=before, schema={"fields": FIELDS})


def toasted(id_: int, pos: int, small: str, before: dict[str, Any] | None = None) -> str:
    return row(id_, pos, "u", before, small=small, big=PH, bin=PH_B64, iarr=PH_INTS, doc=PH)


def lake_row(query, cfg) -> list[tuple[Any, ...]]:  # noqa: ANN001
    return [(r["id"], r["small"], r["big"], bytes(r["bin"]) if r["bin"] is not None else None, r["iarr"], r["doc"])
            for r in query(cfg, "SELECT * FROM orders__full_view ORDER BY id")]


def full(id_: int, small: str) -> tuple[Any, ...]:
    return (id_, small, BIG, bytes(range(256)), "[1,2,3]", '{"k": 1}')


def test_placeholders_keep_the_previous_value_within_a_batch_across_batches_and_through_compaction(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    first = feed([row(1, 10, small="a", big=BIG, bin=BIN, iarr=[1, 2, 3], doc='{"k": 1}'), toasted(1, 20, "b"),
                  row(2, 11, small="a", big=BIG, bin=BIN, iarr=[1, 2, 3], doc='{"k": 1}')])
    assert lake_row(query, cfg) == [full(1, "b"), full(2, "a")]  # within a batch
    assert first.stage_seconds is not None
    feed([toasted(1, 30, "c"), toasted(2, 31, "c"), toasted(2, 32, "d")])  # across batches: from the stored delta layer
    assert lake_row(query, cfg) == [full(1, "c"), full(2, "d")]
    compact(lake.table_path(cfg.lake, "orders"), cfg.table("orders"))
    assert lake_row(query, cfg) == [full(1, "c"), full(2, "d")]
    feed([toasted(1, 40, "e")])  # after compaction: from the base layer
    assert lake_row(query, cfg) == [full(1, "e"), full(2, "d")]
    stored = query(cfg, "SELECT big, doc FROM orders")
    assert all(PH not in (r["big"] or "") and PH not in (r["doc"] or "") for r in stored)
    sql = "SELECT stage_figures FROM stage_progress WHERE query = 'latest_state' ORDER BY batch_id"
    figures = [r["stage_figures"] for r in query(cfg, sql)]
    assert [f.get("latest_state.unavailable_filled") for f in figures] == [4.0, 12.0, 4.0]


def test_a_placeholder_takes_the_before_image_then_null_when_nothing_is_known(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    # REPLICA IDENTITY FULL: the before image carries the real values, even for a row the lake never saw.
    feed([toasted(1, 10, "b", before={"id": 1, "small": "a", "big": BIG, "bin": BIN, "iarr": [1, 2, 3], "doc": '{"k": 1}'})])
    assert lake_row(query, cfg) == [full(1, "b")]
    feed([toasted(2, 20, "b")])  # no before image, never seen: NULL, counted, never the placeholder
    assert lake_row(query, cfg)[1] == (2, "b", None, None, None, None)
    figures = query(cfg, "SELECT stage_figures FROM stage_progress WHERE query = 'latest_state' AND batch_id = 1")[0]["stage_figures"]
    assert figures["latest_state.unavailable_unresolved"] == 4.0


def test_a_deleted_row_gives_no_previous_value(make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    feed([row(1, 10, small="a", big=BIG, bin=BIN, iarr=[1, 2, 3], doc='{"k": 1}')])
    feed([ev("d", pos=20, before={"id": 1}), toasted(1, 30, "z")])  # cannot happen at a real source; stays NULL
    assert lake_row(query, cfg) == [(1, "z", None, None, None, None)]


# --- ties at one source position -----------------------------------------------------------------------

def tie(id_: int, amount: int) -> str:
    """A change whose connector gives every event the same position (as a constant-position tool does)."""
    return u(id_, 500, amount=amount)


@pytest.mark.parametrize("compact_between", [False, True])
def test_ties_the_later_arrival_wins_within_and_across_batches_and_a_redelivery_changes_nothing(compact_between: bool, make_config, query) -> None:
    cfg = make_config({ORDERS: {"key": ["id"]}})
    feed = Feed(cfg)
    path = lake.table_path(cfg.lake, "orders")

    def maybe_compact() -> None:
        if compact_between:
            compact(path, cfg.table("orders"))

    feed([tie(1, 1), tie(1, 2), tie(2, 1)])  # within a batch: the later line wins
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 2), (2, 1)]
    maybe_compact()
    feed([tie(2, 7)])  # across the batch boundary: the later batch wins
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 2), (2, 7)]
    maybe_compact()
    before = state(query, cfg)
    feed([tie(2, 7), tie(1, 2)])  # identical redeliveries of the current winners: nothing changes
    assert state(query, cfg) == before
    feed([tie(2, 1), tie(2, 7)])  # a replay of the log in order (Connect restart): the same winner
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 2), (2, 7)]
    maybe_compact()
    compact(path, cfg.table("orders"))
    assert [(r["id"], r["amount"]) for r in state(query, cfg)] == [(1, 2), (2, 7)]


def test_the_consistent_view_never_shows_the_placeholder(make_config, land, run_pipeline, query) -> None:  # noqa: ANN001
    """The consistent view reads the raw log, which keeps events as sent: it resolves the placeholder itself,
    by the latest-state rules (the before image, else the key's earlier visible value, else NULL)."""
    cfg = make_config({ORDERS: {"key": ["id"]}})
    whole = {"big": BIG, "bin": BIN, "iarr": [1, 2, 3], "doc": '{"k": 1}'}
    land(None, [row(1, 10, small="a", **whole), toasted(1, 20, "b"), row(2, 11, small="a", **whole), row(3, 12, small="a", **whole)])
    run_pipeline(cfg)
    land(None, [toasted(2, 30, "c"),  # across runs: from the earlier visible event
                row(3, 31, "d", before={"id": 3}), row(3, 32, small="new", big="fresh", bin=None, iarr=None, doc=None), toasted(3, 33, "z"),
                toasted(4, 34, "b", before={"id": 4, "small": "a", **whole}),  # REPLICA IDENTITY FULL, never seen before
                toasted(5, 35, "b")])  # known nowhere
    run_pipeline(cfg)

    got = query(cfg, "SELECT id, small, big, bin, iarr, doc FROM orders__consistent_view ORDER BY id")
    text = json.dumps(got, default=lambda b: base64.b64encode(bytes(b)).decode())  # `bin` is binary, as the full view has it
    assert PH not in text and PH_B64 not in text
    expected = {"big": BIG, "bin": bytearray(base64.b64decode(BIN)), "doc": '{"k": 1}'}
    assert [{k: r[k] for k in ("id", "small", "big", "bin", "doc")} for r in got] == [
        {"id": 1, "small": "b", **expected}, {"id": 2, "small": "c", **expected},
        {"id": 3, "small": "z", "big": "fresh", "bin": None, "doc": None},  # the delete forgot the values before it
        {"id": 4, "small": "b", **expected}, {"id": 5, "small": "b", "big": None, "bin": None, "doc": None},
    ]
    assert [json.loads(r["iarr"]) if r["iarr"] else None for r in got] == [[1, 2, 3], [1, 2, 3], None, [1, 2, 3], None]
    full = query(cfg, "SELECT id, small, big, bin, iarr, doc FROM orders__full_view ORDER BY id")
    assert full == got, "the same values as the full view"
