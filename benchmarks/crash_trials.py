"""Crash trials: SIGKILL `cdc stream` at random moments over a growing landing directory; lose nothing.

One trial = start `cdc stream` as a subprocess (its own session, so the kill takes the JVM and Spark's
Python workers with it), let it run while a feeder keeps landing files, kill it with SIGKILL at a
moment chosen by the trial's mode, and start again. Modes aim at different places in a micro-batch:

* `random`        - any time after start (Spark start-up, planning, parsing, commits, idle)
* `after_offsets` - the instant Spark has written a batch's offsets (batch planned, nothing committed)
* `after_raw`     - the instant the raw log committed (mid-batch: stages and metrics not yet)
* `after_state`   - the instant a latest-state table committed (mid-batch, later stages pending)
* `after_metrics` - the instant the batch's metrics committed (before Spark records the batch done)

At the end the feeder lands the rest, one clean `cdc run` drains the lake, and the lake is compared with
a reference lake that one uncrashed `cdc run` built from the same final landing directory: the raw log
(event ids, no duplicates), markers, dead letters, each latest-state table (`<name>__full_view`) and
`transactions` must be equal. A trial counts as failed when its kill left the lake unable to finish.

    .venv/bin/python benchmarks/crash_trials.py                 # 50 trials
    .venv/bin/python benchmarks/crash_trials.py --trials 5      # a quick look
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:  # as a script (benchmarks/ on sys.path) or imported by the test suite (repo root on sys.path)
    from _common import OUT, REPO, banner, exit_now, fresh_dir, load_average, say
except ImportError:  # pragma: no cover - exercised by tests/cdc_platform/test_crash_trials.py
    from benchmarks._common import (
        OUT,
        REPO,
        banner,
        exit_now,
        fresh_dir,
        load_average,
        say,
    )

from cdc_platform.spark.processes import stop_group  # after _common, which puts the repo on sys.path

MODES = ("random", "after_offsets", "after_raw", "after_state", "after_metrics")


@dataclass
class TrialResult:
    number: int
    mode: str
    seconds_alive: float
    killed: bool  # False when the process had already exited (that is a failure: a stream must not stop)
    files_landed: int
    note: str = ""


@dataclass
class CrashReport:
    trials: list[TrialResult] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def failures(self) -> int:
        return sum(1 for t in self.trials if not t.killed) + (1 if self.mismatches else 0)


class Feeder:
    """Lands the workload's files in order, a few at a time, as a connector dump would grow."""

    def __init__(self, source: Path, landing: Path) -> None:
        self.landing = landing
        by_topic = {d.name: sorted(d.glob("*.jsonl")) for d in sorted(source.iterdir()) if d.is_dir()}
        self.pending: list[Path] = []
        for i in range(max((len(v) for v in by_topic.values()), default=0)):
            for files in by_topic.values():
                if i < len(files):
                    self.pending.append(files[i])
        self.total = len(self.pending)
        self.landed = 0
        self._lock = threading.Lock()

    def land(self, n: int = 1) -> int:
        with self._lock:
            done = 0
            while self.pending and done < n:
                src = self.pending.pop(0)
                target = self.landing / src.parent.name / src.name
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.parent / f".{src.name}.tmp"  # Spark's file source skips hidden names
                tmp.write_bytes(src.read_bytes())
                os.replace(tmp, target)
                done += 1
            self.landed += done
            return done

    def land_all(self) -> None:
        self.land(len(self.pending))


def _count(path: Path) -> int:
    try:
        return len(os.listdir(path))
    except OSError:
        return 0


def _watch_dir(mode: str, lake: Path, checkpoint: Path, state_table: str | None) -> Path | None:
    if mode == "after_offsets":
        return checkpoint / "offsets"
    if mode == "after_raw":
        return lake / "raw_change_events" / "_delta_log"
    if mode == "after_state":
        return lake / (state_table or "raw_change_events") / "_delta_log"
    if mode == "after_metrics":
        return lake / "pipeline_metrics" / "_delta_log"
    return None


