"""Maintenance (`cdc maintain`): fold pending changes, purge expired tombstones, compact small files, vacuum.

Why each step:

* Fold: the latest-state tables are merge-on-read (see the latest_state package). The stream folds the delta
  layer into the base on its own once it passes a threshold; folding here as well keeps the views'
  work minimal between bursts and is the moment tombstones can be judged.
* Purge: a tombstone keeps a stale change from resurrecting its row. Keeping tombstones forever grows the
  base with dead keys, so those older than the table's `tombstone_retention` go; a change arriving later
  than that may resurrect its row, which is the promise the retention states.
* Compact: every micro-batch appends at least one small file to each table it touches; many small files
  make every scan slow. delta-spark `OPTIMIZE` bins them into large ones without changing a row.
* Vacuum: compaction and MERGE leave unreferenced files behind; after `vacuum_hours` (default 7 days, so
  a reader holding an older snapshot keeps working) delta-spark `VACUUM` deletes them; the count comes
  from its `VACUUM END` entry in `DESCRIBE HISTORY`.

Fold and purge are delta-spark MERGE and DELETE (`latest_state.compaction`); OPTIMIZE and VACUUM leave
the table's protocol and features as they were, so the driver's delta-rs reads keep working after them
(`tests/cdc_platform/test_lake_spark.py`).

Every step is an ordinary Delta commit, safe to run while the stream runs (a conflicting commit is
retried), and safe to interrupt.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.stages import latest_state
from cdc_platform.spark import spark_jobs
from cdc_platform.config import TableConfig
from cdc_platform.errors import LakeError
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_VACUUM_HOURS = 168.0


@dataclass
class TableMaintenance:
    """What maintenance did to one table."""

    name: str
    folded: int = 0
    purged: int = 0
    files_before: int = 0
    files_after: int = 0
    vacuumed: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        parts = []
        if self.folded:
            parts.append(f"folded {self.folded:,} pending changes into the base")
        if self.purged:
            parts.append(f"purged {self.purged:,} expired tombstones")
        if self.files_after != self.files_before:
            parts.append(f"compacted {self.files_before:,} files into {self.files_after:,}")
        if self.vacuumed:
            parts.append(f"vacuumed {self.vacuumed:,} unreferenced files")
        parts += self.notes
        return f"{self.name}: {', '.join(parts) if parts else 'nothing to do'} ({self.seconds:.1f} s)"


def _optimize(spark: SparkSession, path: Path, name: str) -> None:
    """OPTIMIZE, redone when a concurrent writer (the stream) commits first and Delta refuses the commit."""
    lake_spark.with_retries(lambda: lake_spark.optimize(spark, path), what=f"compacting the files of {name}", advice="rerun `cdc maintain`")


def maintain(
    spark: SparkSession,
    lake_dir: LakePath,
    *,
    tables: Sequence[TableConfig] | None = None,
    only: Sequence[str] | None = None,
    vacuum_hours: float = DEFAULT_VACUUM_HOURS,
    now: dt.datetime | None = None,
    progress: Callable[[str], None] | None = None,
    workers: int = spark_jobs.PARALLEL_COMMITS,
) -> list[TableMaintenance]:
    """Maintain every Delta table of the lake; latest-state tables also get folded and purged.

    `tables` defaults to the lake's registry, so a lake can be maintained without its config file.
    `only` names the lake's tables to maintain (all when None): a hot table can be compacted on a
    schedule of its own, and a lake on an object store, where every step is dozens of requests per
    table, need not be walked whole for it. A name the lake does not hold raises before any table is touched.

    The tables are maintained side by side (`workers` at a time; their VACUUMs one at a time,
    `lake_spark.vacuum`): each table's steps are a few small jobs and commits, and their driver work
    and waits overlap. A small lake's 12 tables took a median 28.4 s one after the other against
    19.9 s four at a time, in a warm session (`benchmarks/maintain.py`). A table that fails does not
    stop the others: every table is tried, `progress` says each one's outcome as it ends, and then the
    first failure (in the lake's order) is raised.
    """
    say = progress or (lambda _m: None)
    if not lake_dir.is_dir():
        raise LakeError(f"lake directory {lake_dir} does not exist; pass the right --lake")
    now = now or dt.datetime.now(dt.timezone.utc)
    configured = {t.name: t for t in (tables if tables is not None else lake.registered_tables(lake_dir))}
    present = selected_tables(lake_dir, only)
    names = list(present)

    def said(i: int, report: TableMaintenance | None, error: BaseException | None) -> None:
        say(f"{names[i]}: failed: {error}" if report is None else report.summary())

    return spark_jobs.side_by_side(  # reports in the lake's order; the first table that failed, in that order, raises
        [lambda name=name: _maintain_table(spark, name, present[name], configured.get(name), vacuum_hours, now) for name in names],
        name="cdc-maintain", workers=workers, on_done=said,
    )


def selected_tables(lake_dir: LakePath, only: Sequence[str] | None = None) -> dict[str, LakePath]:
    """The lake's tables by name, or those `only` names; a name the lake lacks is a mistake said with the names it has."""
    present = lake.lake_tables(lake_dir)
    if only is None:
        return present
    wanted = set(only)
    unknown = sorted(wanted - set(present))
    if unknown:
        raise LakeError(f"the lake {lake_dir} has no table named {', '.join(unknown)}; its tables: {', '.join(present) or 'none'}")
    return {name: path for name, path in present.items() if name in wanted}


def _maintain_table(spark: SparkSession, name: str, path: LakePath, table: TableConfig | None, vacuum_hours: float,
                    now: dt.datetime) -> TableMaintenance:
    with spark_jobs.labelled("maintain", f"cdc maintain: {name}"):  # the table's jobs, named in the Spark UI
        return _maintenance_steps(spark, name, path, table, vacuum_hours, now)


def _maintenance_steps(spark: SparkSession, name: str, path: LakePath, table: TableConfig | None, vacuum_hours: float,
                       now: dt.datetime) -> TableMaintenance:
    t0 = time.perf_counter()
    report = TableMaintenance(name)
    if table is not None:
        folded = latest_state.compact(path, table, spark)
        report.folded = folded.folded
        if folded.truncated:
            report.notes.append("applied a truncate to the base")
        report.purged = latest_state.purge_tombstones(path, table, now, spark)
        if report.purged:
            report.notes.append(f"retention {_duration(table.tombstone_retention)}")
    report.files_before = lake_spark.file_count(spark, path)
    _optimize(spark, path, name)
    report.files_after = lake_spark.file_count(spark, path)
    report.vacuumed = lake_spark.vacuum(spark, path, vacuum_hours, enforce_retention=False)
    report.seconds = time.perf_counter() - t0
    return report


def _duration(seconds: float) -> str:
    for unit, size in (("days", 86_400), ("hours", 3_600), ("minutes", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"
