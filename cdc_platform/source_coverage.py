"""Coverage against the live source: a table's latest state compared with the source table itself.

The raw-log coverage check (`checks.coverage`) proves the latest state agrees with the lake's own log;
it cannot see an event that never reached the log. This check reads the source database
(`source_connection`) in one consistent snapshot, with the log position that snapshot saw, and
compares it with the lake row by row and value by value:

* a key the lake holds at a *higher* position than the read's was changed after the read: left out;
* every other source row must be live in the lake with equal values (`missing_in_lake`, `different_values`);
* every other live lake row must be in the source (`extra_in_lake`).

A stream that is merely behind looks like loss in a single read, so the keys that differ are read
again, from both sides, `recheck_after` seconds later (a new snapshot, a new position); only what
still differs fails the check. Values are compared after mapping both sides to one form (README,
"Types"): timestamps as UTC microseconds (a zone-less source value taken as UTC, as Debezium does),
numbers exactly, JSON by content, uuid/enum as text, time and interval as microseconds (the lake keeps
Debezium's integer, in ms, µs or ns by the column's precision).

Known limit: the source side is held in the driver's memory for the compare (one table at a time).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cdc_platform import lake
from cdc_platform.checks import SAMPLE, CheckOutcome, Severity
from cdc_platform.config import TableConfig
from cdc_platform.errors import ConfigError
from cdc_platform.latest_state.layout import RESERVED
from cdc_platform.source_connection import SourceConnection, SourceRead, read_table
from cdc_platform.storage import LakePath

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
KINDS = ("missing_in_lake", "different_values", "extra_in_lake")
#: At most this many differing keys are read again; more than that is not a stream that is behind.
MAX_RECHECK = 10_000

Key = tuple[Any, ...]


def _micros(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _number(value: Any) -> decimal.Decimal | None:
    try:
        n = decimal.Decimal(str(value))
    except (decimal.InvalidOperation, ValueError):
        return None
    return n if n.is_finite() else None


def _json(value: Any) -> Any:
    """JSON content with numbers as exact decimals, so `1.50` and `1.5` agree and key order does not matter."""
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float, decimal.Decimal)):
        n = _number(value)
        return str(n.normalize()) if n is not None else str(value)
    return canonical(value)


def _parse_json(text: Any) -> Any:
    if not isinstance(text, str) or not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text, parse_float=decimal.Decimal)
    except ValueError:
        return None


def canonical(value: Any) -> Any:
    """One comparable, hashable form of a value from either side (driver or lake)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, decimal.Decimal)):
        n = _number(value)
        return ("n", str(n.normalize())) if n is not None else ("n", str(value))
    if isinstance(value, dt.datetime):
        return ("ts", _micros(value))
    if isinstance(value, dt.date):
        return ("date", value.isoformat())
    if isinstance(value, dt.time):
        return ("us", ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond)
    if isinstance(value, dt.timedelta):
        return ("us", (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(value))
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (dict, list, tuple)):
        return ("json", json.dumps(_json(value), sort_keys=True))
    return str(value)


