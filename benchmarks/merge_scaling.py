"""Does the cost of applying a batch of changes grow with the latest-state table? Measured, not assumed.

For tables of 100k, 1M and 10M rows (written directly with delta-rs as a compacted base, the way
compaction leaves them) and two key patterns, uniformly random keys and keys skewed to recent rows
(90% among the newest 1% of keys, the rest anywhere; 80% updates, 10% inserts, 10% deletes):

* apply: `LatestStateStage` prepare + commit on a 10k-change micro-batch, exactly what the stream runs per batch
  (JSON row images typed, folded per key, appended to the delta layer with its exactly-once guard);
  median of `--batches` batches after one warm-up batch;
* full view: Spark SQL over `<name>__full_view` with those batches pending (the view folds base and
  delta): a full count, an aggregate over every row, and a point lookup; best of `--repeats`;
* compaction: folding the pending changes into the base (a copy-on-write delta-rs MERGE), and the same
  for a single 10k batch, which is what a copy-on-write design would pay on *every* batch.

    .venv/bin/python benchmarks/merge_scaling.py                    # 100k, 1M, 10M (a few minutes)
    .venv/bin/python benchmarks/merge_scaling.py --sizes 100000 1000000

The machine is shared (2 cores), so the load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _common import banner, exit_now, load_average, say  # noqa: E402
from deltalake import write_deltalake  # noqa: E402

from cdc_platform import lake, schemas  # noqa: E402
from cdc_platform.config import PlatformConfig, parse_config  # noqa: E402
from cdc_platform.stage import BatchContext, ParsedBatch, apply_stage  # noqa: E402
from cdc_platform.latest_state import (  # noqa: E402
    BASE,
    DELTA,
    LAYER,
    META_FIELDS,
    LatestStateStage,
    compact,
    ensure_tables,
)

OUT = REPO / "benchmarks" / "out" / "merge_scaling"
SOURCE = "bench.customers"
NAME = "customers"
BATCH = 10_000
COUNTRIES = np.array(["NL", "US", "DE", "FR", "GB", "BR", "IN", "JP"])
T0_MS = 1_767_225_600_000


def position(n: np.ndarray | int) -> Any:
    """MySQL-style position text (binlog file 1, pos n, row 0), the same shape the parser writes."""
    if isinstance(n, (int, np.integer)):
        return f"{1:010d}{int(n):020d}{0:010d}"
    return pc.binary_join_element_wise("0000000001", pc.utf8_lpad(pc.cast(pa.array(n), pa.string()), 20, "0"), "0000000000", "")


# --- the base table -----------------------------------------------------------------------------

def base_chunk(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi, dtype=np.int64)
    n = hi - lo
    rng = np.random.default_rng(lo)
    text = pc.cast(pa.array(ids), pa.string())
    ts = pa.array(T0_MS * 1000 + ids * 1000, pa.int64()).cast(schemas.TS)
    data = {
        "id": pa.array(ids),
        "name": pc.binary_join_element_wise("customer-", text, ""),
        "email": pc.binary_join_element_wise("user", text, "@example.com", ""),
        "country": pa.array(COUNTRIES[rng.integers(0, len(COUNTRIES), n)]),
        "amount": pa.array(np.round(rng.random(n) * 1000, 2)),
        "updated_at": pa.array(T0_MS + ids, pa.int64()),
        "_op": pa.array(np.full(n, "r", dtype=object), pa.string()),
        "_deleted": pa.array(np.zeros(n, dtype=bool)),
        "_position": position(ids),
        "_source_ts": ts,
        "_transaction_id": pa.nulls(n, pa.string()),
        "_ingested_at": ts,
        "_event_id": pc.binary_join_element_wise("base-", text, ""),
        "_seq": pa.array(np.zeros(n, dtype=np.int64)),
        LAYER: pa.array(np.full(n, BASE, dtype=object), pa.string()),
    }
    return pa.table(data)


def write_base(path: Path, rows: int) -> float:
    t0 = time.perf_counter()
    if path.exists():
        shutil.rmtree(path)
    schema = base_chunk(0, 1).schema
    assert [f.name for f in schema][-len(META_FIELDS):] == [f.name for f in META_FIELDS]

    def chunks() -> Iterator[pa.RecordBatch]:
        step = 1_000_000
        for lo in range(0, rows, step):
            yield from base_chunk(lo, min(rows, lo + step)).to_batches()

    write_deltalake(str(path), pa.RecordBatchReader.from_batches(schema, chunks()), partition_by=[LAYER])
    return time.perf_counter() - t0


# --- change batches ------------------------------------------------------------------------------

def change_keys(rng: np.random.Generator, rows: int, pattern: str, next_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, ops) for one batch: 80% updates, 10% inserts of new ids, 10% deletes."""
    ops = rng.choice(np.array(["u", "c", "d"]), size=BATCH, p=[0.8, 0.1, 0.1])
    if pattern == "uniform":
        ids = rng.integers(0, rows, BATCH)
    else:  # 90% among the newest 1% of keys, 10% anywhere
        recent = max(1, rows // 100)
        ids = np.where(rng.random(BATCH) < 0.9, rows - 1 - rng.integers(0, recent, BATCH), rng.integers(0, rows, BATCH))
    inserts = ops == "c"
    ids[inserts] = np.arange(next_id, next_id + int(inserts.sum()))
    return ids, ops


def change_batch(batch_id: int, ids: np.ndarray, ops: np.ndarray, first_pos: int, rng: np.random.Generator) -> ParsedBatch:
    """A parsed micro-batch of Debezium-shaped change events (what `ingest.split_parsed` hands the stages)."""
    n = len(ids)
    now = dt.datetime.now(dt.timezone.utc)
    countries = COUNTRIES[rng.integers(0, len(COUNTRIES), n)]
    amounts = np.round(rng.random(n) * 1000, 2)
    keys, befores, afters = [], [], []
    for i, (k, op) in enumerate(zip(ids.tolist(), ops.tolist())):
        row = {"id": k, "name": f"customer-{k}", "email": f"user{k}@example.com", "country": str(countries[i]),
               "amount": float(amounts[i]), "updated_at": T0_MS + first_pos + i}
        keys.append(f'{{"id":{k}}}')
        befores.append(json.dumps({"id": k}) if op == "d" else None)
        afters.append(None if op == "d" else json.dumps(row, separators=(",", ":")))
    pos = np.arange(first_pos, first_pos + n)
    ts = pa.array((T0_MS + pos) * 1000, pa.int64()).cast(schemas.TS)
    cols: dict[str, Any] = {
        "event_id": pc.binary_join_element_wise(f"b{batch_id}-", pc.cast(pa.array(pos), pa.string()), ""),
        "event_date": pa.array([now.date()] * n, pa.date32()),
        "table_id": pa.array([SOURCE] * n),
        "source_connector": pa.array(["mysql"] * n),
        "op": pa.array(ops.tolist()),
        "key": pa.array(keys),
        "before": pa.array(befores, pa.string()),
        "after": pa.array(afters, pa.string()),
        "position": position(pos),
        "position_kind": pa.array(["mysql_binlog"] * n),
        "source_ts": ts,
        "envelope_ts": ts,
        "snapshot": pa.array([False] * n),
        "ingested_at": pa.array([now] * n, schemas.TS),
    }
    events = pa.table({f.name: cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in schemas.RAW_CHANGE_EVENTS},
                      schema=schemas.RAW_CHANGE_EVENTS)
    empty = lambda s: s.empty_table()  # noqa: E731
    return ParsedBatch(batch_id=batch_id, events=events, markers=empty(schemas.TRANSACTION_MARKERS), dead_letters=empty(schemas.DEAD_LETTER),
                       tombstones=0, rows_read=n, in_batch_duplicates=0, ingested_at=now)


# --- measuring -------------------------------------------------------------------------------------

class Bench:
    """One generated latest-state table and the stream position reached on it."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        root = OUT / f"rows-{rows}"
        if root.exists():
            shutil.rmtree(root)
        (root / "landing").mkdir(parents=True)
        self.cfg: PlatformConfig = parse_config({"landing": "landing", "lake": "lake", "tables": {SOURCE: {"key": ["id"]}}}, base=root)
        self.path = lake.table_path(self.cfg.lake, NAME)
        self.generate_seconds = write_base(self.path, rows)
        ensure_tables(self.cfg.lake, self.cfg.tables[0])
        lake.write_registry(self.cfg)
        self.mib = sum(f.stat().st_size for f in self.path.rglob("*.parquet")) / 2**20
        self.rng = np.random.default_rng(rows)
        self.next_id, self.next_pos, self.batch_id = rows, rows + 1, 0
        # Compaction is measured on its own below, never inside an apply.
        self.stage = LatestStateStage(compact_min_changes=10**12)

    def apply(self, pattern: str) -> float:
        ids, ops = change_keys(self.rng, self.rows, pattern, self.next_id)
        self.next_id += int((ops == "c").sum())
        batch = change_batch(self.batch_id, ids, ops, self.next_pos, self.rng)
        self.next_pos += BATCH
        t = time.perf_counter()
        apply_stage(self.stage, batch, BatchContext(self.cfg, "bench", self.batch_id))
        self.batch_id += 1
        return time.perf_counter() - t

    def compact(self) -> tuple[int, float]:
        t = time.perf_counter()
        folded = compact(self.path, self.cfg.tables[0]).folded
        return folded, time.perf_counter() - t

    def pending(self) -> int:
        actions = pa.table(lake.open_table(self.path).get_add_actions(flatten=True))
        col = f"partition.{LAYER}"
        return int(sum(n for layer, n in zip(actions.column(col).to_pylist(), actions.column("num_records").to_pylist()) if layer == DELTA))


def queries(rows: int, pattern: str) -> dict[str, str]:
    probe = rows - 1 if pattern == "recent" else rows // 2
    return {
        "count": f"SELECT count(*) FROM {NAME}__full_view",
        "aggregate": f"SELECT country, count(*), sum(amount) FROM {NAME}__full_view GROUP BY country",
        "lookup": f"SELECT * FROM {NAME}__full_view WHERE id = {probe}",
    }


def measure(spark: Any, benches: list[Bench], pattern: str, batches: int, repeats: int) -> list[dict[str, Any]]:
    """Round-robin over the table sizes, so a change in the machine's load hits every size alike."""
    from cdc_platform.views import register_lake

    applies: dict[int, list[float]] = {b.rows: [] for b in benches}
    for round_ in range(batches + 1):
        for b in benches:
            seconds = b.apply(pattern)
            if round_:  # the first round warms caches
                applies[b.rows].append(seconds)
    best: dict[int, dict[str, float]] = {b.rows: {} for b in benches}
    for _ in range(repeats):
        for b in benches:
            register_lake(spark, b.cfg.lake)  # the view names are the same in every lake: register, then query
            for label, sql in queries(b.rows, pattern).items():
                t = time.perf_counter()
                spark.sql(sql).collect()
                best[b.rows][label] = min(best[b.rows].get(label, float("inf")), time.perf_counter() - t)
    results = []
    for b in benches:
        pending = b.pending()
        folded, compact_all = b.compact()
        b.apply(pattern)
        _, cow = b.compact()  # one 10k batch into the base: what copy-on-write pays per batch
        r = {"rows": b.rows, "pattern": pattern, "apply": statistics.median(applies[b.rows]), "apply_min": min(applies[b.rows]),
             "apply_max": max(applies[b.rows]), "pending": pending, "folded": folded, "compact": compact_all, "cow": cow, **best[b.rows]}
        say(f"  {b.rows:>10,} {pattern:<8} apply median {r['apply']:.3f} s (min {r['apply_min']:.3f}, max {r['apply_max']:.3f}); "
            f"full view with {pending:,} pending: count {r['count']:.2f} s, aggregate {r['aggregate']:.2f} s, lookup {r['lookup']:.2f} s; "
            f"compaction of {folded:,} {compact_all:.2f} s, of one batch {cow:.2f} s  [{load_average()}]")
        results.append(r)
    return results


def threshold_compaction(b: Bench) -> dict[str, Any]:
    """The stream's own compaction at its threshold (max(100k, 10% of the base) pending changes, uniform
    keys: the worst case), and what it adds per 10k batch when spread over the batches that filled it."""
    from cdc_platform.latest_state import COMPACT_MIN_CHANGES, COMPACT_RATIO

    pending = int(max(COMPACT_MIN_CHANGES, COMPACT_RATIO * b.rows))
    rng = np.random.default_rng(7)
    chunk = base_chunk(0, pending)
    chunk = chunk.set_column(0, "id", pa.array(rng.integers(0, b.rows, pending)))
    chunk = chunk.set_column(chunk.schema.get_field_index("_position"), "_position", position(np.arange(b.next_pos, b.next_pos + pending)))
    chunk = chunk.set_column(chunk.schema.get_field_index("_op"), "_op", pa.array(["u"] * pending))
    chunk = chunk.set_column(chunk.schema.get_field_index("_seq"), "_seq", pa.array(np.full(pending, 10**6, dtype=np.int64)))
    chunk = chunk.set_column(chunk.schema.get_field_index(LAYER), LAYER, pa.array([DELTA] * pending))
    b.next_pos += pending
    for i in range(0, pending, BATCH):  # one file per batch, as the stream writes them
        write_deltalake(str(b.path), chunk.slice(i, BATCH), mode="append", partition_by=[LAYER])
    _, seconds = b.compact()
    r = {"rows": b.rows, "pattern": "threshold", "pending": pending, "compact": seconds, "per_batch": seconds * BATCH / pending}
    say(f"  {b.rows:>10,} rows: stream compaction at its threshold, {pending:,} pending changes folded in {seconds:.2f} s "
        f"= {r['per_batch']:.3f} s per 10k batch amortised  [{load_average()}]")
    return r


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--patterns", nargs="+", default=["uniform", "recent"], choices=["uniform", "recent"])
    parser.add_argument("--batches", type=int, default=8, help="measured 10k-change batches per size and pattern (after one warm-up round)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per view query (the best is kept)")
    args = parser.parse_args()

    from cdc_platform.session import get_spark

    started = time.perf_counter()
    banner("merge_scaling")
    spark = get_spark("cdc-merge-scaling")
    sizes = sorted(args.sizes)
    say("warm-up on 10,000 rows (JIT, Python workers, caches; not part of the figures):")
    warm = Bench(10_000)
    measure(spark, [warm], "uniform", 1, 1)
    shutil.rmtree(OUT / "rows-10000", ignore_errors=True)
    say("generating:")
    benches = []
    for rows in sizes:
        benches.append(Bench(rows))
        say(f"  {rows:>10,} rows in {benches[-1].generate_seconds:.1f} s ({benches[-1].mib:,.0f} MiB of Parquet)  [{load_average()}]")
    results: list[dict[str, Any]] = []
    for pattern in args.patterns:
        say(f"{pattern} keys, sizes interleaved:")
        results += measure(spark, benches, pattern, args.batches, args.repeats)
    say("compaction by the stream at its threshold:")
    thresholds = [threshold_compaction(b) for b in benches]

    say("")
    say(f"Applying one {BATCH:,}-change batch (LatestStateStage prepare + commit: median of {args.batches}) and querying the full view with those batches pending")
    header = f"{'rows':>11} {'keys':<8} {'apply s':>8} {'pending':>8} {'count s':>8} {'agg s':>7} {'lookup s':>9} {'compact s':>10} {'CoW 10k s':>10}"
    say(header)
    say("-" * len(header))
    for r in results:
        say(f"{r['rows']:>11,} {r['pattern']:<8} {r['apply']:>8.3f} {r['pending']:>8,} {r['count']:>8.2f} {r['aggregate']:>7.2f} {r['lookup']:>9.2f} "
            f"{r['compact']:>10.2f} {r['cow']:>10.2f}")
    say("")
    small, large = sizes[0], sizes[-1]
    if small != large:
        for pattern in args.patterns:
            by = {r["rows"]: r for r in results if r["pattern"] == pattern}
            say(f"{pattern:<8} largest/smallest ({large:,} vs {small:,} rows): apply {by[large]['apply'] / by[small]['apply']:.2f}x "
                f"(target <= 1.5x), full-view count {by[large]['count'] / by[small]['count']:.2f}x, "
                f"copy-on-write MERGE of one batch {by[large]['cow'] / by[small]['cow']:.2f}x")
    say("")
    say("Compaction by the stream at its threshold, max(100k, 10% of the base) pending changes with uniform keys (the worst case):")
    for r in thresholds:
        say(f"{r['rows']:>11,} rows: {r['pending']:>9,} changes folded in {r['compact']:6.2f} s = {r['per_batch']:.3f} s per 10k-change batch amortised")
    say(f"total {time.perf_counter() - started:.0f} s, {load_average()}")
    (OUT / "results.json").write_text(json.dumps(results + thresholds, indent=2), encoding="utf-8")


if __name__ == "__main__":
    exit_now(main())
