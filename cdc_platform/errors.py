"""The platform's exception hierarchy.

Code and set-up problems raise one of these, each with a message that says what to do next.
Data problems never raise: a bad line becomes a dead-letter row, a violated expectation a failed check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


class CdcError(Exception):
    """Base class: the CLI prints these as one line and exits 2, without a traceback."""


class ConfigError(CdcError):
    """The configuration file or a flag is wrong; the message names the offending entry."""


class EnvironmentNotReadyError(CdcError):
    """Something the platform needs on the machine is missing (Java, a directory)."""


class LakeError(CdcError):
    """The lake is missing, unreadable, or was written by an incompatible version."""


class CommitConflictError(LakeError):
    """A Delta commit kept conflicting with a concurrent writer after every retry."""


#: What a commit conflict that never clears asks of the user, unless the caller knows better.
ONE_WRITER = "make sure only one stream writes this lake, then rerun"


def retry_conflicts(
    action: Callable[[], Any], conflicts: tuple[type[BaseException], ...], *, what: str, attempts: int = 8,
    advice: str = ONE_WRITER,
) -> Any:
    """Run a Delta commit again after it lost a race to a concurrent writer (a backfill or `cdc maintain`
    beside the stream): optimistic concurrency refuses such a commit whole, so a retry re-reads and
    redoes it. `conflicts` are the Delta library's own conflict errors (delta-rs's or delta-spark's);
    `advice` is what the error tells the user to do when the conflict never clears."""
    delay = 0.05
    for attempt in range(1, attempts + 1):
        try:
            return action()
        except conflicts as exc:
            if attempt == attempts:
                first = (str(exc).splitlines() or [""])[0]
                raise CommitConflictError(
                    f"{what}: the commit kept conflicting with another writer after {attempts} attempts ({first}); "
                    f"{advice} (nothing was half-written)"
                ) from exc
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
    return None


class CheckCrashed(CdcError):
    """A check raised instead of returning an outcome: a code or environment problem, not a data one (a
    failed check is an outcome). The message names the check and its error; fix that and run it again."""


class QueryError(CdcError):
    """A SQL query given to `cdc sql` failed in Spark (syntax, unknown column, table or function, a bad
    value); the message names the cause in words, Spark's error class last, so the user can fix the query."""


class ServeError(CdcError):
    """`cdc serve` cannot start or keep serving: a port is taken, or another server already serves the lake;
    the message names the port or the running server and what to pass or stop."""
