"""Coverage against the live source on a big table: the driver's memory and the time of one compare.

The database is a stand-in: `source_connection._connect` is patched to a PostgreSQL-shaped connection whose
server-side cursor yields `--rows` rows as it is fetched (a real server streams the same way), and the
lake's folded state is a Spark frame of as many rows (`views.table_frame` patched), one in
`--differ` of them with another `name` and a few keys on one side only. Everything between those two
ends is the product's code: the read, the compare, the recheck of the differing keys (`recheck_after` 0).

Because it patches only those two seams, the same script runs against an earlier checkout of the package
(`--package-root`, e.g. a worktree of the commit before the compare moved onto the executors), so the
figures before and after come from one harness:

    .venv/bin/python benchmarks/source_coverage.py --rows 1000000
    git worktree add -f /tmp/wt-before <commit> && ln -s $PWD/.venv /tmp/wt-before/.venv && ln -s $PWD/jvm/jars /tmp/wt-before/jvm/jars
    .venv/bin/python benchmarks/source_coverage.py --rows 1000000 --package-root /tmp/wt-before

Printed: the check's outcome (counts), its wall time, and the peak memory of the driver's Python, its JVM
and the Python workers (`_common.MemorySampler`), with the load average.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows on each side (default 1,000,000)")
    parser.add_argument("--differ", type=int, default=2_000, help="one row in this many differs in `name` (default 2,000)")
    parser.add_argument("--package-root", type=Path, default=None, help="import cdc_platform from this checkout instead")
    args = parser.parse_args()
    from _common import MemorySampler, banner, exit_now, load_average, memory_line, say  # puts this checkout first on sys.path

    if args.package_root is not None:
        sys.path.insert(0, str(args.package_root.resolve()))

    import cdc_platform
    from cdc_platform import lake, views
    from cdc_platform.sources import source_connection
    from cdc_platform.checks import source_coverage
    from cdc_platform.config import TableConfig
    from cdc_platform.spark.session import get_spark

    banner("coverage against the live source")
    say(f"package: {Path(cdc_platform.__file__).parent}; {args.rows:,} rows a side, one in {args.differ:,} different")
    n, differ = args.rows, args.differ
    spark = get_spark("cdc-bench-source-coverage")

    class Cursor:
        """A server-side cursor over `n` generated rows (ids 0..n-1, one extra id past them), fetched in pieces."""

        def __init__(self) -> None:
            self.rows = self._generate()
            self.description = [type("Column", (), {"name": c})() for c in ("id", "name", "email")]
            self.itersize = 10_000

        @staticmethod
        def _generate() -> Iterator[tuple[Any, ...]]:
            for i in range(1, n):  # id 0 is missing from the source: extra in the lake
                yield (i, f"name {i}" if i % differ else f"renamed {i}", f"user{i}@example.com")
            yield (n + 1, "only in the source", "new@example.com")  # missing in the lake

        def __enter__(self) -> Cursor:
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

        def execute(self, sql: str, params: Any = None) -> Cursor:
            if params:  # the recheck: only the keys asked for
                wanted = set(params)
                self.rows = (r for r in self._generate() if r[0] in wanted)
            return self

        def fetchone(self) -> tuple[str]:
            return (f"{10**12 >> 32:X}/{10**12 & 0xFFFFFFFF:X}",)

        def fetchmany(self, size: int) -> list[tuple[Any, ...]]:
            return [row for _, row in zip(range(size), self.rows)]

        def __iter__(self) -> Iterator[tuple[Any, ...]]:
            return self.rows

    class Connection:
        def __init__(self) -> None:
            self.cur = Cursor()

        def execute(self, sql: str) -> Cursor:
            return self.cur

        def cursor(self, name: str | None = None) -> Cursor:
            self.cur = Cursor()
            return self.cur

        def rollback(self) -> None:
            return None

    @contextmanager
    def connect(_conn: Any) -> Iterator[Connection]:
        yield Connection()

    def lake_state(spark_: Any, lake_dir: Any, name: str) -> Any:
        from pyspark.sql import functions as F

        return spark.range(0, n).select(
            F.col("id"), F.concat(F.lit("name "), F.col("id").cast("string")).alias("name"),
            F.concat(F.lit("user"), F.col("id").cast("string"), F.lit("@example.com")).alias("email"),
            F.lit(f"{10**11:020d}").alias("_position"), F.lit(False).alias("_deleted"))  # older than the read: none left out

    source_connection._connect = connect  # type: ignore[assignment]
    lake.exists = lambda path: True  # type: ignore[assignment]
    views.table_frame = lake_state  # type: ignore[assignment]
    table = TableConfig(source="public.accounts", name="accounts", key=("id",))
    conn = source_connection.SourceConnection("postgresql", "127.0.0.1", 5432, "app", "reader", "pw", recheck_after=0.0)

    with tempfile.TemporaryDirectory(prefix="cdc-bench-coverage-") as root:
        say(f"[{load_average()}]")
        memory = MemorySampler().start()
        t0 = time.perf_counter()
        out = source_coverage.source_coverage(spark, Path(root), table, conn, sleep=lambda s: None)
        seconds = time.perf_counter() - t0
        mem = memory.stop()
    counts = {k: out.metadata[k] for k in ("matched", "changed_after_read", "missing_in_lake", "different_values", "extra_in_lake")}
    say(f"outcome: passed={out.passed}; {counts}; rechecked {out.metadata['rechecked_keys']:,} keys")
    say(f"check: {seconds:.1f} s = {n / seconds:,.0f} rows a side per second   [{load_average()}]")
    say(memory_line(mem))
    expected_different = len(range(differ, n, differ))
    assert counts["different_values"] == expected_different and counts["missing_in_lake"] == 1 and counts["extra_in_lake"] == 1, counts
    exit_now(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