def same_value(source: Any, stored: Any) -> bool:
    """Whether the lake's value is the source's, under the type mapping of the module docstring."""
    a, b = canonical(source), canonical(stored)
    if a == b:
        return True
    if source is None or stored is None:
        return False
    if isinstance(source, (dict, list)) or isinstance(stored, str) and isinstance(source, str):
        left = source if isinstance(source, (dict, list)) else _parse_json(source)
        right = _parse_json(stored)
        return left is not None and right is not None and _json(left) == _json(right)
    if isinstance(source, (dt.time, dt.timedelta)) and isinstance(stored, int) and not isinstance(stored, bool):
        us = a[1]
        return stored in (us, us * 1000) or (us % 1000 == 0 and stored == us // 1000)
    if isinstance(stored, bool) and isinstance(source, int):  # MySQL's TINYINT(1), which Debezium calls boolean
        return source in (0, 1) and bool(source) == stored
    if isinstance(source, (int, float, decimal.Decimal)) and isinstance(stored, str):  # a decimal kept as exact text
        return _number(stored) is not None and canonical(_number(stored)) == a
    if isinstance(source, str) and isinstance(stored, (int, float, decimal.Decimal)):
        return _number(source) is not None and canonical(_number(source)) == b
    return False


def key_of(table: TableConfig, row: Mapping[str, Any]) -> Key:
    """A key as both sides agree on it (an integer id and the same id as a decimal are one key)."""
    return tuple(canonical(row[k]) for k in table.key)


@dataclass
class LakeSide:
    """The latest state of one table as the compare needs it: per key, source columns and position."""

    columns: tuple[str, ...]
    rows: dict[Key, dict[str, Any]]


def read_lake(spark: Any, lake_dir: LakePath, table: TableConfig) -> LakeSide:
    """The folded latest state (tombstones included, with `_position`), through Spark."""
    from pyspark.sql import functions as F

    from cdc_platform.views import table_frame

    if not lake.exists(lake.table_path(lake_dir, table.name)):
        return LakeSide((), {})
    frame = table_frame(spark, lake_dir, table.name)
    columns = tuple(c for c in frame.columns if c not in RESERVED)
    if any(k not in columns for k in table.key):
        return LakeSide(columns, {})  # nothing has landed yet: only the metadata columns exist
    rows = frame.where(F.col(table.key[0]).isNotNull()).select(*columns, "_position", "_deleted").toArrow().to_pylist()
    return LakeSide(columns, {key_of(table, r): r for r in rows})


@dataclass
class Compared:
    """Per-key verdicts of one compare; only keys that differ are kept by name."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("matched", "changed_after_read", *KINDS), 0))
    differing: dict[Key, tuple[str, tuple[Any, ...]]] = field(default_factory=dict)  # key -> (kind, key values to re-read)
    different_columns: dict[str, int] = field(default_factory=dict)


def _column_map(source_columns: Sequence[str], lake_columns: Sequence[str]) -> dict[str, str]:
    exact = set(lake_columns)
    folded = {c.lower(): c for c in lake_columns}
    return {c: c if c in exact else folded[c.lower()] for c in source_columns if c in exact or c.lower() in folded}


def compare(read: SourceRead, stored: LakeSide, table: TableConfig, keys: set[Key] | None = None) -> Compared:
    """Judge every source row of `read` and every live lake row (or only `keys`) against each other."""
    out = Compared()
    columns = _column_map(read.columns, stored.columns)
    key_at = [read.columns.index(k) if k in read.columns else None for k in table.key]
    if any(i is None for i in key_at):
        raise ConfigError(f"the source table {table.source} has no key column {', '.join(k for k, i in zip(table.key, key_at) if i is None)} "
                          f"(its columns: {', '.join(read.columns)}); fix `key:` of {table.name} in the config")
    seen: set[Key] = set()
    for row in read.rows:
        key_values = tuple(row[i] for i in key_at)  # type: ignore[index]
        key = tuple(canonical(v) for v in key_values)
        seen.add(key)
        current = stored.rows.get(key)
        if current is not None and current["_position"] > read.position:
            out.counts["changed_after_read"] += 1
            continue
        if current is None or current["_deleted"]:
            kind = "missing_in_lake"
        else:
            bad = [c for c, lc in columns.items() if not same_value(row[read.columns.index(c)], current.get(lc))]
            for c in bad:
                out.different_columns[c] = out.different_columns.get(c, 0) + 1
            kind = "different_values" if bad else "matched"
        out.counts[kind] += 1
        if kind != "matched":
            out.differing[key] = (kind, key_values)
    for key, current in stored.rows.items():
        if key in seen or current["_deleted"] or (keys is not None and key not in keys):
            continue
        if current["_position"] > read.position:
            out.counts["changed_after_read"] += 1
            continue
        out.counts["extra_in_lake"] += 1
        out.differing[key] = ("extra_in_lake", tuple(current[k] for k in table.key))
    return out


def _shown(table: TableConfig, values: Sequence[Any]) -> str:
    return json.dumps(dict(zip(table.key, values)), default=str, sort_keys=True)


def source_coverage(spark: Any, lake_dir: LakePath, table: TableConfig, connection: SourceConnection, *,
                    sleep: Callable[[float], None] = time.sleep) -> CheckOutcome:
    """The latest state of `table` against its live source table (module docstring)."""
    read = read_table(connection, table.source)
    stored = read_lake(spark, lake_dir, table)
    first = compare(read, stored, table)
    result, rechecked = first, 0
    if first.differing and len(first.differing) <= MAX_RECHECK and connection.recheck_after >= 0:
        sleep(connection.recheck_after)
        rechecked = len(first.differing)
        again = read_table(connection, table.source, table.key, [values for _, values in first.differing.values()])
        second = compare(again, read_lake(spark, lake_dir, table), table, keys=set(first.differing))
        result = Compared(counts=dict(first.counts), different_columns=second.different_columns)
        for kind, _ in first.differing.values():
            result.counts[kind] -= 1
        for kind, n in second.counts.items():
            result.counts[kind] += n
        result.differing = second.differing
    counts = result.counts
    considered = sum(counts[k] for k in ("matched", "missing_in_lake", "different_values"))
    pct = 100.0 * counts["matched"] / considered if considered else 100.0
    meta: dict[str, Any] = {"source": connection.describe(), "source_position": read.position, "source_rows": len(read.rows),
                            "live_coverage_percent": round(pct, 4), **counts, "rechecked_keys": rechecked}
    compared_columns = _column_map(read.columns, stored.columns)
    not_in_lake = [c for c in read.columns if c not in compared_columns]
    if not_in_lake and stored.rows:  # a column no change event has carried yet (added, never written since): not compared
        meta["source_columns_not_in_lake"] = not_in_lake
    if result.different_columns:
        meta["different_columns"] = dict(sorted(result.different_columns.items()))
    bad = {k: counts[k] for k in KINDS if counts[k]}
    if bad:
        samples: dict[str, list[str]] = {}
        for kind, values in result.differing.values():
            if len(samples.setdefault(kind, [])) < SAMPLE:
                samples[kind].append(_shown(table, values))
        meta["live_mismatched_keys"] = {k: sorted(samples[k]) for k in bad}
        described = ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in bad.items())
        example = meta["live_mismatched_keys"][next(iter(bad))][0]
        when = f", still after a recheck {connection.recheck_after:g} s later" if rechecked else ""
        return CheckOutcome(False, Severity.ERROR, f"{table.name} vs the live {table.source}: {pct:.2f}% covered; {described} (e.g. key {example}){when}; "
                            f"find the cause (dead letters, a connector's lost events), then `cdc rebuild --table {table.name}` or a snapshot load", meta)
    return CheckOutcome(True, Severity.ERROR, f"{table.name} vs the live {table.source}: {pct:.2f}% covered ({counts['matched']:,} rows equal, "
                        f"{counts['changed_after_read']:,} changed after the read)", meta)

