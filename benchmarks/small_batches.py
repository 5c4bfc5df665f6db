"""Small micro-batches: what one `cdc run` of a few dozen events costs a warm session, under Spark settings to compare.

A small batch is where the fixed cost of a micro-batch shows (the freshness target, and most of the test
suite): the same few planned queries and Delta commits, whatever the data. Each variant - a name and the
Spark settings it starts its session with - runs in a process of its own (some settings are static, read
when Spark starts), `--runs` runs of `cdc run` each, on a generated sample (multi-table transactions with
their markers, a duplicate, a malformed line):

* by default each run is a fresh lake from the whole sample (the tables created, then one batch);
* with `--steady` the runs share one lake and each lands the next slice of a sample `--runs` times as
  big: what a stream's batches see (tables that exist and grow, transactions open across batches).

Printed per run: wall seconds, seconds inside the batch by step (`BatchReport.stage_seconds`, each the
step's end since the batch began: the steps run side by side), CPU seconds by role, how many classes
Spark compiled with Janino (`CodegenMetrics`), the Spark jobs it ran and the Delta commits it made (each a
log version of one of the lake's tables), and those jobs by the label each carries (`spark_jobs.labelled`: the
batch's split, each stage, dead letters, metrics); then per variant the medians over the runs after the first
`--warmup` (the JVM's own warm-up). `--repeat 2` runs the variants twice, the second time in the reverse
order, so that a load drifting on this shared machine falls on every variant; the medians pool both.

    .venv/bin/python benchmarks/small_batches.py                            # Spark's codegen cache of 100 against the session's 4,000
    .venv/bin/python benchmarks/small_batches.py --steady --runs 8 --warmup 2 --repeat 2 \\
        --variant session --variant snap1=spark.databricks.delta.snapshotPartitions=1
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import OUT, CpuByRole, alternating, banner, cpu_roles, exit_now, fresh_dir, jvm_thread_seconds, largest_first, say

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: The variants run when none is named: the codegen cache at Spark's default and at the session's setting.
DEFAULT_VARIANTS = ["cache-100=spark.sql.codegen.cache.maxEntries=100", "cache-4000=spark.sql.codegen.cache.maxEntries=4000"]


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """`name` or `name=key=value[,key=value...]`: a variant's name and the settings its session starts with."""
    name, _, rest = text.partition("=")
    conf: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"--variant {text!r}: settings are key=value, comma-separated")
        conf[key] = value
    return name, conf


