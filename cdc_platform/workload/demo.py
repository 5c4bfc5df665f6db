"""`cdc demo`: what a first-time user sees, so every line of it must be true as printed.

The demo is the platform's first impression, and a new user takes its words literally. So:

* each count is named for what it counts: `open_transactions` is the transaction stage's *state*, which
  holds open transactions and also finished ones it remembers to recognise late events, so its row count
  is not "open transactions"; a latest-state table stores tombstones of deleted rows next to the live ones,
  so "stored rows" and "live rows" are different numbers and both are shown;
* a masked column that shows NULL says why (`views.masked_expression`: hashing needs the salt variable,
  and without it the clean view shows NULL rather than a guessable unsalted hash);
* the "try next" commands run as printed: `cdc` is spelled the way this shell reaches it (`.venv/bin/cdc`
  unless the venv's bin is on PATH), and paths are quoted;
* the time "in all" is measured after the counting, which costs as much as the pipeline itself.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_platform import lake
from cdc_platform.config import PlatformConfig, TableConfig, mask_salt
from cdc_platform.errors import ConfigError
from cdc_platform.workload.generate import CDC_YAML

#: What one row of each platform table is, in words, for the counts the demo prints.
ROW_MEANING = {
    "raw_change_events": "change events (every distinct event once)",
    "transaction_markers": "BEGIN/END transaction markers",
    "dead_letter": "lines that could not be used, each with a reason",
    "pipeline_metrics": "micro-batches",
    "transactions": "complete source transactions",
    "incomplete_transactions": "transactions that timed out incomplete",
    "late_transaction_events": "events or markers that arrived after their transaction finished",
    "consistency_watermark": "sources with a consistency watermark",
}
_GROUPS = (
    ("raw log", ("raw_change_events", "transaction_markers", "dead_letter", "pipeline_metrics")),
    ("transactions", ("transactions", "incomplete_transactions", "late_transaction_events", "open_transactions", "consistency_watermark")),
)
_STATE = "open_transactions"


@dataclass(frozen=True)
class Timing:
    """Seconds per phase of the demo; `total` is wall time from start to the last count."""

    generate: float
    spark: float
    pipeline: float
    counting: float
    total: float


def prepare_dir(out: Path) -> None:
    """Clear a previous demo (or generated sample) in `out`, and refuse anything else.

    The demo starts from scratch each time, so it deletes its directory; a `--dir` pointing at a folder
    of the user's (`--dir .`, `--dir ~`) must never be deleted, hence the check for the demo's own cdc.yaml.
    """
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"{out} exists and is not a directory; choose another --dir")
    config = out / "cdc.yaml"
    ours = config.is_file() and config.read_text(encoding="utf-8", errors="replace") == CDC_YAML
    if any(out.iterdir()) and not ours:
        raise ConfigError(
            f"{out} is not empty and holds no cdc.yaml written by `cdc demo` or `cdc generate`; the demo replaces its "
            "directory, so choose another --dir (or empty this one)"
        )
    shutil.rmtree(out)


def count_lake(spark: Any, config: PlatformConfig, names: Sequence[str]) -> dict[tuple[str, str], int]:
    """(name, what) -> count: a whole table's rows from its Delta log where the log can say (`lake.row_count`,
    no Spark), the rest in one Spark query (a UNION ALL runs as one job instead of one per table).

    For a latest-state table: `live` and `tombstones` from the folded state, `stored` from the Delta
    table itself (both layers); for `open_transactions`, one count per `entry` kind; for any other table,
    `rows`. The consistent views are named, not counted: their first query in the demo's cold process
    (each folds the raw log as of the watermark) doubled the counting, 26.7 s against 14.4 s without them.
    """
    q = _quote
    present = set(names)
    latest = [t for t in config.tables if f"{t.name}__stored" in present]
    latest_names = {t.name for t in latest} | {f"{t.name}__stored" for t in latest}
    latest_names |= {t.history_name for t in latest} | {f"{t.history_name}__stored" for t in latest}
    parts: list[str] = []
    counts: dict[tuple[str, str], int] = {}

    def whole(name: str, what: str, table: str, relation: str) -> None:
        path = lake.table_path(config.lake, table)
        n = lake.row_count(path) if lake.exists(path) else None
        if n is not None:
            counts[(name, what)] = n
        else:
            parts.append(f"SELECT {_lit(name)} AS name, {_lit(what)} AS what, count(*) AS n FROM {q(relation)}")

    for name in names:
        if name == _STATE:
            parts.append(f"SELECT {_lit(name)} AS name, entry AS what, count(*) AS n FROM {q(name)} GROUP BY entry")
        elif name not in latest_names and "__" not in name:
            whole(name, "rows", name, name)
    for t in latest:
        whole(t.name, "stored", t.name, t.name + "__stored")
        parts.append(f"SELECT {_lit(t.name)} AS name, IF(`_deleted`, 'tombstones', 'live') AS what, count(*) AS n "
                     f"FROM {q(t.name)} GROUP BY `_deleted`")
        if t.history and t.history_name in present:
            parts.append(f"SELECT {_lit(t.name)} AS name, 'versions' AS what, count(*) AS n FROM {q(t.history_name)}")
    if parts:
        counts.update({(r["name"], r["what"]): int(r["n"]) for r in spark.sql(" UNION ALL ".join(parts)).collect()})
    return counts


COUNTS_FILE = "demo-counts.json"


def write_counts(path: Path, counts: Mapping[tuple[str, str], int]) -> None:
    """Save the demo's counts (`name/what` -> n) beside its config, for tools that report what landed
    without starting Spark (the Dagster recorder, `dagster_project/record.py`)."""
    import json

    path.write_text(json.dumps({f"{name}/{what}": n for (name, what), n in sorted(counts.items())}, indent=1), encoding="utf-8")


def _quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _lit(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def describe_state(counts: Mapping[tuple[str, str], int], config: PlatformConfig) -> str:
    """`open_transactions` in words: how many are open, how many finished ones are only remembered."""
    by_entry = {what: n for (name, what), n in counts.items() if name == _STATE}
    opened, completed, expired = by_entry.get("open", 0), by_entry.get("completed", 0), by_entry.get("expired", 0)
    bookkeeping = sum(by_entry.values()) - opened - completed - expired
    retention = config.transaction_retention or 5 * config.transaction_timeout
    return (f"open transactions; beside them the stage's state remembers {completed + expired:,} finished ones "
            f"({completed:,} completed, {expired:,} expired) for {retention:g} s to recognise late events, "
            f"and keeps {bookkeeping:,} rows of per-stream event time ({sum(by_entry.values()):,} state rows in all)")


def describe_latest(table: TableConfig, counts: Mapping[tuple[str, str], int]) -> tuple[int, str]:
    """(live rows, the rest in words): live rows are the table; stored rows also hold tombstones."""
    live = counts.get((table.name, "live"), 0)
    tombstones = counts.get((table.name, "tombstones"), 0)
    stored = counts.get((table.name, "stored"), 0)
    superseded = stored - live - tombstones
    words = f"live rows (`{table.name}__full_view`); the Delta table stores {stored:,} rows: these plus {tombstones:,} tombstones of deleted rows"
    if superseded > 0:
        words += f" and {superseded:,} older versions awaiting compaction"
    if (table.name, "versions") in counts:
        words += f"; {counts[(table.name, 'versions')]:,} versions in `{table.history_name}`"
    return live, words


def masking_notes(config: PlatformConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Why each masked column looks as it does in `<name>__clean_view` (see `views.masked_expression`)."""
    notes = []
    for t in config.tables:
        if not t.mask:
            continue
        cols = ", ".join(f"`{c}`" for c in t.mask)
        view = f"{t.name}__clean_view"
        if t.mask_mode == "remove":
            notes.append(f"{view} leaves out {cols} (masked, mask_mode remove).")
        elif mask_salt(t, environ) is None:
            notes.append(
                f"{view} shows {cols} as NULL: the column is masked, and masking hashes it with the salt in ${t.mask_salt_env}, "
                f"which is not set; without a salt the hash would be guessable, so the view shows NULL instead. "
                f"`export {t.mask_salt_env}=<a secret>` and query again to see salted SHA-256 hashes (equal values still join); "
                f"`{t.name}__full_view` has the clear values."
            )
        else:
            notes.append(f"{view} shows {cols} as salted SHA-256 hashes (salt from ${t.mask_salt_env}).")
    return notes


