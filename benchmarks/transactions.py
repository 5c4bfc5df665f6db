"""Transaction aggregation throughput: events/s through the stage and peak state rows, sample workload.

    .venv/bin/python benchmarks/transactions.py                       # stage only, 400k transactions
    .venv/bin/python benchmarks/transactions.py --pipeline            # also the whole `cdc run` (Spark)
    .venv/bin/python benchmarks/transactions.py --transactions 100000 # smaller

The workload is `cdc_platform.workload.generate` (Debezium MySQL, BEGIN/END markers in their own topic, three
tables, duplicates, a late delivery, truncated lines), kept under benchmarks/out/ between runs.

Stage mode feeds the stage exactly what the stream would: landing files in modification-time order,
`max_files_per_trigger` files per micro-batch, parsed by the platform's parser and split by ingest's
`split_parsed`; only `TransactionStage` prepare + commit is timed, with its real Delta commits (outputs and the
state table). Events/s counts transactional change events plus markers entering the stage.

Pipeline mode runs `IngestJob.run_available_now` with only this stage after the raw log, and reads the
stage's seconds and state rows per batch back from `pipeline_metrics`.

For comparison, the issue's measurements on this machine (1M events, 100k transactions, local[2]):
transformWithStateInPandas 230-280 s, applyInPandasWithState 138-180 s, transformWithState (Row API)
58 s, a vectorised group-by merged into a Delta state table 15.7 s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python benchmarks/transactions.py` without installing the repo
    sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402
from _common import exit_now  # noqa: E402

from cdc_platform import lake
from cdc_platform.stages import transactions as T
from cdc_platform.config import PlatformConfig, load_config  # noqa: E402
from cdc_platform.parse.envelope import KeySpec, parse_line  # noqa: E402
from cdc_platform.run.ingest import IngestJob  # noqa: E402
from cdc_platform.parse.parsed_batches import rows_to_batch, split_parsed  # noqa: E402
from cdc_platform.stages.stage import BatchContext, apply_stage  # noqa: E402
from cdc_platform.stages.transactions import aggregation as tx_aggregation  # noqa: E402
from cdc_platform.stages.transactions import stage as tx_stage  # noqa: E402

OUT = REPO / "benchmarks" / "out"


def say(message: str) -> None:
    print(message, flush=True)


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def workload(transactions: int, seed: int) -> tuple[Path, PlatformConfig, Any]:
    from cdc_platform.workload.generate import generate_workload

    root = OUT / f"transactions-t{transactions}-s{seed}"
    done = root / ".complete"
    if not done.is_file():
        if root.exists():
            shutil.rmtree(root)
        t0 = time.perf_counter()
        w = generate_workload(root, transactions=transactions, seed=seed, track_state=False)
        done.write_text(f"{w.change_events} {w.markers} {w.duplicate_events} {w.malformed_lines}\n", encoding="utf-8")
        say(f"generated {transactions:,} transactions: {w.change_events:,} change events, {w.markers:,} markers, "
            f"{w.duplicate_events:,} duplicates, {w.malformed_lines} truncated lines in {w.files:,} files ({time.perf_counter() - t0:.1f} s)")
    facts = done.read_text(encoding="utf-8").split()
    config = load_config(root / "cdc.yaml")
    return root, config, {"change_events": int(facts[0]), "markers": int(facts[1]), "duplicates": int(facts[2]), "truncated": int(facts[3])}


def fresh_lake(config: PlatformConfig) -> None:
    if config.lake.exists():
        shutil.rmtree(config.lake)


def files_in_stream_order(landing: Path) -> list[Path]:
    """What Spark's file source does: oldest modification time first."""
    files = [p for p in landing.rglob("*") if p.is_file() and not p.name.startswith((".", "_"))]
    return sorted(files, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def run_stage(config: PlatformConfig, global_clock: bool = False) -> dict[str, Any]:
    fresh_lake(config)
    config.lake.mkdir(parents=True)
    stage = T.TransactionStage()
    stage.setup(config)
    keys = KeySpec(dict(config.keys_by_source))
    files = files_in_stream_order(config.landing)
    per = config.max_files_per_trigger
    timings = {"aggregate": 0.0}
    real_step = tx_stage.step  # what the stage calls each batch (aggregation on its held state)

    def timed_step(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return real_step(*args, **kwargs)
        finally:
            timings["aggregate"] += time.perf_counter() - t

    tx_stage.step = timed_step  # type: ignore[assignment]
    real_due = tx_aggregation._due  # what the step calls to judge expiry
    if global_clock:  # the rejected design: one event time for all streams, the max timestamp seen

        def one_clock(plan: Any, progress: dict[str, int], *args: Any) -> Any:
            top = max(progress.values(), default=None)
            return real_due(plan, {s: top for s in progress} if top is not None else progress, *args)

        tx_aggregation._due = one_clock  # type: ignore[assignment]
    seconds = parse_seconds = 0.0
    events = markers = 0
    peak_state = peak_open = 0
    rows: list[dict[str, Any]] = []
    try:
        for batch_id, start in enumerate(range(0, len(files), per)):
            t = time.perf_counter()
            parsed_rows = []
            for path in files[start:start + per]:
                name = str(path)
                with path.open(encoding="utf-8") as fh:
                    parsed_rows += [parse_line(line.rstrip("\n"), name, keys) for line in fh]
            batch = split_parsed(pa.Table.from_batches([rows_to_batch(parsed_rows)]), batch_id)
            parse_seconds += time.perf_counter() - t
            tx_events = batch.events.num_rows - batch.events.column("transaction_id").null_count
            t = time.perf_counter()
            result = apply_stage(stage, batch, BatchContext(config, "bench", batch_id))
            took = time.perf_counter() - t
            seconds += took
            events += tx_events
            markers += batch.markers.num_rows
            f = result.figures
            peak_state = max(peak_state, int(f.get("state_rows", 0)))
            peak_open = max(peak_open, int(f.get("open", 0)))
            rows.append({"batch": batch_id, "in": tx_events + batch.markers.num_rows, "seconds": took, **f})
    finally:
        tx_stage.step = real_step  # type: ignore[assignment]
        tx_aggregation._due = real_due  # type: ignore[assignment]
    return {
        "batches": rows, "seconds": seconds, "aggregate_seconds": timings["aggregate"], "parse_seconds": parse_seconds,
        "events": events, "markers": markers, "peak_state": peak_state, "peak_open": peak_open,
    }


def run_pipeline(config: PlatformConfig) -> dict[str, Any]:
    from cdc_platform.spark.session import get_spark

    fresh_lake(config)
    spark = get_spark("cdc-benchmark-transactions")
    t0 = time.perf_counter()
    report = IngestJob(config, stages=[T.TransactionStage()]).run_available_now(spark)
    total = time.perf_counter() - t0
    metrics = lake.open_table(lake.table_path(config.lake, "pipeline_metrics")).to_pyarrow_table().to_pylist()
    figures = [dict(m["stage_figures"] or []) for m in metrics]
    stage_seconds = sum(b.stage_seconds.get(T.TransactionStage.name, 0.0) for b in report.batches)
    return {
        "seconds": total, "stage_seconds": stage_seconds, "batches": len(report.batches),
        "lines": report.total("rows_read"),
        "peak_state": int(max((f.get("transactions.state_rows", 0) for f in figures), default=0)),
        "peak_open": int(max((f.get("transactions.open", 0) for f in figures), default=0)),
    }


def outcome(config: PlatformConfig) -> str:
    def table(name: str, columns: list[str]) -> pa.Table:
        return lake.open_table(lake.table_path(config.lake, name)).to_pyarrow_table(columns=columns)

    complete = table(T.TRANSACTIONS, ["transaction_id"]).num_rows
    reasons = Counter(table(T.INCOMPLETE, ["reason"]).column("reason").to_pylist())
    fates = Counter(table(T.LATE, ["fate"]).column("fate").to_pylist())
    wm = table(T.WATERMARK, ["source", "position", "open_transactions"]).to_pylist()
    return (
        f"  outcome: {complete:,} complete; incomplete {dict(reasons) or 0}; late arrivals by fate {dict(fates) or 0}\n"
        f"  consistency watermark: {wm}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=400_000, help="generated transactions (400k: ~550k change events + 800k markers)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--pipeline", action="store_true", help="also run the whole pipeline through Spark")
    parser.add_argument("--global-clock", action="store_true", help="also show what one max-timestamp clock for all streams would expire")
    args = parser.parse_args(argv)

    root, config, facts = workload(args.transactions, args.seed)
    say(f"== transaction aggregation == {dt.datetime.now():%Y-%m-%d %H:%M:%S}  {load()}")
    say(f"workload: {root} ({args.transactions:,} transactions, {facts['change_events']:,} change events, {facts['markers']:,} markers, "
        f"{facts['duplicates']:,} duplicates, {facts['truncated']} truncated lines); {config.max_files_per_trigger} files per batch, "
        f"timeout {config.transaction_timeout:g} s")

    r = run_stage(config)
    n = r["events"] + r["markers"]
    say(f"stage only: {len(r['batches'])} batches, {r['events']:,} transactional events + {r['markers']:,} markers = {n:,} in "
        f"{r['seconds']:.1f} s -> {n / r['seconds']:,.0f} events/s through the stage "
        f"({r['aggregate_seconds']:.1f} s aggregating, {r['seconds'] - r['aggregate_seconds']:.1f} s Delta commits; parsing, not timed: {r['parse_seconds']:.1f} s)")
    say(f"  peak state rows: {r['peak_state']:,} (peak open transactions {r['peak_open']:,})")
    say(f"  change events only: {r['events'] / r['seconds']:,.0f} events/s")
    for b in r["batches"]:
        say(f"    batch {b['batch']:>3}: {b['in']:>7,} in, {b['seconds']:5.2f} s, completed {int(b.get('completed', 0)):>6,}, "
            f"expired {int(b.get('expired', 0)):>3}, late {int(b.get('late', 0)):>4}, open {int(b.get('open', 0)):>5,}, state rows {int(b.get('state_rows', 0)):>6,}")
    say(outcome(config))
    say(f"  ({load()})")

    if args.global_clock:
        run_stage(config, global_clock=True)
        say("with one global clock (max timestamp over all streams) instead of one per stream:")
        say(outcome(config))

    if args.pipeline:
        p = run_pipeline(config)
        say(f"pipeline (cdc run, Spark parse + raw log + this stage): {p['lines']:,} lines in {p['batches']} batches, {p['seconds']:.1f} s; "
            f"the stage {p['stage_seconds']:.1f} s -> {n / p['stage_seconds']:,.0f} events/s through the stage; "
            f"peak state rows {p['peak_state']:,} (open {p['peak_open']:,})")
        say(outcome(config))
        say(f"  ({load()})")
    return 0


if __name__ == "__main__":
    exit_now(main())
