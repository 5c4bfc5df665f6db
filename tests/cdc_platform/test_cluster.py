"""The same job on a real Spark cluster: `cdc run --master spark://...` builds the lake local mode builds.

The cluster is the session fixture `spark_cluster` (a standalone master and two one-core workers on loopback,
from pyspark's own classes). The cluster run is a `python -m cdc_platform run --master ...` child process (this
process already holds the suite's local session, and a process holds one), started beside the local run of the
same config into another lake. Then both lakes are read through the same session and compared row for row: every
table the lake holds (raw log, markers, dead letters, the transaction tables and their state, each latest-state
table as stored and its history) and every full view. Ignored: the columns that say when or in which micro-batch
a row was written (`*_at`, batch ids, `_seq`), and pipeline_metrics, whose totals are compared instead. The other
views are SQL over these tables, the same on both sides.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import yaml

from cdc_platform.config import load_config
from cdc_platform.workload.generate import generate_workload
from cdc_platform.run.ingest import IngestJob
from cdc_platform.views import register_lake

REPO = Path(__file__).resolve().parents[2]
METRIC_TOTALS = ("rows_read", "change_events", "markers", "tombstones", "dead_letters", "duplicates_skipped")


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def volatile(column: str) -> bool:
    """Columns that record when, or in which micro-batch, a row was written (or how long it took): they differ
    between two runs."""
    return column.endswith(("_at", "_batch")) or column in ("batch_id", "_seq", "query_id", "applied_through", "stage_seconds", "stage_figures")


def _canon(value: Any) -> Any:
    """A hashable, order-independent form of a Spark value (maps come back as dicts, structs as Rows)."""
    if hasattr(value, "asDict"):
        return tuple((k, _canon(v)) for k, v in value.asDict().items())
    if isinstance(value, dict):
        return tuple(sorted(((repr(k), _canon(v)) for k, v in value.items()), key=repr))
    if isinstance(value, (list, tuple)):
        return tuple(_canon(v) for v in value)
    if isinstance(value, float) and value != value:
        return "NaN"
    return value


def in_tables(name: str, tables: Collection[str] | None) -> bool:
    """Whether a lake name (a table, or one of its views: `customers__full_view`) is one of `tables`' (all when None)."""
    return tables is None or name.split("__")[0] in tables


def lake_contents(spark: Any, lake_dir: Path, tables: Collection[str] | None = None) -> tuple[dict[str, collections.Counter[tuple[Any, ...]]], dict[str, int]]:
    """Every table and full view of the lake as a multiset of rows (volatile columns left out), and the metrics' totals.
    `tables`: only these tables and their full views (a step that wrote one table is checked on it, not the lake)."""
    contents: dict[str, collections.Counter[tuple[Any, ...]]] = {}
    totals: dict[str, int] = {}
    names = register_lake(spark, lake_dir)
    for name in [n for n in names if "__" not in n or n.endswith("__full_view")]:  # tables as readers see them, full views
        if not in_tables(name, tables):
            continue
        columns = [c for c in spark.table(quote(name)).columns if not volatile(c)]
        if name == "pipeline_metrics":
            sums = ", ".join(f"sum({c}) AS {c}" for c in METRIC_TOTALS)
            totals = spark.sql(f"SELECT {sums} FROM pipeline_metrics").collect()[0].asDict()
            continue
        select = ", ".join(quote(c) for c in columns)
        rows = spark.sql(f"SELECT {select} FROM {quote(name)}").collect()
        contents[name] = collections.Counter(tuple(_canon(v) for v in row) for row in rows)
    return contents, totals


def build_input(root: Path, peer: dict[str, Path]) -> Path:
    """One landing directory: `cdc generate`'s sample (MySQL-shaped payments: multi-table transactions, markers,
    duplicates, a malformed line, tombstones), small, plus every file of the peer data (real Debezium
    PostgreSQL output). Several micro-batches, each read by the executors."""
    w = generate_workload(root / "input", transactions=300, seed=5, events_per_file=60, track_state=False)
    flink = w.landing_dir / "flink"
    flink.mkdir()
    for path in sorted(next(iter(peer.values())).parent.glob("*.txt")):
        (flink / f"{path.stem}.jsonl").write_bytes(path.read_bytes())
    doc = yaml.safe_load(w.config_path.read_text(encoding="utf-8"))
    doc["tables"]["inventory.products"] = {"key": ["id"], "history": True}
    doc["max_files_per_trigger"] = 8
    w.config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return w.config_path


def test_cdc_run_on_a_standalone_cluster_builds_the_local_lake(
    tmp_path: Path, spark: Any, spark_cluster: Any, peer_files: dict[str, Path]
) -> None:
    config_path = build_input(tmp_path, peer_files)
    local_lake, cluster_lake = tmp_path / "lake-local", tmp_path / "lake-cluster"
    apps_before = len(spark_cluster.state().get("completedapps", []))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    command = [
        sys.executable, "-m", "cdc_platform", "run", "--config", str(config_path), "--lake", str(cluster_lake), "--master", spark_cluster.master_url,
    ]
    t0 = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True)
    try:
        IngestJob(load_config(config_path, lake=local_lake)).run_available_now(spark)  # meanwhile, local mode
        local_s = time.perf_counter() - t0
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    cluster_s = time.perf_counter() - t0
    log = output.decode("utf-8", errors="replace")
    assert proc.returncode == 0, log[-4000:]
    assert f"starting Spark ({spark_cluster.master_url})" in log

    apps = spark_cluster.state().get("completedapps", [])
    assert len(apps) == apps_before + 1, apps
    assert apps[-1]["cores"] == 2, apps[-1]  # both one-core workers ran an executor for it

    local, local_totals = lake_contents(spark, local_lake)
    remote, remote_totals = lake_contents(spark, cluster_lake)
    assert sorted(remote) == sorted(local)
    for name in ("raw_change_events", "transaction_markers", "dead_letter"):
        assert name in local
    assert {"customers__full_view", "charges__full_view", "refunds__full_view", "products__full_view"} <= set(local)
    assert sum(local["raw_change_events"].values()) > 0
    differences = {
        name: f"{sum((rows - remote[name]).values())} row(s) only in the local lake, {sum((remote[name] - rows).values())} only in the cluster's"
        for name, rows in local.items()
        if remote[name] != rows
    }
    assert differences == {}
    assert remote_totals == local_totals
    done = [ln for ln in log.splitlines() if ln.startswith("[cdc] done in")]
    print(
        f"local run {local_s:.1f} s, cluster run {cluster_s:.1f} s (child process: Spark start, executors, job; {done[-1][6:]}); "
        + ", ".join(f"{n} {sum(c.values())}" for n, c in sorted(local.items()))
    )


def test_a_server_stops_with_its_whole_process_group(tmp_path: Path) -> None:
    """What the cluster relies on to leave nothing behind: the group goes, children and all, even if it ignores SIGTERM."""
    from cdc_platform.spark.cluster import Server
    from cdc_platform.spark.processes import group_alive as _group_alive

    for script, grace in (("sleep 60 & sleep 60 & wait", 10.0), ("trap '' TERM; sleep 60 & wait", 0.5)):
        server = Server("sleepers", tmp_path / "sleepers.log")
        server.launch(["sh", "-c", script], dict(os.environ), tmp_path)
        pgid = server.pid
        assert pgid is not None
        time.sleep(0.3)
        assert _group_alive(pgid)
        t0 = time.perf_counter()
        server.stop(grace)
        assert not _group_alive(pgid)
        assert time.perf_counter() - t0 < grace + 5
