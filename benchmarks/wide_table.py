"""Small batches into one latest-state table of many columns: what a batch costs as the table widens.

Source tables of hundreds or thousands of columns exist (MySQL allows 4,096, PostgreSQL 1,600); the bad-input
corpus carries a 5,001-column row. Each width gets a fresh lake and `--batches` runs of `cdc run`, each landing
`--rows` MySQL-shaped change events (inserts, then updates of the same keys) for `wide.t`. The runs share one
warm session; the first run of each width (table creation, schema evolution) is printed but left out of the
median.

    .venv/bin/python benchmarks/wide_table.py                        # 10, 1,000 and 5,000 columns
    .venv/bin/python benchmarks/wide_table.py --columns 10,1600 --batches 6
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml
from _common import OUT, banner, fresh_dir, load_average, say

from cdc_platform.config import load_config
from cdc_platform.run.ingest import IngestJob
from cdc_platform.spark.session import get_spark


def events(columns: int, rows: int, batch: int, position: int) -> list[str]:
    """`rows` change events of `wide.t`, each with `columns` columns besides the key: inserts in the first
    batch, updates of the same keys after it; binlog positions from `position` on."""
    lines = []
    for key in range(rows):
        pos = position + key
        image: dict[str, Any] = {"id": key} | {f"c{i}": batch * 1_000 + i for i in range(columns)}
        lines.append(json.dumps({
            "before": image if batch else None,
            "after": image,
            "source": {"version": "2.7.3.Final", "connector": "mysql", "name": "wide", "ts_ms": 1767225600000 + pos, "snapshot": "false",
                       "db": "wide", "table": "t", "server_id": 1, "file": "mysql-bin.000001", "pos": pos, "row": 0},
            "op": "u" if batch else "c",
            "ts_ms": 1767225600400 + pos,
            "transaction": None,
        }))
    return lines


def run_width(spark: Any, root: Path, columns: int, rows: int, batches: int) -> list[dict[str, Any]]:
    (root / "landing").mkdir(parents=True)
    (root / "cdc.yaml").write_text(yaml.safe_dump({"landing": "landing", "lake": "lake", "tables": {"wide.t": {"key": ["id"]}}}),
                                   encoding="utf-8")
    config = load_config(root / "cdc.yaml")
    out = []
    for batch in range(batches):
        (root / "landing" / f"part-{batch:04d}.jsonl").write_text("\n".join(events(columns, rows, batch, 1_000 * (batch + 1))) + "\n",
                                                                 encoding="utf-8")
        t = time.perf_counter()
        report = IngestJob(config).run_available_now(spark)
        wall = time.perf_counter() - t
        stages = {k: round(v, 2) for k, v in report.stage_seconds().items()}
        say(f"  {columns:>6,} columns, run {batch}: {wall:6.2f} s ({len(report.batches)} batch, {report.total('rows_read')} lines) {stages}")
        out.append({"wall": wall, "stages": stages})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--columns", default="10,1000,5000", help="widths to measure, comma-separated (default 10,1000,5000)")
    parser.add_argument("--rows", type=int, default=20, help="change events a run lands")
    parser.add_argument("--batches", type=int, default=4, help="runs per width (the first is left out of the median)")
    args = parser.parse_args()
    widths = [int(c) for c in args.columns.split(",")]

    banner(f"wide table: {args.rows} change events a run, {args.batches} runs per width; load {load_average()}")
    spark = get_spark("bench-wide-table")
    root = fresh_dir(OUT / "wide_table")
    run_width(spark, root / "warm-up", 5, args.rows, 2)  # the JVM's own warm-up, not measured
    medians = {}
    for columns in widths:
        runs = run_width(spark, root / f"c{columns}", columns, args.rows, args.batches)
        medians[columns] = statistics.median(r["wall"] for r in runs[1:]) if len(runs) > 1 else runs[0]["wall"]
    banner(f"median of runs 1-{args.batches - 1} per width; load {load_average()}")
    for columns, median in medians.items():
        say(f"  {columns:>6,} columns: {median:6.2f} s a run")


if __name__ == "__main__":
    main()
