"""The one retry loop both Delta libraries' commits take when they lose a race to another writer."""

from __future__ import annotations

import pytest

from cdc_platform import errors
from cdc_platform.errors import CommitConflictError, retry_conflicts


class Conflict(Exception):
    """Stands in for a Delta library's conflict error (delta-spark's `DeltaConcurrentModificationException`)."""


def test_a_conflict_is_retried_and_a_persistent_one_gives_up_with_an_actionable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(errors.time, "sleep", lambda _s: None)
    calls = {"n": 0}

    def always_conflicts() -> None:
        calls["n"] += 1
        raise Conflict("conflict\nwith details")

    with pytest.raises(CommitConflictError, match=r"append to t: .*after 3 attempts \(conflict\); make sure only one stream writes this lake"):
        retry_conflicts(always_conflicts, (Conflict,), what="append to t", attempts=3)
    assert calls["n"] == 3

    outcome = iter([Conflict("conflict"), None])

    def conflicts_once() -> str:
        err = next(outcome)
        if err:
            raise err
        return "ok"

    assert retry_conflicts(conflicts_once, (Conflict,), what="t") == "ok"


def test_other_errors_are_not_retried() -> None:
    calls = {"n": 0}

    def fails() -> None:
        calls["n"] += 1
        raise ValueError("not a conflict")

    with pytest.raises(ValueError):
        retry_conflicts(fails, (Conflict,), what="t")
    assert calls["n"] == 1
