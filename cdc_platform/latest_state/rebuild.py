"""`cdc rebuild --table NAME`: a table and its history rebuilt from the raw log, the newest type winning.

It replays the stage's typing and folding over the table's whole raw log and replaces both tables in
one overwrite each, so it sits above the stage (its dead-letter rows) and compaction (how a truncate
tombstones older rows); nothing in the package imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform import lake, lake_spark, schemas, spark_jobs, unavailable
from cdc_platform.config import PlatformConfig
from cdc_platform.errors import LakeError
from cdc_platform.latest_state.apply import _dead_rows
from cdc_platform.latest_state.layout import BASE, LAYER
from cdc_platform.latest_state.rows import Events, build_rows, change_rows, fill_keys, last_per_key, type_rows
from cdc_platform.latest_state.writing import accept_names, ensure_tables
from cdc_platform.parse_spark import with_lines
from cdc_platform.stage import RAW, dead_letter_rows


def _key_filter(key: Sequence[str], *, null: bool) -> pc.Expression:
    expr: pc.Expression | None = None
    for k in key:
        part = pc.field(k).is_null() if null else pc.field(k).is_valid()
        expr = part if expr is None else (expr & part)
    assert expr is not None
    return expr


def _newest(rows: pa.Table) -> pa.Table:
    """The one row with the highest `_position`."""
    return rows.slice(pc.index(rows.column("_position"), pc.max(rows.column("_position"))).as_py(), 1)


def _tombstone_below(rows: pa.Table, cut: Mapping[str, Any], key: Sequence[str], src_cols: Mapping[str, pa.DataType]) -> pa.Table:
    """Rows below a truncate become the truncate's tombstones: key kept, values gone, its metadata
    (the rule `compaction._tombstone_below` applies in Spark, here on the rebuild's Arrow rows)."""
    below = pc.less(rows.column("_position"), cut["_position"])
    if not pc.any(below).as_py():
        return rows
    out = rows
    for col in src_cols:
        if col in key:
            continue
        i = out.schema.get_field_index(col)
        out = out.set_column(i, col, pc.if_else(below, pa.scalar(None, out.schema.field(col).type), out.column(col)))
    replace = {"_op": "t", "_deleted": True, "_position": cut["_position"], "_source_ts": cut["_source_ts"],
               "_transaction_id": cut["_transaction_id"], "_ingested_at": cut["_ingested_at"], "_event_id": cut["_event_id"]}
    for col, value in replace.items():
        i = out.schema.get_field_index(col)
        typ = out.schema.field(col).type
        out = out.set_column(i, col, pc.if_else(below, pa.scalar(value, typ), out.column(col)))
    return out


@dataclass
class RebuildReport:
    events: int = 0
    rows: int = 0
    history_rows: int = 0
    dead_letters: int = 0
    seconds: float = 0.0


def rebuild_table(config: PlatformConfig, name: str, progress: Callable[[str], None] | None = None) -> RebuildReport:
    """Rebuild `<name>` (and its history) from the raw log, letting the newest type of each column win.

    Stop the stream first: the rebuild replaces the table in one commit, and a batch appended meanwhile
    would be lost from it (it stays in the raw log, so a second rebuild recovers it).
    """
    lake_spark.session()  # started first, so that its jobs carry the label
    with spark_jobs.labelled("rebuild", f"cdc rebuild: {name}"):
        return _rebuild(config, name, progress)


def _rebuild(config: PlatformConfig, name: str, progress: Callable[[str], None] | None) -> RebuildReport:
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    table = config.table(name)
    raw_path = lake.table_path(config.lake, RAW)
    spark = lake_spark.session()
    if not lake_spark.is_table(spark, raw_path):
        raise LakeError(f"{config.lake} has no raw_change_events; run `cdc run --config ...` before `cdc rebuild`")
    # a lake of an earlier version gains new columns
    lake_spark.ensure_table(spark, raw_path, lake_spark.spark_schema(schemas.RAW_CHANGE_EVENTS), schemas.RAW_PARTITION_BY)
    from pyspark.sql import functions as F

    frame = lake_spark.read(spark, raw_path).where(F.col("table_id") == table.source)
    # Without the original lines (the widest column: the whole envelope again): the fold never reads them, and
    # the few events it dead-letters get theirs back below (`with_lines`), as the stream's stage does.
    raw = schemas.conform(frame.select(*[c for c in schemas.RAW_CHANGE_EVENTS.names if c != "line"]).toArrow(), schemas.RAW_CHANGE_EVENTS)
    # First-arrival order (the raw log keeps each event's first copy), so ties at one position fold as the stream did.
    raw = raw.sort_by([("ingested_at", "ascending"), ("kafka_topic", "ascending"), ("kafka_partition", "ascending"), ("kafka_offset", "ascending")])
    events = Events(fill_keys(raw, table.key))  # events that landed before the table was configured have no key yet
    say(f"rebuilding {name} from {len(events):,} raw events of {table.source} ...")
    rows, bad = change_rows(events, table.key)
    typed, _, _ = unavailable.resolve_batch(rows, events, lambda: type_rows(rows, events, {}, table, coerce=True), table.key, None)
    for e, code, reason in bad:
        typed.dead.setdefault(e, (code, reason))
    live = [i for i, r in enumerate(rows) if r.event not in typed.dead]
    winners = [live[i] for i in last_per_key([rows[i] for i in live], events)]
    markers = [i for i in live if rows[i].key is None]
    report = RebuildReport(events=len(events), dead_letters=len(typed.dead))

    ensure_tables(spark, config.lake, table)
    path = lake.table_path(config.lake, name)
    state = build_rows(typed, events, sorted(winners + markers), table.key, seq=0)
    state = state.set_column(state.schema.get_field_index(LAYER), LAYER, pa.array([BASE] * state.num_rows, pa.string()))
    if markers and all(k in typed.columns for k in table.key):
        newest = _newest(state.filter(_key_filter(table.key, null=True)))
        keyed = state.filter(_key_filter(table.key, null=False))
        state = pa.concat_tables([_tombstone_below(keyed, newest.to_pylist()[0], table.key, typed.columns), newest])
    _overwrite(spark, path, state, [LAYER], what=f"rebuild {name}")
    report.rows = state.num_rows
    if table.history:
        hpath = lake.table_path(config.lake, table.history_name)
        hist = build_rows(typed, events, live, table.key, seq=0, history=True)
        _overwrite(spark, hpath, hist, None, what=f"rebuild {table.history_name}")
        report.history_rows = hist.num_rows
    if typed.dead:
        dead = with_lines(dead_letter_rows(_dead_rows(events, typed.dead), stage="rebuild", batch_id=None), frame)
        dl = lake.table_path(config.lake, "dead_letter")
        lake_spark.ensure_table(spark, dl, lake_spark.spark_schema(schemas.DEAD_LETTER))
        lake_spark.from_arrow(spark, dead, schemas.DEAD_LETTER).write.format("delta").mode("append").save(lake_spark.location(dl))
    report.seconds = time.perf_counter() - t0
    say(f"rebuilt {name}: {report.rows:,} rows (tombstones included), {report.history_rows:,} history rows, "
        f"{report.dead_letters:,} events dead-lettered, {report.seconds:.1f} s")
    return report


def _overwrite(spark: Any, path: Any, rows: pa.Table, partition_by: list[str] | None, *, what: str) -> None:
    """Replace a table's rows and schema with `rows` in one delta-spark commit."""
    accept_names(spark, path, rows.schema)
    frame = lake_spark.from_arrow(spark, rows, rows.schema)

    def attempt() -> None:
        writer = frame.write.format("delta").mode("overwrite").option("overwriteSchema", "true").option("userMetadata", "cdc_operation=rebuild")
        if partition_by:
            writer = writer.partitionBy(*partition_by)
        writer.save(lake_spark.location(path))

    lake_spark.with_retries(attempt, what=what)
