"""Debezium's `execute-snapshot` signal for exactly the keys that differ: pure, no database and no Spark.

A repair asks the connector to re-read chosen rows through an incremental snapshot whose
`additional-conditions` filter names those rows' keys. Debezium appends the filter to its chunk query as
raw SQL (`SELECT * FROM t WHERE <chunk bounds> AND <filter> ORDER BY <key> LIMIT n`, `JdbcConnection.
buildSelectWithRowLimits`), so the filter is SQL the platform writes from values it read from the source:
every value here is a literal of the source's dialect, never text spliced in as it came.

* PostgreSQL: each value is an untyped string literal in the type's text input form, `E'...'` with `\\`
  and `'` escaped, so it reads the same whatever `standard_conforming_strings` says; PostgreSQL coerces an
  untyped literal to the column's own type (`id = '7'` compares integers, a `timestamptz` keeps its offset,
  `bytea` is `\\x...`). The quoting does not depend on the value's type, only the text form does.
* MariaDB/MySQL: numbers as digits, strings and bytes as hexadecimal literals (`_utf8mb4 X'...'`, `X'...'`),
  which no `sql_mode` reads differently (`NO_BACKSLASH_ESCAPES`, `ANSI_QUOTES`); dates and times as quoted
  ASCII text; a `TIMESTAMP` column's instant as `FROM_UNIXTIME(seconds)`, which the connector's session turns
  into its own time zone as it reads the column.
* Identifiers are quoted (`"..."`, backticks), the whole filter is parenthesised (Debezium ANDs it with its
  own bounds without parentheses), and one key column is `IN (...)`, several a row value `(a, b) IN ((..), ..)`.

A value that has no literal here (NULL, NaN in MariaDB, a JSON document, a range or another type only the
driver knows) is reported with the reason, never guessed: its key stays out of the signal. The keys are
split into signals whose JSON stays within `max_chars` (the signalling table's `data` column, a Kafka
message) and `max_keys`; each signal is one incremental snapshot of the table with its own filter.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Dialects, as `source_connection.kind` names them.
POSTGRESQL, MARIADB, MYSQL = "postgresql", "mariadb", "mysql"
DIALECTS = (POSTGRESQL, MARIADB, MYSQL)
#: Debezium's signal type and the snapshot type asked for.
SIGNAL_TYPE = "execute-snapshot"
#: Default bounds of one signal: its `data` text, and the keys its filter names.
DEFAULT_MAX_CHARS = 60_000
DEFAULT_MAX_KEYS = 1_000
_REGEX_SPECIAL = set("\\.[]{}()*+?^$|")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

Key = tuple[Any, ...]


class Unexpressible(ValueError):
    """A key value no literal of the dialect stands for; the message says why."""


@dataclass(frozen=True)
class KeyColumn:
    """A key column: its name, and its type as the database's catalog names it (`information_schema.columns.
    data_type`, lower case; only MariaDB/MySQL's `timestamp` changes how a value is written)."""

    name: str
    data_type: str = ""


@dataclass(frozen=True)
class Signal:
    """One `execute-snapshot` signal: its id, the `data` document, and the keys its filter names."""

    id: str
    data: dict[str, Any]
    keys: tuple[Key, ...]

    @property
    def text(self) -> str:
        """The `data` as the signalling table's `data` column or the Kafka message's `data` field holds it."""
        return json.dumps(self.data, ensure_ascii=False, separators=(",", ":"))


@dataclass
class SignalPlan:
    """The signals for a set of keys, and the keys that could not be written, each with the reason."""

    signals: list[Signal] = field(default_factory=list)
    unexpressible: list[tuple[Key, str]] = field(default_factory=list)

    @property
    def keys(self) -> int:
        return sum(len(s.keys) for s in self.signals)


def collection_pattern(source_table: str) -> str:
    """A Java regex matching exactly the data collection `source_table` (`schema.table` or `db.table`).

    Debezium reads `data-collections` and each condition's `data-collection` as regular expressions
    (`ExecuteSnapshot`), so the dot between the parts, and any other special character, is escaped."""
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in source_table)


def quote_identifier(name: str, dialect: str) -> str:
    if dialect == POSTGRESQL:
        return '"' + name.replace('"', '""') + '"'
    return "`" + name.replace("`", "``") + "`"


def _pg_string(text: str) -> str:
    if "\x00" in text:
        raise Unexpressible("holds a NUL character, which no PostgreSQL text value can")
    return "E'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _decimal_text(value: decimal.Decimal) -> str:
    if not value.is_finite():
        raise Unexpressible(f"is {value}, not a number a key can be matched on")
    return format(value, "f")


def _float_text(value: float, dialect: str) -> str:
    if math.isfinite(value):
        return repr(value)
    if dialect == POSTGRESQL:
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    raise Unexpressible(f"is {value}, which MariaDB/MySQL cannot store or compare")


def _interval_text(value: dt.timedelta) -> str:
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    return f"{micros} microseconds"


def _time_text(value: dt.timedelta) -> str:
    """MariaDB's TIME (the driver's `timedelta`): [-]HHH:MM:SS.ffffff."""
    micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
    sign, micros = ("-", -micros) if micros < 0 else ("", micros)
    seconds, frac = divmod(micros, 1_000_000)
    hours, rest = divmod(seconds, 3600)
    return f"{sign}{hours:02d}:{rest // 60:02d}:{rest % 60:02d}.{frac:06d}"


def _pg_text(value: Any) -> str:
    """A value in PostgreSQL's text input form for its type (the literal stays untyped: the column types it)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return "NaN" if value.is_nan() else _decimal_text(value)
    if isinstance(value, float):
        return _float_text(value, POSTGRESQL)
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, dt.datetime):  # aware (timestamptz, read in UTC) keeps its offset; naive is a timestamp
        return value.isoformat(sep=" ")
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return _interval_text(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    raise Unexpressible(f"is a {type(value).__name__}, which has no literal here (a key of such a type is not matched)")


def _binlog_literal(value: Any, column: KeyColumn) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, decimal.Decimal):
        return _decimal_text(value)
    if isinstance(value, float):
        return _float_text(value, MARIADB)
    if isinstance(value, str):
        return "_utf8mb4 X'" + value.encode("utf-8").hex() + "'" if value else "''"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "X'" + bytes(value).hex() + "'" if bytes(value) else "X''"
    if isinstance(value, dt.datetime):
        if column.data_type == "timestamp":  # an instant: the session's time zone turns it into the column's value
            aware = value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
            delta = aware - _EPOCH
            micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
            whole, frac = divmod(micros, 1_000_000)
            return f"FROM_UNIXTIME({whole}.{frac:06d})"
        return "'" + value.replace(tzinfo=None).isoformat(sep=" ") + "'"
    if isinstance(value, dt.date):
        return "'" + value.isoformat() + "'"
    if isinstance(value, dt.time):
        return "'" + value.isoformat() + "'"
    if isinstance(value, dt.timedelta):
        return "'" + _time_text(value) + "'"
    if isinstance(value, uuid.UUID):
        return "'" + str(value) + "'"
    raise Unexpressible(f"is a {type(value).__name__}, which has no literal here (a key of such a type is not matched)")


def literal(value: Any, column: KeyColumn, dialect: str) -> str:
    """`value` of `column` as a SQL literal of `dialect`; `Unexpressible` when there is none."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r}; expected one of {', '.join(DIALECTS)}")
    if value is None:
        raise Unexpressible("is NULL, which no key filter can match")
    if dialect == POSTGRESQL:
        return _pg_string(_pg_text(value))
    return _binlog_literal(value, column)


def _item(columns: Sequence[KeyColumn], key: Key, dialect: str) -> str:
    """One key's entry of the IN list: a literal, or a row of literals for a key of several columns."""
    if len(key) != len(columns):
        raise ValueError(f"a key of {len(columns)} column(s) has {len(key)} value(s)")
    values = []
    for value, column in zip(key, columns):
        try:
            values.append(literal(value, column, dialect))
        except Unexpressible as why:
            raise Unexpressible(f"{column.name} {why}") from None
    return values[0] if len(values) == 1 else "(" + ", ".join(values) + ")"


def _ends(columns: Sequence[KeyColumn], dialect: str) -> tuple[str, str]:
    names = [quote_identifier(c.name, dialect) for c in columns]
    head = names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    return f"({head} IN (", "))"


def key_filter(columns: Sequence[KeyColumn], keys: Sequence[Key], dialect: str) -> str:
    """The parenthesised condition selecting exactly `keys` (each a tuple of values in `columns`' order)."""
    if not keys:
        raise ValueError("a key filter needs at least one key")
    head, tail = _ends(columns, dialect)
    return head + ", ".join(_item(columns, key, dialect) for key in keys) + tail


def signal_data(source_table: str, condition: str) -> dict[str, Any]:
    """The `data` of an incremental `execute-snapshot` of one table, its rows filtered by `condition`."""
    pattern = collection_pattern(source_table)
    return {"type": "incremental", "data-collections": [pattern],
            "additional-conditions": [{"data-collection": pattern, "filter": condition}]}


def _json_chars(text: str) -> int:
    """How many characters `text` takes inside a JSON string (escapes are per character, so lengths add up)."""
    return len(json.dumps(text, ensure_ascii=False)) - 2


def plan_signals(source_table: str, columns: Sequence[KeyColumn], keys: Sequence[Key], dialect: str, *,
                 max_chars: int = DEFAULT_MAX_CHARS, max_keys: int = DEFAULT_MAX_KEYS, id_prefix: str = "cdc-repair") -> SignalPlan:
    """Signals re-reading every expressible key of `keys`, each within `max_chars` of `data` text and `max_keys` keys.

    Keys are written in the order given. A key whose values have no literal, or whose filter alone would not
    fit `max_chars`, is reported in `unexpressible` with the reason."""
    if max_keys < 1:
        raise ValueError("max_keys must be at least 1")
    plan = SignalPlan()
    head, tail = _ends(columns, dialect)
    # The data's text with an empty filter, plus the filter's ends: what every signal of this table costs.
    fixed = len(Signal("", signal_data(source_table, ""), ()).text) + _json_chars(head) + _json_chars(tail)
    chunk: list[tuple[Key, str]] = []
    size = fixed

    def close() -> None:
        if chunk:
            condition = head + ", ".join(item for _, item in chunk) + tail
            plan.signals.append(Signal(f"{id_prefix}-{uuid.uuid4().hex[:20]}", signal_data(source_table, condition),
                                       tuple(k for k, _ in chunk)))
            chunk.clear()

    for key in keys:
        try:
            item = _item(columns, key, dialect)
        except Unexpressible as why:
            plan.unexpressible.append((key, str(why)))
            continue
        grows = _json_chars(item) + (2 if chunk else 0)  # ", " before every item but the first
        if fixed + _json_chars(item) > max_chars:
            plan.unexpressible.append((key, f"its filter alone is longer than a signal may be ({max_chars:,} characters)"))
            continue
        if chunk and (len(chunk) >= max_keys or size + grows > max_chars):
            close()
            size, grows = fixed, _json_chars(item)
        chunk.append((key, item))
        size += grows
    close()
    return plan