def shell_path(path: Path) -> str:
    """A path as the user can type it here: relative to the working directory when under it, quoted."""
    path = Path(os.path.abspath(path))
    try:
        text = str(path.relative_to(Path.cwd()))
    except ValueError:
        text = str(path)
    return shlex.quote(text)


def cdc_command() -> str:
    """How this shell reaches the running `cdc`: `cdc` when PATH finds this very script, else its path.

    `make setup` installs `cdc` into `.venv/bin`, which is not on PATH unless the venv is activated, so a
    bare `cdc` in printed advice fails with `command not found` for most first-time users.
    """
    script = Path(sys.argv[0]) if Path(sys.argv[0]).name == "cdc" else Path(sys.executable).parent / "cdc"
    if not script.is_file():
        return f"{shlex.quote(sys.executable)} -m cdc_platform"
    found = shutil.which("cdc")
    if found and Path(found).resolve() == script.resolve():
        return "cdc"
    return _as_command(shell_path(script))


def _as_command(text: str) -> str:
    """A relative path without a slash would be looked up on PATH; `./` makes the shell run the file."""
    return text if "/" in text else f"./{text}"


def activate_hint() -> str | None:
    """How to type just `cdc`, when the printed commands need its path."""
    command = cdc_command()
    if command == "cdc" or " -m " in command:
        return None
    activate = Path(os.path.abspath(sys.argv[0] if Path(sys.argv[0]).name == "cdc" else Path(sys.executable).parent / "cdc")).parent / "activate"
    if not activate.is_file():
        return None
    return f"(`cdc` lives in {shell_path(activate.parent)}/; `source {shell_path(activate)}` puts it on PATH for this shell)"


