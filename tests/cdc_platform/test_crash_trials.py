"""A short crash trial in CI: SIGKILL `cdc stream` mid-run three times, restart, and lose nothing.

The long run (>= 50 trials, every kill mode) is `benchmarks/crash_trials.py`; this one uses the same
machinery with four kills aimed at different moments: anywhere, right after Spark wrote a batch's
offsets (the moment that used to leave a temp file blocking every restart), right after the raw log
committed (mid-batch), and right after a latest-state commit (later stages still pending). A real subprocess is
the point here: only a killed process shows what survives a crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.crash_trials import run_trials


def test_sigkilled_stream_loses_and_doubles_nothing(tmp_path: Path, spark: Any) -> None:
    lines: list[str] = []
    report = run_trials(
        tmp_path / "trials",
        trials=4,
        transactions=1_500,
        seed=3,
        events_per_file=40,
        modes=("random", "after_offsets", "after_raw", "after_state"),
        max_wait=30.0,
        spark=spark,
        log=lines.append,
    )
    assert len(report.trials) == 4
    assert all(t.killed for t in report.trials), [t.note for t in report.trials if not t.killed]
    assert report.mismatches == [], report.mismatches
    assert report.failures == 0, "\n".join(lines)
    print("\n".join(lines), report.figures)
