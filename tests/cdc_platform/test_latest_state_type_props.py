"""Property: every value a Debezium event carries reaches the full view exactly (issue 13, "Property
tests for types").

Events and the values they must give come from `tests/strategies/debezium_types.py`, whose oracle
implements the target type mapping on its own. The fast tests run the parser and the latest-state
typing without Spark, one test per type family so a defect marks only its own family; the end-to-end
tests land one file with a table per group of families, run the pipeline once and read every
`__full_view` (and the dead letters) back through Spark. `benchmarks/type_fuzz.py` runs the same property with thousands of examples.

Twelve defects these tests found (decimals through a float or rounded to 28 digits, wide decimals
clamped, VariableScaleDecimal as struct text, NaN strings refused, timestamps scaled through a float,
out-of-range times raising, big plain integers refused) were fixed; to mark a new one as known, give
its family `pytest.mark.xfail(strict=True, reason=...)` so the marker fails once the fix lands.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings

from tests.strategies.debezium_types import EPOCH, EPOCH_DAY, FAMILIES, PLAIN, WRAPPED, TableCase, table_cases
from tests.strategies.type_property import Failure, check_case, report, same

MIXED = {"mixed_wrapped": WRAPPED, "mixed_plain": PLAIN}


# --- Fast: parser + latest-state typing, no Spark ---------------------------------------------------


@pytest.mark.parametrize("family", [*FAMILIES, *MIXED])
def test_events_type_to_the_values_they_carry(family: str) -> None:
    families = MIXED.get(family, (family,))
    examples = settings().max_examples * (4 if family in MIXED else 1)

    @settings(max_examples=examples)
    @given(table_cases(families, max_columns=5 if family in MIXED else 3))
    def prop(case: TableCase) -> None:
        failures = check_case(case)
        assert not failures, report(failures)

    prop()


# --- End to end: one landing file, one pipeline run, every full view read back through Spark --------

#: One table per group of families (registering a table's views costs Spark about a second and a half,
#: so a table per family would make this test minutes long).
GROUPS: dict[str, tuple[str, ...]] = {
    "numbers": ("integers", "float32", "float64", "boolean"),
    "text": ("string", "bytes", "semantic_string", "decimal_mode_string", "decimal_mode_double"),
    "nested": ("array", "map", "struct"),
    "times": ("date", "time", "zoned_timestamp"),
    "plain": ("plain_int", "plain_double", "plain_string", "plain_boolean", "plain_json"),
    "float_specials": ("float_specials",),
    "variable_scale_decimal": ("variable_scale_decimal",),
    "epoch_timestamps": ("timestamp", "nano_timestamp"),
    "plain_big_int": ("plain_big_int",),
    "decimals": ("decimal_base64", "decimal_numeric", "decimal_no_precision", "decimal_wide"),
    "micro_timestamp": ("micro_timestamp",),
    "time_out_of_range": ("time_out_of_range",),
}
assert sorted(f for g in GROUPS.values() for f in g) == sorted(FAMILIES)
E2E_KEYS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 2**63 - 1, -(2**63))


def _e2e_case(group: str, index: int) -> TableCase:
    """A deterministic, non-trivial table for a group: the largest of a dozen derandomized examples."""
    families = GROUPS[group]
    found: list[TableCase] = []

    @settings(max_examples=12, derandomize=True, database=None, phases=[Phase.generate], deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(table_cases(families, table=f"t{index:02d}_{group}", min_columns=len(families), max_columns=len(families) + 2,
                       min_events=10, max_events=16, every_family=True, keys=E2E_KEYS))
    def collect(case: TableCase) -> None:
        found.append(case)

    with _no_local_constants():
        collect()
    return max(found, key=lambda c: len(c.events) * len(c.columns))


@contextlib.contextmanager
def _no_local_constants() -> Iterator[None]:
    """Make the derandomized draw independent of which modules are loaded.

    Hypothesis (>= 6.131) sometimes draws constants found in the source of every local module in
    `sys.modules`, so the same derandomized test drew one table in a single-file run and another in the full
    suite (or in whichever pytest-xdist worker ran it). Here that pool is held empty, so CI and a developer
    draw the same tables. The hook is internal to Hypothesis: if it moves, the draw is merely less stable."""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:  # pragma: no cover - a Hypothesis without the module
        yield
        return
    if not hasattr(providers, "_get_local_constants") or not hasattr(providers, "Constants"):  # pragma: no cover
        yield
        return
    saved = providers._get_local_constants
    providers._get_local_constants = providers.Constants  # an empty pool
    try:
        yield
    finally:
        providers._get_local_constants = saved


@dataclass
class Lake:
    config: Any
    cases: dict[str, TableCase]
    error: BaseException | None
    dead: dict[str, tuple[str, str, str]]  # line -> (stage, reason_code, reason)


@pytest.fixture(scope="module")
def e2e(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lake]:
    """One landing file with a table per group of families, one `cdc run`. Module-scoped (the conftest builders are
    per test) so that the run happens once for all the family tests below."""
    from cdc_platform.config import load_config
    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.views import register_lake

    root: Path = tmp_path_factory.mktemp("type_props")
    cases = {group: _e2e_case(group, i) for i, group in enumerate(GROUPS, 1)}
    per_table = [case.lines() for case in cases.values()]
    lines = [table[i] for i in range(max(map(len, per_table))) for table in per_table if i < len(table)]  # tables interleaved
    (root / "landing").mkdir()
    (root / "landing" / "types.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    doc = {"landing": "landing", "lake": "lake", "tables": {case.source: {"key": ["id"]} for case in cases.values()}}
    (root / "cdc.yaml").write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    config = load_config(root / "cdc.yaml")
    error: BaseException | None = None
    try:
        IngestJob(config).run_available_now(spark)
    except Exception as exc:  # noqa: BLE001 - recorded; test_one_run_lands_every_table reports it
        error = exc
    register_lake(spark, config.lake)
    dead = {}
    if error is None:
        for r in spark.sql("SELECT line, stage, reason_code, reason FROM dead_letter").collect():
            dead[r["line"]] = (r["stage"], r["reason_code"], r["reason"])
    yield Lake(config, cases, error, dead)


def test_one_run_lands_every_table(e2e: Lake) -> None:
    assert e2e.error is None, f"the pipeline run raised {type(e2e.error).__name__}: {e2e.error}"
    assert sum(len(c.events) for c in e2e.cases.values()) >= 100


def _view_rows(spark: Any, case: TableCase, view: str = "full") -> tuple[dict[str, str], dict[int, dict[str, Any]]]:
    """(column -> Spark type, id -> row) of the table's full (or consistent) view, timestamps and dates read as exact integers."""
    df = spark.table(f"`{case.table}__{view}_view`")
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields if not f.name.startswith("_")}
    exprs = []
    for name, typ in types.items():
        col = f"`{name}`"
        exprs.append(f"unix_micros({col}) AS {col}" if typ == "timestamp" else f"unix_date({col}) AS {col}" if typ == "date" else col)
    rows: dict[int, dict[str, Any]] = {}
    for r in df.selectExpr(*exprs).collect():
        row = r.asDict()
        for name, typ in types.items():
            v = row[name]
            if v is not None and typ == "timestamp":
                row[name] = EPOCH + dt.timedelta(microseconds=v)
            elif v is not None and typ == "date":
                row[name] = EPOCH_DAY + dt.timedelta(days=v)
            elif isinstance(v, bytearray):
                row[name] = bytes(v)
        rows[row["id"]] = row
    return types, rows


