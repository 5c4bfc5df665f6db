"""The stage protocol: what the job hands a pipeline stage, what it gets back, and how one bad event
is kept from stopping the lake.

Every stage after the raw log (latest state, transactions, and any new one) works in two phases:

* `prepare(batch, ctx)` reads the lake and computes everything the batch changes, and writes nothing.
  It may raise on an event it cannot take (a value no rule foresaw, a defect).
* `commit(prepared, ctx)` writes what one `prepare` returned, exactly once per (query id, batch id).

Why two phases: because `prepare` has no effects, the job may call it again on parts of the batch.
When it raises, `run_stage` bisects the batch (events and markers alike) to find the events that make
it raise, dead-letters them (`stage_error`, with the stage, the exception and the original line) and
commits the rest, so one poison event costs one dead letter, never a stopped stream. A new stage gets
this by following the protocol. A failure that is not about events stops the run with one line
(`StageFailure`): the lake or the disk failing (`CdcError`, `OSError`, `MemoryError`), a batch that
fails whole but in no part, most of a batch failing event by event (a defect, not bad data), and any
error while committing.

A stage may instead take the batch as Spark DataFrames (`SparkStage.run`): its per-event work then runs
on the executors, and it isolates poison events there with the same `isolate` (the latest-state stage,
`latest_state.staging`). The job hands such a stage the batch's events and markers as they are in Spark
and never collects them for it.

This module imports no stage and no job: stages and the job both import it, never each other.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from cdc_platform import lake
from cdc_platform.lake import schemas
from cdc_platform.config import PlatformConfig
from cdc_platform.errors import CdcError

RAW = "raw_change_events"
MARKERS = "transaction_markers"
DEAD_LETTER = "dead_letter"
METRICS = "pipeline_metrics"
PROGRESS = "stage_progress"

#: The dead-letter code of an event that made a stage raise.
STAGE_ERROR = "stage_error"


@dataclass(frozen=True)
class ParsedBatch:
    """One micro-batch after parsing, split by destination and deduplicated within the batch."""

    batch_id: int
    events: pa.Table  # RAW_CHANGE_EVENTS
    markers: pa.Table  # TRANSACTION_MARKERS
    dead_letters: pa.Table  # DEAD_LETTER
    tombstones: int
    rows_read: int
    in_batch_duplicates: int
    ingested_at: dt.datetime

    def subset(self, events: Sequence[int], markers: Sequence[int]) -> ParsedBatch:
        """The same batch with only the given event and marker rows (in their batch order)."""
        return replace(self, events=self.events.take(pa.array(sorted(events), pa.int64())),
                       markers=self.markers.take(pa.array(sorted(markers), pa.int64())))


@dataclass(frozen=True)
class BatchContext:
    config: PlatformConfig
    query_id: str
    batch_id: int

    def app_id(self, table: str) -> str:
        return lake.app_id(self.query_id, table)


#: One source table's part of a batch for the stream clocks: (table id, "" for none; the newest source time in
#: microseconds, None if no event has one; the least source name, "" for none; how many of its events belong to
#: a transaction). Only for tables with an event that has a source time or a transaction.
TableClock = tuple[str, "int | None", str, int]


@dataclass(frozen=True)
class SparkBatch:
    """One micro-batch as Spark DataFrames, for a `SparkStage`: nothing of it is on the driver."""

    batch_id: int
    events: Any  # DataFrame: RAW_CHANGE_EVENTS plus `_seq` (input order), one row per event id
    markers: Any  # DataFrame: TRANSACTION_MARKERS plus `_seq`, one row per marker id
    table_ids: frozenset[str]  # the source tables with change events in the batch (from its one aggregate)
    ingested_at: dt.datetime
    event_count: int | None = None  # distinct change events and markers (from the same aggregate); None: not counted
    marker_count: int | None = None
    #: From the batch's one aggregate too: each source table's clock, by table id, and the markers' (newest
    #: marker time in microseconds, markers that name a transaction). None: not computed, and a stage that
    #: needs them reads them from the frames (the transaction stage's clocks).
    table_clocks: tuple[TableClock, ...] | None = None
    marker_clock: tuple[int | None, int] | None = None


@dataclass
class StageResult:
    """What a stage reports back: rows it landed per table, figures for metrics, and its dead letters.

    A Spark stage's dead letters may be a DataFrame (`dead_frame`, `dead_count` rows) that the job
    writes with the batch's other dead letters, then calls `release` (the stage's cached work).
    """

    rows_landed: dict[str, int] = field(default_factory=dict)
    figures: dict[str, float] = field(default_factory=dict)
    dead_letters: pa.Table | None = None
    dead_frame: Any = None
    dead_count: int = 0
    release: Callable[[], None] | None = None


class Stage(Protocol):
    """A pipeline stage fed from each parsed batch after the raw log has committed (see the module doc).

    `prepare` must not write: the job may call it several times, on parts of a batch, and then commit
    only the last result. It should also compute in full on a batch that was already committed (a
    replay), so that the dead letters it reports are the same; `commit` then writes nothing twice.

    A stage may also define `on_idle(ctx, idle_seconds) -> StageResult | None`: `run_continuously`
    calls it while no data arrives (Spark runs no batch then), so time-based work such as transaction
    timeouts still happens on a quiet stream. `ctx.batch_id` is the last batch id, which the stage
    must not use as a commit version. Never called by `run_available_now`.
    """

    name: str

    def setup(self, config: PlatformConfig) -> None: ...

    def prepare(self, batch: ParsedBatch, ctx: BatchContext) -> Any: ...

    def commit(self, prepared: Any, ctx: BatchContext) -> StageResult: ...


class SparkStage(Protocol):
    """A stage that takes the batch as DataFrames and does its per-event work on the executors.

    `run` commits exactly once per (query id, batch id), like `Stage.commit`, and keeps one bad event
    from stopping the lake itself (see `latest_state.staging`); it raises `StageFailure` for a failure
    that is not about events.

    A Spark stage may also define `driver_stage_for(batch, ctx) -> Stage | None`: a driver-side `Stage` that
    lands the same rows, for a batch small enough that collecting it costs less than the executors' fixed
    cost of a batch (their jobs, Python workers and broadcasts); None runs the batch on the executors.
    """

    name: str

    def setup(self, config: PlatformConfig) -> None: ...

    def run(self, batch: SparkBatch, ctx: BatchContext) -> StageResult: ...


Number = TypeVar("Number", int, float)


def summed(parts: Iterable[Mapping[str, Number]]) -> dict[str, Number]:
    """Figures by name summed over parts (batches, buckets, stages), with every name any part has."""
    out: dict[str, Number] = {}
    for part in parts:
        for k, v in part.items():
            out[k] = out.get(k, 0) + v
    return out


class StageFailure(CdcError):
    """A stage failed in a way that is not about one event; the batch was not committed and replays on restart."""


def apply_stage(stage: Stage, batch: ParsedBatch, ctx: BatchContext) -> StageResult:
    """Prepare and commit in one call, without isolation: for tools and tests that drive a stage directly."""
    return stage.commit(stage.prepare(batch, ctx), ctx)


def dead_letter_rows(
    rows: Sequence[dict[str, Any]], *, stage: str, batch_id: int | None, at: dt.datetime | None = None
) -> pa.Table:
    """Build `dead_letter` rows from dicts with reason_code, reason and optional table_id/event_id/line/source_file."""
    at = at or dt.datetime.now(dt.timezone.utc)
    cols: dict[str, list[Any]] = {f.name: [] for f in schemas.DEAD_LETTER}
    for r in rows:
        for f in schemas.DEAD_LETTER:
            cols[f.name].append(r.get(f.name))
        cols["stage"][-1] = stage
        cols["batch_id"][-1] = batch_id
        cols["dead_lettered_at"][-1] = at
    return pa.table(cols, schema=schemas.DEAD_LETTER)


# --- Isolating the events a stage cannot take ---------------------------------------------------------

#: Errors of the machine or the lake, never of one event: they stop the run at once.
NOT_ABOUT_EVENTS: tuple[type[BaseException], ...] = (CdcError, OSError, MemoryError)


def describe_error(exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


Item = tuple[str, int]  # ("event" | "marker", row index in the batch)


@dataclass
class Isolation:
    """The events (and markers) of a batch that made a stage's `prepare` raise, with the error each raised."""

    failed: dict[Item, BaseException] = field(default_factory=dict)
    probes: int = 0


