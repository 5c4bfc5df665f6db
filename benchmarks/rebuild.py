"""`cdc rebuild` of a table with a long history: time and the driver's peak memory.

The rebuild (and onboarding, which runs the same fold inside the stream) folds the table's whole raw-log
history; since 2026-11-28 on the executors (before, in the driver, whose memory followed the table's past:
`--package-root` on an older checkout shows it). One lake is built
once from a generated workload (`cdc run`, kept under benchmarks/out/rebuild and reused by later runs);
each measured run rebuilds `--table` in a fresh process of its own (so the peak is this run's), with the
driver Python's peak (VmHWM), the JVM's, and the raw-log events the table has.

`--package-root` runs an earlier checkout of the package on the same lake (e.g. a worktree of the commit
before a change), so before and after come from one harness:

    .venv/bin/python benchmarks/rebuild.py                                 # 200k change events, customers
    .venv/bin/python benchmarks/rebuild.py --package-root /tmp/wt-before
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="change events of the lake's workload (default 200,000)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--table", default="customers", help="the latest-state table to rebuild (default customers)")
    parser.add_argument("--package-root", type=Path, default=None, help="import cdc_platform from this checkout instead")
    args = parser.parse_args()
    from _common import OUT, MemorySampler, _status_kib, banner, built_lake, exit_now, load_average, memory_line, say, transactions_for, workload  # this checkout first

    if args.package_root is not None:
        sys.path.insert(0, str(args.package_root.resolve()))

    from pyspark.sql import functions as F

    import cdc_platform
    from cdc_platform import lake
    from cdc_platform.lake import lake_spark
    from cdc_platform.config import load_config, with_overrides
    from cdc_platform.stages.latest_state import rebuild_table
    from cdc_platform.spark.session import get_spark

    w = workload(transactions_for(args.events), args.seed)
    root = OUT / "rebuild"
    spark = get_spark("cdc-bench-rebuild")
    config = with_overrides(load_config(w.config_path), lake=root / "lake")
    built_lake(spark, config, root, w)

    table = config.table(args.table)
    history = lake_spark.read(spark, lake.table_path(config.lake, "raw_change_events")).where(F.col("table_id") == table.source).count()
    banner(f"cdc rebuild --table {table.name}")
    say(f"package: {Path(cdc_platform.__file__).parent}; {history:,} raw-log events of {table.source}   [{load_average()}]")
    base_mib = _status_kib(os.getpid(), "VmRSS") / 1024
    memory = MemorySampler().start()
    t0 = time.perf_counter()
    report = rebuild_table(config, table.name)
    seconds = time.perf_counter() - t0
    mem = memory.stop()
    say(f"rebuilt: {report.rows:,} rows, {report.history_rows:,} history rows, {report.dead_letters:,} dead letters in {seconds:.1f} s"
        f"   [{load_average()}]")
    say(memory_line(mem))
    grown = mem["driver_python_peak_mib"] - base_mib
    say(f"driver python: {base_mib:,.0f} MiB before, peak {grown:,.0f} MiB above that = {grown * 2**20 / max(history, 1):,.0f} bytes a raw-log event")
    exit_now(0)


if __name__ == "__main__":
    main()
