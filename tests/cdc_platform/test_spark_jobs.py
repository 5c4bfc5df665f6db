"""Spark jobs side by side and named: every action runs to its end, and threads carry their caller's label."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_platform.spark import spark_jobs


def tagged_jobs(spark: Any, label: str) -> set[int]:
    """The ids of the jobs Spark's status tracker holds with the tag `labelled(label, ...)` gives."""
    return set(spark.sparkContext._jsc.sc().statusTracker().getJobIdsForTag(spark_jobs.JOB_TAG_PREFIX + label))


def test_side_by_side_runs_every_action_at_once_and_raises_the_first_failure_last() -> None:
    import threading

    meeting = threading.Barrier(2, timeout=30)  # the two first actions only finish together
    finished: list[str] = []

    def meet(name: str) -> str:
        meeting.wait()
        finished.append(name)
        return name

    def fail() -> str:
        raise ValueError("no room")

    assert spark_jobs.side_by_side([lambda: meet("a"), lambda: meet("b")]) == ["a", "b"]
    finished.clear()
    with pytest.raises(ValueError, match="no room"):
        spark_jobs.side_by_side([fail, lambda: finished.append("after") or "after"])
    assert finished == ["after"]  # the sibling of a failed action still ran to its end


def test_labelled_jobs_carry_their_label_into_side_by_side_threads_and_only_theirs(spark: Any) -> None:
    sc = spark.sparkContext
    seen: dict[str, tuple[set[str], str | None]] = {}

    def part(name: str) -> Any:
        def run() -> None:
            with spark_jobs.labelled(f"test-{name}", f"part {name}"):
                spark.range(3).count()
                spark_jobs.side_by_side([lambda: spark.range(4).count(), lambda: spark.range(5).count()])  # nested threads
                seen[name] = (set(sc.getJobTags()), sc.getLocalProperty("spark.job.description"))
        return run

    sc.setJobDescription("the caller's")
    try:
        with spark_jobs.labelled("test-outer", "outer"):
            spark_jobs.side_by_side([part("a"), part("b")])
        assert sc.getLocalProperty("spark.job.description") == "the caller's" and "cdc-test-outer" not in sc.getJobTags()
    finally:
        sc.setJobDescription(None)
    assert seen == {"a": ({"cdc-test-outer", "cdc-test-a"}, "part a"), "b": ({"cdc-test-outer", "cdc-test-b"}, "part b")}
    a, b, outer = (tagged_jobs(spark, f"test-{n}") for n in ("a", "b", "outer"))
    assert len(a) == len(b) >= 3 and not a & b and a | b <= outer  # three counts each, nested ones included


def test_without_a_running_spark_a_label_names_nothing_and_the_block_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    ran = []
    with spark_jobs.labelled("nothing", "no Spark here"):
        ran.append(1)
    assert ran == [1] and spark_jobs.side_by_side([lambda: 1, lambda: 2]) == [1, 2]


def test_side_by_side_threads_carry_the_callers_job_group(spark: Any) -> None:
    """A streaming query runs its batch under its job group, which stopping the query cancels: a stage's
    threads must be in it too, not outside it."""
    sc = spark.sparkContext
    sc.setJobGroup("test-query-run", "a streaming batch", interruptOnCancel=True)
    try:
        groups = spark_jobs.side_by_side([lambda: sc.getLocalProperty("spark.jobGroup.id"), lambda: sc.getLocalProperty("spark.jobGroup.id")])
    finally:
        sc._jsc.clearJobGroup()  # PySpark has no clearJobGroup
    assert groups == ["test-query-run", "test-query-run"]
