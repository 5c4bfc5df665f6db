"""Spark's errors in words: one line for the `error:` the CLI prints, and the JVM stack for `--verbose`.

A failing Spark call raises a pyspark exception whose text is a multi-line message, often followed by the
analyzed plan or, when `spark.sql.pyspark.jvmStacktrace.enabled` is on, the whole JVM stack; the CLI
promises one line. Spark's own error classes (`getCondition()`, formerly `getErrorClass()`) and their
message parameters say what went wrong precisely, so the common mistakes of a hand-written query
(a typo, an unknown column, table or function) are phrased here from those, with what to do next; any
other Spark error keeps the first line of Spark's message and its error class.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

_CLASS_PREFIX = re.compile(r"^\s*\[[A-Z0-9_.]+\]\s*")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+.*$")
_PARSE_WHERE = re.compile(r"\(line (\d+), pos (\d+)\)")


def condition(exc: BaseException) -> str | None:
    """Spark's error class (e.g. `TABLE_OR_VIEW_NOT_FOUND`), or None for an error without one."""
    for method in ("getCondition", "getErrorClass"):  # getErrorClass is the pre-4.0 name, deprecated since
        get = getattr(exc, method, None)
        if callable(get):
            try:
                return get()
            except Exception:  # a JVM that is gone cannot answer; the message still can
                return None
    return None


def unknown_relation(exc: BaseException) -> bool:
    """Whether Spark failed on a table or view name it does not know (`describe` then names the closest ones)."""
    return (condition(exc) or "").startswith("TABLE_OR_VIEW_NOT_FOUND")


def _parameters(exc: BaseException) -> dict[str, str]:
    get = getattr(exc, "getMessageParameters", None)
    try:
        return dict(get() or {}) if callable(get) else {}
    except Exception:
        return {}


def first_line(text: str) -> str:
    """The first non-empty line, trimmed: Spark puts the plan, the SQL and the stack on the lines after."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _message(exc: BaseException) -> str:
    """Spark's message without its `[CLASS]` prefix and `SQLSTATE` suffix."""
    line = first_line(str(exc))
    return _SQLSTATE.sub("", _CLASS_PREFIX.sub("", line)).rstrip()


def is_spark_error(exc: BaseException) -> bool:
    """A pyspark error (analysis, parse, runtime), a raw Py4J error from the JVM, or a server's answer."""
    module = type(exc).__module__
    return module.startswith("pyspark.errors") or type(exc).__name__ == "Py4JJavaError" or isinstance(exc, ServerSideError)


_SERVER_ERROR = re.compile(r"Error running query: (?:\[[A-Z0-9_.]+\] )?(?:[\w.$]+(?:Exception|Error): ?\s*)?(?P<message>.*)", re.DOTALL)
#: Where a server's text names what an error class's parameters name (Spark's message templates).
_PARAMETERS = {
    "UNRESOLVED_COLUMN": re.compile(r"with name (?P<objectName>`.*?`) cannot be resolved\.(?: Did you mean one of the following\? (?P<proposal>\[.*?\]))?"),
    "TABLE_OR_VIEW_NOT_FOUND": re.compile(r"The table or view (?P<relationName>`.*?`) cannot be found"),
    "UNRESOLVED_ROUTINE": re.compile(r"Cannot resolve routine (?P<routineName>`.*?`)"),
    "PARSE_SYNTAX_ERROR": re.compile(r"Syntax error at or near (?P<error>'.*?'|end of input)(?P<hint>[^.]*)\."),
}


class ServerSideError(Exception):
    """A query that failed on `cdc serve`, as its HiveServer2 endpoint reports it: Spark's error class and
    message parameters recovered from the text, so `describe` phrases it as it does a local error."""

    def __init__(self, text: str) -> None:
        found = _SERVER_ERROR.search(text)
        message = found.group("message") if found else text
        super().__init__(message)
        self._stackTrace = text  # the server's whole answer, for --verbose
        head = _CLASS_PREFIX.match(message)
        self._condition = head.group(0).strip(" []") if head else None
        self._parameters: dict[str, str] = {}
        pattern = _PARAMETERS.get((self._condition or "").split(".")[0])
        if pattern is not None and (hit := pattern.search(first_line(message))):
            self._parameters = {k: v for k, v in hit.groupdict().items() if v is not None}

    def getCondition(self) -> str | None:  # noqa: N802 - the name pyspark's errors answer to
        return self._condition

    def getMessageParameters(self) -> dict[str, str]:  # noqa: N802 - likewise
        return dict(self._parameters)


def describe(exc: BaseException, known_names: Sequence[str] = ()) -> str:
    """One line saying what failed and what to do, from Spark's error class and its parameters.

    `known_names` are the tables and views the query could have meant (a `cdc sql` session's), used to
    suggest the closest one for an unknown table.
    """
    cls = condition(exc)
    params = _parameters(exc)
    if type(exc).__name__ == "Py4JJavaError":
        java = getattr(exc, "java_exception", None)
        text = first_line(str(java.toString())) if java is not None else first_line(str(exc))
        return f"Spark failed: {text} (run with --verbose for the JVM stack)"
    if cls is None:
        return f"Spark failed: {_message(exc) or type(exc).__name__}"
    if cls == "PARSE_SYNTAX_ERROR" or cls.startswith("PARSE_"):
        where = _PARSE_WHERE.search(first_line(str(exc)))
        at = f" (line {where.group(1)}, position {int(where.group(2)) + 1})" if where else ""
        if cls == "PARSE_SYNTAX_ERROR" and "error" in params:
            hint = params.get("hint", "").strip()
            return f"syntax error in the query at or near {params['error']}{at}{' ' + hint if hint else ''}: fix the SQL"
        return f"the query does not parse{at}: {_message(exc)} (Spark {cls})"
    if cls.startswith("UNRESOLVED_COLUMN"):
        name = params.get("objectName", "?")
        proposal = params.get("proposal", "")
        suggestion = f"; the columns nearest by name are {proposal.strip('[]')}" if proposal else ""
        return f"unknown column {name}{suggestion} (`DESCRIBE name_of_table` lists a table's columns)"
    if unknown_relation(exc):
        name = params.get("relationName", "?")
        bare = name.strip("`").split("`.`")[-1]
        close = difflib.get_close_matches(bare, list(known_names), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(f'`{c}`' for c in close)}? " if close else ""
        listing = f"the lake has {len(known_names)} tables and views; " if known_names else "the lake registers no such name; "
        return f"unknown table or view {name}: {hint}{listing}`SHOW TABLES` lists them"
    if cls.startswith("UNRESOLVED_ROUTINE"):
        name = params.get("routineName", "?")
        return f"unknown function {name}: `SHOW FUNCTIONS` lists Spark SQL's functions"
    return f"{_message(exc)} (Spark {cls})"


def jvm_stack(exc: BaseException) -> str | None:
    """The JVM side's stack of a pyspark error, which Python's traceback does not show, for `--verbose`."""
    for cause in _chain(exc):
        stack = getattr(cause, "_stackTrace", None)  # pyspark's CapturedException keeps it here
        if isinstance(stack, str) and stack.strip():
            return stack
    return None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen

