"""A realistic sample workload: Debezium MySQL output for a small `payments` database.

The platform must be tested on what connectors actually deliver, not on tidy fixtures, so this module
simulates a `payments` MySQL database (customers, charges, refunds) under an application load and
writes what Debezium's MySQL connector (JSON converter, transaction metadata on) would put on Kafka,
dumped topic by topic into JSON-lines files. Everything is derived from one seed, so tests and
benchmarks can compare runs byte for byte.

What the files look like, and why:

* One folder per Kafka topic under `landing/`: `payments.payments.<table>` for changes and
  `payments.transaction` for BEGIN/END markers. Topics are written independently, so one transaction's
  events and markers land in different files, exactly the problem the platform has to solve.
* An initial snapshot (`op: "r"`) of ~10% of the customers precedes streaming. All snapshot events
  share one binlog coordinate and carry no transaction block, so `(file, pos, row)` alone does not
  identify a snapshot event; the primary key must be part of any identity.
* Streaming events carry a GTID transaction id and their own strictly increasing binlog position, so
  sorting by `(file index, pos, row)` recovers the true history. `row` is always 0.
* Faults real pipelines see are injected deterministically and counted: connector-restart duplicates
  (identical except envelope `ts_ms`), an update delivered in a later file than a newer update to the
  same key, truncated JSON lines, Kafka tombstones (`null`) after every delete, and some customers
  files written with `schemas.enable=true` (`{"schema":..., "payload":...}` per line).

The generator streams: it keeps the live rows it needs to emit correct `before` images plus one
file's worth of lines per topic, never the whole history.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from cdc_platform.errors import ConfigError
from cdc_platform.workload.generate_resume import Recovered, recover
from cdc_platform.workload.generate_files import (
    CONNECTOR_VERSION, DATABASE, SERVER_ID, SERVER_UUID, TOPIC_PREFIX, Binlog, Change, TopicWriter, customers_connect_schema, topic_for,
)

__all__ = ["GeneratedWorkload", "generate_workload", "append_workload", "CDC_YAML", "SERVER_UUID"]

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
FIRST_GTID = 17
FIRST_BINLOG_INDEX = 3
SNAPSHOT_POS = 4821
TABLES = ("customers", "charges", "refunds")
TRANSACTION_TOPIC = f"{TOPIC_PREFIX}.transaction"

SNAPSHOT_SHARE = 0.022  # snapshot customers per transaction: ~10% of all customers with the mix below
LATE_PAIR_EVERY = 25_000  # one planned late delivery per this many transactions (at least one)

CDC_YAML = """\
landing: landing
lake: lake
tables:
  payments.customers:
    key: [id]
    mask: [email]
  payments.charges:
    key: [id]
  payments.refunds:
    key: [id]
