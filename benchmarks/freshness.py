"""Freshness: from an event's source timestamp to its row being visible in the latest-state table.

A feeder lands the sample workload's files at a steady rate of change events (default 2,000/s) while
`cdc stream` runs as a subprocess, exactly as an operator runs it. Each change event's `source.ts_ms`
is set to the wall clock at the moment its file lands, so "source timestamp" means "the moment the
connector delivered it". A reader polls the configured latest-state tables the way every reader
does, `lake_spark.read(spark, lake/<name>)` (delta-spark; the stored table behind `<name>__full_view`), and notes
when each event's row (`_event_id`) first shows up. Latency = first seen - source timestamp; it
includes the poll interval, which is printed with the figures.

    .venv/bin/python benchmarks/freshness.py                        # 2,000 events/s for 60 s
    .venv/bin/python benchmarks/freshness.py --rate 500 --seconds 30 --trigger-interval '2 seconds'

Needs cdc_platform/latest_state/ (issue 3); without it there is no latest-state table to watch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from _common import (
    OUT,
    REPO,
    banner,
    exit_now,
    fresh_dir,
    load_average,
    say,
    transactions_for,
    workload,
)

_SOURCE_TS = re.compile(r'("name":"payments","ts_ms":)\d{13}')
_MARKER_TS = re.compile(r'("status":"(?:BEGIN|END)","id":"[^"]*","ts_ms":)\d{13}')


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Feeder(threading.Thread):
    """Lands files so that change events arrive at `rate` per second, stamping them as they land."""

    def __init__(self, source: Path, landing: Path, rate: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.landing = landing
        self.rate = rate
        self.seconds = seconds
        by_topic = {d.name: sorted(d.glob("*.jsonl")) for d in sorted(source.iterdir()) if d.is_dir()}
        self.files: list[Path] = []
        for i in range(max(len(v) for v in by_topic.values())):
            for files in by_topic.values():
                if i < len(files):
                    self.files.append(files[i])
        self.events_written = 0
        self.lines_written = 0
        self.files_written = 0
        self.started_at = 0.0
        self.finished_at = 0.0
        self.behind_max = 0.0

    def run(self) -> None:
        self.started_at = time.time()
        t0 = time.perf_counter()
        for path in self.files:
            elapsed = time.perf_counter() - t0
            if elapsed >= self.seconds:
                break
            due = self.events_written / self.rate  # when the events written so far should have been done
            if due > elapsed:
                time.sleep(due - elapsed)
            else:
                self.behind_max = max(self.behind_max, elapsed - due)
            text = path.read_text(encoding="utf-8")
            now_ms = str(int(time.time() * 1000))
            text, changes = _SOURCE_TS.subn(lambda m: m.group(1) + now_ms, text)
            text = _MARKER_TS.sub(lambda m: m.group(1) + now_ms, text)
            target = self.landing / path.parent.name / path.name
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.parent / f".{path.name}.tmp"
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, target)
            self.events_written += changes
            self.lines_written += text.count("\n")
            self.files_written += 1
        self.finished_at = time.time()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=2000.0, help="change events per second (default 2,000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the feeder runs (default 60)")
    parser.add_argument("--trigger-interval", default="1 second", help="cdc stream --trigger-interval (default '1 second')")
    parser.add_argument("--max-files-per-trigger", type=int, default=200)
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between reader polls (default 0.5)")
    parser.add_argument("--events-per-file", type=int, default=200)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds at the start left out of the steady-state figures")
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from cdc_platform import lake, lake_spark
    from cdc_platform.config import load_config
    from cdc_platform.ingest import IngestJob
    from cdc_platform.session import get_spark

    events_needed = int(args.rate * args.seconds * 1.1) + 1000
    w = workload(transactions_for(events_needed), args.seed, args.events_per_file)
    run_dir = fresh_dir(OUT / "freshness")
    (run_dir / "landing").mkdir()
    base = (w.config_path).read_text(encoding="utf-8").replace("landing: landing\nlake: lake\n", "")
    config_path = run_dir / "cdc.yaml"
    config_path.write_text(f"landing: landing\nlake: lake\nmax_files_per_trigger: {args.max_files_per_trigger}\n{base}", encoding="utf-8")
    config = load_config(config_path)
    banner(f"freshness: {args.rate:,.0f} change events/s for {args.seconds:.0f} s, trigger {args.trigger_interval!r}, poll {args.poll} s")
    say(f"stages: {', '.join(type(s).__name__ for s in IngestJob(config).stages) or 'none'}; watching {', '.join(t.name for t in config.tables)}")

    spark = get_spark("cdc-benchmark-freshness")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    log = (run_dir / "stream.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cdc_platform", "stream", "--config", str(config_path), "--trigger-interval", args.trigger_interval],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=run_dir,
    )
    seen: dict[str, float] = {}  # _event_id -> latency in seconds
    first_seen_wall: dict[str, float] = {}
    watermark = [0]  # newest _source_ts (µs) seen, minus a margin, to keep each poll small

    def poll() -> int:
        frames = []
        for table in config.tables:
            path = config.lake / table.name
            if lake.exists(path):
                frames.append(lake_spark.read(spark, path).select("_event_id", "_source_ts"))
        if not frames:
            return 0
        observed = time.time()
        df = frames[0]
        for other in frames[1:]:
            df = df.unionByName(other)
        since = watermark[0] - 30_000_000
        rows = df.where(F.col("_source_ts") >= F.timestamp_micros(F.lit(since))).toArrow()
        new = 0
        for event_id, ts in zip(rows.column("_event_id").to_pylist(), rows.column("_source_ts").cast("int64").to_pylist()):
            if event_id is None or ts is None or event_id in seen:
                continue
            seen[event_id] = observed - ts / 1e6
            first_seen_wall[event_id] = observed
            watermark[0] = max(watermark[0], ts)
            new += 1
        return new

    try:
        # Warm-up: wait until the stream is up and a first file is visible, so start-up is not measured.
        t0 = time.perf_counter()
        warm = Feeder(w.landing, run_dir / "landing", rate=1e9, seconds=1e9)
        warm.files = warm.files[:4]
        warm.run()
        while time.perf_counter() - t0 < 180 and proc.poll() is None:
            if poll():
                break
            time.sleep(1.0)
        if proc.poll() is not None or not seen:
            say(f"the stream did not come up (exit {proc.returncode}); see {run_dir / 'stream.log'}")
            return 1
        warm_ids = set(seen)
        say(f"stream up and first rows visible after {time.perf_counter() - t0:.1f} s; feeding ...  [{load_average()}]")
        feeder = Feeder(w.landing, run_dir / "landing", args.rate, args.seconds)
        feeder.files = feeder.files[4:]
        feeder.start()
        while feeder.is_alive():
            poll()
            time.sleep(args.poll)
        say(f"feeder done: {feeder.events_written:,} change events ({feeder.lines_written:,} lines, {feeder.files_written} files) "
            f"in {feeder.finished_at - feeder.started_at:.1f} s = {feeder.events_written / (feeder.finished_at - feeder.started_at):,.0f} events/s; "
            f"at most {feeder.behind_max:.1f} s behind schedule  [{load_average()}]")
        drain_deadline = time.perf_counter() + 120
        last_new = time.perf_counter()
        while time.perf_counter() < drain_deadline and proc.poll() is None:
            if poll():
                last_new = time.perf_counter()
            elif time.perf_counter() - last_new > 15:
                break
            time.sleep(args.poll)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()

    measured = {k: v for k, v in seen.items() if k not in warm_ids}
    steady_from = feeder.started_at + args.warmup
    steady = [v for k, v in measured.items() if first_seen_wall[k] - v >= steady_from]
    lat = list(measured.values())
    metrics = lake.open_table(config.lake / "pipeline_metrics").to_pyarrow_table().to_pylist()
    batch_s = [(m["finished_at"] - m["started_at"]).total_seconds() for m in metrics]
    say(f"rows seen in latest-state tables: {len(lat):,} events (the rest were superseded by a later change to the same key before a poll, "
        f"or dead-lettered); stream batches: {len(metrics)}, foreachBatch seconds p50 {percentile(batch_s, 50):.2f} / max {max(batch_s, default=0):.2f}")
    say(f"latency all:          p50 {percentile(lat, 50):.2f} s  p90 {percentile(lat, 90):.2f} s  p99 {percentile(lat, 99):.2f} s  max {max(lat, default=float('nan')):.2f} s")
    say(f"latency steady state: p50 {percentile(steady, 50):.2f} s  p90 {percentile(steady, 90):.2f} s  p99 {percentile(steady, 99):.2f} s  "
        f"(events sourced >= {args.warmup:.0f} s after feeding began; n={len(steady):,})  target p99 <= 5 s  [{load_average()}]")
    (OUT / "freshness.json").write_text(json.dumps({
        "rate": args.rate, "seconds": args.seconds, "trigger_interval": args.trigger_interval, "poll": args.poll,
        "events_written": feeder.events_written, "rows_seen": len(lat),
        "p50": percentile(lat, 50), "p99": percentile(lat, 99), "steady_p50": percentile(steady, 50), "steady_p99": percentile(steady, 99),
        "load": load_average(),
    }, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    exit_now(main())
