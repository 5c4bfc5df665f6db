"""The type property: a generated table's events, parsed and typed by the platform, must give the
oracle's values (or be dead-lettered with a reason the oracle allows).

`check_case` runs the same calls as the latest-state stage (`envelope.parse_lines`, the ingest split,
then `latest_state.change_rows`, `type_rows`, `build_rows`, as `apply_table` does) without Spark or
Delta, and returns every difference as a `Failure` naming the column's type family, so a test can
assert there are none and `benchmarks/type_fuzz.py` can count them by type.

`same` and `spark_name` are shared with the end-to-end test, which reads the values back through Spark.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tests.strategies.debezium_types import LATEST_STATE_CODES, Dead, JsonText, TableCase

FILE = "type-props.jsonl"


# --- Comparing values -------------------------------------------------------------------------------


def _json_equal(a: Any, b: Any) -> bool:
    """JSON values equal as JSON: numbers by value (1 and 1.0 alike), booleans never equal to numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def same(expected: Any, actual: Any) -> bool:
    """Whether a value read back is exactly the one the oracle expects (NaN equals NaN; -0.0 is not 0.0)."""
    if expected is None:
        return actual is None
    if isinstance(expected, JsonText):
        if not isinstance(actual, str):
            return False
        try:
            return _json_equal(json.loads(actual), expected.value)
        except ValueError:
            return False
    if isinstance(expected, bool):
        return type(actual) is bool and actual == expected
    if isinstance(expected, float):
        if not isinstance(actual, float):
            return False
        if math.isnan(expected):
            return math.isnan(actual)
        return actual == expected and math.copysign(1.0, actual) == math.copysign(1.0, expected)
    if isinstance(expected, int):
        return (type(actual) is int or isinstance(actual, decimal.Decimal)) and actual == expected
    if isinstance(expected, decimal.Decimal):
        return isinstance(actual, decimal.Decimal) and actual == expected
    if isinstance(expected, dt.datetime):
        return isinstance(actual, dt.datetime) and actual.tzinfo is not None and actual == expected
    if isinstance(expected, dt.date):
        return type(actual) is dt.date and actual == expected
    if isinstance(expected, bytes):
        return isinstance(actual, (bytes, bytearray)) and bytes(actual) == expected
    if isinstance(expected, str):
        return isinstance(actual, str) and actual == expected
    raise TypeError(f"the oracle has no rule for {type(expected).__name__}")


def spark_name(t: pa.DataType) -> str:
    """The Spark SQL type (`simpleString`) an Arrow column becomes when Spark reads the Delta table."""
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    names = [
        (pa.types.is_int8, "tinyint"), (pa.types.is_int16, "smallint"), (pa.types.is_int32, "int"), (pa.types.is_int64, "bigint"),
        (pa.types.is_float32, "float"), (pa.types.is_float64, "double"), (pa.types.is_boolean, "boolean"),
        (pa.types.is_date32, "date"),
        (lambda x: pa.types.is_string(x) or pa.types.is_large_string(x) or pa.types.is_string_view(x), "string"),
        (lambda x: pa.types.is_binary(x) or pa.types.is_large_binary(x) or pa.types.is_binary_view(x), "binary"),
    ]
    for test, name in names:
        if test(t):
            return name
    return str(t)


def show(value: Any) -> str:
    if isinstance(value, JsonText):
        return f"JSON {json.dumps(value.value, default=str)[:120]}"
    if isinstance(value, Dead):
        return f"dead letter ({' or '.join(sorted(value.codes))}: {value.why})"
    text = repr(value)
    return text if len(text) <= 160 else text[:157] + "..."


# --- Failures ---------------------------------------------------------------------------------------


@dataclass
class Failure:
    family: str  # the column's type family, or "-" when no column can be named
    label: str  # the column's declared type, e.g. `Decimal(p<=38) number`
    what: str  # value | type | dead_unexpected | dead_missing | dead_code | raised | not_a_change
    column: str | None
    line: str | None
    expected: Any
    actual: Any
    note: str = ""

    def describe(self) -> str:
        col = f" column `{self.column}`" if self.column else ""
        text = f"[{self.family}: {self.label}] {self.what}{col}: expected {show(self.expected)}, got {show(self.actual)}"
        if self.note:
            text += f" ({self.note})"
        if self.line is not None:
            text += f"\n    line: {self.line if len(self.line) <= 1500 else self.line[:1500] + '...'}"
        return text


def report(failures: Sequence[Failure], limit: int = 8) -> str:
    shown = "\n".join(f.describe() for f in failures[:limit])
    more = f"\n... and {len(failures) - limit} more" if len(failures) > limit else ""
    return f"{len(failures)} difference(s) from the type oracle:\n{shown}{more}"


# --- Running the platform's typing ----------------------------------------------------------------------


@dataclass
class Outcome:
    """What the platform made of a table's lines, by line index."""

    values: dict[int, dict[str, Any]] = field(default_factory=dict)  # landed rows
    types: dict[str, str] = field(default_factory=dict)  # column -> Spark type name
    dead: dict[int, tuple[str, str, str]] = field(default_factory=dict)  # line -> (stage, code, reason)
    other: dict[int, str] = field(default_factory=dict)  # line -> kind, for lines that became neither


