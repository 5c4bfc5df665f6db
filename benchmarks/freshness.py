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

`--through stack` measures the real path instead (issue 11): a writer commits row changes to
PostgreSQL at the rate (transactions of `--tx-rows` rows, half inserts, half updates), Debezium's
connector publishes them to Kafka, and `cdc stream` (`source: kafka`) lands them; latency is the
source commit time Debezium reports (`source.ts_ms`, the lake's `_source_ts`) to the row being seen.
It starts the test bed (`cdc_platform.testbed`) itself and stops it at the end.

    .venv/bin/python benchmarks/freshness.py --through stack        # 2,000 row changes/s for 60 s

Needs cdc_platform/latest_state/ (issue 3); without it there is no latest-state table to watch.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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

from cdc_platform.config import DEFAULT_MAX_FILES_PER_TRIGGER
from cdc_platform.spark.processes import stop_group

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


class Poller:
    """Reads the latest-state tables as every reader does and notes when each event's row first shows up."""

    def __init__(self, spark: Any, paths: list[Path]) -> None:
        self.spark, self.paths = spark, paths
        self.seen: dict[str, float] = {}  # _event_id -> latency in seconds
        self.first_seen_wall: dict[str, float] = {}
        self.watermark = 0  # newest _source_ts (µs) seen, minus a margin, to keep each poll small

    def poll(self) -> int:
        from pyspark.sql import functions as F

        from cdc_platform import lake
        from cdc_platform.lake import lake_spark

        frames = [lake_spark.read(self.spark, p).select("_event_id", "_source_ts") for p in self.paths if lake.exists(p)]
        if not frames:
            return 0
        observed = time.time()
        df = frames[0]
        for other in frames[1:]:
            df = df.unionByName(other)
        since = self.watermark - 30_000_000
        rows = df.where(F.col("_source_ts") >= F.timestamp_micros(F.lit(since))).toArrow()
        new = 0
        for event_id, ts in zip(rows.column("_event_id").to_pylist(), rows.column("_source_ts").cast("int64").to_pylist()):
            if event_id is None or ts is None or event_id in self.seen:
                continue
            self.seen[event_id] = observed - ts / 1e6
            self.first_seen_wall[event_id] = observed
            self.watermark = max(self.watermark, ts)
            new += 1
        return new

    def wait_until_up(self, proc: subprocess.Popen[bytes], timeout: float) -> bool:
        """Poll until a first row shows up (the stream is up and landing), the stream exits, or `timeout`."""
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < timeout and proc.poll() is None and not self.poll():
            time.sleep(1.0)
        return proc.poll() is None and bool(self.seen)

    def drain(self, alive: Any, interval: float, quiet: float = 15.0, limit: float = 120.0, until_ts: float | None = None) -> bool:
        """Poll until nothing new shows up for `quiet` seconds (or `limit`, or the stream exits); with `until_ts`
        (epoch seconds), until a row sourced at or after it is seen instead, however long a batch takes.
        Returns whether the lake caught up (always true without `until_ts`)."""
        deadline, last_new = time.perf_counter() + limit, time.perf_counter()
        while time.perf_counter() < deadline and alive():
            if self.poll():
                last_new = time.perf_counter()
            if until_ts is not None:
                if self.watermark >= until_ts * 1e6:
                    return True
            elif time.perf_counter() - last_new > quiet:
                break
            time.sleep(interval)
        return until_ts is None


def report(poller: Poller, warm_ids: set[str], started_at: float, warmup: float, metrics_path: Path, out: dict[str, Any]) -> None:
    """Latency percentiles, all and steady state (events sourced `warmup` s after the feed began)."""
    from cdc_platform import lake

    measured = {k: v for k, v in poller.seen.items() if k not in warm_ids}
    steady = [v for k, v in measured.items() if poller.first_seen_wall[k] - v >= started_at + warmup]
    lat = list(measured.values())
    metrics = lake.open_table(metrics_path).to_pyarrow_table().to_pylist()
    batch_s = [(m["finished_at"] - m["started_at"]).total_seconds() for m in metrics]
    say(f"rows seen in latest-state tables: {len(lat):,} events (the rest were superseded by a later change to the same key before a poll, "
        f"or dead-lettered); stream batches: {len(metrics)}, foreachBatch seconds p50 {percentile(batch_s, 50):.2f} / max {max(batch_s, default=0):.2f}")
    say(f"latency all:          p50 {percentile(lat, 50):.2f} s  p90 {percentile(lat, 90):.2f} s  p99 {percentile(lat, 99):.2f} s  max {max(lat, default=float('nan')):.2f} s")
    say(f"latency steady state: p50 {percentile(steady, 50):.2f} s  p90 {percentile(steady, 90):.2f} s  p99 {percentile(steady, 99):.2f} s  "
        f"(events sourced >= {warmup:.0f} s after feeding began; n={len(steady):,})  target p99 <= 5 s  [{load_average()}]")
    out |= {"rows_seen": len(lat), "p50": percentile(lat, 50), "p90": percentile(lat, 90), "p99": percentile(lat, 99),
            "steady_p50": percentile(steady, 50), "steady_p90": percentile(steady, 90), "steady_p99": percentile(steady, 99), "load": load_average()}


def start_stream(config_path: Path, run_dir: Path, trigger_interval: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    with (run_dir / "stream.log").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "cdc_platform", "stream", "--config", str(config_path), "--trigger-interval", trigger_interval],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=run_dir,
        )