"""

# Transaction kinds and their weights. Charge creation (~38/100) roughly matches settlement
# (~14 single + ~6 batches of 2-6) so the pending pool neither drains nor grows without bound.
_KINDS: tuple[tuple[str, int], ...] = (
    ("new_customer", 12),
    ("signup_and_charge", 8),  # customers + charges
    ("new_charge", 24),
    ("checkout_with_profile_update", 6),  # customers + charges
    ("settle", 14),
    ("settle_batch", 6),
    ("refund", 7),  # charges + refunds
    ("customer_update", 19),
    ("delete_customer", 2),
    ("delete_failed_charge", 2),
)
_KIND_NAMES = tuple(k for k, _ in _KINDS)
_KIND_CUM: list[int] = []
for _, _w in _KINDS:
    _KIND_CUM.append((_KIND_CUM[-1] if _KIND_CUM else 0) + _w)
_KIND_TOTAL = _KIND_CUM[-1]

_FIRST_NAMES = (
    "Ana", "Ben", "Chloe", "Daniel", "Elif", "Farah", "Gustavo", "Hana", "Ivan", "Julia", "Kenji",
    "Lena", "Mateo", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sven", "Tomasz", "Uma", "Victor",
    "Wei", "Ximena", "Yusuf", "Zoe",
)
_LAST_NAMES = (
    "Silva", "Smith", "Muller", "Dubois", "Rossi", "Garcia", "Kowalski", "Tanaka", "Singh", "Jansen",
    "Andersson", "Novak", "Okafor", "Haddad", "Kim", "Nguyen", "Costa", "Meyer", "Lopez", "Brown",
)
_DOMAINS = ("example.com", "mail.example.org", "inbox.example.net", "corp.example.io")
_COUNTRY_CURRENCY = {
    "US": "USD", "GB": "GBP", "DE": "EUR", "FR": "EUR", "NL": "EUR", "ES": "EUR", "IT": "EUR",
    "BR": "BRL", "IN": "INR", "JP": "JPY", "CA": "CAD", "AU": "AUD", "SE": "SEK", "PL": "PLN",
    "MX": "MXN",
}
_COUNTRIES = tuple(_COUNTRY_CURRENCY)
_REFUND_REASONS = ("requested_by_customer", "duplicate", "fraudulent", "product_not_received")

Row = dict[str, Any]


@dataclass(frozen=True)
class GeneratedWorkload:
    """What was written, with the counts a test or benchmark needs to check a pipeline against."""

    out_dir: Path
    landing_dir: Path
    config_path: Path
    transactions: int  # committed source transactions generated
    change_events: int  # distinct change events incl. snapshot reads (excluding injected duplicates)
    duplicate_events: int  # injected redeliveries
    markers: int  # BEGIN + END lines
    malformed_lines: int  # injected bad lines
    tombstones: int  # 'null' lines after deletes
    files: int
    expected_state: dict[str, dict[tuple, dict | None]]  # filled only when track_state=True


class _Simulator:
    """The source database: live rows plus the pools the application draws its next action from.

    Rows are never mutated in place: an update builds a new dict, so the previous dict can serve as the
    event's `before` image and every emitted image stays valid after later changes.
    """

    def __init__(self, rng: random.Random, track_state: bool, start_ms: int = START_MS) -> None:
        self.rng = rng
        self.track = track_state
        self.now = start_ms
        self.customers: dict[int, Row] = {}
        self.charges: dict[int, Row] = {}
        self.refunds: dict[int, Row] = {}
        self.deleted: dict[str, set[int]] = {t: set() for t in TABLES}
        self.customer_ids: list[int] = []  # creation order, for recency-biased picks
        self.charge_count: dict[int, int] = {}
        self.pending: list[int] = []
        self.refundable_ids: list[int] = []
        self.refundable: set[int] = set()
        self.failed: list[int] = []
        self.protected: set[int] = set()
        self.next_id = {t: 1 for t in TABLES}

    def restore(self, state: Recovered) -> None:
        """Take over a database read back from landing files, rebuilding the pools the actions draw from.

        Ids are visited in creation order, so recency-biased picks favour the newest rows as before.
        A charge counts for its customer until deleted (a customer with charges is never deleted);
        refunded charges are terminal and, as in a fresh run, kept only when state is tracked.
        """
        for cid, row in sorted(state.rows.get("customers", {}).items()):
            self.customer_ids.append(cid)
            if row is None:
                self.deleted["customers"].add(cid)
            else:
                self.customers[cid] = row
        for chid, row in sorted(state.rows.get("charges", {}).items()):
            if row is None:
                if self.track:
                    self.deleted["charges"].add(chid)
                continue
            self.charge_count[row["customer_id"]] = self.charge_count.get(row["customer_id"], 0) + 1
            if row["status"] != "refunded" or self.track:
                self.charges[chid] = row
            self._enter_pool(chid, row["status"])
        if self.track:
            self.refunds.update({rid: row for rid, row in sorted(state.rows.get("refunds", {}).items()) if row is not None})
        self.next_id.update(state.next_id)

    # -- helpers -------------------------------------------------------------------------------
    def _new_id(self, table: str) -> int:
        value = self.next_id[table]
        self.next_id[table] = value + 1
        return value

    def _pick_recent(self, ids: list[int], ok: Callable[[int], bool]) -> int | None:
        """Mostly a recently created key (recent customers and charges see most activity), sometimes any."""
        n = len(ids)
        if n == 0:
            return None
        rng = self.rng
        for _ in range(8):
            if rng.random() < 0.7:
                idx = n - 1 - min(n - 1, int(rng.expovariate(1 / 40)))
            else:
                idx = rng.randrange(n)
            candidate = ids[idx]
            if ok(candidate):
                return candidate
        return None

    def _live_customer(self) -> int | None:
        return self._pick_recent(self.customer_ids, self.customers.__contains__)

    def _make_customer(self, cid: int, created_at: int) -> Row:
        rng = self.rng
        first = rng.choice(_FIRST_NAMES)
        last = rng.choice(_LAST_NAMES)
        return {
            "id": cid,
            "name": f"{first} {last}",
            "email": f"{first.lower()}.{last.lower()}{cid}@{rng.choice(_DOMAINS)}",
            "country": rng.choice(_COUNTRIES),
            "created_at": created_at,
        }

    def snapshot_customer(self, created_at: int) -> Row:
        cid = self._new_id("customers")
        row = self._make_customer(cid, created_at)
        self.customers[cid] = row
        self.customer_ids.append(cid)
        return row

    # -- change builders -----------------------------------------------------------------------
    def _insert_customer(self) -> Change:
        cid = self._new_id("customers")
        row = self._make_customer(cid, self.now)
        self.customers[cid] = row
        self.customer_ids.append(cid)
        return ("customers", "c", None, row, "")

    def _update_customer(self, cid: int, late: str = "") -> Change:
        rng = self.rng
        before = self.customers[cid]
        after = dict(before)
        what = rng.random()
        if what < 0.5 or late:
            local, _, _domain = before["email"].partition("@")
            after["email"] = f"{local.rstrip('0123456789.')}.{rng.randint(1, 999)}@{rng.choice(_DOMAINS)}"
        if what >= 0.35:
            after["country"] = rng.choice([c for c in _COUNTRIES if c != before["country"]])
        self.customers[cid] = after
        return ("customers", "u", before, after, late)

    def _insert_charge(self, cid: int) -> Change:
        rng = self.rng
        chid = self._new_id("charges")
        country = self.customers[cid]["country"]
        currency = _COUNTRY_CURRENCY[country] if rng.random() < 0.9 else "USD"
        roll = rng.random()
        status = "pending" if roll < 0.8 else ("succeeded" if roll < 0.95 else "failed")
        row = {
            "id": chid,
            "customer_id": cid,
            "amount_cents": max(50, int(rng.lognormvariate(7.6, 1.1))),
            "currency": currency,
            "status": status,
            "updated_at": self.now,
        }
        self.charges[chid] = row
        self.charge_count[cid] = self.charge_count.get(cid, 0) + 1
        self._enter_pool(chid, status)
        return ("charges", "c", None, row, "")

    def _enter_pool(self, chid: int, status: str) -> None:
        if status == "pending":
            self.pending.append(chid)
        elif status == "succeeded":
            self.refundable_ids.append(chid)
            self.refundable.add(chid)
        elif status == "failed":
            self.failed.append(chid)

    def _set_charge_status(self, chid: int, status: str) -> Change:
        before = self.charges[chid]
        after = dict(before)
        after["status"] = status
        after["updated_at"] = self.now
        if status == "refunded" and not self.track:
            del self.charges[chid]  # terminal: nothing will touch it again
        else:
            self.charges[chid] = after
        return ("charges", "u", before, after, "")

    def _take(self, pool: list[int]) -> int:
        i = self.rng.randrange(len(pool))
        pool[i], pool[-1] = pool[-1], pool[i]
        return pool.pop()

    def _settle_one(self) -> Change:
        chid = self._take(self.pending)
        status = "succeeded" if self.rng.random() < 0.88 else "failed"
        change = self._set_charge_status(chid, status)
        self._enter_pool(chid, status)
        return change

    # -- transactions --------------------------------------------------------------------------
    def run(self, kind: str) -> list[Change]:
        """Apply one application transaction; fall back to a plain new charge when it has nothing to act on."""
        rng = self.rng
        if kind == "new_customer":
            return [self._insert_customer()]
        if kind == "signup_and_charge":
            first = self._insert_customer()
            return [first, self._insert_charge(first[3]["id"])]  # type: ignore[index]
        if kind == "new_charge":
            pass  # the shared fallback below is exactly this transaction
        elif kind == "checkout_with_profile_update":
            cid = self._live_customer()
            if cid is not None:
                return [self._update_customer(cid), self._insert_charge(cid)]
        elif kind == "settle":
            if self.pending:
                return [self._settle_one()]
        elif kind == "settle_batch":
            if len(self.pending) >= 2:
                return [self._settle_one() for _ in range(min(rng.randint(2, 6), len(self.pending)))]
        elif kind == "refund":
            chid = self._pick_recent(self.refundable_ids, self.refundable.__contains__)
            if chid is not None:
                self.refundable.discard(chid)
                charge = self.charges[chid]
                amount = charge["amount_cents"]
                if rng.random() >= 0.6 and amount > 1:
                    amount = rng.randint(1, amount - 1)
                refund = {
                    "id": self._new_id("refunds"),
                    "charge_id": chid,
                    "amount_cents": amount,
                    "reason": rng.choice(_REFUND_REASONS),
                }
                if self.track:
                    self.refunds[refund["id"]] = refund
                return [self._set_charge_status(chid, "refunded"), ("refunds", "c", None, refund, "")]
        elif kind == "customer_update":
            cid = self._live_customer()
            if cid is not None:
                return [self._update_customer(cid)]
        elif kind == "delete_customer":
            if len(self.customers) > 1:
                cid = self._pick_recent(
                    self.customer_ids,
                    lambda c: c in self.customers and not self.charge_count.get(c) and c not in self.protected,
                )
                if cid is not None:
                    before = self.customers.pop(cid)
                    self.charge_count.pop(cid, None)
                    self.deleted["customers"].add(cid)
                    return [("customers", "d", before, None, "")]
        elif kind == "delete_failed_charge":
            if self.failed:
                chid = self._take(self.failed)
                before = self.charges.pop(chid)
                self.charge_count[before["customer_id"]] -= 1
                if self.track:
                    self.deleted["charges"].add(chid)
                return [("charges", "d", before, None, "")]
        else:
            raise AssertionError(kind)
        cid = self._live_customer()
        if cid is None:
            return [self._insert_customer()]
        return [self._insert_charge(cid)]

    def late_first(self) -> tuple[list[Change], int]:
        """The older half of a planned late delivery: an update whose key is updated again shortly."""
        cid = self._live_customer()
        if cid is None:  # recency picks can miss; fall back to the newest live customer
            cid = next(c for c in reversed(self.customer_ids) if c in self.customers)
        self.protected.add(cid)
        return [self._update_customer(cid, late="hold")], cid

    def late_second(self, cid: int) -> list[Change]:
        self.protected.discard(cid)
        return [self._update_customer(cid, late="arm")]

    def expected_state(self) -> dict[str, dict[tuple, dict | None]]:
        state: dict[str, dict[tuple, dict | None]] = {}
        for table, rows in (("customers", self.customers), ("charges", self.charges), ("refunds", self.refunds)):
            merged: dict[int, dict | None] = dict(rows)
            for key in self.deleted[table]:
                merged[key] = None
            state[f"{DATABASE}.{table}"] = {(k,): merged[k] for k in sorted(merged)}
        return state


def _plan_late_pairs(transactions: int, rng: random.Random) -> dict[int, tuple[str, int]]:
    """Transaction slots for the planned late deliveries: {index: ("first"|"second", pair number)}."""
    plan: dict[int, tuple[str, int]] = {}
    if transactions < 2:
        return plan
    pairs = max(1, transactions // LATE_PAIR_EVERY)
    span = transactions / pairs
    for p in range(pairs):
        first = min(transactions - 2, int(span * p + span * 0.37))
        second = min(transactions - 1, first + rng.randint(1, 3))
        if first in plan or second in plan:
            continue
        plan[first] = ("first", p)
        plan[second] = ("second", p)
    return plan


MEAN_COMMIT_GAP_MS = 325  # commits are 50-600 ms apart


def recent_start_ms(transactions: int, now_ms: int) -> int:
    """A start time that makes the workload's last commit land about `now_ms`, as from a live database."""
    return now_ms - transactions * MEAN_COMMIT_GAP_MS


