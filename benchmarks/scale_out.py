"""Scale-out: `cdc run` on a Spark standalone cluster with one worker and with two (one core each), same workload.

Each configuration gets a fresh cluster (`cdc_platform.spark.cluster.LocalCluster`: master and workers on
127.0.0.1, from pyspark's own classes) and a fresh lake, and `cdc run --master spark://...` runs as a
process of its own, exactly as a user runs it. Printed per configuration:

* change events/s over the job's own time (`cdc run`'s "done in", without Spark's start-up), and the
  process's wall time (with it);
* where the job's time went, from `pipeline_metrics`: Spark outside `foreachBatch` (trigger, listing,
  planning), and inside it `collect` (the executors read the batch's files and ship its lines to the
  driver), `parse`, the raw log, each stage, dead letters;
* CPU seconds used by the driver (the `cdc run` process, its JVM and parser pool), by the executors (and
  their Python workers) and by the master and workers themselves, sampled from /proc every 0.5 s (a lower
  bound: a process's last half second before it exits can be missed);
* the load average before and after.

Then the ratio of events/s, two workers over one (target >= 1.7), and a check that both lakes hold the
same rows per table and full view and read every line. The machine has 2 cores, which the driver, the
executors and anything else running share; the load average says how much else there was.

    .venv/bin/python benchmarks/scale_out.py                   # >= 1M change events (the issue's size)
    .venv/bin/python benchmarks/scale_out.py --events 200000 --repeat 2   # a moderate size, rounds 1,2 then 2,1
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _common import OUT, REPO, banner, cpu_seconds, descendants, exit_now, fresh_dir, load_average, say, transactions_for, workload

from cdc_platform.config import DEFAULT_MAX_FILES_PER_TRIGGER
from cdc_platform.stages.stage import summed

RUN_DIR = OUT / "scale_out"


@dataclass
class CpuSampler:
    """CPU seconds per group of process trees (name -> root pids), sampled; each pid counts its highest reading."""

    roots: dict[str, list[int]]
    own_roots: bool = True  # count the root processes themselves, not only their descendants
    interval: float = 0.5
    seen: dict[str, dict[int, float]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> CpuSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def sample(self) -> None:
        for name, roots in self.roots.items():
            group = self.seen.setdefault(name, {})
            for root in roots:
                for pid in ([root] if self.own_roots else []) + descendants(root):
                    cpu = cpu_seconds(pid)
                    if cpu is not None:
                        group[pid] = max(group.get(pid, 0.0), cpu)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return {name: sum(pids.values()) for name, pids in self.seen.items()}


def run_config(w: Any, workers: int, args: argparse.Namespace, label: str) -> dict[str, Any]:
    """A fresh cluster of `workers` one-core workers, a fresh lake, one `cdc run --master`; its figures."""
    import yaml

    from cdc_platform.spark.cluster import LocalCluster

    root = fresh_dir(RUN_DIR / label)
    lake = root / "lake"
    doc = yaml.safe_load(w.config_path.read_text(encoding="utf-8"))
    doc.update(landing=str(w.landing), lake=str(lake), max_files_per_trigger=args.max_files_per_trigger)
    config = root / "cdc.yaml"
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")

    cluster = LocalCluster(workers, cores=1, memory=args.worker_memory, work_dir=root / "cluster")
    cluster.start()
    try:
        say(f"[{label}] cluster {cluster.master_url}: {workers} worker(s) ALIVE in {cluster.started_seconds:.1f} s  [{load_average()}]")
        load_before = load_average()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        command = [sys.executable, "-m", "cdc_platform", "run", "--config", str(config), "--master", cluster.master_url]
        log_path = root / "cdc-run.log"
        t0 = time.perf_counter()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
            servers = [s.pid for s in cluster.servers if s.pid is not None]  # the master, then the workers
            driver = CpuSampler({"driver": [proc.pid]}).start()
            executors = CpuSampler({"executors": servers[1:]}, own_roots=False).start()  # the workers' children
            proc.wait()
            wall = time.perf_counter() - t0
            driver_cpu = driver.stop().get("driver", 0.0)
            executor_cpu = executors.stop().get("executors", 0.0)
        server_cpu = sum(cpu_seconds(pid) or 0.0 for pid in servers)
        text = log_path.read_text(encoding="utf-8", errors="replace")
        if proc.returncode != 0:
            raise SystemExit(f"[{label}] cdc run failed with {proc.returncode}; log {log_path}:\n{text[-3000:]}")
        m = re.search(r"\[cdc\] done in ([0-9.]+) s: (\d+) batch", text)
        if m is None:
            raise SystemExit(f"[{label}] no 'done in' line in {log_path}")
        job_s, batches = float(m.group(1)), int(m.group(2))
        app: dict[str, Any] = {}
        for _ in range(40):  # the master files the application as completed once the driver has gone
            done = cluster.state().get("completedapps") or []
            if done:
                app = done[-1]
                break
            time.sleep(0.25)
    finally:
        cluster.stop(keep_logs=True)
    result = {
        "workers": workers,
        "job_seconds": job_s,
        "wall_seconds": wall,
        "batches": batches,
        "events_per_s": w.change_events / job_s,
        "cpu_seconds": {"driver": driver_cpu, "executors": executor_cpu, "master_and_workers": server_cpu},
        "app_cores": app.get("cores"),
        "load_before": load_before,
        "load_after": load_average(),
        "lake": str(lake),
    }
    say(
        f"[{label}] cdc run: {job_s:.1f} s = {result['events_per_s']:,.0f} change events/s ({batches} batches; process wall "
        f"{wall:.1f} s with Spark's start); the application held {app.get('cores')} core(s)  [{result['load_after']}]"
    )
    say(
        f"[{label}] CPU seconds: driver (cdc run's Python, its JVM, parser pool) {driver_cpu:.1f}, executors {executor_cpu:.1f}, "
        f"master and workers (since their start) {server_cpu:.1f}"
    )
    return result


def inspect(spark: Any, lake_dir: Path) -> dict[str, Any]:
    """Rows per table and full view, and where each batch's time went (pipeline_metrics), through the public views."""
    from cdc_platform.views import register_lake

    names = register_lake(spark, lake_dir)
    wanted = [n for n in names if ("__" not in n or n.endswith("__full_view")) and n != "pipeline_metrics"]
    counts = {n: spark.sql(f"SELECT count(*) AS n FROM `{n}`").collect()[0]["n"] for n in wanted}
    rows = [r.asDict(recursive=True) for r in spark.sql(
        "SELECT batch_id, started_at, finished_at, rows_read, stage_seconds FROM pipeline_metrics ORDER BY batch_id"
    ).collect()]
    inside = sum((r["finished_at"] - r["started_at"]).total_seconds() for r in rows)
    by_step: dict[str, float] = summed(r["stage_seconds"] or {} for r in rows)
    return {"counts": counts, "rows_read": sum(r["rows_read"] for r in rows), "inside_foreach_batch": inside, "by_step": by_step}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="at least this many change events (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=11, help="workload seed (default 11, the throughput benchmark's)")
    parser.add_argument("--events-per-file", type=int, default=500)
    parser.add_argument("--max-files-per-trigger", type=int, default=DEFAULT_MAX_FILES_PER_TRIGGER,
                        help=f"files per micro-batch (default {DEFAULT_MAX_FILES_PER_TRIGGER:,}, the config's)")
    parser.add_argument("--worker-memory", default="1g", help="memory each worker offers its executor (default 1g)")
    parser.add_argument("--workers", default="1,2", help="cluster sizes to run, in order (default 1,2)")
    parser.add_argument(
        "--repeat", type=int, default=1,
        help="rounds; odd rounds run the sizes in reverse (1,2 then 2,1), so a drifting machine load falls on both alike; "
        "the ratio is of the medians (default 1)",
    )
    args = parser.parse_args()
    sizes = [int(x) for x in args.workers.split(",")]

    w = workload(transactions_for(args.events), args.seed, args.events_per_file)
    f = w.facts
    banner("scale-out benchmark")
    say(
        f"workload: {w.change_events:,} change events, {w.lines:,} lines in {f['files']:,} files, {f['bytes'] / 2**20:,.0f} MiB; "
        f"max_files_per_trigger={args.max_files_per_trigger}; {w.landing}"
    )
    t0 = time.perf_counter()
    for path in sorted(p for p in w.landing.rglob("*") if p.is_file()):
        path.read_bytes()  # the page cache, so the first configuration does not pay the disk alone
    say(f"landing files read once in {time.perf_counter() - t0:.1f} s (page cache)")
    fresh_dir(RUN_DIR)
    plan = [(r, n) for r in range(args.repeat) for n in (sizes if r % 2 == 0 else sizes[::-1])]
    results = [run_config(w, n, args, f"{n}-worker{'s' if n > 1 else ''}-round{r + 1}") for r, n in plan]

    from cdc_platform.spark.session import get_spark

    spark = get_spark("cdc-benchmark-scale-out")  # local, after the clusters are gone: reads the lakes
    ok = True
    reference: dict[str, int] | None = None
    for r in results:
        seen = inspect(spark, Path(r["lake"]))
        r.update(seen)
        spark_outside = r["job_seconds"] - seen["inside_foreach_batch"]
        order = ["collect", "parse", "raw"]
        ranked = sorted(seen["by_step"].items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order), kv[0] == "dead_letter"))
        steps = ", ".join(f"{k} {v:.1f} s" for k, v in ranked)
        steps += f", other {seen['inside_foreach_batch'] - sum(seen['by_step'].values()):.1f} s"
        tag = Path(r["lake"]).parent.name
        say(f"[{tag}] where the job's {r['job_seconds']:.1f} s went: Spark outside foreachBatch {spark_outside:.1f} s; inside: {steps}")
        lines_ok = seen["rows_read"] == w.lines
        raw_ok = seen["counts"].get("raw_change_events") == w.change_events
        same = reference is None or seen["counts"] == reference
        reference = reference or seen["counts"]
        ok = ok and lines_ok and raw_ok and same
        say(
            f"[{tag}] accounting: lines read {seen['rows_read']:,} (expected {w.lines:,}) {'OK' if lines_ok else 'MISMATCH'}; "
            f"raw events {seen['counts'].get('raw_change_events', 0):,} (expected {w.change_events:,}) {'OK' if raw_ok else 'MISMATCH'}; "
            f"rows per table and full view {'equal to the first configuration' if same else 'DIFFER from the first configuration'}"
        )
    summary: dict[str, Any] = {"workload": f, "max_files_per_trigger": args.max_files_per_trigger, "results": results}
    medians = {n: statistics.median(r["events_per_s"] for r in results if r["workers"] == n) for n in sizes}
    for n in sizes:
        runs = [f"{r['events_per_s']:,.0f} ({r['load_before'].split(' (')[0]})" for r in results if r["workers"] == n]
        say(f"{n} worker(s): median {medians[n]:,.0f} change events/s over {len(runs)} run(s): {'; '.join(runs)}")
    if len(sizes) >= 2:
        ratio = medians[sizes[-1]] / medians[sizes[0]]
        summary["medians"] = medians
        summary["ratio"] = ratio
        say(
            f"scale-out {sizes[-1]} workers / {sizes[0]}: {medians[sizes[-1]]:,.0f} / {medians[sizes[0]]:,.0f} change events/s = "
            f"{ratio:.2f}x  (target >= 1.7)  [{load_average()}]"
        )
    (OUT / "scale_out.json").write_text(json.dumps(summary, indent=2, default=str), encoding="utf-8")
    say(f"figures: {OUT / 'scale_out.json'}; logs and lakes: {RUN_DIR}")
    return 0 if ok else 1


if __name__ == "__main__":
    exit_now(main())
