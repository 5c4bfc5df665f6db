"""Transaction aggregation as a pure function: parsed lines in, Arrow tables out, no Spark.

Each test feeds Debezium-shaped lines through the real parser (`envelope.parse_line`) and the ingest
split, then through `transactions.aggregate` one micro-batch at a time, carrying the state along as
the stage does. Time is in seconds after START; the timeout is 60 s and the retention 300 s (the defaults).
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform.stages import transactions as T
from cdc_platform.parse.envelope import KeySpec, parse_line
from cdc_platform.parse.parsed_batches import rows_to_batch, split_parsed

START_MS = 1_767_225_600_000
KEYS = KeySpec({"shop.charges": ["id"], "shop.audits": ["id"], "public.accounts": ["id"]})
SETTINGS = T.Settings(timeout_us=60_000_000, retention_us=300_000_000)  # the defaults
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
COUNTS = {"shop.charges": 1, "shop.audits": 1}


def ev(tx: str | None, table: str, pos: int, t: float, *, row: int = 1, op: str = "c", order: int = 1, ts_ms: int | None = None) -> str:
    """A Debezium MySQL change event at binlog `pos`, committed `t` seconds after START."""
    image = {"id": row, "pos": pos}
    return json.dumps({
        "before": image if op in ("u", "d") else None,
        "after": None if op == "d" else image,
        "source": {"connector": "mysql", "name": "shop", "db": "shop", "table": table, "ts_ms": START_MS + int(t * 1000),
                   "file": "mysql-bin.000001", "pos": pos, "row": 0},
        "op": op,
        "ts_ms": ts_ms if ts_ms is not None else START_MS + int(t * 1000) + 7,
        "transaction": None if tx is None else {"id": tx, "total_order": order, "data_collection_order": 1},
    })


def begin(tx: str, t: float) -> str:
    return json.dumps({"status": "BEGIN", "id": tx, "ts_ms": START_MS + int(t * 1000), "event_count": None, "data_collections": None})


def end(tx: str, t: float, counts: dict[str, int]) -> str:
    return json.dumps({
        "status": "END", "id": tx, "ts_ms": START_MS + int(t * 1000), "event_count": sum(counts.values()),
        "data_collections": [{"data_collection": k, "event_count": v} for k, v in counts.items()],
    })


def whole(tx: str, pos: int, t: float, *, row: int = 1) -> list[str]:
    """A complete two-table transaction: charges then audits."""
    return [begin(tx, t), ev(tx, "charges", pos, t, row=row, order=1), ev(tx, "audits", pos + 1, t, row=row, order=2), end(tx, t, COUNTS)]


class Feed:
    """Runs micro-batches through `aggregate`, carrying the state and collecting every output."""

    def __init__(self, settings: T.Settings = SETTINGS) -> None:
        self.settings = settings
        self.state = T.empty_state()
        self.batch_id = 0
        self.completed: list[dict[str, Any]] = []
        self.incomplete: list[dict[str, Any]] = []
        self.late: list[dict[str, Any]] = []
        self.figures: list[dict[str, float]] = []
        self.watermark: list[dict[str, Any]] = []

    def batch(self, lines: list[str], idle_seconds: float = 0) -> T.Step:
        rows = [parse_line(line, "f.jsonl", KEYS) for line in lines]
        assert all(r["kind"] in ("change", "marker") for r in rows), [r.get("reason") for r in rows]
        parsed = split_parsed(pa.Table.from_batches([rows_to_batch(rows)]), self.batch_id)
        step = T.aggregate(
            self.state, parsed.events, parsed.markers, self.settings,
            batch_id=self.batch_id, now=NOW, idle_us=int(idle_seconds * 1_000_000),
        )
        self.state = step.state
        self.batch_id += 1
        self.completed += step.completed.to_pylist()
        self.incomplete += step.incomplete.to_pylist()
        self.late += step.late.to_pylist()
        self.figures.append(step.figures)
        self.watermark = step.watermark.to_pylist()
        return step

    def idle(self, seconds: float) -> T.Step:
        step = T.aggregate(self.state, pa.table({}), pa.table({}), self.settings, batch_id=None, now=NOW, idle_us=int(seconds * 1_000_000))
        self.state = step.state
        self.incomplete += step.incomplete.to_pylist()
        self.watermark = step.watermark.to_pylist()
        return step

    def open_ids(self) -> list[str]:
        return sorted(r["transaction_id"] for r in self.state.to_pylist() if r["entry"] == T.OPEN)


def table_ops(tx: dict[str, Any]) -> list[tuple[int, str, str]]:
    return [(e["tx_total_order"], e["table_id"], e["op"]) for e in tx["events"]]


def test_transaction_across_batches_out_of_order_completes_once_in_order() -> None:
    feed = Feed()
    feed.batch([end("g:1", 1, {"shop.charges": 2, "shop.audits": 1}), ev("g:1", "audits", 103, 1, order=3)])
    feed.batch([ev("g:1", "charges", 102, 1, row=2, order=2, op="u")])
    assert feed.completed == [] and feed.open_ids() == ["g:1"]
    feed.batch([ev("g:1", "charges", 101, 1, order=1), begin("g:1", 1)])
    (tx,) = feed.completed
    assert tx["transaction_id"] == "g:1" and tx["event_count"] == 3 and tx["source"] == "shop"
    assert dict(tx["events_per_table"]) == {"shop.charges": 2, "shop.audits": 1}
    assert table_ops(tx) == [(1, "shop.charges", "c"), (2, "shop.charges", "u"), (3, "shop.audits", "c")]
    assert [json.loads(e["after"])["pos"] for e in tx["events"]] == [101, 102, 103]
    assert tx["begin_ts"] == tx["end_ts"] == NOW + dt.timedelta(seconds=1)
    assert tx["marker_shape"] == "debezium" and tx["completed_batch"] == 2
    assert feed.open_ids() == [] and feed.incomplete == [] and feed.late == []


def test_duplicates_count_once_within_and_across_batches() -> None:
    feed = Feed()
    charge = ev("g:1", "charges", 101, 1)
    restart_copy = ev("g:1", "charges", 101, 1, ts_ms=START_MS + 99_999)  # connector restart: new envelope ts_ms
    feed.batch([begin("g:1", 1), charge, restart_copy])
    feed.batch([charge, ev("g:1", "audits", 102, 1, order=2), ev("g:1", "audits", 102, 1, order=2)])
    assert feed.completed == []
    feed.batch([end("g:1", 1, COUNTS), restart_copy])
    (tx,) = feed.completed
    assert tx["event_count"] == 2 and dict(tx["events_per_table"]) == COUNTS


def test_lost_event_is_incomplete_with_per_table_counts_once_its_stream_moves_on() -> None:
    feed = Feed()
    feed.batch([begin("g:1", 1), ev("g:1", "charges", 101, 1), end("g:1", 1, {"shop.charges": 2, "shop.audits": 1}), ev("g:1", "audits", 103, 1, order=3)])
    # Markers and audits move far ahead; charges (the table still owed an event) has not: keep waiting.
    feed.batch(whole("g:2", 200, 100)[:1] + [ev("g:2", "audits", 201, 100)] + whole("g:2", 200, 100)[3:])
    assert feed.incomplete == [] and "g:1" in feed.open_ids()
    # The charges stream passes END + 60 s: the second charge is not coming.
    feed.batch([ev("g:2", "charges", 200, 100)])
    (inc,) = feed.incomplete
    assert inc["transaction_id"] == "g:1" and inc["reason"] == T.MISSING_EVENTS and inc["expired_by"] == T.EVENT_TIME
    assert dict(inc["expected_per_table"]) == {"shop.charges": 2, "shop.audits": 1}
    assert dict(inc["seen_per_table"]) == {"shop.charges": 1, "shop.audits": 1}
    assert (inc["expected_count"], inc["seen_count"], inc["has_begin"], inc["has_end"]) == (3, 2, True, True)
    assert [e["tx_total_order"] for e in inc["events"]] == [1, 3]
    assert [t["transaction_id"] for t in feed.completed] == ["g:2"]


def test_missing_end_times_out_when_the_markers_move_on() -> None:
    feed = Feed()
    feed.batch([begin("g:1", 1), ev("g:1", "charges", 101, 1), ev("g:1", "audits", 102, 1, order=2)])
    feed.batch(whole("g:2", 200, 30))
    assert feed.incomplete == []
    feed.batch(whole("g:3", 300, 61.5))
    (inc,) = feed.incomplete
    assert (inc["transaction_id"], inc["reason"], inc["has_begin"], inc["has_end"]) == ("g:1", T.MISSING_END, True, False)
    assert inc["expected_per_table"] is None and dict(inc["seen_per_table"]) == COUNTS


def test_missing_begin_times_out_past_its_end() -> None:
    feed = Feed()
    feed.batch([ev("g:1", "charges", 101, 1), ev("g:1", "audits", 102, 1, order=2), end("g:1", 1, COUNTS)])
    feed.batch(whole("g:2", 200, 62))
    (inc,) = feed.incomplete
    assert (inc["transaction_id"], inc["reason"], inc["has_begin"]) == ("g:1", T.MISSING_BEGIN, False)
    assert dict(inc["expected_per_table"]) == dict(inc["seen_per_table"]) == COUNTS


def test_more_events_than_the_end_counts_is_a_count_mismatch_at_once() -> None:
    feed = Feed()
    feed.batch([begin("g:1", 1), ev("g:1", "charges", 101, 1), ev("g:1", "charges", 102, 1, row=2, order=2), end("g:1", 1, {"shop.charges": 1})])
    (inc,) = feed.incomplete
    assert inc["reason"] == T.COUNT_MISMATCH and dict(inc["seen_per_table"]) == {"shop.charges": 2}


def test_late_events_carry_the_transactions_fate_and_state_forgets_finished_ones() -> None:
    feed = Feed()
    feed.batch(whole("g:1", 100, 1) + [begin("g:2", 1), ev("g:2", "charges", 105, 1, row=2), end("g:2", 1, {"shop.charges": 2})])
    feed.batch(whole("g:3", 200, 70, row=3))  # charges passes g:2's END + 60 s
    assert [i["transaction_id"] for i in feed.incomplete] == ["g:2"]
    # A redelivered event of the completed one and a straggler of the expired one.
    feed.batch([ev("g:1", "charges", 100, 1), ev("g:2", "charges", 106, 1, row=2, order=2), end("g:1", 1, COUNTS)])
    late = sorted((r["transaction_id"], r["fate"], r["kind"]) for r in feed.late)
    assert late == [("g:1", "completed", "event"), ("g:1", "completed", "marker"), ("g:2", "expired", "event")]
    assert [t["transaction_id"] for t in feed.completed] == ["g:1", "g:3"], "a late event never re-emits"
    # Every stream moves well past: the finished records are forgotten, arrivals that old are late `unknown`.
    feed.batch(whole("g:4", 300, 400, row=4))
    finished = [r for r in feed.state.to_pylist() if r["entry"] in (T.COMPLETED, T.EXPIRED)]
    assert [r["transaction_id"] for r in finished] == ["g:4"]
    feed.batch([ev("g:1", "audits", 101, 1, order=2)])
    assert feed.late[-1]["transaction_id"] == "g:1" and feed.late[-1]["fate"] == "unknown"
    assert feed.open_ids() == [] and len(feed.incomplete) == 1, "a forgotten transaction's straggler opens nothing"


def test_state_stays_bounded_over_many_batches() -> None:
    feed = Feed()
    for b in range(30):
        lines = []
        for i in range(20):
            n = b * 20 + i
            lines += whole(f"g:{n}", 1000 + 10 * n, 30 * b + i, row=n)
        feed.batch(lines)
    assert len(feed.completed) == 600 and feed.incomplete == []
    assert max(f["state_rows"] for f in feed.figures) < 300
    assert feed.figures[-1]["open"] == 0


def test_a_slow_stream_does_not_time_out_transactions_waiting_for_it() -> None:
    feed = Feed()
    feed.batch(whole("g:0", 50, 0.5) + [begin("g:1", 1), ev("g:1", "charges", 101, 1), end("g:1", 1, COUNTS)])
    for n in range(2, 12):  # markers and charges run 1000 s ahead; audits is quiet
        feed.batch([begin(f"g:{n}", 100 * n), ev(f"g:{n}", "charges", 100 * n, 100 * n, row=n), end(f"g:{n}", 100 * n, {"shop.charges": 1})])
    assert feed.incomplete == [] and feed.open_ids() == ["g:1"]
    feed.batch([ev("g:1", "audits", 102, 1, order=2)])
    assert feed.completed[-1]["transaction_id"] == "g:1" and feed.incomplete == []
    assert feed.watermark[0]["position"] == position(1100), "g:1 held the watermark at g:0 until it completed"


def test_a_stream_still_delivering_its_snapshot_is_behind_not_silent() -> None:
    """Snapshot reads carry no transaction but are deliveries on their topic: they set its clock.

    Found by the crash trials: the audits topic was still landing its snapshot while charges ran far
    ahead; counted as never seen, audits was judged by the fastest stream plus the retention, and a
    healthy transaction waiting for its audits event expired.
    """
    feed = Feed()
    snapshot = [ev(None, "audits", 10 + i, 0, row=100 + i, op="r") for i in range(3)]
    feed.batch(snapshot + [begin("g:1", 1), ev("g:1", "charges", 101, 1), end("g:1", 1, COUNTS)])
    for n in range(2, 12):  # markers and charges run 1000 s ahead; audits has delivered only its snapshot
        feed.batch([begin(f"g:{n}", 100 * n), ev(f"g:{n}", "charges", 100 * n, 100 * n, row=n), end(f"g:{n}", 100 * n, {"shop.charges": 1})])
    assert feed.incomplete == [] and feed.open_ids() == ["g:1"]
    feed.batch([ev("g:1", "audits", 102, 1, order=2)])
    assert feed.completed[-1]["transaction_id"] == "g:1" and feed.incomplete == []
    feed.batch([ev(None, "audits", 5000, 1200, row=7)])  # once the topic itself is past the timeout, it does judge
    feed.batch([begin("g:20", 1300), ev("g:20", "charges", 6000, 1300, row=20), end("g:20", 1300, COUNTS)])
    feed.batch([ev(None, "audits", 7000, 1400, row=8)])
    assert [(i["transaction_id"], i["reason"]) for i in feed.incomplete] == [("g:20", T.MISSING_EVENTS)]


def test_idle_time_expires_what_is_open() -> None:
    feed = Feed()
    feed.batch([begin("g:1", 1), ev("g:1", "charges", 101, 1)] + whole("g:2", 200, 2))
    assert feed.idle(30).incomplete.num_rows == 0
    step = feed.idle(61)
    (inc,) = step.incomplete.to_pylist()
    assert (inc["transaction_id"], inc["reason"], inc["expired_by"], inc["expired_batch"]) == ("g:1", T.MISSING_END, T.PROCESSING_TIME, None)
    assert feed.open_ids() == []


def test_stripe_markers_with_bare_table_names() -> None:
    feed = Feed()
    stripe_begin = json.dumps({"marker": "BEGIN", "transaction_id": "tx-9", "ts_ms": START_MS + 1000})
    stripe_commit = json.dumps({
        "marker": "COMMIT", "transaction_id": "tx-9", "ts_ms": START_MS + 1000, "total_events": 2,
        "per_source_event_counts": {"charges": 1, "audits": 1},
    })
    feed.batch([stripe_commit, ev("tx-9", "charges", 101, 1)])
    feed.batch([ev("tx-9", "audits", 102, 1, order=2), stripe_begin])
    (tx,) = feed.completed
    assert tx["transaction_id"] == "tx-9" and tx["marker_shape"] == "stripe"
    assert dict(tx["events_per_table"]) == {"shop.charges": 1, "shop.audits": 1}


def pg_event(raw_tx: str, lsn: int, t: float, row: int, order: int) -> str:
    return json.dumps({
        "before": None, "after": {"id": row, "balance": 10 * row},
        "source": {"connector": "postgresql", "name": "bank", "db": "bank", "schema": "public", "table": "accounts",
                   "ts_ms": START_MS + int(t * 1000), "txId": 571, "lsn": lsn},
        "op": "c", "ts_ms": START_MS + int(t * 1000) + 3,
        "transaction": {"id": raw_tx, "total_order": order, "data_collection_order": order},
    })


def test_postgres_transaction_ids_with_lsn_suffixes_are_one_transaction() -> None:
    feed = Feed()
    feed.batch([
        json.dumps({"status": "BEGIN", "id": "571:53736952", "ts_ms": START_MS + 1000, "event_count": None, "data_collections": None}),
        pg_event("571:53737000", 53737000, 1, 1, 1),
    ])
    feed.batch([
        pg_event("571:53737112", 53737112, 1, 2, 2),
        json.dumps({"status": "END", "id": "571:53737208", "ts_ms": START_MS + 1000, "event_count": 2,
                    "data_collections": [{"data_collection": "public.accounts", "event_count": 2}]}),
    ])
    (tx,) = feed.completed
    assert tx["transaction_id"] == "571" and tx["source"] == "bank" and tx["event_count"] == 2
    assert [e["position"] for e in tx["events"]] == [f"{53737000:020d}", f"{53737112:020d}"]
    assert feed.watermark == [dict(feed.watermark[0], source="bank", position=f"{53737112:020d}", open_transactions=0)]


def test_events_without_transaction_metadata_are_not_aggregated_but_move_the_watermark() -> None:
    feed = Feed()
    step = feed.batch([ev(None, "charges", 50, 0.5), ev(None, "charges", 60, 0.6, row=2)])
    assert step.figures["open"] == 0 and feed.completed == [] and feed.incomplete == []
    assert feed.watermark[0]["position"] == f"{1:010d}{60:020d}{0:010d}"


def position(pos: int) -> str:
    return f"{1:010d}{pos:020d}{0:010d}"


def test_watermark_stops_below_open_transactions_and_before_markers_only_ones() -> None:
    feed = Feed()
    feed.batch(whole("g:1", 100, 1) + [begin("g:2", 2), ev("g:2", "charges", 200, 2, row=2)] + whole("g:3", 300, 3, row=3))
    (wm,) = feed.watermark
    assert (wm["position"], wm["blocking_transaction_id"], wm["open_transactions"]) == (position(101), "g:2", 1)
    feed.batch([ev("g:2", "audits", 201, 2, row=2, order=2), end("g:2", 2, COUNTS)])
    assert feed.watermark[0]["position"] == position(301), "g:2 complete: everything seen is settled"
    # g:5's markers are in but none of its events: nothing committed at or after its time can count.
    feed.batch([begin("g:5", 5), end("g:5", 5, COUNTS)] + whole("g:4", 400, 4, row=4) + whole("g:6", 600, 6, row=6))
    (wm,) = feed.watermark
    assert (wm["position"], wm["blocking_transaction_id"]) == (position(401), "g:5")
    feed.batch([ev("g:5", "charges", 500, 5, row=5), ev("g:5", "audits", 501, 5, row=5, order=2)])
    assert feed.watermark[0]["position"] == position(601)


def test_replaying_a_step_from_the_same_state_decides_the_same() -> None:
    lines = whole("g:1", 100, 1) + [begin("g:2", 2), ev("g:2", "charges", 200, 2)]
    a, b = Feed(), Feed()
    first, second = a.batch(lines), b.batch(lines)
    for name in ("completed", "incomplete", "late", "watermark", "state"):
        assert getattr(first, name).equals(getattr(second, name)), name


@pytest.mark.parametrize("name", sorted(T.TABLE_SCHEMAS))
def test_outputs_have_their_declared_schemas(name: str) -> None:
    feed = Feed()
    step = feed.batch(whole("g:1", 100, 1) + [begin("g:2", 1), ev("g:2", "charges", 110, 1, row=2), end("g:2", 1, {"shop.charges": 3})])
    table = {
        T.TRANSACTIONS: step.completed, T.INCOMPLETE: step.incomplete, T.LATE: step.late,
        T.WATERMARK: step.watermark, T.OPEN_TRANSACTIONS: step.state,
    }[name]
    assert table.schema.equals(T.TABLE_SCHEMAS[name])


def test_an_in_batch_duplicate_drops_no_other_event() -> None:
    """Regression: ingest's in-batch dedup once kept the duplicate and dropped the next distinct event."""
    lines = [ev("g:1", "charges", 101, 1), ev("g:1", "charges", 101, 1, ts_ms=START_MS + 5), ev("g:1", "audits", 102, 1, order=2)]
    parsed = split_parsed(pa.Table.from_batches([rows_to_batch([parse_line(x, "f.jsonl", KEYS) for x in lines])]), 0)
    assert parsed.events.column("table_id").to_pylist() == ["shop.charges", "shop.audits"]
    assert parsed.in_batch_duplicates == 1