def run_trials(
    work: Path,
    *,
    trials: int,
    transactions: int,
    seed: int,
    events_per_file: int = 100,
    files_per_tick: int = 1,
    tick_seconds: float = 0.4,
    max_wait: float = 25.0,
    modes: tuple[str, ...] = MODES,
    spark: Any = None,
    log: Any = say,
) -> CrashReport:
    """Run the trials in `work` (emptied first) and compare with an uncrashed reference lake."""
    import yaml

    from cdc_platform.config import load_config, with_overrides
    from cdc_platform.workload.generate import generate_workload
    from cdc_platform.run.ingest import IngestJob

    fresh_dir(work)
    rng = random.Random(seed)
    w = generate_workload(work / "source", transactions=transactions, seed=seed, events_per_file=events_per_file, track_state=False)
    base = yaml.safe_load(w.config_path.read_text(encoding="utf-8"))
    landing = work / "landing"
    landing.mkdir()
    config_path = work / "cdc.yaml"
    config_path.write_text(yaml.safe_dump({**base, "landing": "landing", "lake": "lake", "max_files_per_trigger": 20}), encoding="utf-8")
    config = load_config(config_path)
    state_table = config.tables[0].name if config.tables else None
    feeder = Feeder(w.landing_dir, landing)
    feeder.land(3)
    report = CrashReport()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    command = [sys.executable, "-m", "cdc_platform", "stream", "--config", str(config_path), "--trigger-interval", "500 milliseconds"]
    stop_feeding = threading.Event()
    trial_running = threading.Event()  # files land only while a stream runs, so every trial sees new ones

    def feed() -> None:
        while not stop_feeding.wait(tick_seconds):
            if trial_running.is_set():
                feeder.land(files_per_tick)

    feeding = threading.Thread(target=feed, daemon=True)
    feeding.start()
    t_all = time.perf_counter()
    try:
        for number in range(1, trials + 1):
            mode = modes[(number - 1) % len(modes)] if number <= len(modes) else rng.choice(modes)
            watch = _watch_dir(mode, config.lake, config.checkpoint_dir, state_table)
            before = _count(watch) if watch is not None else 0
            logfile = (work / f"trial-{number:03d}.log").open("wb")
            started = time.perf_counter()
            proc = subprocess.Popen(command, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True, env=env, cwd=work)
            trial_running.set()
            deadline = started + max_wait
            random_at = started + rng.uniform(2.0, 14.0)
            note = "kill at deadline"
            while time.perf_counter() < deadline and proc.poll() is None:
                if watch is None:
                    if time.perf_counter() >= random_at:
                        note = f"random kill at {time.perf_counter() - started:.1f} s"
                        break
                elif _count(watch) > before:
                    note = f"killed right after a new entry in {watch.parent.name}/{watch.name}"
                    break
                time.sleep(0.01)
            trial_running.clear()
            alive = proc.poll() is None
            # the JVM and Python workers die with the group: wait until they are gone
            stop_group(proc.pid, signal.SIGKILL, timeout=10, reap=proc.poll)
            proc.wait()
            logfile.close()
            result = TrialResult(number, mode, time.perf_counter() - started, alive, feeder.landed, note)
            if not alive:
                errors = [ln for ln in Path(logfile.name).read_text(encoding="utf-8", errors="replace").splitlines() if ln.startswith("error:")]
                result.note = f"cdc stream exited by itself with {proc.returncode}: {(errors or ['(no error line)'])[-1][:300]}"
            report.trials.append(result)
            log(f"trial {number:3d}/{trials} {mode:<13} {'killed' if alive else 'EXITED'} after {result.seconds_alive:5.1f} s; "
                f"{feeder.landed}/{feeder.total} files landed; {result.note}")
            if len(report.trials) >= 3 and not any(t.killed for t in report.trials[-3:]):
                log("the stream failed to start three times in a row: the lake is stuck, stopping the trials here")
                break
    finally:
        stop_feeding.set()
        feeding.join()
    crash_seconds = time.perf_counter() - t_all

    feeder.land_all()
    from cdc_platform.spark.session import get_spark

    spark = spark or get_spark()
    t0 = time.perf_counter()
    # The clean drain after the last crash, then the reference: each in one batch (batch boundaries
    # must not matter, and one batch is the quickest way through the stages).
    from cdc_platform.errors import CdcError

    try:
        IngestJob(with_overrides(config, max_files_per_trigger=100_000)).run_available_now(spark)
    except CdcError as exc:  # the lake cannot even be drained: every later comparison is moot
        report.mismatches = [f"the clean drain after the last crash failed: {str(exc)[:300]}"]
        report.figures = {"files": feeder.total, "lines": 0, "change_events": w.change_events, "crash_phase_seconds": round(crash_seconds, 1),
                          "drain_seconds": 0, "reference_seconds": 0, "compare_seconds": 0,
                          "modes": dict(collections.Counter(t.mode for t in report.trials))}
        return report
    drain_s = time.perf_counter() - t0
    reference = with_overrides(config, lake=work / "reference_lake", checkpoint=None, max_files_per_trigger=100_000)
    t0 = time.perf_counter()
    IngestJob(reference).run_available_now(spark)
    reference_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    report.mismatches = compare_lakes(spark, config, reference)
    compare_s = time.perf_counter() - t0
    report.figures = {
        "files": feeder.total,
        "lines": w.change_events + w.duplicate_events + w.markers + w.malformed_lines + w.tombstones,
        "change_events": w.change_events,
        "crash_phase_seconds": round(crash_seconds, 1),
        "drain_seconds": round(drain_s, 1),
        "reference_seconds": round(reference_s, 1),
        "compare_seconds": round(compare_s, 1),
        "modes": dict(collections.Counter(t.mode for t in report.trials)),
    }
    return report


def _rows(table: Any) -> collections.Counter[tuple[Any, ...]]:
    names = table.column_names
    return collections.Counter(tuple(repr(r[c]) for c in names) for r in table.to_pylist())


