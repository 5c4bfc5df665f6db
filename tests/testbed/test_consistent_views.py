"""Issue 11: while the workload runs, a reader of the consistent views never sees half of a transaction.

An invariant workload on the real stack (PostgreSQL -> Debezium -> Kafka -> the stream, in this process):
accounts open in one transaction, then every transaction makes one to three moves of money between two
accounts (per move two balance updates and the insert of the move). So in any state the source passes through,
the balances sum to what the accounts opened with, and each balance is its opening plus the moves into
it minus the moves out of it. A transaction's events arrive on two topics (and its BEGIN and END on a
third), and the stream cuts each topic into batches on its own (`max_offsets_per_trigger`), so the lake
does pass through half-applied transactions: the full views, which show each batch as it lands, can
break the invariant (tried while writing this test). The consistent views must not: the test reads both
in one SQL statement (one snapshot, `register_lake` pins every table) over and over while the workload
and the stream run, and checks the invariant on every read; the workload runs in phases, each waiting for a
read to show the one before, so that the reads are spread over it (`PHASES`). At the end both kinds of view equal the
source tables.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.config import load_config
from cdc_platform.testbed import Stack
from tests.testbed.streaming import Running, rows_once_set_up

PREFIX = "consistent_pg"
ACCOUNTS = "cv_accounts"
MOVES = "cv_moves"
OPENING = Decimal("1000.00")
N_ACCOUNTS = 5
#: Source transactions after the accounts open, one every PAUSE seconds, in PHASES: after each phase but
#: the last the workload waits until a read has shown all of that phase's moves. A read under load takes
#: 5 to 30 s (the stream shares the two cores), longer than the whole workload would, so without the gates
#: every read could come after it; with them the reads see the lake between phases, and while the stream
#: cuts the next phase's transactions into batches.
TRANSFERS, PAUSE, PHASES = 24, 0.5, 3
#: Distinct numbers of visible moves the reads must have seen strictly between none and all, so that they
#: were spread over the workload rather than all before or after it (the gates guarantee PHASES - 1).
MIN_STATES = 2
#: Seconds the workload waits at a gate for a read to show the moves so far.
GATE_TIMEOUT = 300.0


def invariant_sql(view: str) -> str:
    """One statement over both tables' `view`s, each read once (a view named twice is computed twice):
    visible accounts and moves, the sum of balances, balances that disagree with the moves, and accounts
    that moves name but that are not visible."""
    return f"""
WITH legs AS (
  SELECT leg.id, sum(leg.delta) AS delta, sum(leg.n) AS moves
  FROM {MOVES}__{view} LATERAL VIEW explode(array(named_struct('id', dst, 'delta', amount, 'n', 1),
                                                  named_struct('id', src, 'delta', -amount, 'n', 0))) l AS leg
  GROUP BY leg.id
)
SELECT count(a.id) AS accounts, coalesce(sum(a.balance), 0) AS total, coalesce(sum(legs.moves), 0) AS moves,
       count_if(a.id IS NOT NULL AND a.balance <> {OPENING} + coalesce(legs.delta, 0)) AS disagreeing,
       count_if(a.id IS NULL) AS dangling