def try_next(config: PlatformConfig, names: Sequence[str]) -> list[str]:
    """Three queries worth running next, as complete shell commands."""
    queries = ["SELECT reason_code, count(*) AS n FROM dead_letter GROUP BY reason_code"]
    if "transactions" in names:
        queries.append("SELECT transaction_id, event_count, events_per_table FROM transactions ORDER BY end_ts DESC LIMIT 5")
    masked = next((t for t in config.tables if t.mask and f"{t.name}__clean_view" in names), None)
    if masked is not None:
        queries.append(f"SELECT * FROM {masked.name}__clean_view ORDER BY {', '.join(masked.key)} LIMIT 5")
    else:
        queries.append("SELECT batch_id, rows_read, duplicates_skipped, lag_seconds FROM pipeline_metrics ORDER BY batch_id")
    return [f"{cdc_command()} sql --lake {shell_path(config.lake)} {shlex.quote(q)}" for q in queries]


def render(config: PlatformConfig, names: Sequence[str], counts: Mapping[tuple[str, str], int], report: Any, timing: Timing) -> str:
    """The demo's report: counts named for what they are, why masked columns are NULL, what to try, the time."""
    from cdc_platform.stages.stage import RAW

    out = [f"\nLanded in {shell_path(config.lake)}:"]
    shown: set[str] = set()
    for title, group in _GROUPS:
        rows = [name for name in group if name in names]
        if not rows:
            continue
        out.append(f"  {title}")
        for name in rows:
            shown.add(name)
            if name == _STATE:
                n, words = counts.get((_STATE, "open"), 0), describe_state(counts, config)
            else:
                n, words = counts.get((name, "rows"), 0), ROW_MEANING.get(name, "rows")
            out.append(f"    {name:<26} {n:>8,}  {words}")
    latest = [t for t in config.tables if (t.name, "stored") in counts]
    if latest:
        consistent = any(f"{t.name}__consistent_view" in names for t in latest)
        out.append("  latest state (in SQL, `NAME` is the folded state with tombstones, `NAME__full_view` the live rows"
                   + (", `NAME__consistent_view` them as of the source's consistency watermark)" if consistent else ")"))
        for t in latest:
            shown.update({t.name, t.history_name})
            live, words = describe_latest(t, counts)
            out.append(f"    {t.name:<26} {live:>8,}  {words}")
    others = [name for (name, what) in counts if what == "rows" and name not in shown]
    for name in sorted(set(others)):
        out.append(f"    {name:<26} {counts[(name, 'rows')]:>8,}  rows")
    landed = report.landed()
    out.append(
        f"\n{report.total('rows_read'):,} lines read, {landed.get(RAW, 0):,} change events, "
        f"{report.total('dead_letters'):,} dead letters, {report.total('duplicates_skipped'):,} duplicates skipped."
    )
    notes = masking_notes(config)
    if notes:
        out.append("")
        out.extend(notes)
    out.append("\nTry next:")
    out.extend(f"  {command}" for command in try_next(config, names))
    hint = activate_hint()
    if hint:
        out.append(f"  {hint}")
    out.append(
        f"\n{timing.total:.1f} s in all: generating {timing.generate:.1f} s, starting Spark {timing.spark:.1f} s, "
        f"the pipeline {timing.pipeline:.1f} s, counting what landed {timing.counting:.1f} s."
    )
    return "\n".join(out)
