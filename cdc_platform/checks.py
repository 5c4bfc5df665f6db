"""Checks: the platform's SLOs (completeness, coverage, freshness, dead letters) as plain functions.

Each returns a `CheckOutcome`: pass/fail, a severity, a sentence, and numeric metadata a person can
read and plot. Dagster wraps them in asset checks (`dagster_project/checks.py`) through one adapter;
here they are tested without Dagster. A failed check is a data problem, never an exception.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdc_platform import lake

CHECK_STATE_DIR = "_cdc_checks"


class Severity(str, Enum):
    WARN = "WARN"
    ERROR = "ERROR"


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    severity: Severity
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TableStats:
    rows: int
    version: int
    files: int
    size_bytes: int

    def as_metadata(self) -> dict[str, int]:
        return {"rows": self.rows, "delta_version": self.version, "files": self.files, "size_bytes": self.size_bytes}


def _add_actions(table: DeltaTable) -> pa.Table:
    return pa.table(table.get_add_actions(flatten=True))


def table_stats(path: Path) -> TableStats:
    """Rows, version, files and bytes from the Delta log alone (file statistics), without a scan."""
    table = lake.open_table(path)
    actions = _add_actions(table)
    rows = int(pc.sum(actions.column("num_records")).as_py() or 0) if actions.num_rows else 0
    size = int(pc.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0
    return TableStats(rows=rows, version=table.version(), files=actions.num_rows, size_bytes=size)


def column_max(path: Path, column: str) -> Any:
    """The largest value of a column from file statistics (None for an empty table or missing stats)."""
    actions = _add_actions(lake.open_table(path))
    name = f"max.{column}"
    if actions.num_rows == 0 or name not in actions.column_names:
        return None
    return pc.max(actions.column(name)).as_py()


def _as_utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return None


def freshness(lake_dir: Path, slo_seconds: float, now: dt.datetime | None = None, latest_state: Path | None = None) -> CheckOutcome:
    """Lag from the newest source commit time in the raw log to now, and from the raw log to a latest-state table.

    The first is Stripe's freshness SLO (how stale is the lake compared to the database); the second
    says whether a stage downstream of the raw log is falling behind it.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    newest_raw = _as_utc(column_max(lake.table_path(lake_dir, "raw_change_events"), "source_ts"))
    meta: dict[str, Any] = {"slo_seconds": float(slo_seconds)}
    if newest_raw is None:
        return CheckOutcome(False, Severity.WARN, "the raw log is empty: nothing has landed yet, so freshness is unknown", meta)
    lag = (now - newest_raw).total_seconds()
    meta |= {"newest_source_ts": newest_raw.isoformat(), "lag_seconds": round(lag, 3)}
    passed = lag <= slo_seconds
    parts = [f"newest source change is {lag:,.0f} s old (SLO {slo_seconds:,.0f} s)"]
    if latest_state is not None and lake.exists(latest_state):
        newest_state = _as_utc(column_max(latest_state, "_source_ts"))
        behind = (newest_raw - newest_state).total_seconds() if newest_state is not None else float("inf")
        meta["latest_state_behind_raw_seconds"] = round(behind, 3) if behind != float("inf") else -1.0
        if behind > slo_seconds:
            passed = False
        parts.append(f"latest state trails the raw log by {behind:,.0f} s" if behind != float("inf") else "latest state is empty")
    return CheckOutcome(passed, Severity.ERROR, "; ".join(parts), meta)


def _state_file(lake_dir: Path, name: str) -> Path:
    return lake_dir / CHECK_STATE_DIR / f"{name}.json"


def _read_state(lake_dir: Path, name: str) -> dict[str, Any]:
    path = _state_file(lake_dir, name)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _write_state(lake_dir: Path, name: str, state: dict[str, Any]) -> None:
    path = _state_file(lake_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(state, fh)
    os.replace(tmp, path)


def new_dead_letters(lake_dir: Path, *, advance: bool = True) -> CheckOutcome:
    """Dead-letter rows added since the previous evaluation (a WARN: the data is kept, a person should look).

    The cursor (the `dead_letter` row count last seen) lives in the lake, so it survives a reset of the
    Dagster instance and is shared by everyone checking the same lake.
    """
    path = lake.table_path(lake_dir, "dead_letter")
    stats = table_stats(path)
    seen = int(_read_state(lake_dir, "dead_letter").get("rows", 0))
    new = max(stats.rows - seen, 0)
    meta: dict[str, Any] = {"new_dead_letters": new, "total_dead_letters": stats.rows, "delta_version": stats.version}
    if new:
        reasons = _recent_reasons(path, new)
        meta["new_by_reason"] = reasons
        description = f"{new} new dead-letter row(s) since the last check: " + ", ".join(f"{k} ×{v}" for k, v in reasons.items())
    else:
        description = "no new dead-letter rows since the last check"
    if advance:
        _write_state(lake_dir, "dead_letter", {"rows": stats.rows, "version": stats.version})
    return CheckOutcome(new == 0, Severity.WARN, description, meta)


def _recent_reasons(path: Path, newest: int) -> dict[str, int]:
    table = lake.open_table(path).to_pyarrow_table(columns=["reason_code", "dead_lettered_at"])
    table = table.sort_by([("dead_lettered_at", "descending")]).slice(0, newest)
    counts = table.group_by("reason_code").aggregate([("reason_code", "count")])
    return {r["reason_code"]: int(r["reason_code_count"]) for r in counts.to_pylist()}


def unconfigured_tables(lake_dir: Path, configured_sources: set[str]) -> dict[str, int]:
    """Source tables seen in the raw log that have no `tables:` entry, with their event counts.

    Reads one column through delta-rs (no Spark), so the onboarding sensor stays cheap.
    """
    path = lake.table_path(lake_dir, "raw_change_events")
    if not lake.exists(path):
        return {}
    ids = lake.open_table(path).to_pyarrow_table(columns=["table_id"])
    counts = ids.group_by("table_id").aggregate([("table_id", "count")]).to_pylist()
    return {r["table_id"]: int(r["table_id_count"]) for r in counts if r["table_id"] not in configured_sources}