def compare_lakes(spark: Any, crashed: Any, reference: Any) -> list[str]:
    """What differs between the crashed-and-drained lake and the reference; empty when they are equal."""
    from cdc_platform import lake
    from cdc_platform.views import register_lake

    problems: list[str] = []

    def delta(cfg: Any, name: str, columns: list[str]) -> Any:
        path = cfg.lake / name
        if not lake.exists(path):
            return None
        table = lake.open_table(path)
        present = [c for c in columns if c in table.schema().to_arrow().names] if columns else None
        return table.to_pyarrow_table(columns=present)

    ids = delta(crashed, "raw_change_events", ["event_id"]).column("event_id").to_pylist()
    ref_ids = delta(reference, "raw_change_events", ["event_id"]).column("event_id").to_pylist()
    if len(ids) != len(set(ids)):
        problems.append(f"raw_change_events: {len(ids) - len(set(ids))} event(s) landed twice")
    if set(ids) != set(ref_ids):
        problems.append(f"raw_change_events: {len(set(ref_ids) - set(ids))} lost, {len(set(ids) - set(ref_ids))} extra")
    checks = [
        ("transaction_markers", ["marker_id"]),
        ("dead_letter", ["reason_code", "stage", "line"]),
        ("transactions", ["transaction_id", "source", "begin_ts", "end_ts", "event_count", "first_position", "last_position", "marker_shape"]),
        ("incomplete_transactions", ["transaction_id", "source", "reason", "has_begin", "has_end", "expected_count", "seen_count"]),
    ]
    for name, columns in checks:
        mine, ref = delta(crashed, name, columns), delta(reference, name, columns)
        if (mine is None) != (ref is None):
            problems.append(f"{name}: exists in only one lake")
        elif mine is not None and _rows(mine) != _rows(ref):
            a, b = _rows(mine), _rows(ref)
            problems.append(f"{name}: {sum((b - a).values())} row(s) missing, {sum((a - b).values())} extra (of {sum(b.values())})")
    def state_rows(cfg: Any) -> dict[str, collections.Counter[tuple[Any, ...]]]:
        names = set(register_lake(spark, cfg.lake))
        out: dict[str, collections.Counter[tuple[Any, ...]]] = {}
        for table in crashed.tables:
            view = f"{table.name}__full_view"
            if view in names:
                cols = [c for c in spark.table(view).columns if not c.startswith("_") or c in ("_position", "_op", "_deleted")]
                quoted = ", ".join(lake.quote_identifier(c) for c in cols)
                out[view] = collections.Counter(tuple(r) for r in spark.sql(f"SELECT {quoted} FROM {view}").collect())
        return out

    mine_state, ref_state = state_rows(crashed), state_rows(reference)
    if set(mine_state) != set(ref_state):
        problems.append(f"latest-state views differ: {sorted(mine_state)} vs {sorted(ref_state)}")
    for view, ref_rows in ref_state.items():
        mine_rows = mine_state.get(view, collections.Counter())
        if mine_rows != ref_rows:
            problems.append(f"{view}: {sum((ref_rows - mine_rows).values())} row(s) missing, {sum((mine_rows - ref_rows).values())} extra (of {sum(ref_rows.values())})")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=50)
    parser.add_argument("--transactions", type=int, default=20_000, help="size of the workload fed during the trials")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--events-per-file", type=int, default=50)
    parser.add_argument("--max-wait", type=float, default=40.0, help="kill at the latest this many seconds after start")
    parser.add_argument("--tick", type=float, default=1.0, help="seconds between landed files while a stream runs")
    args = parser.parse_args()
    banner(f"crash trials: {args.trials} SIGKILLs of `cdc stream`")
    t0 = time.perf_counter()
    report = run_trials(OUT / "crash_trials", trials=args.trials, transactions=args.transactions, seed=args.seed,
                        events_per_file=args.events_per_file, max_wait=args.max_wait, tick_seconds=args.tick)
    say(f"workload: {report.figures['files']:,} files, {report.figures['lines']:,} lines, {report.figures['change_events']:,} change events")
    say(f"kill modes: {report.figures['modes']}")
    say(f"crash phase {report.figures['crash_phase_seconds']} s, drain {report.figures['drain_seconds']} s, reference run {report.figures['reference_seconds']} s, "
        f"compare {report.figures['compare_seconds']} s; "
        f"total {time.perf_counter() - t0:.0f} s  [{load_average()}]")
    for problem in report.mismatches:
        say(f"MISMATCH: {problem}")
    exited = [t for t in report.trials if not t.killed]
    for t in exited:
        say(f"trial {t.number}: {t.note}")
    say(f"trials run: {len(report.trials)}, failures: {report.failures} "
        f"({len(exited)} stream(s) died by themselves, lake {'differs from' if report.mismatches else 'equals'} the uncrashed reference)")
    return 0 if report.failures == 0 else 1


if __name__ == "__main__":
    exit_now(main())
