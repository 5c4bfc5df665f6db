"""A fresh lake's first `cdc run` in a warm session: the tables created the platform's way (a local table's
first commit by delta-rs, its checksum by Delta Kernel) against delta-spark's `createIfNotExists` (the way
before, and still an object store's), alternated in one process over the same landing files.

Every test and every first `cdc run` or `cdc demo` starts a lake: its set-up creates a dozen tables or more.

    .venv/bin/python benchmarks/fresh_lake.py                  # 4 rounds of the sample's 50 transactions
    .venv/bin/python benchmarks/fresh_lake.py --rounds 6 --transactions 500
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

from _common import OUT, alternating, banner, fresh_dir, load_average, say

from cdc_platform.config import load_config
from cdc_platform.lake import lake_spark
from cdc_platform.run.ingest import IngestJob
from cdc_platform.spark.session import get_spark
from cdc_platform.workload.generate import generate_workload

WAYS = {
    "delta-rs + Kernel checksum (now)": lake_spark._create_local,
    "delta-spark createIfNotExists (before)": lambda *args, **kwargs: None,  # `ensure_table` then creates with Spark
}


def one_run(spark: object, config_path: Path, way: str) -> tuple[float, float]:
    """(set-up seconds, whole first run seconds) of a fresh lake, its tables created `way`."""
    config = load_config(config_path)
    shutil.rmtree(config.lake, ignore_errors=True)
    lake_spark._create_local = WAYS[way]  # type: ignore[assignment]
    t = time.perf_counter()
    job = IngestJob(config)
    job.setup(spark)
    setup = time.perf_counter() - t
    job.run_available_now(spark)
    return setup, time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--transactions", type=int, default=50)
    args = parser.parse_args()
    root = fresh_dir(OUT / "fresh_lake")
    w = generate_workload(root, transactions=args.transactions, seed=7)
    spark = get_spark()
    banner(f"a fresh lake's first cdc run, {w.change_events:,} change events, {len(WAYS)} ways x {args.rounds} rounds")
    for way in WAYS:  # warm-up: each way's first run in this JVM is left out
        one_run(spark, w.config_path, way)
    figures: dict[str, list[tuple[float, float]]] = {way: [] for way in WAYS}
    for way in alternating(list(WAYS), args.rounds):
        figures[way].append(one_run(spark, w.config_path, way))
        say(f"{way}: set-up {figures[way][-1][0]:.2f} s, first run {figures[way][-1][1]:.2f} s  ({load_average()})")
    for way, runs in figures.items():
        say(f"{way}: median set-up {statistics.median(r[0] for r in runs):.2f} s, median first run {statistics.median(r[1] for r in runs):.2f} s")


if __name__ == "__main__":
    main()
