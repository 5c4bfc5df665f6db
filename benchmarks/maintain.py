"""`cdc maintain` on a small lake: its tables one after the other against side by side.

One lake is built once (`cdc run` of a generated sample, several micro-batches, so every table has
small files, pending latest-state changes and files to vacuum) and copied for every measured run, so
each run maintains the same lake. The runs share one warm session (a first, unmeasured run warms the
JVM) and alternate the settings (a b b a ...), so a load drifting on this shared machine falls on both.

    .venv/bin/python benchmarks/maintain.py                    # workers 1 against 4, two runs each
    .venv/bin/python benchmarks/maintain.py --workers 1,2,4 --repeat 3
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time

import yaml
from _common import OUT, alternating, banner, fresh_dir, say

from cdc_platform.config import load_config
from cdc_platform.workload.generate import generate_workload
from cdc_platform.run.ingest import IngestJob
from cdc_platform.maintenance import maintain
from cdc_platform.spark.session import get_spark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,4", help="tables maintained at a time, the settings to compare (default 1,4)")
    parser.add_argument("--repeat", type=int, default=2, help="measured runs of each setting")
    parser.add_argument("--transactions", type=int, default=300)
    args = parser.parse_args()
    settings = [int(w) for w in args.workers.split(",")]

    root = fresh_dir(OUT / "maintain")
    w = generate_workload(root / "input", transactions=args.transactions, seed=5, events_per_file=60, track_state=False)
    doc = yaml.safe_load(w.config_path.read_text(encoding="utf-8"))
    doc["max_files_per_trigger"] = 8  # several batches: small files and pending changes in every table
    w.config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    config = load_config(w.config_path)
    spark = get_spark("bench-maintain")
    banner(f"building the lake: {w.change_events:,} change events in {w.files} files")
    IngestJob(config).run_available_now(spark)
    template = root / "template"
    shutil.copytree(config.lake, template)

    def run(workers: int, n: int) -> float:
        lake_dir = root / f"lake-{n}"
        shutil.rmtree(lake_dir, ignore_errors=True)
        shutil.copytree(template, lake_dir)
        t0 = time.perf_counter()
        reports = maintain(spark, lake_dir, tables=config.tables, vacuum_hours=0, workers=workers)
        seconds = time.perf_counter() - t0
        say(f"  workers {workers}: {seconds:6.1f} s, {len(reports)} tables, {sum(r.folded for r in reports)} changes folded, "
            f"{sum(r.vacuumed for r in reports)} files vacuumed")
        shutil.rmtree(lake_dir, ignore_errors=True)
        return seconds

    banner("warm-up run (not counted)")
    run(settings[-1], 0)
    order = alternating(settings, args.repeat)
    banner(f"measured runs, in this order: {order}")
    seconds: dict[int, list[float]] = {s: [] for s in settings}
    for n, workers in enumerate(order, start=1):
        seconds[workers].append(run(workers, n))
    banner("medians")
    for workers in settings:
        say(f"  workers {workers}: {statistics.median(seconds[workers]):6.1f} s (n = {len(seconds[workers])})")


if __name__ == "__main__":
    main()