def _check_sizes(transactions: Any, events_per_file: Any) -> None:
    if isinstance(transactions, bool) or not isinstance(transactions, int) or transactions < 1:
        raise ConfigError(f"transactions must be an integer >= 1, got {transactions!r}")
    if isinstance(events_per_file, bool) or not isinstance(events_per_file, int) or events_per_file < 1:
        raise ConfigError(f"events_per_file must be an integer >= 1, got {events_per_file!r}")


def _writers(landing: Path, events_per_file: int, seed: int, first_file: dict[str, int] | None = None) -> tuple[dict[str, TopicWriter], TopicWriter]:
    first = first_file or {}
    writers = {
        table: TopicWriter(
            landing / topic_for(table),
            events_per_file,
            random.Random(seed * 1_000_003 + 10 + i),
            schema=customers_connect_schema() if table == "customers" else None,
            first_file=first.get(topic_for(table), 0),
        )
        for i, table in enumerate(TABLES)
    }
    tx_writer = TopicWriter(landing / TRANSACTION_TOPIC, events_per_file, random.Random(seed * 1_000_003 + 99), faults=False,
                            first_file=first.get(TRANSACTION_TOPIC, 0))
    return writers, tx_writer


def _stream(sim: _Simulator, binlog: Binlog, transactions: int, rng: random.Random, plan_rng: random.Random,
            writers: dict[str, TopicWriter], tx_writer: TopicWriter) -> int:
    """Run `transactions` application transactions through the binlog; return the change events written."""
    plan = _plan_late_pairs(transactions, plan_rng)
    late_keys: dict[int, int] = {}
    kind_names = _KIND_NAMES
    kind_cum = _KIND_CUM
    change_events = 0
    for t in range(transactions):
        sim.now = binlog.begin(rng)
        slot = plan.get(t)
        if slot is None:
            changes = sim.run(kind_names[bisect.bisect_right(kind_cum, rng.random() * _KIND_TOTAL)])
        elif slot[0] == "first":
            changes, late_keys[slot[1]] = sim.late_first()
        else:
            changes = sim.late_second(late_keys.pop(slot[1]))
        change_events += binlog.write(changes, rng, writers, tx_writer)
    return change_events


