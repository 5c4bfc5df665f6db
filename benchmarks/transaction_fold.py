"""Where the transaction stage folds a batch: the driver stage against the executors' buckets, on the same batches.

`SparkTransactionStage` runs a batch either on the driver (`TransactionStage`, the step over the collected
batch) or on the executors (transactions hashed into buckets, cogrouped into Python workers); in local mode
it takes the driver up to `LOCAL_BATCH_ROWS` events and markers (`spark_stage.py`). This benchmark shows why:
the sample workload is cut into `--slices` consecutive slices of its landing files (in landing order); each
slice is landed, ingested into the raw log alone, and then the transaction stage's query drains it, so every
stage batch is one slice carrying the state the earlier ones left. Each way runs on its own lake from the
same files, in one session; `--reverse` runs the executors second (the first way also warms the JVM).

Printed per slice: the drain's wall seconds, the stage's own seconds, its events and markers, the state rows
it holds after, and which way it ran; then each way's sum over the slices after the first.

    .venv/bin/python benchmarks/transaction_fold.py                       # 300,000 transactions in 8 slices
    .venv/bin/python benchmarks/transaction_fold.py --reverse
    .venv/bin/python benchmarks/transaction_fold.py --transactions 40000 --slices 1
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from _common import OUT, banner, fresh_dir, load_average, say, workload

#: Each way: its name and the stage's bounds (`small_batch_rows=0`: every batch on the executors).
WAYS = {"executors": {"small_batch_rows": 0}, "driver": {"small_batch_rows": 10**9, "small_state_rows": 10**9}}


def slices(landing: Path, n: int) -> list[list[Path]]:
    """The landing files in landing order (modification time, then name), cut into `n` consecutive slices."""
    files = sorted((p for p in landing.rglob("*") if p.is_file()), key=lambda p: (p.stat().st_mtime, str(p)))
    return [files[i * len(files) // n:(i + 1) * len(files) // n] for i in range(n)]


def run_way(spark: Any, name: str, w: Any, cut: list[list[Path]]) -> list[float]:
    from cdc_platform import lake
    from cdc_platform.config import load_config
    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.stages.stage import PROGRESS
    from cdc_platform.stages.transactions import SparkTransactionStage

    root = fresh_dir(OUT / "transaction_fold" / name)
    (root / "landing").mkdir()
    shutil.copy(w.config_path, root / "cdc.yaml")
    config = load_config(root / "cdc.yaml")
    stage = SparkTransactionStage(**WAYS[name])
    seconds = []
    for i, files in enumerate(cut):
        for path in files:
            target = root / "landing" / path.relative_to(w.landing)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        IngestJob(config, stages=[]).run_available_now(spark)  # the raw log alone
        t0 = time.perf_counter()
        IngestJob(config, stages=[stage]).run_available_now(spark)  # nothing new to ingest: the stage drains the slice
        wall = time.perf_counter() - t0
        rows = lake.open_table(lake.table_path(config.lake, PROGRESS)).to_pyarrow_table().to_pylist()
        last = max((r for r in rows if r["query"] == stage.name), key=lambda r: r["batch_id"])
        figures = dict(last["stage_figures"])
        way = "driver" if figures.get("transactions.driver_batches") else "executors"
        seconds.append(dict(last["stage_seconds"])[stage.name])
        say(f"{name:9s} slice {i}: drain {wall:6.2f} s, stage {seconds[-1]:6.2f} s, {last['events']:,} events, {last['markers']:,} markers, "
            f"state rows {int(figures.get('transactions.state_rows', 0)):,}, ran on the {way}  [{load_average()}]")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transactions", type=int, default=300_000, help="source transactions in the workload (default 300,000)")
    parser.add_argument("--slices", type=int, default=8, help="stage batches the workload is cut into (default 8)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--reverse", action="store_true", help="run the driver first, the executors second")
    args = parser.parse_args()

    from cdc_platform.spark.session import get_spark

    w = workload(args.transactions, args.seed)
    cut = slices(w.landing, args.slices)
    spark = get_spark("cdc-benchmark-transaction-fold")
    banner(f"transaction fold: {args.transactions:,} transactions in {args.slices} stage batches, driver against executors")
    order = ["driver", "executors"] if args.reverse else ["executors", "driver"]
    totals = {name: run_way(spark, name, w, cut) for name in order}
    for name, seconds in totals.items():
        rest = seconds[1:] or seconds
        say(f"{name:9s}: the stage {sum(seconds):.1f} s over {len(seconds)} batches; after the first, {sum(rest):.1f} s, "
            f"{min(rest):.2f}-{max(rest):.2f} s a batch")


if __name__ == "__main__":
    main()
