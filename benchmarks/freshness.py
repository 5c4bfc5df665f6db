"""Freshness: from an event's source timestamp to its row being visible in `<name>__full_view`.

A feeder lands the sample workload's files at a steady rate of change events (default 2,000/s) while
`cdc stream` runs as a subprocess, exactly as an operator runs it. The workload's commit times
(`source.ts_ms`, the markers' `ts_ms`) are moved onto the wall clock, spread so that change events come
at the rate, and each file lands once its newest commit has happened (`Feeder`), so "source timestamp"
means the commit time a connector would report. A reader polls every `<name>__full_view` the way a
reader's session does (the lake's views registered again, then one query), and notes when each event's
row (`_event_id`) first shows up there; the consistent views are polled beside them. Latency = first
seen - source timestamp; it includes the poll interval and the poll's own query, whose seconds are
printed with the figures.

First, in the same run, the floor: the same lines fed at the same rate to a plain Structured Streaming
append into one Delta table (no parsing, no guarantees), polled the same way (its Delta table read
again each poll). Where 5 s is below it, the target is being within 1.5x of it.

    .venv/bin/python benchmarks/freshness.py                        # 2,000 events/s for 60 s, floor first
    .venv/bin/python benchmarks/freshness.py --rate 500 --seconds 30 --trigger-interval '2 seconds' --no-floor

`--through stack` measures the real path instead (issue 11): a writer commits row changes to
PostgreSQL at the rate (transactions of `--tx-rows` rows, half inserts, half updates), Debezium's
connector publishes them to Kafka, and `cdc stream` (`source: kafka`) lands them; latency is the
source commit time Debezium reports (`source.ts_ms`, the lake's `_source_ts`) to the row being seen in
the full view. It starts the test bed (`cdc_platform.testbed`) itself and stops it at the end.

    .venv/bin/python benchmarks/freshness.py --through stack        # 2,000 row changes/s for 60 s
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
from collections.abc import Callable
from typing import Any

from _common import (
    OUT,
    REPO,
    banner,
    cpu_seconds,
    descendants,
    exit_now,
    fresh_dir,
    load_average,
    say,
    transactions_for,
    workload,
)

from cdc_platform.config import DEFAULT_MAX_FILES_PER_TRIGGER
from cdc_platform.spark.processes import stop_group

_SOURCE_TS = re.compile(r'("name":"payments","ts_ms":)(\d{13})')
_MARKER_TS = re.compile(r'("status":"(?:BEGIN|END)","id":"[^"]*","ts_ms":)(\d{13})')


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Feeder(threading.Thread):
    """Lands the workload's files at `rate` change events per second, each timestamp moved to the feed's clock.

    Every source and marker timestamp is mapped by one affine map from the workload's clock to the wall
    clock (its first commit = the moment feeding begins, its commits spread so that the change events
    come at `rate`), and a file lands once the newest commit in it has happened, in that order across the
    topics: a file sink behind Debezium does the same. So one transaction's events and markers carry one
    commit time wherever they land, and a connector-restart duplicate carries its original's (as
    Debezium's do). Stamping each file with the moment it landed instead gave a transaction's parts in
    different topics times up to a minute apart: the stage timed dozens of complete transactions out and
    took duplicates for new events (their identity holds `source.ts_ms`).
    """

    def __init__(self, source: Path, landing: Path, rate: float, seconds: float) -> None:
        super().__init__(daemon=True)
        self.landing = landing
        self.rate = rate
        self.seconds = seconds
        spans: list[tuple[int, int, int, Path]] = []
        for topic in sorted(d for d in source.iterdir() if d.is_dir()):
            last = 0  # a file with no stamp at all (tombstones, malformed lines) lands with the one before it
            for path in sorted(topic.glob("*.jsonl")):
                text = path.read_text(encoding="utf-8")
                changes = [int(m.group(2)) for m in _SOURCE_TS.finditer(text)]
                stamps = changes + [int(m.group(2)) for m in _MARKER_TS.finditer(text)]
                last = max(stamps, default=last)
                spans.append((last, min(stamps, default=last), len(changes), path))
        spans.sort(key=lambda s: (s[0], str(s[3])))
        self.files = [s[3] for s in spans]
        self._span = {s[3]: (s[1], s[0], s[2]) for s in spans}
        self.events_written = 0
        self.lines_written = 0
        self.files_written = 0
        self.started_at = 0.0
        self.finished_at = 0.0
        self.behind_max = 0.0

    def run(self) -> None:
        spans = [self._span[p] for p in self.files]
        first = min((s[0] for s in spans if s[0]), default=0)  # 0: a file without stamps before any with them
        last = max((s[1] for s in spans), default=0)
        events = sum(s[2] for s in spans)
        # Workload ms -> feed ms: `events` change events over `events / rate` seconds.
        scale = (events / self.rate * 1000.0) / (last - first) if last > first else 0.0
        self.started_at = time.time()
        start_ms = self.started_at * 1000.0
        t0 = time.perf_counter()

        def mapped(ms: int) -> int:
            return int(start_ms + (ms - first) * scale)

        for path in self.files:
            newest = self._span[path][1]
            due = (mapped(newest) - start_ms) / 1000.0 if newest else 0.0  # when the file's newest commit happens
            elapsed = time.perf_counter() - t0
            if due >= self.seconds:
                break
            if due > elapsed:
                time.sleep(due - elapsed)
            else:
                self.behind_max = max(self.behind_max, elapsed - due)
            text = path.read_text(encoding="utf-8")
            text, changes = _SOURCE_TS.subn(lambda m: m.group(1) + str(mapped(int(m.group(2)))), text)
            text = _MARKER_TS.sub(lambda m: m.group(1) + str(mapped(int(m.group(2)))), text)
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
    """Reads what a reader reads and notes when each event's row first shows up there.

    `fetch(since_micros)` returns (`_event_id`, `_source_ts` in µs) of the rows sourced at or after `since`:
    `full_views` reads every `<name>__full_view` (registered again each poll, pinned to the lake as it then is,
    as a reader's session does), `floor_table` the plain append's Delta table. Each poll's own seconds are kept:
    they are part of what a reader waits for."""

    def __init__(self, fetch: Callable[[int], Any]) -> None:
        self.fetch = fetch
        self.seen: dict[str, float] = {}  # _event_id -> latency in seconds
        self.first_seen_wall: dict[str, float] = {}
        self.watermark = 0  # newest _source_ts (µs) seen, minus a margin, to keep each poll small
        self.poll_seconds: list[float] = []

    def poll(self) -> int:
        t0 = time.perf_counter()
        rows = self.fetch(self.watermark - 30_000_000)
        observed = time.time()
        self.poll_seconds.append(time.perf_counter() - t0)
        if rows is None:
            return 0
        new = 0
        for event_id, ts in zip(rows.column("_event_id").to_pylist(), rows.column("_source_ts").cast("int64").to_pylist()):
            if event_id is None or ts is None or event_id in self.seen:
                continue
            self.seen[event_id] = observed - ts / 1e6
            self.first_seen_wall[event_id] = observed
            self.watermark = max(self.watermark, ts)
            new += 1
        return new

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


def full_views(spark: Any, lake_dir: Path, names: list[str], suffix: str = "__full_view") -> Callable[[int], Any]:
    """A poll of the latest-state tables' full views (or, with `suffix`, another view of each), as `cdc sql` reads them."""
    from cdc_platform import lake
    from cdc_platform.views import register_consistent_views, register_latest_state_views, register_tables

    def fetch(since: int) -> Any:
        if not lake.exists(lake.table_path(lake_dir, names[0])):
            return None
        register_latest_state_views(spark, lake_dir)
        if suffix == "__consistent_view":  # they read the transaction stage's tables too, as a reader's session has them
            present = lake.lake_tables(lake_dir)
            register_tables(spark, lake_dir, [n for n in ("transactions", "consistency_watermark", "dead_letter") if n in present])
            if not register_consistent_views(spark, lake_dir):
                return None
        union = " UNION ALL ".join(f"SELECT _event_id, _source_ts FROM `{n}{suffix}` WHERE _source_ts >= timestamp_micros({since})" for n in names)
        return spark.sql(union).toArrow()

    return fetch


def floor_table(spark: Any, path: Path) -> Callable[[int], Any]:
    """A poll of the plain append's table: every change event's line, its id the line's hash, its time `source.ts_ms`."""
    from pyspark.sql import functions as F

    def fetch(since: int) -> Any:
        if not (path / "_delta_log").is_dir():
            return None
        df = spark.read.format("delta").load(str(path))
        ts = F.get_json_object("value", "$.source.ts_ms").cast("bigint") * 1000
        rows = df.where(ts.isNotNull() & (ts >= since)).select(F.sha2("value", 256).alias("_event_id"), ts.alias("_source_ts"))
        return rows.toArrow()

    return fetch


def floor_stream(landing: str, target: str, trigger: str) -> int:
    """The freshness floor: a plain Structured Streaming append of the landing's lines into one Delta table."""
    from cdc_platform.spark.session import get_spark

    spark = get_spark("cdc-benchmark-freshness-floor")
    query = (spark.readStream.format("text").option("recursiveFileLookup", "true").load(landing)
             .writeStream.format("delta").option("checkpointLocation", target + "_checkpoint").trigger(processingTime=trigger)
             .start(target))
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    return 0


def report(poller: Poller, warm_ids: set[str], started_at: float, warmup: float, metrics_path: Path | None, out: dict[str, Any],
           what: str = "full views") -> None:
    """Latency percentiles, all and steady state (events sourced `warmup` s after the feed began)."""
    from cdc_platform import lake

    measured = {k: v for k, v in poller.seen.items() if k not in warm_ids}
    steady = [v for k, v in measured.items() if poller.first_seen_wall[k] - v >= started_at + warmup]
    lat = list(measured.values())
    batches = ""
    if metrics_path is not None:
        metrics = lake.open_table(metrics_path).to_pyarrow_table().to_pylist()
        batch_s = [(m["finished_at"] - m["started_at"]).total_seconds() for m in metrics]
        batches = f"; ingest batches: {len(metrics)}, foreachBatch seconds p50 {percentile(batch_s, 50):.2f} / max {max(batch_s, default=0):.2f}"
    polls = poller.poll_seconds
    say(f"[{what}] rows seen: {len(lat):,} events (the rest were superseded by a later change to the same key before a poll, "
        f"or dead-lettered){batches}; a poll took p50 {percentile(polls, 50):.2f} s / p90 {percentile(polls, 90):.2f} s")
    say(f"[{what}] latency all:          p50 {percentile(lat, 50):.2f} s  p90 {percentile(lat, 90):.2f} s  p99 {percentile(lat, 99):.2f} s  max {max(lat, default=float('nan')):.2f} s")
    say(f"[{what}] latency steady state: p50 {percentile(steady, 50):.2f} s  p90 {percentile(steady, 90):.2f} s  p99 {percentile(steady, 99):.2f} s  "
        f"(events sourced >= {warmup:.0f} s after feeding began; n={len(steady):,})  target p99 <= 5 s  [{load_average()}]")
    out |= {"poll_p50": percentile(polls, 50), "rows_seen": len(lat), "p50": percentile(lat, 50), "p90": percentile(lat, 90), "p99": percentile(lat, 99),
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
    parser.add_argument("--stage-trigger-interval", default=None,
                        help="the config's stage_trigger_interval: the stage queries' cadence (default: the trigger interval's)")
    parser.add_argument("--max-files-per-trigger", type=int, default=DEFAULT_MAX_FILES_PER_TRIGGER,
                        help=f"files per micro-batch (default {DEFAULT_MAX_FILES_PER_TRIGGER:,}, the config's)")
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between reader polls (default 0.5)")
    parser.add_argument("--events-per-file", type=int, default=200)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--drain-limit", type=float, default=900.0,
                        help="--through stack: how long to wait, after the writer, for the lake to catch up (default 900 s)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds at the start left out of the steady-state figures")
    parser.add_argument("--floor", action=argparse.BooleanOptionalAction, default=True,
                        help="first measure the floor: a plain Structured Streaming append of the same lines into one Delta table (default on)")
    parser.add_argument("--consistent", action=argparse.BooleanOptionalAction, default=True,
                        help="also poll the consistent views (default on)")
    parser.add_argument("--floor-stream", nargs=3, metavar=("LANDING", "TARGET", "TRIGGER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_stream:
        return floor_stream(*args.floor_stream)
    if args.through == "stack":
        return through_stack(args)

    from cdc_platform.config import load_config
    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.spark.session import get_spark

    events_needed = int(args.rate * args.seconds * 1.1) + 1000
    w = workload(transactions_for(events_needed), args.seed, args.events_per_file)
    run_dir = fresh_dir(OUT / "freshness")
    spark = get_spark("cdc-benchmark-freshness")
    out: dict[str, Any] = {"through": "files", "rate": args.rate, "seconds": args.seconds, "trigger_interval": args.trigger_interval,
                           "poll": args.poll}

    if args.floor:
        banner(f"the floor: a plain Structured Streaming append of the same lines into one Delta table, {args.rate:,.0f} change events/s")
        floor_dir = run_dir / "floor"
        (floor_dir / "landing").mkdir(parents=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        with (floor_dir / "stream.log").open("wb") as log:
            proc = subprocess.Popen([sys.executable, __file__, "--floor-stream", str(floor_dir / "landing"), str(floor_dir / "lines"),
                                     args.trigger_interval], stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env)
        floor = Poller(floor_table(spark, floor_dir / "lines"))
        fed = feed_and_poll(w, floor_dir / "landing", args, proc, [floor])
        if fed is None:
            say(f"the floor's stream did not come up; see {floor_dir / 'stream.log'}")
            return 1
        feeder, warm = fed
        floor_out: dict[str, Any] = {}
        report(floor, warm[0], feeder.started_at, args.warmup, None, floor_out, what="plain append (floor)")
        out["floor"] = floor_out

    (run_dir / "landing").mkdir()
    base = (w.config_path).read_text(encoding="utf-8").replace("landing: landing\nlake: lake\n", "")
    config_path = run_dir / "cdc.yaml"
    stages = f"stage_trigger_interval: {args.stage_trigger_interval}\n" if args.stage_trigger_interval else ""
    config_path.write_text(f"landing: landing\nlake: lake\nmax_files_per_trigger: {args.max_files_per_trigger}\n{stages}{base}", encoding="utf-8")
    config = load_config(config_path)
    banner(f"freshness: {args.rate:,.0f} change events/s for {args.seconds:.0f} s, trigger {args.trigger_interval!r}, "
           f"stage queries' trigger {config.stage_trigger_interval or args.trigger_interval!r}, poll {args.poll} s")
    say(f"stages: {', '.join(type(s).__name__ for s in IngestJob(config).stages) or 'none'}; watching {', '.join(t.name for t in config.tables)}")
    names = [t.name for t in config.tables]
    proc = start_stream(config_path, run_dir, args.trigger_interval)
    pollers = [Poller(full_views(spark, config.lake, names))]
    if args.consistent:
        pollers.append(Poller(full_views(spark, config.lake, names, "__consistent_view")))
    fed = feed_and_poll(w, run_dir / "landing", args, proc, pollers)
    if fed is None:
        say(f"the stream did not come up (exit {proc.returncode}); see {run_dir / 'stream.log'}")
        return 1
    feeder, warm = fed
    out["events_written"] = feeder.events_written
    report(pollers[0], warm[0], feeder.started_at, args.warmup, config.lake / "pipeline_metrics", out)
    if args.consistent:
        consistent: dict[str, Any] = {}
        report(pollers[1], warm[1], feeder.started_at, args.warmup, None, consistent, what="consistent views")
        out["consistent"] = consistent
    if args.floor:
        say(f"full views' steady p99 / the floor's: {out['steady_p99'] / out['floor']['steady_p99']:.2f} (target <= 1.5 where 5 s is below the floor)")
    (OUT / "freshness.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    return 0


def cpu_split(stream_pid: int) -> dict[str, float]:
    """CPU seconds so far of the stream (its process and everything under it: its JVM, Spark's Python workers)
    and of the rest of this benchmark's tree: the reader's Spark and the feeder. On two cores the reader
    competes with the stream it measures, so its share is printed beside the figures."""
    def tree(root: int, skip: set[int]) -> float:
        return sum(cpu_seconds(p) or 0.0 for p in [root, *descendants(root)] if p not in skip)

    stream = {stream_pid, *descendants(stream_pid)}
    return {"the stream": tree(stream_pid, set()), "the reader and feeder": tree(os.getpid(), stream)}


def feed_and_poll(w: Any, landing: Path, args: argparse.Namespace, proc: subprocess.Popen[bytes],
                  pollers: list[Poller]) -> tuple[Feeder, list[set[str]]] | None:
    """Warm the stream up (a first file visible), feed at the rate while polling, drain, stop the stream.
    Returns the feeder and each poller's warm-up ids, or None when the stream did not come up."""
    try:
        t0 = time.perf_counter()
        warm = Feeder(w.landing, landing, rate=1e9, seconds=1e9)
        warm.files = warm.files[:4]
        warm.run()
        up = pollers[0]
        while time.perf_counter() - t0 < 240 and proc.poll() is None and not up.poll():
            time.sleep(1.0)
        if proc.poll() is not None or not up.seen:
            return None
        for other in pollers[1:]:
            other.poll()
        warm_ids = [set(p.seen) for p in pollers]
        say(f"stream up and first rows visible after {time.perf_counter() - t0:.1f} s; feeding ...  [{load_average()}]")
        feeder = Feeder(w.landing, landing, args.rate, args.seconds)
        feeder.files = feeder.files[4:]
        cpu_before, window = cpu_split(proc.pid), time.perf_counter()
        feeder.start()
        while feeder.is_alive():
            for p in pollers:
                p.poll()
            time.sleep(args.poll)
        cpu = {k: v - cpu_before[k] for k, v in cpu_split(proc.pid).items()}
        window = time.perf_counter() - window  # the feed and the poll still running when it ended
        fed_for = feeder.finished_at - feeder.started_at
        say(f"feeder done: {feeder.events_written:,} change events ({feeder.lines_written:,} lines, {feeder.files_written} files) "
            f"in {fed_for:.1f} s = {feeder.events_written / fed_for:,.0f} events/s; "
            f"at most {feeder.behind_max:.1f} s behind schedule  [{load_average()}]")
        say(f"CPU while feeding ({window:.1f} s): " + ", ".join(f"{k} {v:.0f} s ({v / window:.2f} cores)" for k, v in cpu.items()))
        for p in pollers:
            p.drain(lambda: proc.poll() is None, args.poll)
        return feeder, warm_ids
    finally:
        stop_stream(proc)


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
        poller = Poller(full_views(spark, config.lake, [table]))
        t0 = time.perf_counter()
        t_up = time.perf_counter()
        while time.perf_counter() - t_up < 240 and proc.poll() is None and not poller.poll():  # the snapshot row: the stream is up
            time.sleep(1.0)
        if proc.poll() is not None or not poller.seen:
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