def run_typing(case: TableCase) -> Outcome:
    """Parse and type `case`'s lines exactly as the ingest job and the latest-state stage do."""
    from cdc_platform.config import TableConfig
    from cdc_platform.parse.envelope import KeySpec, parse_lines
    from cdc_platform.stages.latest_state import Events, build_rows, change_rows, type_rows
    from cdc_platform.parse.parsed_batches import rows_to_batch, split_parsed

    lines = case.lines()
    index = {line: i for i, line in enumerate(lines)}
    parsed = parse_lines(lines, [FILE] * len(lines), KeySpec({case.source: ["id"]}))
    out = Outcome()
    for i, row in enumerate(parsed):
        if row["kind"] == "dead_letter":
            out.dead[i] = ("ingest", row["reason_code"], row["reason"])
        elif row["kind"] != "change":
            out.other[i] = row["kind"]
    batch = split_parsed(pa.Table.from_batches([rows_to_batch(parsed)]), batch_id=0)
    mine = batch.events.filter(pc.equal(batch.events.column("table_id"), case.source))
    if mine.num_rows == 0:
        return out
    events = Events(mine)
    line_of = [index[text] for text in events.col("line")]
    table = TableConfig(case.source, case.table, ("id",))
    rows, bad = change_rows(events, table.key)
    typed = type_rows(rows, events, {}, table)
    for e, code, reason in bad:
        typed.dead.setdefault(e, (code, reason))
    for e, (code, reason) in typed.dead.items():
        out.dead[line_of[e]] = ("latest_state", code, reason)
    live = [i for i, r in enumerate(rows) if r.event not in typed.dead]
    if not live:
        return out
    built = build_rows(typed, events, live, table.key, seq=0, history=True)
    out.types = {c: spark_name(built.schema.field(c).type) for c in typed.columns}
    for i, values in zip(live, built.select(list(typed.columns)).to_pylist()):
        out.values[line_of[rows[i].event]] = values
    return out


_NAMED = re.compile(r"`([^`]+)`")


def _culprit(case: TableCase, reason: str) -> str | None:
    lowered = {c.name.lower(): c.name for c in case.columns}
    for name in _NAMED.findall(reason):
        if name.lower() in lowered:
            return lowered[name.lower()]
    return None


def compare(case: TableCase, out: Outcome) -> list[Failure]:
    """Every difference between the platform's outcome and the oracle, per event and column."""
    failures: list[Failure] = []
    lines = case.lines()
    by_name = {c.name: c for c in case.columns}

    def fail(col: str | None, what: str, line: int | None, expected: Any, actual: Any, note: str = "") -> None:
        kind = by_name[col].kind if col in by_name else None
        family = kind.family if kind else ("-" if len(case.families) != 1 else case.families[0])
        label = kind.label if kind else ("key `id`" if col == "id" else "-")
        failures.append(Failure(family, label, what, col, None if line is None else lines[line], expected, actual, note))

    for i, event in enumerate(case.events):
        if i in out.other:
            fail(None, "not_a_change", i, "a change event", out.other[i])
            continue
        dead = event.dead
        got = out.dead.get(i)
        if dead is not None:
            col = next(c for c, cell in event.cells.items() if isinstance(cell.expected, Dead))
            if got is None:
                fail(col, "dead_missing", i, dead, out.values.get(i, {}).get(col, "<no row>"), event.cells[col].note)
            elif got[1] not in dead.codes:
                fail(col, "dead_code", i, dead, f"{got[0]} {got[1]}: {got[2]}", event.cells[col].note)
            continue
        if got is not None:
            col = _culprit(case, got[2])
            note = event.cells[col].note if col in event.cells else ""
            if got[1] not in LATEST_STATE_CODES | {"out_of_range"}:
                note = (note + "; " if note else "") + f"code {got[1]} is not a reason this stage may give"
            fail(col, "dead_unexpected", i, event.expected_row().get(col) if col else "a landed row", f"{got[0]} {got[1]}: {got[2]}", note)
            continue
        landed = out.values.get(i)
        if landed is None:
            fail(None, "dead_missing", i, "a landed row", "no row and no dead letter")
            continue
        for col, expected in event.expected_row().items():
            actual = landed.get(col)
            if not same(expected, actual):
                fail(col, "value", i, expected, actual, event.cells[col].note if col in event.cells else "")
    if out.values:
        live = case.live_events()
        for col, accepted in case.spark_types().items():
            got_type = out.types.get(col, "<no column>")
            carriers = [i for i in live if col == "id" or case.events[i].cells[col].json is not None]
            if col not in out.types and carriers and all(i in out.dead for i in carriers):
                continue  # every value of it was dead-lettered, and each of those is reported above
            if got_type not in accepted:
                fail(col, "type", None, " or ".join(sorted(accepted)), got_type)
    return failures


def check_case(case: TableCase) -> list[Failure]:
    """The property for one table. A raising stage is a failure too, pinned on the columns that raise alone."""
    try:
        return compare(case, run_typing(case))
    except Exception as exc:  # noqa: BLE001 - the property is that no input makes the stage raise
        failures: list[Failure] = []
        for col in case.columns:
            try:
                run_typing(case.only([col.name]))
            except Exception as alone:  # noqa: BLE001
                failures.append(Failure(col.kind.family, col.kind.label, "raised", col.name, _first_line(case.only([col.name])),
                                        "no exception", f"{type(alone).__name__}: {alone}"[:300]))
        if not failures:
            failures.append(Failure("-", "-", "raised", None, _first_line(case), "no exception", f"{type(exc).__name__}: {exc}"[:300]))
        return failures


def _first_line(case: TableCase) -> str | None:
    """The smallest line that still raises alone, else the first line."""
    for i in sorted(range(len(case.events)), key=lambda i: len(case.line(i))):
        single = TableCase(case.form, case.connector, case.namespace, case.table, case.columns, [case.events[i]])
        try:
            run_typing(single)
        except Exception:  # noqa: BLE001
            return case.line(i)
    return case.line(0) if case.events else None


def by_family(failures: Sequence[Failure]) -> Mapping[str, list[Failure]]:
    out: dict[str, list[Failure]] = {}
    for f in failures:
        out.setdefault(f.family, []).append(f)
    return out