def _slices(landing: Path, n: int) -> dict[Path, list[list[bytes]]]:
    """Each landed file's lines cut into `n` consecutive slices (the steady runs land one slice each)."""
    out: dict[Path, list[list[bytes]]] = {}
    for f in sorted(p for p in landing.rglob("*") if p.is_file()):
        lines = f.read_bytes().splitlines(keepends=True)
        out[f.relative_to(landing)] = [lines[i * len(lines) // n:(i + 1) * len(lines) // n] for i in range(n)]
    return out


#: The tables an ingest batch commits to: what a reader of the full views waits for.
INGEST_TABLES = ("raw_change_events", "transaction_markers", "dead_letter", "pipeline_metrics")


def _commits(lake: Path, tables: tuple[str, ...] | None = None) -> int:
    """Delta commits so far, over every table of the lake or of `tables` (a commit is one `_delta_log/<version>.json`)."""
    if not lake.is_dir():
        return 0
    return sum(1 for p in lake.glob("*/_delta_log/*.json") if tables is None or p.parent.parent.name in tables)


def _jobs(spark: Any) -> int | None:
    """Spark jobs started so far in this session: the scheduler's next job id (internal to Spark; None if it moves)."""
    try:
        return int(spark.sparkContext._jsc.sc().dagScheduler().nextJobId())  # type: ignore[attr-defined]  # py4j passes the AtomicInteger as its value
    except Exception:  # noqa: BLE001 - a figure to print, not one to fail on
        return None


#: The labels a batch's Spark jobs carry (`spark_jobs.labelled`: a job tag `cdc-<label>` each), printed per run.
LABELS = ("split", "raw_change_events", "latest_state", "transactions", "collect", "dead_letter", "metrics")


def _jobs_by_label(spark: Any) -> dict[str, set[int]] | None:
    """The job ids Spark's status tracker holds for each label's tag, and for the batch's (None if unreadable)."""
    try:
        tracker = spark.sparkContext._jsc.sc().statusTracker()
        return {label: set(tracker.getJobIdsForTag(f"cdc-{label}")) for label in (*LABELS, "batch")}
    except Exception:  # noqa: BLE001 - a figure to print, not one to fail on
        return None


def child(name: str, conf: dict[str, str], runs: int, transactions: int, steady: bool) -> None:
    """One process, one Spark session with the variant's settings: `runs` runs, a JSON line per run on stdout."""
    from cdc_platform.config import load_config
    from cdc_platform.workload.generate import generate_workload
    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.spark.session import get_spark

    root = fresh_dir(OUT / "small_batches" / name)
    sample = generate_workload(root / "sample", transactions=transactions * (runs if steady else 1), seed=7, track_state=False)
    slices = _slices(sample.landing_dir, runs) if steady else {}
    spark = get_spark("bench-small-batches", conf=conf)
    codegen = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics  # type: ignore[attr-defined]
    for n in range(runs):
        run_root = root / ("steady" if steady else f"run-{n}")
        if steady:
            for rel, parts in slices.items():
                target = run_root / "landing" / rel.parent / f"{rel.stem}-{n:04d}{rel.suffix}"
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(b"".join(parts[n]))
        else:
            shutil.copytree(sample.landing_dir, run_root / "landing")
        shutil.copy(sample.config_path, run_root / "cdc.yaml")
        config = load_config(run_root / "cdc.yaml", lake=run_root / "lake", landing=run_root / "landing")
        compiles = codegen.METRIC_COMPILATION_TIME().getCount()
        jobs, commits, labelled = _jobs(spark), _commits(config.lake), _jobs_by_label(spark)
        ingest_commits = _commits(config.lake, INGEST_TABLES)
        cpu = CpuByRole(jvm_threads=True).start()
        t = time.perf_counter()
        report = IngestJob(config).run_available_now(spark)
        wall = time.perf_counter() - t
        after_labels = _jobs_by_label(spark)
        by_label = None if labelled is None or after_labels is None else {k: len(after_labels[k] - labelled[k]) for k in after_labels}
        row: dict[str, Any] = {
            "run": n, "wall": wall, "cpu": cpu.stop(), "compiles": codegen.METRIC_COMPILATION_TIME().getCount() - compiles,
            "jobs": None if jobs is None or (after := _jobs(spark)) is None else after - jobs, "commits": _commits(config.lake) - commits,
            "ingest_commits": _commits(config.lake, INGEST_TABLES) - ingest_commits,
            "stage_batch_seconds": sum(b.seconds for b in report.stage_batches),
            "batches": len(report.batches), "lines": report.total("rows_read"),
            "batch_seconds": sum(b.seconds for b in report.batches),
            "stages": report.stage_seconds(),
            "by_label": by_label,
        }
        print(json.dumps(row), flush=True)
        if not steady:
            shutil.rmtree(run_root, ignore_errors=True)


def _label_text(by_label: dict[str, float], total: float | None) -> str:
    """`split 5, raw_change_events 14, ...`, then the jobs outside a batch's labels (the run's own: listing, setup)."""
    parts = [f"{k} {v:g}" for k, v in by_label.items() if k != "batch" and v]
    if total is not None:
        parts.append(f"outside a batch {total - by_label.get('batch', 0):g}")
    return ", ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", action="append", metavar="NAME[=KEY=VALUE,...]",
                        help="a session to measure (repeatable; `session` alone is the session's own settings); "
                             "default: the codegen cache at 100 and at 4,000")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="runs left out of the medians (default 3)")
    parser.add_argument("--transactions", type=int, default=20, help="source transactions a run (default 20)")
    parser.add_argument("--steady", action="store_true", help="one lake, each run landing the next slice of the sample")
    parser.add_argument("--repeat", type=int, default=1, help="run the variants this many times, alternating their order")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        name, conf = parse_variant(args.child)
        child(name, conf, args.runs, args.transactions, args.steady)
        exit_now(0)
    texts = args.variant or DEFAULT_VARIANTS
    names = [parse_variant(text)[0] for text in texts]
    if len(set(names)) != len(names):
        raise SystemExit("--variant names must differ")
    warm: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for n, (text, name) in enumerate(alternating(list(zip(texts, names)), args.repeat)):
        rep = n // len(names)
        banner(f"{name} (repeat {rep + 1}/{args.repeat}): {args.runs} runs of {args.transactions} transactions"
               f"{', one lake' if args.steady else ', a fresh lake each'}")
        cmd = [sys.executable, __file__, "--child", text, "--runs", str(args.runs), "--transactions", str(args.transactions)]
        out = subprocess.run(cmd + (["--steady"] if args.steady else []), capture_output=True, text=True, cwd=REPO)
        if out.returncode != 0:
            say(out.stderr[-3000:])
            exit_now(out.returncode)
        rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
        for r in rows:
            cpu = largest_first(cpu_roles(r["cpu"]))
            threads = largest_first(jvm_thread_seconds(r["cpu"]))
            stages = " ".join(f"{k} {v:.2f}" for k, v in r["stages"].items())
            say(f"  run {r['run']:2d}: {r['wall']:5.2f} s (in batches {r['batch_seconds']:.2f}: {stages}), {r['batches']} batch(es), "
                f"{r['lines']} lines, {r['compiles']:3d} compiles, {r['jobs']} jobs, {r['commits']} commits "
                f"({r['ingest_commits']} of them the ingest's; stage queries {r['stage_batch_seconds']:.2f} s); CPU s: {cpu}")
            if threads:
                say(f"          JVM CPU s by thread: {threads}")
            if r.get("by_label") is not None:
                say(f"          jobs by label: {_label_text(r['by_label'], r['jobs'])}")
        warm[name] += rows[args.warmup:]
    banner(f"medians of the runs after the first {args.warmup} of each process")
    for name in names:
        rows = warm[name]
        if rows:
            cpu = statistics.median(sum(cpu_roles(r["cpu"]).values()) for r in rows)
            jvm = statistics.median(r["cpu"].get("jvm", 0.0) for r in rows)
            counted = [r["jobs"] for r in rows if r["jobs"] is not None]
            jobs = f"{statistics.median(counted):.0f}" if len(counted) == len(rows) else "?"  # `_jobs` could not read Spark's counter
            say(f"  {name}: {statistics.median(r['wall'] for r in rows):.2f} s wall, "
                f"{statistics.median(r['batch_seconds'] for r in rows):.2f} s in batches, {cpu:.1f} s CPU ({jvm:.1f} s JVM), "
                f"{statistics.median(r['compiles'] for r in rows):.0f} compiles, "
                f"{jobs} Spark jobs, {statistics.median(r['commits'] for r in rows):.0f} Delta commits, "
                f"of them the ingest batch's: {statistics.median(r['by_label']['batch'] for r in rows if r.get('by_label')) if all(r.get('by_label') for r in rows) else '?'} jobs, "
                f"{statistics.median(r['ingest_commits'] for r in rows):.0f} commits, {statistics.median(r['batch_seconds'] for r in rows):.2f} s  (n = {len(rows)})")
            kinds = {k for r in rows for k in jvm_thread_seconds(r["cpu"])}
            if kinds:
                by_kind = {k: statistics.median(jvm_thread_seconds(r["cpu"]).get(k, 0.0) for r in rows) for k in kinds}
                say("    JVM CPU s by thread (medians): " + largest_first(by_kind))
            if all(r.get("by_label") is not None for r in rows):
                medians = {k: statistics.median(r["by_label"][k] for r in rows) for k in rows[0]["by_label"]}
                say(f"    jobs by label (medians): {_label_text(medians, statistics.median(counted) if len(counted) == len(rows) else None)}")
    exit_now(0)


if __name__ == "__main__":
    main()