def test_a_stream_never_seen_holds_nothing_forever() -> None:
    """Events with transaction metadata but no markers landed at all: missing_end, once far enough behind
    the fastest stream as it stood before the batch (a stage batch may hold events before their markers)."""
    feed = Feed()
    feed.batch([ev("g:1", "charges", 101, 1), ev("g:2", "charges", 201, 100, row=2)])
    assert feed.incomplete == [], "100 s is past the timeout but not the retention: the markers may just be slow"
    feed.batch([ev("g:3", "charges", 301, 400, row=3)])
    assert feed.incomplete == [], "the markers are judged by the clocks before this batch: they may lag its events by one batch"
    feed.batch([ev("g:4", "charges", 401, 700, row=4)])
    assert [(i["transaction_id"], i["reason"]) for i in feed.incomplete] == [("g:1", T.MISSING_END), ("g:2", T.MISSING_END)]


def test_retention_defaults_to_five_timeouts_and_may_not_undercut_the_timeout(tmp_path: Any) -> None:
    from cdc_platform.config import parse_config
    from cdc_platform.errors import ConfigError

    base = {"landing": "l", "lake": "k", "transaction_timeout": 30}
    assert T.Settings.from_config(parse_config(base, base=tmp_path)) == T.Settings(timeout_us=30_000_000, retention_us=150_000_000)
    assert T.Settings.from_config(parse_config({**base, "transaction_retention": 45}, base=tmp_path)).retention_us == 45_000_000
    with pytest.raises(ConfigError, match="transaction_retention"):
        parse_config({**base, "transaction_retention": 10}, base=tmp_path)