def isolate(probe: Callable[[ParsedBatch], Any], batch: ParsedBatch, *, stage: str, failed: Exception | None = None) -> Isolation:
    """Bisect `batch` down to the single events on which `probe` raises.

    Halves that pass are cleared in one call, so k bad events among n cost about 2k log2(n) probes.
    `failed` is what `probe` already raised on the whole batch, which is then not probed again.
    Raises `StageFailure` when the failure is not about events: an error of the machine or the lake,
    or more than half of a batch of several events failing one by one (a defect that fails every event).
    """
    items: list[Item] = [("event", i) for i in range(batch.events.num_rows)] + [("marker", i) for i in range(batch.markers.num_rows)]
    found = Isolation()
    limit = max(1, len(items) // 2)

    def sub(part: Sequence[Item]) -> ParsedBatch:
        return batch.subset([i for k, i in part if k == "event"], [i for k, i in part if k == "marker"])

    def search(part: list[Item], known: Exception | None = None) -> None:
        try:
            if known is not None:
                raise known
            found.probes += 1
            probe(sub(part))
            return
        except NOT_ABOUT_EVENTS as exc:
            raise StageFailure(f"the {stage} stage failed on batch {batch.batch_id}: {describe_error(exc)}") from exc
        except Exception as exc:
            if len(part) == 1:
                found.failed[part[0]] = exc
                if len(found.failed) > limit and len(items) > 1:
                    raise StageFailure(
                        f"the {stage} stage fails on most events of batch {batch.batch_id} one by one ({describe_error(exc)}): "
                        "this is a defect or a set-up problem, not bad data; nothing of the batch was committed by this "
                        "stage and it replays on restart"
                    ) from exc
                return
        mid = len(part) // 2
        search(part[:mid])
        search(part[mid:])

    if items:
        search(items, failed)
    return found


def prepare_isolated(probe: Callable[[ParsedBatch], Any], batch: ParsedBatch, *, stage: str) -> tuple[Any, Isolation]:
    """`probe(batch)`, or, when it raises on some events, `probe` of the rest after bisecting them out.

    Returns the result and what was isolated (empty when the whole batch passed). Raises `StageFailure`
    when the failure is not about events (see `isolate`), when the batch fails whole but in no part,
    or when the rest still fails. For the stages that isolate on the executors (latest state,
    transactions), where the probe is the group's own work.
    """
    try:
        return probe(batch), Isolation()
    except NOT_ABOUT_EVENTS as exc:
        raise StageFailure(f"the {stage} stage failed on batch {batch.batch_id}: {describe_error(exc)}") from exc
    except Exception as first:
        found = isolate(probe, batch, stage=stage, failed=first)
        if not found.failed:
            raise StageFailure(
                f"the {stage} stage failed on batch {batch.batch_id} as a whole but on no part of it "
                f"({describe_error(first)}); nothing of the batch was committed by this stage and it replays on restart"
            ) from first
    rest = batch.subset([i for i in range(batch.events.num_rows) if ("event", i) not in found.failed],
                        [i for i in range(batch.markers.num_rows) if ("marker", i) not in found.failed])
    try:
        return probe(rest), found
    except Exception as exc:
        raise StageFailure(
            f"the {stage} stage failed on batch {batch.batch_id} even without the {len(found.failed)} event(s) "
            f"it could not take ({describe_error(exc)}); the batch replays on restart"
        ) from exc


def run_stage(stage: Stage, batch: ParsedBatch, ctx: BatchContext, write_dead: Callable[[pa.Table, str], None]) -> StageResult:
    """Prepare, isolate what the stage cannot take, then commit the rest (see the module doc).

    `write_dead(rows, stage_name)` lands the isolated events' dead letters exactly once per batch,
    before the stage commits: a crash in between replays the batch, finds the same events again,
    and the guard of that write refuses the repeat.
    """
    prepared, found = prepare_isolated(lambda part: stage.prepare(part, ctx), batch, stage=stage.name)
    if found.failed:
        write_dead(poison_rows(batch, found, stage.name), stage.name)
    result = _commit(stage, prepared, ctx, batch)
    if found.failed:
        result.figures["isolated_events"] = float(len(found.failed))
        result.figures["isolation_probes"] = float(found.probes)
    return result


def run_spark_stage(stage: SparkStage, batch: SparkBatch, ctx: BatchContext) -> StageResult:
    """A Spark stage's run: its own failures are already one line; anything else is not about an event."""
    try:
        return stage.run(batch, ctx)
    except CdcError:
        raise
    except Exception as exc:
        raise StageFailure(
            f"the {stage.name} stage could not commit batch {batch.batch_id}: {describe_error(exc)}; the batch replays on restart"
        ) from exc


def _commit(stage: Stage, prepared: Any, ctx: BatchContext, batch: ParsedBatch) -> StageResult:
    try:
        return stage.commit(prepared, ctx)
    except CdcError:
        raise  # already one line that says what to do
    except Exception as exc:
        raise StageFailure(
            f"the {stage.name} stage could not commit batch {batch.batch_id}: {describe_error(exc)}; the batch replays on restart"
        ) from exc


def poison_rows(batch: ParsedBatch, found: Isolation, stage: str) -> pa.Table:
    events = batch.events
    markers = batch.markers
    rows: list[dict[str, Any]] = []
    for (kind, i), exc in sorted(found.failed.items()):
        source = events if kind == "event" else markers
        row = {c: source.column(c)[i].as_py() for c in ("line", "source_file")}
        if kind == "event":
            row["table_id"] = events.column("table_id")[i].as_py()
            row["event_id"] = events.column("event_id")[i].as_py()
        rows.append({**row, "reason_code": STAGE_ERROR, "reason": poison_reason(stage, kind, describe_error(exc))})
    return dead_letter_rows(rows, stage=stage, batch_id=batch.batch_id)


def poison_reason(stage: str, kind: str, error: str) -> str:
    """The dead letter's reason for an event (`kind` "event") or marker that made `stage` raise `error`."""
    what = "event" if kind == "event" else "transaction marker"
    return (
        f"the {stage} stage raised {error} on this {what}; the rest of the batch was applied and the "
        f"{what} is kept in the {'raw log' if kind == 'event' else 'transaction markers'}, from which a rebuild "
        f"re-applies it. This is a defect of the platform: report it with this line"
    )
