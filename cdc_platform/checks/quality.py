"""Great Expectations suites (GX 1.x JSON in `expectations/`) run against lake tables.

One adapter: `validate(df, suite)` runs a suite on a Spark DataFrame and returns a `CheckOutcome`
(`checks.py`), which Dagster turns into an `AssetCheckResult`. `dagster-ge` is not used: it pins
GX < 1.0.

Suites are templates so one file serves every latest-state table: in any expectation's kwargs the
string `"$key"` expands the expectation once per key column, and `"$keys"` becomes the list of key
columns (a compound-uniqueness expectation over a single key column becomes plain uniqueness). A file `expectations/<table>.json` applies to that table; `expectations/latest_state.json`
applies to every latest-state table in addition.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_platform.checks import CheckOutcome, Severity
from cdc_platform.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

LATEST_STATE_SUITE = "latest_state"


def default_expectations_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "expectations"


def load_suite(path: Path) -> dict[str, Any]:
    try:
        suite = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"expectation suite {path} cannot be read as JSON ({exc}); fix or remove it") from exc
    if not isinstance(suite, dict) or not isinstance(suite.get("expectations"), list):
        raise ConfigError(f"expectation suite {path} must be a GX 1.x suite: an object with `name` and an `expectations` list")
    return suite


def expand(suite: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """Fill the `$key` / `$keys` placeholders with a table's key columns."""
    out = copy.deepcopy(suite)
    expanded: list[dict[str, Any]] = []
    for exp in out["expectations"]:
        kwargs = exp.get("kwargs", {})
        if "$key" in kwargs.values():
            for key in keys:
                e = copy.deepcopy(exp)
                e["kwargs"] = {k: (key if v == "$key" else v) for k, v in kwargs.items()}
                expanded.append(e)
            continue
        exp["kwargs"] = {k: (list(keys) if v == "$keys" else v) for k, v in kwargs.items()}
        if exp["type"] == "expect_compound_columns_to_be_unique" and len(exp["kwargs"].get("column_list", ())) == 1:
            # GX wants two or more columns for a compound key; one key column is plain uniqueness.
            column = exp["kwargs"].pop("column_list")[0]
            exp["type"] = "expect_column_values_to_be_unique"
            exp["kwargs"]["column"] = column
        expanded.append(exp)
    out["expectations"] = expanded
    return out


def suites_for(table: str, keys: Sequence[str] = (), latest_state: bool = False, directory: Path | None = None) -> list[dict[str, Any]]:
    directory = directory or default_expectations_dir()
    names = ([LATEST_STATE_SUITE] if latest_state else []) + [table]
    return [expand(load_suite(directory / f"{n}.json"), keys) for n in names if (directory / f"{n}.json").is_file()]


def _context() -> Any:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    return context


def validate(df: DataFrame, suite: dict[str, Any]) -> CheckOutcome:
    """Run a suite on a Spark DataFrame; the outcome names every failed expectation with its counts."""
    import great_expectations as gx

    context = _context()
    source = context.data_sources.add_spark("lake")
    batch_def = source.add_dataframe_asset("table").add_batch_definition_whole_dataframe("all")
    gx_suite = gx.ExpectationSuite(name=suite.get("name", "suite"), expectations=[
        {"type": e["type"], "kwargs": e.get("kwargs", {}), "meta": e.get("meta", {})} for e in suite["expectations"]
    ])
    result = batch_def.get_batch(batch_parameters={"dataframe": df}).validate(gx_suite)
    failed: list[str] = []
    meta: dict[str, Any] = {"suite": suite.get("name", "suite")}
    for r in result.results:
        cfg = r.expectation_config
        column = cfg.kwargs.get("column") or ",".join(cfg.kwargs.get("column_list") or [])
        label = f"{cfg.type}({column})" if column else cfg.type
        unexpected = (r.result or {}).get("unexpected_count")
        if not r.success:
            sample = (r.result or {}).get("partial_unexpected_list") or []
            failed.append(f"{label}: {unexpected if unexpected is not None else '?'} unexpected, e.g. {sample[:3]}")
        if unexpected is not None:
            meta[f"unexpected.{label}"] = int(unexpected)
    stats = result.statistics
    meta |= {
        "evaluated_expectations": int(stats["evaluated_expectations"]),
        "successful_expectations": int(stats["successful_expectations"]),
        "success_percent": float(stats["success_percent"] or 0.0),
    }
    if failed:
        meta["failed"] = failed
        description = f"{len(failed)} expectation(s) failed: " + "; ".join(failed)
    else:
        description = f"all {stats['evaluated_expectations']} expectations of {meta['suite']} passed"
    return CheckOutcome(bool(result.success), Severity.ERROR, description, meta)
