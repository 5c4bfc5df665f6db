"""A snapshot backfill into a lake with a long history: time, CPU and the driver's peak memory.

A backfill decides each snapshot row against the raw log (DBLog's rule) and the latest state. What it
costs the driver is the question: the lake's history of the table can be far longer than the snapshot.
One lake is built once from a generated workload (`cdc run`, kept under benchmarks/out/backfill and
reused by later runs); each measured run is a dry run of a `customers` snapshot of `--rows` rows, half of
them keys the lake has, half new, in one warm session (a first, unmeasured run warms the JVM). Printed per
run: seconds, the diff, CPU by role and the peak memory of the driver's Python (VmHWM, reset before the
run), against the number of raw-log events the table has.

    .venv/bin/python benchmarks/backfill.py                        # 200k change events, 1,000 snapshot rows, 3 runs
    .venv/bin/python benchmarks/backfill.py --events 1000000 --rows 100000
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time

from _common import OUT, CpuByRole, MemorySampler, banner, built_lake, cpu_line, exit_now, say, transactions_for, workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="change events of the lake's workload (default 200,000)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--rows", type=int, default=1_000, help="snapshot rows, half of them keys the lake has (default 1,000)")
    parser.add_argument("--runs", type=int, default=3, help="measured dry runs (default 3)")
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from cdc_platform import backfill, lake
    from cdc_platform.lake import lake_spark
    from cdc_platform.config import load_config, with_overrides
    from cdc_platform.spark.session import get_spark

    w = workload(transactions_for(args.events), args.seed)
    root = OUT / "backfill"
    spark = get_spark("cdc-bench-backfill")
    config = with_overrides(load_config(w.config_path), lake=root / "lake", snapshots=root / "snapshots")
    built_lake(spark, config, root, w)

    table = config.table("customers")
    raw = lake_spark.read(spark, lake.table_path(config.lake, "raw_change_events")).where(F.col("table_id") == table.source)
    history = raw.count()
    known = [row["id"] for row in spark.sql(f"SELECT DISTINCT id FROM delta.`{lake.table_path(config.lake, 'customers')}` "
                                            f"WHERE id IS NOT NULL ORDER BY id LIMIT {args.rows // 2}").collect()]
    new = range(10**9, 10**9 + args.rows - len(known))
    snap = backfill.snapshot_dir(config, table)
    shutil.rmtree(snap, ignore_errors=True)
    snap.mkdir(parents=True)
    lines = [f"{i},Snap {i},snap{i}@example.com,NL" for i in [*known, *new]]
    (snap / "rows.csv").write_text("id,name,email,country\n" + "\n".join(lines) + "\n", encoding="utf-8")
    (snap / "as_of.json").write_text(json.dumps({"connector": "mysql", "file": "mysql-bin.000001", "pos": 4}), encoding="utf-8")
    banner(f"backfill dry runs: {len(lines):,} snapshot rows ({len(known):,} known keys) into a lake whose "
           f"{table.source} has {history:,} raw-log events")

    backfill.load_snapshot(config, "customers", dry_run=True)  # warm-up, not counted
    seconds: list[float] = []
    for n in range(args.runs):
        memory, cpu = MemorySampler().start(), CpuByRole().start()
        t0 = time.perf_counter()
        diff = backfill.load_snapshot(config, "customers", dry_run=True)
        wall = time.perf_counter() - t0
        used, mem = cpu.stop(), memory.stop()
        seconds.append(wall)
        say(f"run {n}: {wall:.2f} s; {diff.summary()}")
        say(f"  {cpu_line(used, wall)}")
        say(f"  peak memory of the driver's Python {mem['driver_python_peak_mib']:,.0f} MiB (VmHWM), JVM {mem['jvm_peak_mib']:,.0f} MiB")
    say(f"median {statistics.median(seconds):.2f} s over {len(seconds)} runs")
    exit_now(0)


if __name__ == "__main__":
    main()
