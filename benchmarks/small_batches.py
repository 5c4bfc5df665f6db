"""Small micro-batches: what one `cdc run` of a few dozen events costs a warm session, by Spark's generated-code cache.

A small batch is where the fixed cost of a micro-batch shows (the freshness target, and most of the test
suite): the same few planned queries and Delta commits, whatever the data. Each setting of
`spark.sql.codegen.cache.maxEntries` runs in a process of its own (a static setting, read when Spark
starts): `--runs` runs of `cdc run`, each into a fresh lake, on the same landing files (a generated
sample: multi-table transactions with their markers, a duplicate, a malformed line). Printed per run:
wall seconds, seconds inside the batch by step (`BatchReport.stage_seconds`), CPU seconds by role, and how
many classes Spark compiled with Janino (`CodegenMetrics`);
then medians over the runs after the first `--warmup` (the JVM's own warm-up).

    .venv/bin/python benchmarks/small_batches.py                          # Spark's default 100 against the session's 4,000
    .venv/bin/python benchmarks/small_batches.py --cache 100 --cache 4000 --runs 12 --transactions 40
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import OUT, CpuByRole, banner, exit_now, fresh_dir, say

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def child(cache: int, runs: int, transactions: int) -> None:
    """One process, one Spark session with the given cache size: `runs` runs, a JSON line per run on stdout."""
    from cdc_platform.config import load_config
    from cdc_platform.generate import generate_workload
    from cdc_platform.ingest import IngestJob
    from cdc_platform.session import get_spark

    root = fresh_dir(OUT / "small_batches" / f"cache-{cache}")
    sample = generate_workload(root / "sample", transactions=transactions, seed=7, track_state=False)
    spark = get_spark("bench-small-batches", conf={"spark.sql.codegen.cache.maxEntries": str(cache)})
    codegen = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics  # type: ignore[attr-defined]
    for n in range(runs):
        run_root = root / f"run-{n}"
        shutil.copytree(sample.landing_dir, run_root / "landing")
        shutil.copy(sample.config_path, run_root / "cdc.yaml")
        config = load_config(run_root / "cdc.yaml", lake=run_root / "lake")
        compiles = codegen.METRIC_COMPILATION_TIME().getCount()
        cpu = CpuByRole().start()
        t = time.perf_counter()
        report = IngestJob(config).run_available_now(spark)
        wall = time.perf_counter() - t
        row: dict[str, Any] = {
            "run": n, "wall": wall, "cpu": cpu.stop(), "compiles": codegen.METRIC_COMPILATION_TIME().getCount() - compiles,
            "batches": len(report.batches), "lines": report.total("rows_read"),
            "batch_seconds": sum(b.seconds for b in report.batches),
            "stages": {k: sum(b.stage_seconds.get(k, 0.0) for b in report.batches) for k in report.batches[0].stage_seconds},
        }
        print(json.dumps(row), flush=True)
        shutil.rmtree(run_root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=int, action="append", help="spark.sql.codegen.cache.maxEntries (repeatable; default 100 and 4000)")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="runs left out of the medians (default 3)")
    parser.add_argument("--transactions", type=int, default=20, help="source transactions in the sample (default 20)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.runs, args.transactions)
        exit_now(0)
    for cache in args.cache or [100, 4000]:
        banner(f"spark.sql.codegen.cache.maxEntries = {cache}: {args.runs} runs of {args.transactions} transactions")
        out = subprocess.run([sys.executable, __file__, "--child", str(cache), "--runs", str(args.runs), "--transactions", str(args.transactions)],
                             capture_output=True, text=True, cwd=REPO)
        if out.returncode != 0:
            say(out.stderr[-3000:])
            exit_now(out.returncode)
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        for r in rows:
            cpu = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["cpu"].items(), key=lambda kv: -kv[1]))
            stages = " ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
            say(f"  run {r['run']:2d}: {r['wall']:5.2f} s (in batches {r['batch_seconds']:.2f}: {stages}), {r['batches']} batch(es), "
                f"{r['lines']} lines, {r['compiles']:3d} compiles; CPU s: {cpu}")
        warm = rows[args.warmup:]
        if warm:
            jvm = statistics.median(r["cpu"].get("jvm", 0.0) for r in warm)
            say(f"  median of runs {args.warmup}-{len(rows) - 1}: {statistics.median(r['wall'] for r in warm):.2f} s wall, "
                f"{statistics.median(r['batch_seconds'] for r in warm):.2f} s in batches, "
                f"{jvm:.1f} s JVM CPU, {statistics.median(r['compiles'] for r in warm):.0f} compiles")
    banner("done")
    exit_now(0)


if __name__ == "__main__":
    main()
