"""`RunReport`: a run's figures summed over its batches."""

from __future__ import annotations

from cdc_platform.run.run_reports import BatchReport, RunReport


def batch(n: int, landed: dict[str, int], seconds: dict[str, float]) -> BatchReport:
    return BatchReport(batch_id=n, rows_read=10 * n, change_events=n, markers=0, tombstones=0, dead_letters=0, duplicates_skipped=0,
                       rows_landed=landed, stage_seconds=seconds, seconds=sum(seconds.values()))


def test_rows_landed_and_seconds_by_step_are_summed_over_batches_with_every_name_any_batch_has() -> None:
    report = RunReport([batch(1, {"raw": 3}, {"split": 0.5, "raw": 1.0}),
                        batch(2, {"raw": 2, "orders": 4}, {"split": 0.25, "raw": 0.5, "collect": 2.0})])
    assert report.landed() == {"raw": 5, "orders": 4}
    assert report.stage_seconds() == {"split": 0.75, "raw": 1.5, "collect": 2.0}
    assert report.total("rows_read") == 30
    assert RunReport().landed() == {} and RunReport().stage_seconds() == {}