def _result(out: Path, landing: Path, config_path: Path, transactions: int, change_events: int,
            writers: dict[str, TopicWriter], tx_writer: TopicWriter, sim: _Simulator, track_state: bool) -> GeneratedWorkload:
    return GeneratedWorkload(
        out_dir=out,
        landing_dir=landing,
        config_path=config_path,
        transactions=transactions,
        change_events=change_events,
        duplicate_events=sum(w.duplicates for w in writers.values()),
        markers=tx_writer.lines,
        malformed_lines=sum(w.malformed for w in writers.values()),
        tombstones=sum(w.tombstones for w in writers.values()),
        files=sum(w.files for w in (*writers.values(), tx_writer)),
        expected_state=sim.expected_state() if track_state else {},
    )


def generate_workload(
    out_dir: str | Path,
    transactions: int = 200,
    seed: int = 7,
    events_per_file: int = 500,
    track_state: bool = True,
    start_ms: int | None = None,
) -> GeneratedWorkload:
    """Write a deterministic Debezium MySQL workload to `out_dir/landing` and its `out_dir/cdc.yaml`.

    Refuses a landing directory that already holds files, so two workloads are never mixed
    (`append_workload` adds an increment to one instead).
    `track_state=False` skips building `expected_state` (and keeps less in memory); the files written
    are identical either way. `start_ms` is the source clock at the first transaction (default a fixed
    2026-01-01, so a seed always writes the same bytes); the CLI passes a recent time instead so that
    freshness checks on the sample judge it like a live database.
    """
    start = START_MS if start_ms is None else start_ms
    _check_sizes(transactions, events_per_file)
    out = Path(out_dir)
    landing = out / "landing"
    if landing.exists():
        if not landing.is_dir():
            raise ConfigError(f"{landing} exists and is not a directory; remove it or choose another out_dir")
        if any(p.is_file() for p in landing.rglob("*")):
            raise ConfigError(
                f"{landing} already contains files; delete it or choose an empty out_dir so two workloads are not mixed "
                "(or add an increment to it: `cdc generate --append`)"
            )
    landing.mkdir(parents=True, exist_ok=True)
    config_path = out / "cdc.yaml"
    config_path.write_text(CDC_YAML, encoding="utf-8")

    rng = random.Random(seed)
    plan_rng = random.Random(seed * 1_000_003 + 1)
    sim = _Simulator(rng, track_state, start)
    writers, tx_writer = _writers(landing, events_per_file, seed)
    change_events = 0

    # Initial snapshot: one consistent read at one binlog coordinate, no transaction metadata.
    binlog = Binlog(FIRST_BINLOG_INDEX, SNAPSHOT_POS, 0, FIRST_GTID, start)
    snapshot_count = max(1, round(transactions * SNAPSHOT_SHARE))
    year_ms = 365 * 86_400_000
    step = year_ms // snapshot_count  # created during 2025, in id order
    for i in range(snapshot_count):
        row = sim.snapshot_customer(start - year_ms + i * step + rng.randrange(step))
        source = {
            "version": CONNECTOR_VERSION, "connector": "mysql", "name": TOPIC_PREFIX, "ts_ms": start,
            "snapshot": "last" if i == snapshot_count - 1 else "true", "db": DATABASE, "sequence": None,
            "table": "customers", "server_id": SERVER_ID, "gtid": None, "file": binlog.file,
            "pos": SNAPSHOT_POS, "row": 0, "thread": None, "query": None,
        }
        env = {"before": None, "after": row, "source": source, "op": "r", "ts_ms": start + 40 + i, "transaction": None}
        writers["customers"].add_change(env, row["id"])
        change_events += 1

    change_events += _stream(sim, binlog, transactions, rng, plan_rng, writers, tx_writer)

    # Guarantee each fault at least once, whatever the dice said.
    customers = writers["customers"]
    if not any(w.duplicates_scheduled for w in writers.values()):
        assert customers.last_candidate is not None  # the snapshot always has one customer
        customers.schedule_duplicate(customers.last_candidate, customers.lines + 1, plan_rng.randint(1_000, 30_000))
    if not any(w.malformed for w in writers.values()):
        assert customers.last_candidate is not None
        customers.add_truncated(customers.last_candidate)

    for writer in (*writers.values(), tx_writer):
        writer.close()
    return _result(out, landing, config_path, transactions, change_events, writers, tx_writer, sim, track_state)


