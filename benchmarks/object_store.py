"""The lake on an object store: `cdc run` into `s3a://` against the same run into a local folder.

Same workload, same Spark session (local[2], with Hadoop's S3A jars), a fresh lake each time: a local
folder, or a fresh bucket on moto's S3 server (`cdc_platform.testbed.object_store`, its own process on a
loopback port, objects in memory). A first local run warms the JVM up and is not counted (the first
run of a session took 72.6 s where the same run took 41.7 s later); then rounds alternate the order
(local first, then S3 first). Printed per run: the job's time, change events/s, micro-batches,
where the time went (`pipeline_metrics`' stage seconds), and the S3 server's CPU seconds; then a check
that both lakes hold the same rows per table.

What this measures is the S3A path's own cost (Delta's log on S3, listing instead of directories,
every write a PUT, the checkpoint on the store) on a server with no network in between; a real
store adds its latency to each of the ~11 commits a batch makes.

    .venv/bin/python benchmarks/object_store.py                      # 200k change events, 2 rounds
    .venv/bin/python benchmarks/object_store.py --events 50000 --rounds 1
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

from _common import OUT, banner, cpu_seconds, exit_now, fresh_dir, say, transactions_for, workload


def lake_rows(spark: Any, lake_dir: Any) -> dict[str, int]:
    from cdc_platform import lake
    from cdc_platform.lake import lake_spark

    return {name: lake_spark.read(spark, path).count() for name, path in sorted(lake.lake_tables(lake_dir).items())}


def run_once(spark: Any, config: Any, label: str) -> dict[str, Any]:
    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.stages.stage import RAW

    t0 = time.perf_counter()
    report = IngestJob(config).run_available_now(spark)
    seconds = time.perf_counter() - t0
    landed = report.landed().get(RAW, 0)
    stages = report.stage_seconds()
    say(f"{label}: {seconds:.1f} s, {landed / seconds:,.0f} change events/s, {len(report.batches)} batches; "
        + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    return {"label": label, "seconds": seconds, "landed": landed, "batches": len(report.batches), "stages": stages}


def main() -> None:
    from cdc_platform.config import DEFAULT_MAX_FILES_PER_TRIGGER, load_config
    from cdc_platform.spark.session import get_spark
    from cdc_platform.storage import lake_location, parse_object_store
    from cdc_platform.testbed.object_store import S3Server

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="change events to generate (default 200,000)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--rounds", type=int, default=2, help="rounds; each runs both lakes, the order alternating (default 2)")
    parser.add_argument("--max-files-per-trigger", type=int, default=DEFAULT_MAX_FILES_PER_TRIGGER)
    args = parser.parse_args()

    w = workload(transactions_for(args.events), args.seed)
    banner(f"object-store lake: {w.change_events:,} change events, {w.lines:,} lines in {w.facts['files']:,} files")
    work = fresh_dir(OUT / "object_store")
    spark = get_spark("cdc-bench-object-store", object_store=True)
    base = dataclasses.replace(load_config(w.config_path, environ={}), max_files_per_trigger=args.max_files_per_trigger)
    results: list[dict[str, Any]] = []
    with S3Server.start(work) as s3:
        store = parse_object_store(s3.object_store(), "benchmark", s3.environ())
        counts: dict[str, dict[str, int]] = {}
        run_once(spark, dataclasses.replace(base, lake=fresh_dir(work / "lake-warm-up")), "warm-up (not counted), local")
        for r in range(args.rounds):
            order = ("local", "s3") if r % 2 == 0 else ("s3", "local")
            for side in order:
                if side == "local":
                    lake_dir: Any = fresh_dir(work / f"lake-{r}")
                    config = dataclasses.replace(base, lake=lake_dir)
                else:
                    bucket = f"bench-{uuid.uuid4().hex[:10]}"
                    s3.create_bucket(bucket)
                    lake_dir = lake_location(f"s3a://{bucket}/cdc", store, "benchmark")
                    config = dataclasses.replace(base, lake=lake_dir, object_store=store)
                server_cpu = cpu_seconds(s3.service.pid or 0) or 0.0
                result = run_once(spark, config, f"round {r + 1}, {side}")
                result["server_cpu"] = (cpu_seconds(s3.service.pid or 0) or 0.0) - server_cpu
                if side == "s3":
                    say(f"  S3 server CPU: {result['server_cpu']:.1f} s")
                results.append(result | {"side": side})
                counts.setdefault(side, lake_rows(spark, lake_dir))
    for side in ("local", "s3"):
        runs = [x["seconds"] for x in results if x["side"] == side]
        say(f"{side}: {', '.join(f'{s:.1f}' for s in runs)} s (mean {sum(runs) / len(runs):.1f} s)")
    local_mean = sum(x["seconds"] for x in results if x["side"] == "local") / args.rounds
    s3_mean = sum(x["seconds"] for x in results if x["side"] == "s3") / args.rounds
    say(f"S3 over local: {s3_mean / local_mean:.2f}x the time; rows per table {'equal' if counts['local'] == counts['s3'] else 'DIFFER'}: "
        + ", ".join(f"{k} {v:,}" for k, v in counts["local"].items()))
    banner("done")


if __name__ == "__main__":
    main()
    exit_now(0)
