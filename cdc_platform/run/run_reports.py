"""What an ingest run reports: one `BatchReport` per micro-batch, a `RunReport` per run, and the
heartbeat-only batches whose metrics rows are folded into the next row written (`FoldedBatches`).

Kept apart from the job (`ingest.py`) so that tools and tests can read a run's figures without the job.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from cdc_platform import lake
from cdc_platform.stages.stage import summed

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from cdc_platform.parse import parse_spark
    from cdc_platform.stages.stage import BatchContext


@dataclass
class BatchReport:
    batch_id: int
    rows_read: int
    change_events: int
    markers: int
    tombstones: int
    dead_letters: int
    duplicates_skipped: int
    rows_landed: dict[str, int]
    stage_seconds: dict[str, float]
    seconds: float


@dataclass
class FoldedBatches:
    """Heartbeat-only batches whose metrics rows were not written yet (`IDLE_METRICS_INTERVAL`): their
    counts go onto the next row written, so the table's totals stay exact; the newest of them is kept
    whole, so a stop can write its row (`ingest.IngestJob.flush_folded_metrics`)."""

    batches: int = 0
    heartbeats: int = 0
    rows_read: int = 0
    last: tuple[SparkSession, BatchReport, int, dt.datetime, BatchContext] | None = None
    newest_heartbeat: dt.datetime | None = None  # of all the folded batches

    def add(self, spark: SparkSession, report: BatchReport, figures: parse_spark.BatchFigures, started: dt.datetime, ctx: BatchContext) -> None:
        self.batches += 1
        self.heartbeats += figures.heartbeats
        self.rows_read += report.rows_read
        self.last = (spark, report, figures.heartbeats, started, ctx)
        self.newest_heartbeat = lake.newest(self.newest_heartbeat, figures.newest_heartbeat_ts)

    def onto(self, figures: dict[str, float], rows_read: int) -> tuple[dict[str, float], int]:
        """A row's figures and lines read with the folded batches' added."""
        if not self.batches:
            return figures, rows_read
        figures = {**figures, "ingest.heartbeats": figures.get("ingest.heartbeats", 0.0) + self.heartbeats,
                   "ingest.idle_batches_folded": float(self.batches)}
        return figures, rows_read + self.rows_read


@dataclass
class RunReport:
    """A run: the ingest's batches, and the batches of the stage queries that read its raw log."""

    batches: list[BatchReport] = field(default_factory=list)
    seconds: float = 0.0
    stopped: bool = False  # asked to stop (Ctrl-C) before everything available was read; the next run reads the rest
    #: The stage queries' batches (latest state, transactions): they read no lines, and land and dead-letter rows.
    stage_batches: list[BatchReport] = field(default_factory=list)
    #: Seconds `cdc run` spent after the ingest, letting the stage queries take what it landed (side by side).
    drain_seconds: float = 0.0

    @property
    def all_batches(self) -> list[BatchReport]:
        return [*self.batches, *self.stage_batches]

    def total(self, attr: str) -> int:
        """A figure summed over every batch of the run (lines and events come from the ingest's; dead letters from all)."""
        return sum(getattr(b, attr) for b in self.all_batches)

    def landed(self) -> dict[str, int]:
        """Rows landed per table over the run's batches, the stage queries' included."""
        return summed(b.rows_landed for b in self.all_batches)

    def stage_seconds(self) -> dict[str, float]:
        """Seconds per step (split, raw, each stage, ...) over the run's batches: where a run's time went."""
        return summed(b.stage_seconds for b in self.all_batches)