def stop_stream(proc: subprocess.Popen[bytes]) -> None:
    """Ctrl-C to the stream's group (it finishes the batch in flight), SIGKILL after 30 s; back when the group is gone."""
    stop_group(proc.pid, signal.SIGINT, timeout=30, reap=proc.poll)
    proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--through", choices=("files", "stack"), default="files",
                        help="files: landing files stamped as they land (default); stack: PostgreSQL -> Debezium -> Kafka -> cdc stream")
    parser.add_argument("--tx-rows", type=int, default=100, help="--through stack: row changes per source transaction (default 100)")
    parser.add_argument("--rate", type=float, default=2000.0, help="change events per second (default 2,000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long the feeder runs (default 60)")
    parser.add_argument("--trigger-interval", default="1 second", help="cdc stream --trigger-interval (default '1 second')")
    parser.add_argument("--max-files-per-trigger", type=int, default=DEFAULT_MAX_FILES_PER_TRIGGER,
                        help=f"files per micro-batch (default {DEFAULT_MAX_FILES_PER_TRIGGER:,}, the config's)")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between reader polls (default 0.5)")
    parser.add_argument("--events-per-file", type=int, default=200)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--drain-limit", type=float, default=900.0,
                        help="--through stack: how long to wait, after the writer, for the lake to catch up (default 900 s)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds at the start left out of the steady-state figures")
    args = parser.parse_args()
    if args.through == "stack":
        return through_stack(args)

    from cdc_platform.config import load_config
    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.spark.session import get_spark

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
    proc = start_stream(config_path, run_dir, args.trigger_interval)
    poller = Poller(spark, [config.lake / t.name for t in config.tables])
    try:
        # Warm-up: wait until the stream is up and a first file is visible, so start-up is not measured.
        t0 = time.perf_counter()
        warm = Feeder(w.landing, run_dir / "landing", rate=1e9, seconds=1e9)
        warm.files = warm.files[:4]
        warm.run()
        if not poller.wait_until_up(proc, 180):
            say(f"the stream did not come up (exit {proc.returncode}); see {run_dir / 'stream.log'}")
            return 1
        warm_ids = set(poller.seen)
        say(f"stream up and first rows visible after {time.perf_counter() - t0:.1f} s; feeding ...  [{load_average()}]")
        feeder = Feeder(w.landing, run_dir / "landing", args.rate, args.seconds)
        feeder.files = feeder.files[4:]
        feeder.start()
        while feeder.is_alive():
            poller.poll()
            time.sleep(args.poll)
        say(f"feeder done: {feeder.events_written:,} change events ({feeder.lines_written:,} lines, {feeder.files_written} files) "
            f"in {feeder.finished_at - feeder.started_at:.1f} s = {feeder.events_written / (feeder.finished_at - feeder.started_at):,.0f} events/s; "
            f"at most {feeder.behind_max:.1f} s behind schedule  [{load_average()}]")
        poller.drain(lambda: proc.poll() is None, args.poll)
    finally:
        stop_stream(proc)

    out: dict[str, Any] = {"through": "files", "rate": args.rate, "seconds": args.seconds, "trigger_interval": args.trigger_interval,
                           "poll": args.poll, "events_written": feeder.events_written}
    report(poller, warm_ids, feeder.started_at, args.warmup, config.lake / "pipeline_metrics", out)
    (OUT / "freshness.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


class SourceWriter(threading.Thread):
    """Commits row changes to PostgreSQL at `rate` per second, `tx_rows` per transaction: half inserts of
    new ids, half updates of ids already written (so the stream also folds, not only appends)."""

    def __init__(self, bed: Any, table: str, rate: float, seconds: float, tx_rows: int) -> None:
        super().__init__(daemon=True)
        self.bed, self.table, self.rate, self.seconds, self.tx_rows = bed, table, rate, seconds, tx_rows
        self.changes = 0
        self.transactions = 0
        self.started_at = 0.0
        self.finished_at = 0.0
        self.behind_max = 0.0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with self.bed.postgres.connect(autocommit=False) as conn:
                self.started_at = time.time()
                t0 = time.perf_counter()
                next_id = 1
                rng = random.Random(7)
                while time.perf_counter() - t0 < self.seconds:
                    elapsed = time.perf_counter() - t0
                    due = self.changes / self.rate
                    if due > elapsed:
                        time.sleep(due - elapsed)
                    else:
                        self.behind_max = max(self.behind_max, elapsed - due)
                    inserts = self.tx_rows - self.tx_rows // 2 if next_id > self.tx_rows else self.tx_rows
                    with conn.cursor() as cur:
                        cur.executemany(f"insert into {self.table} values (%s, 0, now())", [(next_id + i,) for i in range(inserts)])
                        updates = self.tx_rows - inserts
                        if updates:
                            ids = rng.sample(range(1, next_id), min(updates, next_id - 1))
                            cur.execute(f"update {self.table} set v = v + 1, at = now() where id = any(%s)", (ids,))
                    conn.commit()
                    next_id += inserts
                    self.changes += self.tx_rows
                    self.transactions += 1
                self.finished_at = time.time()
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark
            self.error = exc


def through_stack(args: argparse.Namespace) -> int:
    """Source commit -> visible in the lake, through PostgreSQL, Debezium, Kafka and `cdc stream`."""
    import yaml

    from cdc_platform.config import load_config
    from cdc_platform.spark.session import get_spark
    from cdc_platform.testbed import Stack

    banner(f"freshness through the stack: {args.rate:,.0f} row changes/s for {args.seconds:.0f} s in transactions of {args.tx_rows}, "
           f"trigger {args.trigger_interval!r}, poll {args.poll} s")
    run_dir = fresh_dir(OUT / "freshness_stack")
    t0 = time.perf_counter()
    bed = Stack.start(run_dir / "bed")
    say(f"test bed up in {time.perf_counter() - t0:.1f} s  [{load_average()}]")
    table, prefix = "fresh_rows", "fresh"
    proc = None
    try:
        with bed.postgres.connect() as conn:
            conn.execute(f"create table {table} (id bigint primary key, v bigint, at timestamptz)")
            conn.execute(f"insert into {table} values (0, 0, now())")
        connector = bed.postgres_connector(prefix, [f"public.{table}"])
        bed.connect.register(prefix, connector)
        bed.wait_streaming(connector)
        config_path = run_dir / "cdc.yaml"
        config_path.write_text(yaml.safe_dump({
            "lake": "lake", "source": {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "subscribe_pattern": rf"{prefix}\..*",
                                       "max_offsets_per_trigger": 1_000_000},
            "tables": {f"public.{table}": {"key": ["id"]}},
        }), encoding="utf-8")
        config = load_config(config_path)
        spark = get_spark("cdc-benchmark-freshness")
        proc = start_stream(config_path, run_dir, args.trigger_interval)
        poller = Poller(spark, [config.lake / table])
        t0 = time.perf_counter()
        if not poller.wait_until_up(proc, 240):  # the snapshot row: the stream is up
            say(f"the stream did not come up (exit {proc.returncode}); see {run_dir / 'stream.log'}")
            return 1
        warm_ids = set(poller.seen)
        say(f"stream up and the snapshot row visible after {time.perf_counter() - t0:.1f} s; writing ...  [{load_average()}]")
        writer = SourceWriter(bed, table, args.rate, args.seconds, args.tx_rows)
        writer.start()
        while writer.is_alive():
            poller.poll()
            time.sleep(args.poll)
        if writer.error is not None:
            raise writer.error
        took = writer.finished_at - writer.started_at
        say(f"writer done: {writer.changes:,} row changes in {writer.transactions:,} transactions in {took:.1f} s = "
            f"{writer.changes / took:,.0f} changes/s; at most {writer.behind_max:.1f} s behind schedule  [{load_average()}]")
        # A last transaction after the writer's: the lake has caught up once its row is seen (a quiet spell proves
        # nothing when one micro-batch takes longer than the spell).
        with bed.postgres.connect() as conn:
            row = conn.execute(f"update {table} set v = v + 1, at = now() where id = 0 returning extract(epoch from now())").fetchone()
            conn.commit()
        last_commit, t_end = float(row[0]), time.perf_counter()
        caught_up = poller.drain(lambda: proc is not None and proc.poll() is None, args.poll, limit=args.drain_limit, until_ts=last_commit)
        backlog = time.perf_counter() - t_end
        say(f"the lake {'caught up' if caught_up else 'had NOT caught up'} with the last source transaction {backlog:.1f} s after it "
            f"committed (limit {args.drain_limit:.0f} s)  [{load_average()}]")
    finally:
        if proc is not None:
            stop_stream(proc)
        bed.stop()
    out: dict[str, Any] = {"through": "stack", "rate": args.rate, "seconds": args.seconds, "tx_rows": args.tx_rows,
                           "trigger_interval": args.trigger_interval, "poll": args.poll, "changes_written": writer.changes,
                           "caught_up": caught_up, "backlog_seconds": backlog}
    report(poller, warm_ids, writer.started_at, args.warmup, config.lake / "pipeline_metrics", out)
    (OUT / "freshness_stack.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    exit_now(main())
