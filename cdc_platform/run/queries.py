"""Running streaming queries the way the platform needs: stopped only between batches, waited on together,
and (for the stage queries of `cdc stream`) watched: time-based work while idle, a restart after a failure.

Kept apart from the ingest job and the stage queries because both use it: each owns a `BatchGate` that its
`foreachBatch` passes through, so a stop lets the batch in flight commit whole and refuses the next one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from cdc_platform.errors import CdcError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming import StreamingQuery

IDLE_POLL_SECONDS = 0.5  # how often a running stream asks stages with `on_idle` whether time is up
#: A failed stage query is started again after this pause, doubled on each failure in a row up to the last.
RESTART_PAUSES = (2.0, 5.0, 15.0, 60.0)


class StopRequested(Exception):
    """A micro-batch Spark started while the query was stopping: refused, so it replays on restart."""


class _RefusedBatchRecords(logging.Filter):
    """Drops py4j's record of a `StopRequested`: py4j logs every exception a Python callback raises, stack
    and all, at ERROR before Spark sees it, so every stop that refused a batch printed a traceback that
    asks an operator to look at nothing. Every other exception's record is kept."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], StopRequested))


def quiet_refused_batches() -> None:
    """Keep a refused batch out of the log (`_RefusedBatchRecords`); called by each query's `start`, once per process."""
    log = logging.getLogger("py4j.clientserver")  # the logger py4j's callback server logs a callback's exception on
    if not any(isinstance(f, _RefusedBatchRecords) for f in log.filters):
        log.addFilter(_RefusedBatchRecords())


