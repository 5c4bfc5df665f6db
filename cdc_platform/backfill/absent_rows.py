"""Rows the lake holds and the source no longer has at all: removed only when asked, through the backfill rules.

A re-read cannot take a row away: the connector finds nothing for a key the source does not have and emits
nothing. Such a key (coverage's `extra_in_lake`, still after the recheck) lost its delete event somewhere.
It leaves the lake only through the source's own delete, or through this path (`cdc repair --remove-absent`,
`repair.remove_absent`), which writes one delete event per key in Debezium's shape and loads it with
`backfill.load_lines`, so every snapshot rule holds:

* the delete's source block is the one of the event the lake's row came from, its position moved one step
  past that row's (PostgreSQL: the LSN plus one; MariaDB/MySQL: the next `row` of the same binlog event), so it
  replaces the row while any change the source makes to the key later, whose position is at least the end of
  a commit record past the row's, still wins over it; a delete placed at the time of the source's read could
  hide a row inserted again by a transaction that was in flight during that read. Other connectors' positions
  are not stepped: their keys are reported, not removed;
* DBLog's rule skips the delete when the raw log holds a newer change of the key (the latest state is behind
  its own log: `cdc rebuild` is the fix there), so it never removes what the log says is newer;
* it lands in the raw log as an ordinary event (its `source` carries `cdc_repair`, the repair's id), so a
  rebuild from the raw log removes the row again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cdc_platform import backfill, lake
from cdc_platform.checks.source_coverage import KEY, canonical, keyed_lake, key_text
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.lake import lake_spark
from cdc_platform.parse.json_codec import canonical_json
from cdc_platform.parse.envelope import loads_json
from cdc_platform.stages.stage import RAW

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class Removal:
    """What the removal of absent rows did: how many were removed, and the keys kept with the reason."""

    removed: int = 0
    kept: list[tuple[str, str]] = field(default_factory=list)  # (key shown, why it stays); samples past the load's rules
    diff: backfill.SnapshotDiff | None = None


def _event_source(line: str) -> dict[str, Any] | None:
    """The `source` block of a raw event's line (plain, or inside the JSON converter's schema wrapper)."""
    try:
        event = loads_json(line)
    except ValueError:
        return None
    if isinstance(event, dict) and "payload" in event and "schema" in event:
        event = event["payload"]
    source = event.get("source") if isinstance(event, dict) else None
    return dict(source) if isinstance(source, dict) else None


def _step_past(source: dict[str, Any], kind: str | None, position: str | None) -> dict[str, Any] | None:
    """`source` with its position fields moved one step past `position` (module docstring); None when it cannot be."""
    if position is None or not position.isdigit():
        return None
    if kind == "pg_lsn":
        moved = {k: v for k, v in source.items() if k not in ("sequence", "lsn")}
        return moved | {"lsn": int(position) + 1}
    if kind == "mysql_binlog" and len(position) == 40 and int(position[30:]) < 10**10 - 1:
        return source | {"row": int(position[30:]) + 1}
    return None


def delete_lines(spark: SparkSession, config: PlatformConfig, table: TableConfig, keys: Sequence[tuple[Any, ...]], repair_id: str,
                 now_ms: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """One Debezium delete line per key live in the lake, at the position of the row it holds; and the keys
    that get none, each with the reason (not live in the lake, its event not in the raw log)."""
    from pyspark.sql import functions as F

    from cdc_platform.views import table_frame

    wanted = {key_text(tuple(canonical(v) for v in values)): values for values in keys}
    shown = {text: canonical_json(dict(zip(table.key, (str(v) for v in values)))) for text, values in wanted.items()}
    if not wanted or not lake.exists(lake.table_path(config.lake, table.name)):
        return [], [(shown[t], "no row of it in the lake") for t in wanted]
    frame = table_frame(spark, config.lake, table.name)
    if any(k not in frame.columns for k in table.key):
        return [], [(shown[t], "no row of it in the lake") for t in wanted]
    rows = (keyed_lake(frame.where(F.col(lake.quote_identifier(table.key[0])).isNotNull())
                       .select(*[lake.quote_identifier(k) for k in table.key], "_event_id", "_deleted"), table)
            .where(F.col(KEY).isin(list(wanted)) & ~F.coalesce(F.col("_deleted"), F.lit(False)))
            .select(KEY, "_event_id").collect())
    found = {r[KEY]: r["_event_id"] for r in rows}
    events, kinds = {}, {}
    if found:
        raw = lake_spark.read(spark, lake.table_path(config.lake, RAW))
        for r in raw.where(F.col("event_id").isin(list(set(found.values())))).select("event_id", "key", "line", "position_kind", "position").collect():
            events[r["event_id"]] = (r["key"], r["line"])
            kinds[r["event_id"]] = (r["position_kind"], r["position"])
    lines, kept = [], []
    for text in wanted:
        if text not in found:
            kept.append((shown[text], "no live row of it in the lake"))
            continue
        key, line = events.get(found[text], (None, None))
        source = _event_source(line) if line else None
        if key is None or source is None:
            kept.append((shown[text], f"the event its row came from ({found[text]}) is not readable in the raw log"))
            continue
        kind, position = kinds.get(found[text], (None, None))
        stepped = _step_past(source, kind, position)
        if stepped is None:
            kept.append((shown[text], f"its position ({kind}) cannot be stepped past; delete it at the source, or rebuild"))
            continue
        source = stepped | {"snapshot": "false", "ts_ms": now_ms, "cdc_repair": repair_id}
        for nested in ("ts_us", "ts_ns"):
            source.pop(nested, None)
        delete = {"before": loads_json(key), "after": None, "op": "d", "source": source, "ts_ms": now_ms, "transaction": None}
        lines.append((canonical_json(delete), f"cdc-repair:{repair_id}"))
    return lines, kept


def remove_absent(spark: SparkSession, config: PlatformConfig, table: TableConfig, keys: Sequence[tuple[Any, ...]], repair_id: str,
                  now_ms: int, *, dry_run: bool = False, progress: Callable[[str], None] | None = None) -> Removal:
    """Tombstone the lake's rows of `keys` (values as coverage reported them) by the backfill rules (module doc)."""
    lines, kept = delete_lines(spark, config, table, keys, repair_id, now_ms)
    out = Removal(kept=kept)
    if not lines:
        return out
    out.diff = backfill.load_lines(config, table.name, lines, dry_run=dry_run, progress=progress)
    for kind in ("skipped_stale", "skipped_deleted"):  # the load names at most its sample of them
        out.kept += [(k, "the raw log holds a newer change of it: the latest state is behind its own log (`cdc rebuild`)")
                     for k in out.diff.samples.get(kind, [])]
    out.removed = out.diff.updated
    return out
