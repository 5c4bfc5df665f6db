"""Spark jobs run side by side and named: the threads that carry a caller's job properties, and the labels.

A Delta commit or a table's creation is mostly the driver waiting (on the log, on a small job), so
independent table operations run in threads (`side_by_side`). PySpark gives each Python thread a JVM
thread of its own (pinned-thread mode) that inherits nothing, so the threads here copy the caller's job
properties: the label (`labelled`) that names every job in the Spark UI and the event log, and the
streaming query's job group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

#: Table operations one caller runs side by side (`side_by_side`): a Delta commit or creation is mostly the
#: driver waiting on the log (listing, writing the commit file, the snapshot after it), not the cores.
PARALLEL_COMMITS = 4


def side_by_side(actions: Sequence[Callable[[], Any]], *, name: str = "cdc-lake", workers: int = PARALLEL_COMMITS,
                 on_done: Callable[[int, Any, BaseException | None], None] | None = None) -> list[Any]:
    """Run independent table operations (on different tables) in threads, `workers` at a time; their results in order.

    Every action runs to its end even when one fails, so no table is left half-way because a sibling
    failed; the first failure (in the actions' order) is then raised. `on_done(index, result, error)` is
    called in the calling thread as each action ends (progress for a user, say), not in the worker's.
    """
    from concurrent.futures import ThreadPoolExecutor, as_completed

    if len(actions) <= 1 and on_done is None:
        return [action() for action in actions]
    actions = _inheriting(actions)
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(actions))), thread_name_prefix=name) as pool:
        futures = [pool.submit(action) for action in actions]
        if on_done is not None:
            index = {future: i for i, future in enumerate(futures)}
            for future in as_completed(futures):
                error = future.exception()
                on_done(index[future], None if error is not None else future.result(), error)
    return [f.result() for f in futures]


def _inheriting(actions: Sequence[Callable[[], Any]]) -> Sequence[Callable[[], Any]]:
    """The actions, each to run with the calling thread's Spark job properties (its label, job group, tags).

    A Python thread gets a JVM thread of its own (PySpark's pinned-thread mode) that inherits nothing, so
    without this a stage's jobs run in `side_by_side`'s threads would lose their label (`labelled`) and
    the streaming query's job group (which stopping the query cancels). It is what PySpark's
    `inheritable_thread_target` does, without the active session that one asks for (a thread of
    `side_by_side` has none, so nested calls would lose the label): each action gets its own copy, taken now.
    """
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        return actions

    def inheriting(action: Callable[[], Any]) -> Callable[[], Any]:
        properties = sc._jsc.sc().getLocalProperties().clone()  # type: ignore[union-attr]

        def run() -> Any:
            sc._jsc.sc().setLocalProperties(properties)  # type: ignore[union-attr]
            return action()

        return run

    return [inheriting(action) for action in actions]


#: The prefix of the job tags `labelled` adds: `cdc-<what>`, so `sc.cancelJobsWithTag("cdc-latest_state")`
#: cancels a stage's jobs, and an event log's jobs can be counted by stage (`benchmarks/small_batches.py`).
JOB_TAG_PREFIX = "cdc-"


@contextmanager
def labelled(what: str, description: str) -> Iterator[None]:
    """Name the Spark jobs this thread starts inside the block, in the Spark UI and the event log.

    `description` becomes the jobs' description (Spark's UI lists jobs by it; Delta's own jobs show their
    own while they run), `what` a job tag `cdc-<what>` that stays on every job, Delta's included. Threads
    started with `side_by_side` inside the block carry both. The thread's earlier description is put back.
    Without a running Spark there is nothing to name, and the block just runs.
    """
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        yield
        return
    tag = JOB_TAG_PREFIX + what
    before = sc.getLocalProperty("spark.job.description")
    had_tag = tag in sc.getJobTags()
    sc.setJobDescription(description)
    sc.addJobTag(tag)
    try:
        yield
    finally:
        if not had_tag:
            sc.removeJobTag(tag)
        sc.setJobDescription(before)  # type: ignore[arg-type]  # None clears it


@contextmanager
def in_pool(pool: str) -> Iterator[None]:
    """Run the Spark jobs this thread starts inside the block in the fair scheduler's pool `pool`
    (`spark.scheduler.mode` FAIR, `spark_conf/fairscheduler.xml`): the ingest and each stage query of `cdc
    stream` share the cores by their pools' weights instead of first come, first served, so a stage's big
    batch never queues the ingest's small one behind it. Threads of `side_by_side` carry the pool."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None:
        yield
        return
    before = sc.getLocalProperty("spark.scheduler.pool")
    sc.setLocalProperty("spark.scheduler.pool", pool)
    try:
        yield
    finally:
        sc.setLocalProperty("spark.scheduler.pool", before)  # type: ignore[arg-type]  # None clears it


def batch_labelled(batch_id: int, part: str, what: str | None = None) -> AbstractContextManager[None]:
    """`labelled` for one part of a micro-batch: tag `cdc-<part>`, description `cdc batch <id>: <what>` (`what`
    defaults to the part's name), the one form every batch's jobs are named in."""
    return labelled(part, f"cdc batch {batch_id}: {what or part}")