class BatchGate:
    """One query's batches and its stop: a batch holds `lock` while it commits; `refuse_after` (set while the
    query stops) refuses batches with a higher id, which replay on restart."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.refuse_after: int | None = None

    def check(self, batch_id: int) -> None:
        if self.refuse_after is not None and batch_id > self.refuse_after:
            raise StopRequested(f"batch {batch_id} started after the stop was asked for; it runs again on restart")


def spark_batch(query: StreamingQuery) -> tuple[int, bool] | None:
    """The id of the batch Spark is on and whether it is constructed yet (its offsets logged), or None if unknown.

    From Spark's internal `latestExecutionContext` (Spark 4): no public API says which batch runs. If a
    Spark upgrade moves it, `stop_after_batch` stops at once instead, refusing the batch (which replays).
    """
    try:
        context = query._jsq.streamingQuery().latestExecutionContext()  # type: ignore[attr-defined]
        return int(context.batchId()), bool(context.isCurrentBatchConstructed())
    except Exception:  # noqa: BLE001 - any failure means "unknown", handled by the caller
        return None


def batch_in_flight(query: StreamingQuery) -> int | None:
    found = spark_batch(query) if query.isActive else None
    return found[0] if found is not None and found[1] else None


def stop_after_batch(query: StreamingQuery, gate: BatchGate) -> None:
    """Stop a started query without interrupting a batch: the one in flight, if any, commits whole; a
    later one refuses to start and replays on restart. (`query.stop()` alone interrupts the batch.)

    In flight means from the moment Spark constructed the batch (logged its offsets) on, not from
    `foreachBatch` on: stopping in the gap between the two (Spark plans and lists files there) cancelled
    the batch half-started, with error logs (a Ctrl-C test found it). Spark starts the next batch the
    moment one ends, so it is the batch's id that is waited for, not a quiet trigger.
    """
    in_flight = batch_in_flight(query)
    gate.refuse_after = -1 if in_flight is None else in_flight
    try:
        while in_flight is not None and query.isActive:
            now = spark_batch(query)
            if now is None or now[0] > in_flight:
                break
            time.sleep(0.1)
        with gate.lock:
            pass
        if query.isActive:
            query.stop()
    finally:
        gate.refuse_after = None


class Watched(Protocol):
    """What `StageRunner` runs: a stage query (`stage_queries.StageQuery`)."""

    name: str
    failure: BaseException | None
    gate: BatchGate
    last_activity: float

    def start(self, spark: SparkSession, *, available_now: bool, interval: str | None = None) -> StreamingQuery: ...

    def on_idle(self, idle_seconds: float) -> Any: ...


def await_queries(queries: Sequence[tuple[Watched, StreamingQuery]], timeout: float | None = None) -> None:
    """Wait until every query has ended (or `timeout`), then raise the first failure (its own error, not Spark's wrapping)."""
    from pyspark.errors import StreamingQueryException

    deadline = None if timeout is None else time.monotonic() + timeout
    first: BaseException | None = None
    for owner, query in queries:
        try:
            query.awaitTermination(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except StreamingQueryException as exc:
            first = first or owner.failure or CdcError(f"the {owner.name} query failed: {str(exc).splitlines()[0]}")
    for owner, _ in queries:
        first = first or owner.failure
    if first is not None:
        raise first


class StageRunner:
    """The stage queries of a running `cdc stream`: started beside the ingest, each on its own.

    A stage query that fails is reported in one line and started again after a pause (`RESTART_PAUSES`):
    its batch replays from its checkpoint, so nothing is lost or applied twice, and the ingest and the other
    stages never wait for it. While a query has had no batch for a while and the source is quiet too, its
    stage's `on_idle` runs (transaction timeouts on a quiet source).

    `source_idle` says how long the ingest has been quiet (None while it has a batch running or data
    waiting): a stage with nothing to read while the ingest is still busy (catching up after a restart, say)
    is not idle, or the rest of a transaction still in the ingest's backlog would be timed out (the crash
    trials found it).
    """

    def __init__(self, spark: SparkSession, queries: Sequence[Watched], interval: str, progress: Callable[[str], None],
                 source_idle: Callable[[], float | None] = lambda: float("inf")) -> None:
        self.spark = spark
        self.source_idle = source_idle
        self.queries = list(queries)
        self.interval = interval
        self.progress = progress
        self.running: dict[str, StreamingQuery] = {}
        self._failures: dict[str, int] = {}
        self._restart_at: dict[str, float] = {}
        for q in self.queries:
            self._start(q)

    def _start(self, q: Watched) -> None:
        q.failure = None
        q.last_activity = time.monotonic()
        self.running[q.name] = q.start(self.spark, available_now=False, interval=self.interval)

    def watch(self, stop: threading.Event) -> threading.Thread:
        """A thread that, until `stop`, restarts failed queries and calls idle ones' `on_idle`."""

        def loop() -> None:
            while not stop.wait(IDLE_POLL_SECONDS):
                for q in self.queries:
                    if stop.is_set():
                        return
                    self._tend(q)

        thread = threading.Thread(target=loop, name="cdc-stage-watch", daemon=True)
        thread.start()
        return thread

    def _tend(self, q: Watched) -> None:
        query = self.running.get(q.name)
        if query is not None and not query.isActive:
            failures = self._failures.get(q.name, 0) + 1
            self._failures[q.name] = failures
            pause = RESTART_PAUSES[min(failures, len(RESTART_PAUSES)) - 1]
            error = q.failure or query.exception()
            self.progress(f"error: the {q.name} query stopped ({_first_line(error)}); its tables wait, the raw log does not; "
                          f"starting it again in {pause:.0f} s")
            self.running.pop(q.name)
            self._restart_at[q.name] = time.monotonic() + pause
            return
        if query is None:
            if time.monotonic() >= self._restart_at.get(q.name, 0.0):
                try:
                    self._start(q)
                except Exception as exc:  # noqa: BLE001 - reported, tried again after the next pause
                    self.progress(f"error: could not start the {q.name} query again: {_first_line(exc)}")
                    self._restart_at[q.name] = time.monotonic() + RESTART_PAUSES[-1]
            return
        status = query.status
        if status.get("isTriggerActive") or status.get("isDataAvailable"):
            return
        self._failures.pop(q.name, None)
        source_idle = self.source_idle()
        if source_idle is None:
            return
        try:
            result = q.on_idle(min(time.monotonic() - q.last_activity, source_idle))
        except Exception as exc:  # noqa: BLE001 - an idle tick that fails is a failed batch: the query restarts
            q.failure = exc
            self.progress(f"error: the {q.name} stage failed while idle ({_first_line(exc)})")
            query.stop()
            return
        if result is not None and getattr(result, "rows_landed", None):
            landed = ", ".join(f"{v:,} {k}" for k, v in sorted(result.rows_landed.items()))
            self.progress(f"idle: {q.name} landed {landed}")

    def stop(self) -> None:
        """Stop every stage query after its batch in flight."""
        for q in self.queries:
            query = self.running.pop(q.name, None)
            if query is not None:
                stop_after_batch(query, q.gate)


def _first_line(error: Any) -> str:
    text = "" if error is None else f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    return (text.strip().splitlines() or ["unknown"])[0]