def append_workload(
    out_dir: str | Path,
    transactions: int = 200,
    seed: int = 7,
    events_per_file: int = 500,
    track_state: bool = True,
    now_ms: int | None = None,
) -> GeneratedWorkload:
    """Write a further increment of the workload already in `out_dir/landing`: `transactions` new ones.

    The database is read back from the files (`generate_resume.recover`): its live rows, its deleted
    keys, the last id per table, the binlog position, GTID and commit time, and each topic's last file.
    The increment continues from there (new rows with higher ids; updates and deletes of existing rows;
    higher GTIDs, positions and commit times; files numbered after the existing ones, written atomically
    so a running stream never reads half a file), with the same faults as a fresh workload (redeliveries,
    a late update, truncated lines, tombstones, a schema-wrapped customers file). `now_ms` moves the
    commit clock up to about now when the files' last commit is older, as for a live source.
    `expected_state` is the whole database after the increment (base and increment).
    """
    _check_sizes(transactions, events_per_file)
    out = Path(out_dir)
    landing = out / "landing"
    state = recover(landing, TABLES, TRANSACTION_TOPIC, topic_for)
    config_path = out / "cdc.yaml"
    if not config_path.exists():
        config_path.write_text(CDC_YAML, encoding="utf-8")
    increment_seed = seed * 1_000_003 + state.next_gtid  # each increment of one landing draws new dice
    rng = random.Random(increment_seed)
    plan_rng = random.Random(increment_seed * 1_000_003 + 1)
    commit = state.last_commit_ms
    if now_ms is not None:
        commit = max(commit, recent_start_ms(transactions, now_ms))
    sim = _Simulator(rng, track_state, commit)
    sim.restore(state)
    writers, tx_writer = _writers(landing, events_per_file, increment_seed, first_file=state.next_file)
    binlog = Binlog(state.binlog_index, state.binlog_pos + 500, state.tx_in_file, state.next_gtid, commit)
    change_events = _stream(sim, binlog, transactions, rng, plan_rng, writers, tx_writer)
    for writer in (*writers.values(), tx_writer):
        writer.close()
    return _result(out, landing, config_path, transactions, change_events, writers, tx_writer, sim, track_state)