def _view_failures(spark: Any, lake: Lake, case: TableCase, view: str = "full") -> list[Failure]:
    from tests.strategies.debezium_types import LATEST_STATE_CODES

    failures: list[Failure] = []
    by_name = {c.name.lower(): c for c in case.columns}
    family = case.families[0] if len(case.families) == 1 else "-"

    def fail(col: str | None, what: str, line: str | None, expected: Any, actual: Any, note: str = "") -> None:
        kind = by_name[col.lower()].kind if col and col.lower() in by_name else None
        failures.append(Failure(kind.family if kind else family, kind.label if kind else "-", what, col, line, expected, actual, note))

    if not spark.catalog.tableExists(f"`{case.table}__{view}_view`"):
        return [Failure(family, "-", "raised", None, None, f"a {view} view", f"none; the run raised {lake.error!r}")]
    types, rows = _view_rows(spark, case, view)
    expected_rows = case.full_view()
    if lake.error is not None and expected_rows and not rows:
        return [Failure(family, "-", "raised", None, None, f"{len(expected_rows)} rows", f"none; the run raised {lake.error!r} first")]
    lines = case.lines()
    last_line = {e.key: lines[i] for i, e in enumerate(case.events) if e.dead is None}
    for key in sorted(expected_rows.keys() | rows.keys()):
        want, got = expected_rows.get(key), rows.get(key)
        if want is None or got is None:
            fail("id", "value", last_line.get(key), want and f"row {key}", got and f"row {key}")
            continue
        lowered = {k.lower(): v for k, v in got.items()}
        for col, value in want.items():
            actual = lowered.get(col.lower())
            if not same(value, actual):
                fail(col, "value", last_line[key], value, actual)
    for col, accepted in case.spark_types().items():
        got_type = {k.lower(): v for k, v in types.items()}.get(col.lower(), "<no column>")
        if got_type not in accepted:
            fail(col, "type", None, " or ".join(sorted(accepted)), got_type)
    if lake.error is None and view == "full":  # dead letters are written after the stages, so only a completed run has them
        for line, event in zip(lines, case.events):
            got_dead = lake.dead.get(line)
            if event.dead is not None and (got_dead is None or got_dead[1] not in event.dead.codes):
                col = next(c for c, cell in event.cells.items() if cell.expected is event.dead)
                fail(col, "dead_missing" if got_dead is None else "dead_code", line, event.dead, got_dead)
            elif event.dead is None and got_dead is not None:
                note = "" if got_dead[1] in LATEST_STATE_CODES else f"code {got_dead[1]} is not a reason this stage may give"
                fail(None, "dead_unexpected", line, "a landed row", got_dead, note)
    return failures


@pytest.mark.parametrize("group", list(GROUPS))
def test_full_view_holds_the_values_events_carried(e2e: Lake, spark: Any, group: str) -> None:
    failures = _view_failures(spark, e2e, e2e.cases[group])
    assert not failures, report(failures)


@pytest.mark.parametrize("group", list(GROUPS))
def test_consistent_view_holds_the_values_events_carried(e2e: Lake, spark: Any, group: str) -> None:
    """The consistent view types the raw log's images in SQL (`connect_sql`); with every event settled it
    must show exactly the full view's values and types, dead-lettered events left out as there.

    One known gap is let through: a Decimal wider than 38 digits sent as a JSON number that Spark reads
    only as a double is NULL there (`connect_sql._quantized`, tested in test_connect_sql.py)."""
    failures = [f for f in _view_failures(spark, e2e, e2e.cases[group], view="consistent")
                if not (f.family == "decimal_wide" and f.label.endswith("number") and f.what == "value" and f.actual is None)]
    assert not failures, report(failures)
