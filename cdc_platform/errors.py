"""The platform's exception hierarchy.

Code and set-up problems raise one of these, each with a message that says what to do next.
Data problems never raise: a bad line becomes a dead-letter row, a violated expectation a failed check.
"""

from __future__ import annotations


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


class QueryError(CdcError):
    """A SQL query given to `cdc sql` failed in Spark (syntax, unknown column, table or function, a bad
    value); the message names the cause in words, Spark's error class last, so the user can fix the query."""


class ServeError(CdcError):
    """`cdc serve` cannot start or keep serving: a port is taken, or another server already serves the lake;
    the message names the port or the running server and what to pass or stop."""
