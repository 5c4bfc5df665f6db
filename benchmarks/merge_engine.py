"""Does a delta-spark MERGE of one micro-batch cost the same at 100k and at 10M rows? The benchmark that
decides the latest-state layout on the new engine (issue 10: keep merge-on-read unless delta-spark
MERGE, deletion vectors allowed, meets the same scaling target of at most 1.5x from 100k to 10M rows).

For each table size and key pattern (uniform keys, or 90% among the newest 1% of keys) a base table of
one row per key is written with delta-spark, then `--batches` MERGEs of a 10k-change batch (80% updates,
10% inserts, 10% deletes, the last change per key by position, the stale ones ignored as the pipeline
does) are timed after one warm-up, with deletion vectors on (merge-on-read inside Delta) and off
(copy-on-write). A full count after the batches shows what the deletion vectors cost readers.

    .venv/bin/python benchmarks/merge_engine.py                         # 100k, 1M, 10M
    .venv/bin/python benchmarks/merge_engine.py --sizes 100000 1000000 --batches 3

Compare with `benchmarks/merge_scaling.py`, the same batches through today's merge-on-read stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _common import OUT, banner, exit_now, fresh_dir, load_average, say  # noqa: E402

BATCH = 10_000


def write_base(spark: Any, path: Path, rows: int, deletion_vectors: bool) -> float:
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    base = (spark.range(rows).select(
        F.col("id"), F.format_string("customer-%d", "id").alias("name"), (F.col("id") * 7 % 1000).cast("decimal(12,2)").alias("amount"),
        F.lpad(F.col("id").cast("string"), 20, "0").alias("position"), F.lit(False).alias("deleted")))
    (base.write.format("delta").mode("overwrite")
     .option("delta.enableDeletionVectors", str(deletion_vectors).lower()).save(str(path)))
    return time.perf_counter() - t0


def change_batch(spark: Any, rows: int, pattern: str, batch: int, next_id: int) -> Any:
    """10k changes as a DataFrame: keys drawn by `pattern`, positions above every earlier batch's."""
    import numpy as np

    rng = np.random.default_rng(1000 + batch)
    kinds = rng.choice(3, size=BATCH, p=[0.8, 0.1, 0.1])  # update, insert, delete
    if pattern == "uniform":
        existing = rng.integers(0, rows, size=BATCH)
    else:
        recent = rng.integers(max(0, rows - rows // 100), rows, size=BATCH)
        existing = np.where(rng.random(BATCH) < 0.9, recent, rng.integers(0, rows, size=BATCH))
    ids = np.where(kinds == 1, np.arange(next_id, next_id + BATCH), existing)
    base_pos = (batch + 1) * 10**12 + rows
    data = [(int(i), f"customer-{int(i)}-v{batch}", float(k), str(base_pos + n).zfill(20), bool(k == 2))
            for n, (i, k) in enumerate(zip(ids, kinds, strict=True))]
    return spark.createDataFrame(data, "id BIGINT, name STRING, amount DOUBLE, position STRING, deleted BOOLEAN").selectExpr(
        "id", "name", "CAST(amount AS DECIMAL(12,2)) AS amount", "position", "deleted")


def merge(spark: Any, path: Path, changes: Any) -> float:
    """The pipeline's rule in one MERGE: last change per key in the batch, a higher position wins."""
    from delta.tables import DeltaTable

    t0 = time.perf_counter()
    last = changes.selectExpr("*", "row_number() OVER (PARTITION BY id ORDER BY position DESC) AS n").where("n = 1").drop("n")
    (DeltaTable.forPath(spark, str(path)).alias("t").merge(last.alias("s"), "t.id = s.id")
     .whenMatchedDelete("s.deleted AND s.position > t.position")
     .whenMatchedUpdateAll("NOT s.deleted AND s.position > t.position")
     .whenNotMatchedInsertAll("NOT s.deleted")
     .execute())
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--patterns", nargs="+", default=["uniform", "recent"], choices=["uniform", "recent"])
    parser.add_argument("--batches", type=int, default=5, help="measured MERGEs per size, pattern and layout (after one warm-up)")
    args = parser.parse_args()

    from cdc_platform.spark.session import get_spark

    banner("merge engine: delta-spark MERGE of a 10k-change batch, deletion vectors on and off")
    spark = get_spark("cdc-benchmark-merge-engine")
    run_dir = OUT / "merge_engine"
    fresh_dir(run_dir)
    results: list[dict[str, Any]] = []
    for dv in (True, False):
        for pattern in args.patterns:
            for rows in args.sizes:
                path = run_dir / f"t_{rows}_{pattern}_{'dv' if dv else 'cow'}"
                base_s = write_base(spark, path, rows, dv)
                seconds = []
                for batch in range(args.batches + 1):
                    s = merge(spark, path, change_batch(spark, rows, pattern, batch, rows + batch * BATCH))
                    if batch:  # the first pays JIT and caches
                        seconds.append(s)
                t0 = time.perf_counter()
                count = spark.read.format("delta").load(str(path)).count()
                count_s = time.perf_counter() - t0
                row = {"rows": rows, "pattern": pattern, "deletion_vectors": dv, "apply_median_s": statistics.median(seconds),
                       "apply_max_s": max(seconds), "count_s": count_s, "count": count, "base_write_s": base_s, "load": load_average()}
                results.append(row)
                say(f"{'DV ' if dv else 'CoW'} {pattern:8s} {rows:>11,} rows: MERGE of 10k changes median {row['apply_median_s']:.2f} s "
                    f"(max {row['apply_max_s']:.2f}), full count {count_s:.2f} s; base written in {base_s:.1f} s  [{load_average()}]")
    say("")
    for dv in (True, False):
        for pattern in args.patterns:
            mine = [r for r in results if r["deletion_vectors"] == dv and r["pattern"] == pattern]
            if len(mine) > 1:
                lo, hi = min(mine, key=lambda r: r["rows"]), max(mine, key=lambda r: r["rows"])
                say(f"{'deletion vectors' if dv else 'copy-on-write   '} {pattern:8s}: {hi['rows']:,} rows / {lo['rows']:,} rows = "
                    f"{hi['apply_median_s'] / lo['apply_median_s']:.2f}x per batch (target <= 1.5x)")
    (OUT / "merge_engine.json").write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    exit_now(main())