FROM (SELECT id, balance FROM {ACCOUNTS}__{view}) a FULL OUTER JOIN legs ON a.id = legs.id
"""


def holds(read: dict[str, Any]) -> bool:
    """Nothing visible yet, or every account with the money it opened with, each balance agreeing with the moves."""
    if read["accounts"] == 0:
        return read["moves"] == 0
    return (read["accounts"] == N_ACCOUNTS and read["total"] == N_ACCOUNTS * OPENING
            and read["disagreeing"] == 0 and read["dangling"] == 0)


def plan(seed: int = 11) -> list[list[tuple[int, int, Decimal]]]:
    """TRANSFERS source transactions, each of one to three moves (from, to, amount) between distinct
    accounts: three to nine change events over two topics in varying proportions, so that the stream's
    per-topic cuts fall inside transactions (with a fixed number of events per topic and transaction,
    proportional cuts would line up with transaction boundaries)."""
    pick = random.Random(seed)
    return [[(*pick.sample(range(1, N_ACCOUNTS + 1), 2), Decimal(pick.randint(1, 50_000)) / 100) for _ in range(pick.randint(1, 3))]
            for _ in range(TRANSFERS)]


class Transfers:
    """Runs `plan()` on the source, one transaction per entry, until done or stopped; after each phase but
    the last it waits at its gate, which the reader opens once it has seen every move made so far."""

    def __init__(self, bed: Stack) -> None:
        self.bed, self.plan, self.done, self.error = bed, plan(), 0, None
        self.stop = threading.Event()
        size = -(-len(self.plan) // PHASES)
        self.phases = [self.plan[i:i + size] for i in range(0, len(self.plan), size)]
        #: Moves made by the end of each phase but the last, and the gate each of those phases waits at.
        self.moves_after = [sum(len(t) for p in self.phases[:k + 1] for t in p) for k in range(len(self.phases) - 1)]
        self.gates = [threading.Event() for _ in self.moves_after]
        self.thread = threading.Thread(target=self.run, daemon=True)

    def seen(self, moves: int) -> None:
        """A read showed `moves` moves: open the gates of the phases it shows whole."""
        for gate, after in zip(self.gates, self.moves_after):
            if moves >= after:
                gate.set()

    def run(self) -> None:
        try:
            with self.bed.postgres.connect(autocommit=False) as conn:
                move = 0
                for k, phase in enumerate(self.phases):
                    for legs in phase:
                        if self.stop.is_set():
                            return
                        for frm, to, amount in legs:
                            move += 1
                            conn.execute(f"update {ACCOUNTS} set balance = balance - %s where id = %s", (amount, frm))
                            conn.execute(f"insert into {MOVES} values (%s, %s, %s, %s)", (move, frm, to, amount))
                            conn.execute(f"update {ACCOUNTS} set balance = balance + %s where id = %s", (amount, to))
                        conn.commit()
                        self.done += 1
                        time.sleep(PAUSE)
                    if k < len(self.gates) and not self.gates[k].wait(GATE_TIMEOUT):
                        raise AssertionError(f"no read showed the {self.moves_after[k]} moves of phase {k + 1} within {GATE_TIMEOUT:.0f} s")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_a_reader_of_the_consistent_views_never_sees_half_a_transaction(testbed: Stack, spark: Any, tmp_path: Path, query) -> None:  # noqa: ANN001
    bed = testbed
    with bed.postgres.connect() as conn:
        conn.execute(f"create table {ACCOUNTS} (id int primary key, balance numeric(14,2) not null)")
        conn.execute(f"create table {MOVES} (id bigint primary key, src int not null, dst int not null, amount numeric(12,2) not null)")
    connector = bed.postgres_connector(PREFIX, [f"public.{ACCOUNTS}", f"public.{MOVES}"])
    doc = {
        "lake": "lake", "transaction_timeout": 3600,  # a transaction split over slow batches must complete, never expire
        # Small batches: each topic is cut on its own, so batches end inside transactions.
        "source": {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "subscribe_pattern": rf"{PREFIX}\..*",
                   "max_offsets_per_trigger": 40},
        "tables": {f"public.{ACCOUNTS}": {"key": ["id"]}, f"public.{MOVES}": {"key": ["id"]}},
    }
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    cfg = load_config(tmp_path / "cdc.yaml")
    transfers = Transfers(bed)

    def source(sql: str) -> list[tuple[Any, ...]]:
        with bed.postgres.connect() as conn:
            return [tuple(r) for r in conn.execute(sql).fetchall()]

    def lake(sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r.values()) for r in query(cfg, sql)]

    def read(view: str) -> dict[str, Any] | None:
        rows = rows_once_set_up(query, cfg, invariant_sql(view))
        if rows is None:
            return None
        (row,) = rows
        return row

    def equal_to_source(view: str) -> Callable[[], bool]:
        def check() -> bool:
            from pyspark.errors import AnalysisException

            try:
                return (lake(f"select id, balance from {ACCOUNTS}__{view} order by id") == source(f"select id, balance from {ACCOUNTS} order by id")
                        and lake(f"select id, src, dst, amount from {MOVES}__{view} order by id") == source(f"select * from {MOVES} order by id"))
            except AnalysisException:
                return False
        return check

    bed.connect.register(PREFIX, connector)
    stream = None
    try:
        bed.wait_streaming(connector)
        stream = Running(spark, cfg)
        with bed.postgres.connect(autocommit=False) as conn:  # the accounts open in one transaction: all visible or none
            for i in range(1, N_ACCOUNTS + 1):
                conn.execute(f"insert into {ACCOUNTS} values (%s, %s)", (i, OPENING))
            conn.commit()
        transfers.thread.start()

        reads: list[dict[str, Any]] = []
        all_moves = sum(map(len, transfers.plan))
        deadline = time.monotonic() + 400
        while not (reads and reads[-1]["moves"] == all_moves):
            assert transfers.error is None, transfers.error
            assert time.monotonic() < deadline, f"the consistent views never showed every move: {reads[-1:]}"
            row = read("consistent_view")
            if row is None:  # nothing landed yet
                stream.wait("the stream is running", lambda: True)  # raises at once if the stream has failed
                time.sleep(1.0)
                continue
            assert holds(row), f"read {len(reads) + 1} saw half a transaction: {row}"
            reads.append(row)
            transfers.seen(row["moves"])
            time.sleep(1.0)  # a reader, not a load test: leave the two cores to the stream for a moment
        transfers.thread.join(timeout=30)
        assert transfers.error is None, transfers.error
        between = {r["moves"] for r in reads} - {0, all_moves}
        assert len(between) >= MIN_STATES, f"the reads saw too few states while the workload ran: {sorted(between)}"

        assert source(f"select count(*) from {MOVES}") == [(all_moves,)]
        stream.wait("the full views equal the source tables", equal_to_source("full_view"))
        assert equal_to_source("consistent_view")(), "settled: the consistent views equal the source tables too"
        settled = ("select (select count(*) from transactions) as done, (select count(*) from incomplete_transactions) as incomplete, "
                   "(select count(*) from dead_letter) as dead")
        assert lake(settled) == [(TRANSFERS + 1, 0, 0)], "every transfer and the accounts' opening once; nothing incomplete or dead"
        seen = sorted({r["moves"] for r in reads})
        print(f"{len(reads)} consistent reads while {TRANSFERS} transfers landed, visible moves {seen}; "
              f"{lake('select count(*) from pipeline_metrics')[0][0]} batches")
    finally:
        transfers.stop.set()
        if stream is not None:
            stream.stop()
        bed.connect.delete(PREFIX)
        with bed.postgres.connect() as conn:
            for table in (MOVES, ACCOUNTS):
                conn.execute(f"drop table if exists {table}")
            conn.execute(f"select pg_drop_replication_slot(slot_name) from pg_replication_slots where slot_name = '{PREFIX}_slot' and not active")