def test_a_held_state_decides_like_a_fresh_read_of_the_state_every_batch() -> None:
    """`step` re-merges only what a batch touches; batch by batch it must equal `aggregate` on the table.

    The mix exercises held rows expiring while untouched (missing END, short events), a table stream
    that first appears mid-run (every held row is re-judged), late arrivals, and idle ticks.
    """
    held = T.hold(T.empty_state())
    state = T.empty_state()
    batches: list[tuple[list[str], float]] = []
    for b in range(12):
        t = 40.0 * b
        lines = whole(f"w:{b}", 1000 + 10 * b, t, row=b)
        lines += [begin(f"m:{b}", t), ev(f"m:{b}", "charges", 2000 + 10 * b, t, row=b)]  # END never comes
        lines += [begin(f"s:{b}", t), ev(f"s:{b}", "charges", 3000 + 10 * b, t, row=b), end(f"s:{b}", t, COUNTS)]  # audits never come
        if b >= 1:
            lines.append(ev(f"s:{b - 1}", "charges", 3000 + 10 * b + 5, t, row=b, order=3))  # touches a held row: count mismatch
        if b == 6:
            lines += [begin("p:1", t), ev("p:1", "accounts", 5000, t), end("p:1", t, {"public.accounts": 1})]  # a new stream
        if b == 9:
            lines.append(ev("w:0", "charges", 1000, 0))  # late, for a completed transaction
        batches.append((lines, 0.0))
    batches.append(([], 120.0))  # an idle tick
    reasons: set[str] = set()
    for i, (lines, idle) in enumerate(batches):
        batch_id = None if idle else i
        if lines:
            rows = [parse_line(line, "f.jsonl", KEYS) for line in lines]
            parsed = split_parsed(pa.Table.from_batches([rows_to_batch(rows)]), i)
            events, markers = parsed.events, parsed.markers
        else:
            events, markers = pa.table({}), pa.table({})
        kw: dict[str, Any] = {"batch_id": batch_id, "now": NOW, "idle_us": int(idle * 1_000_000)}
        fresh = T.aggregate(state, events, markers, SETTINGS, **kw)
        incremental, held = T.step(held, events, markers, SETTINGS, **kw)
        for name in ("completed", "incomplete", "late", "watermark", "state"):
            assert getattr(incremental, name).equals(getattr(fresh, name)), (i, name)
        state = fresh.state
        reasons |= {r["reason"] for r in fresh.incomplete.to_pylist()}
        if 1 <= i < 12 and i != 6:
            assert incremental.figures["merged"] < fresh.figures["merged"], "held rows the batch does not touch are not re-merged"
    assert reasons >= {T.MISSING_END, T.MISSING_EVENTS, T.COUNT_MISMATCH}, "held rows expired for every reason"


def test_a_batch_of_events_whose_markers_come_in_the_next_batch_times_nothing_out() -> None:
    """A stage query's batch may hold a span of events (here 500 s, past the retention) before their BEGIN and
    END markers, which the ingest commits just after them: nothing is judged missing its END on the events'
    own clocks, and the next batch completes every transaction (the crash trials' kill between the two commits)."""
    feed = Feed()
    txs = [(f"m:{i}", 100 * i + 1) for i in range(6)]
    feed.batch([ev(tx, "charges", 10 * i + 1, t, row=i) for i, (tx, t) in enumerate(txs)])
    assert feed.incomplete == []
    feed.batch([line for tx, t in txs for line in (begin(tx, t), end(tx, t, {"shop.charges": 1}))])
    assert feed.incomplete == [] and sorted(c["transaction_id"] for c in feed.completed) == sorted(tx for tx, _ in txs)
