"""Helpers the benchmarks share: where outputs go, cached workloads, machine load and memory figures.

Benchmarks here run on a shared 2-core machine, so every figure is printed next to the load average
at the time it was taken; a figure without its load is not comparable with another one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "benchmarks" / "out"

if str(REPO) not in sys.path:  # run as `python benchmarks/x.py` without installing the repo
    sys.path.insert(0, str(REPO))

#: Change events per generated transaction, measured on the sample workload (seeds 1-7: 1.36-1.37).
EVENTS_PER_TRANSACTION = 1.35


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def say(message: str) -> None:
    print(message, flush=True)


def banner(title: str) -> None:
    say(f"== {title} == {time.strftime('%Y-%m-%d %H:%M:%S')}  {load_average()}")


def alternating(items: list[Any], repeat: int) -> list[Any]:
    """`items` `repeat` times, every second time reversed (a b, b a, a b ...): a load drifting on this shared
    machine then falls on every item alike, which is how benchmarks here compare settings."""
    return [item for i in range(repeat) for item in (items if i % 2 == 0 else items[::-1])]


def transactions_for(events: int) -> int:
    """Transactions the generator needs for at least `events` change events (it reports the exact count)."""
    return max(1, -(-events * 100 // int(EVENTS_PER_TRANSACTION * 100)))


@dataclass(frozen=True)
class Workload:
    """A generated workload kept under benchmarks/out so repeated runs skip the generator."""

    root: Path
    landing: Path
    config_path: Path
    facts: dict[str, Any]

    @property
    def change_events(self) -> int:
        return int(self.facts["change_events"])

    @property
    def lines(self) -> int:
        f = self.facts
        return int(f["change_events"] + f["duplicate_events"] + f["markers"] + f["malformed_lines"] + f["tombstones"])


def workload(transactions: int, seed: int, events_per_file: int = 500) -> Workload:
    """Generate (once) the sample payments workload; the stamp file records what the generator said."""
    root = OUT / f"workload-t{transactions}-s{seed}-f{events_per_file}"
    stamp = root / "workload.json"
    if stamp.is_file():
        facts = json.loads(stamp.read_text(encoding="utf-8"))
        return Workload(root, root / "landing", root / "cdc.yaml", facts)
    if root.exists():
        shutil.rmtree(root)  # an interrupted generation: start again
    # In a child process, so the generator's memory is not counted as the pipeline's.
    subprocess.run([sys.executable, __file__, "generate", str(root), str(transactions), str(seed), str(events_per_file)], check=True)
    facts = json.loads(stamp.read_text(encoding="utf-8"))
    return Workload(root, root / "landing", root / "cdc.yaml", facts)


def _generate(root: Path, transactions: int, seed: int, events_per_file: int) -> None:
    from cdc_platform.workload.generate import generate_workload

    t0 = time.perf_counter()
    w = generate_workload(root, transactions=transactions, seed=seed, events_per_file=events_per_file, track_state=False)
    facts = {
        "transactions": w.transactions,
        "change_events": w.change_events,
        "duplicate_events": w.duplicate_events,
        "markers": w.markers,
        "malformed_lines": w.malformed_lines,
        "tombstones": w.tombstones,
        "files": w.files,
        "bytes": sum(p.stat().st_size for p in w.landing_dir.rglob("*") if p.is_file()),
        "generate_seconds": round(time.perf_counter() - t0, 1),
    }
    (root / "workload.json").write_text(json.dumps(facts, indent=2), encoding="utf-8")


def built_lake(spark: Any, config: Any, root: Path, w: Workload) -> None:
    """Build `config`'s lake from the workload once (`cdc run`), under `root`, and keep it for later runs:
    a stamp file names the workload it was built from, so another workload builds it anew."""
    stamp = root / f"lake-{w.root.name}.done"
    if stamp.is_file():
        return
    from cdc_platform.run.ingest import IngestJob

    shutil.rmtree(root, ignore_errors=True)
    banner(f"building the lake: {w.change_events:,} change events")
    t0 = time.perf_counter()
    IngestJob(config).run_available_now(spark)
    root.mkdir(parents=True, exist_ok=True)
    stamp.write_text(f"{time.perf_counter() - t0:.1f} s\n", encoding="utf-8")


def fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


# --- memory -----------------------------------------------------------------------------------------

def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(pid: int) -> list[int]:
    kids = _children()
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _comm(pid: int, *, task_of: int | None = None) -> str:
    try:
        with open(f"/proc/{pid}/comm" if task_of is None else f"/proc/{task_of}/task/{pid}/comm", encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return "?"


@dataclass
class MemorySampler:
    """Peak resident memory of this process tree: the Python driver, the JVM, Spark's Python workers.

    The driver's and the JVM's peaks are the kernel's high-water marks (VmHWM), reset when the sampler
    starts (`/proc/<pid>/clear_refs` = 5) so one measured phase is not charged with an earlier one's
    peak. Python child processes (the parser pool, Spark's Python workers) come and go, so their figure and the tree total are sampled every
    `interval` seconds: a lower bound of the true peak.
    """

    interval: float = 0.25
    peak_total_kib: int = 0
    peak_workers_kib: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> MemorySampler:
        for pid in [os.getpid(), *descendants(os.getpid())]:
            try:
                with open(f"/proc/{pid}/clear_refs", "w", encoding="utf-8") as fh:
                    fh.write("5")
            except OSError:
                pass  # not permitted here: the figure then covers the process's whole life
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.is_set():
            total = _status_kib(me, "VmRSS")
            workers = 0
            for pid in descendants(me):
                rss = _status_kib(pid, "VmRSS")
                total += rss
                if _comm(pid).startswith("python"):
                    workers += rss
            self.peak_total_kib = max(self.peak_total_kib, total)
            self.peak_workers_kib = max(self.peak_workers_kib, workers)
            self._stop.wait(self.interval)

    def stop(self) -> dict[str, float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        jvm = [p for p in descendants(os.getpid()) if _comm(p) == "java"]
        return {
            "driver_python_peak_mib": _status_kib(os.getpid(), "VmHWM") / 1024,
            "jvm_peak_mib": sum(_status_kib(p, "VmHWM") for p in jvm) / 1024,
            "python_workers_peak_mib": self.peak_workers_kib / 1024,
            "tree_total_peak_mib": self.peak_total_kib / 1024,
        }


_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, *, reaped: bool = False, task_of: int | None = None) -> float | None:
    """utime + stime of one process (with `reaped`, plus its children that exited and were waited for), or of one
    thread `pid` of process `task_of`; None once it is gone."""
    where = f"/proc/{pid}" if task_of is None else f"/proc/{task_of}/task/{pid}"
    try:
        with open(f"{where}/stat", encoding="utf-8") as fh:
            stat = fh.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / _TICKS


@dataclass
class CpuByRole:
    """CPU seconds this process tree spends between `start` and `stop`, by role: the driver's Python, the
    JVM (driver and, in local mode, the executors), and Spark's Python workers (the Arrow functions: the
    parser, the transaction buckets, the part decoders).

    Two readings of /proc, at the start and at the end (with `jvm_threads`, the JVM's threads are also read in
    between, see there). A Python process under the JVM counts with the
    children it reaped (pyspark's daemon forks the workers and waits for them), so workers that ended in
    between are counted; one that was alive at the start and ended in between is charged whole.
    """

    #: Also split each JVM's CPU by the kind of thread that spent it (`jvm_thread_kind`), as `jvm: <kind>` entries
    #: beside the `jvm` total: whether a JVM's time goes to Spark's tasks, the JIT compilers, the garbage
    #: collector or the driver's own threads (planning, Delta's commits, Py4J). Threads come and go (Spark's
    #: pools, the JIT's compiler threads), and one that ends takes its figure out of /proc, so the threads are
    #: read every `interval` seconds and each is charged what it had spent when last seen; what is left of the
    #: JVM's total (threads that lived less than an interval, or the end of one) is `jvm: unseen`.
    jvm_threads: bool = False
    interval: float = 0.5
    _start: dict[int, float] = field(default_factory=dict)
    _threads: dict[tuple[int, int], tuple[str, float, float]] = field(default_factory=dict)  # kind, first, last seen
    _stop: threading.Event = field(default_factory=threading.Event)
    _sampler: threading.Thread | None = None

    def _read(self) -> dict[int, tuple[str, float]]:
        me = os.getpid()
        found = {me: ("driver python", cpu_seconds(me) or 0.0)}
        for pid in descendants(me):
            name = _comm(pid)
            role = "jvm" if name == "java" else "python workers" if name.startswith("python") else "other"
            value = cpu_seconds(pid, reaped=role == "python workers")
            if value is not None:
                found[pid] = (role, value)
        return found

    def _see_threads(self, pids: list[int], *, first: bool = False) -> None:
        for pid in pids:
            try:
                tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                continue
            for tid in tids:
                value = cpu_seconds(tid, task_of=pid)
                if value is None:
                    continue
                known = self._threads.get((pid, tid))
                if known is None:  # a thread's name is read once (a task thread's name changes, not its kind)
                    # A thread first seen after the start began within the measured phase: all its CPU counts.
                    self._threads[(pid, tid)] = (jvm_thread_kind(_comm(tid, task_of=pid)), value if first else 0.0, value)
                else:
                    self._threads[(pid, tid)] = (known[0], known[1], value)

    def _sample(self, pids: list[int]) -> None:
        while not self._stop.wait(self.interval):
            self._see_threads(pids)

    def start(self) -> CpuByRole:
        found = self._read()
        self._start = {pid: value for pid, (_, value) in found.items()}
        if self.jvm_threads:
            jvms = [pid for pid, (role, _) in found.items() if role == "jvm"]
            self._see_threads(jvms, first=True)
            self._sampler = threading.Thread(target=self._sample, args=(jvms,), daemon=True)
            self._sampler.start()
        return self

    def stop(self) -> dict[str, float]:
        roles: dict[str, float] = {}
        found = self._read()
        for pid, (role, value) in found.items():
            roles[role] = roles.get(role, 0.0) + value - self._start.get(pid, 0.0)
        if self._sampler is not None:
            self._stop.set()
            self._sampler.join()
            self._see_threads([pid for pid, (role, _) in found.items() if role == "jvm"])
            by_kind: dict[str, float] = {}
            for kind, first, last in self._threads.values():
                by_kind[kind] = by_kind.get(kind, 0.0) + last - first
            by_kind["unseen"] = roles.get("jvm", 0.0) - sum(by_kind.values())
            roles.update({f"jvm: {kind}": seconds for kind, seconds in by_kind.items()})
        return roles


#: HotSpot names a Java thread's OS thread after it (its first 15 characters): what `CpuByRole` sorts by.
_JVM_THREAD_KINDS = (
    ("Executor task l", "tasks"),  # Spark's "Executor task launch worker for task N"
    ("C2 CompilerThre", "jit"), ("C1 CompilerThre", "jit"),
    ("GC Thread", "gc"), ("G1 ", "gc"), ("VM Thread", "gc"),  # the VM thread runs the safepoint operations, the collections among them
)


def jvm_thread_kind(name: str) -> str:
    """tasks, jit, gc, or driver: every other thread (the main one, Py4J's, the scheduler's, Delta's commit threads)."""
    return next((kind for prefix, kind in _JVM_THREAD_KINDS if name.startswith(prefix)), "driver")


def cpu_roles(cpu: dict[str, float]) -> dict[str, float]:
    """`CpuByRole.stop()`'s roles, which add up to the process tree's CPU (the JVM's split by thread left out)."""
    return {k: v for k, v in cpu.items() if not k.startswith("jvm: ")}


def jvm_thread_seconds(cpu: dict[str, float]) -> dict[str, float]:
    """`CpuByRole.stop()`'s split of the JVM's CPU by kind of thread (empty without `jvm_threads`)."""
    return {k.removeprefix("jvm: "): v for k, v in cpu.items() if k.startswith("jvm: ")}


def largest_first(seconds: dict[str, float]) -> str:
    """`name 1.2, other 0.3`: figures by name, the largest first."""
    return ", ".join(f"{k} {v:,.1f}" for k, v in sorted(seconds.items(), key=lambda kv: -kv[1]))


def cpu_line(cpu: dict[str, float], wall: float) -> str:
    roles = cpu_roles(cpu)
    total = sum(roles.values())
    parts = largest_first(roles)
    threads = jvm_thread_seconds(cpu)
    if threads:
        parts += " (JVM by thread: " + largest_first(threads) + ")"
    return f"CPU seconds: {parts}; total {total:,.1f} = {total / wall:.2f} of {os.cpu_count()} cores over {wall:.1f} s"


def memory_line(mem: dict[str, float]) -> str:
    return (
        f"peak memory: driver python {mem['driver_python_peak_mib']:,.0f} MiB (VmHWM), "
        f"JVM {mem['jvm_peak_mib']:,.0f} MiB (VmHWM), python child processes (parser pool, Spark workers) {mem['python_workers_peak_mib']:,.0f} MiB (sampled), "
        f"whole process tree {mem['tree_total_peak_mib']:,.0f} MiB (sampled)"
    )


def exit_now(code: int | None) -> None:
    """Exit with the benchmark's own code, skipping the interpreter's teardown of native thread pools.

    With deltalake 1.6 and pyarrow 26, a process that scanned a Delta table through pyarrow can abort
    at exit ("terminate called without an active exception", exit 134) after all its work is done:
    a native pool thread is destroyed while still joinable (delta-rs#2184, arrow#34314). The figures
    are printed by then; this keeps a run that succeeded from looking like a crash.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def stage_names(job: Any) -> list[str]:
    return ["raw"] + [getattr(s, "name", type(s).__name__) for s in job.stages] + ["dead_letter"]


if __name__ == "__main__":  # internal: `workload()` runs the generator in a child process
    if len(sys.argv) == 6 and sys.argv[1] == "generate":
        _generate(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        sys.exit("usage: _common.py generate ROOT TRANSACTIONS SEED EVENTS_PER_FILE (used by the benchmarks)")


@dataclass
class TaskSampler:
    """The share of wall time in which no Spark task runs: the driver alone (planning, Delta's commits,
    listing, Python on the driver). It bounds what any cluster can speed a run up by: more executors only
    shorten the other share. Sampled every `interval` seconds from Spark's status tracker (active stages'
    running tasks), so it is an estimate, good to a few percent over a run of minutes."""

    spark: Any
    interval: float = 0.05
    samples: int = 0
    idle: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TaskSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        tracker = self.spark.sparkContext.statusTracker()
        while not self._stop.is_set():
            running = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    running += info.numActiveTasks
            self.samples += 1
            self.idle += running == 0
            self._stop.wait(self.interval)

    def stop(self) -> float:
        """The driver-only share of the time sampled (0..1)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.idle / self.samples if self.samples else float("nan")
