"""`cdc rebuild --table NAME`: a table and its history rebuilt from the raw log, the newest type winning.

It replays the stage's typing and folding over the table's whole raw log and replaces both tables in
one overwrite each, so it sits above the stage (its dead-letter rows) and compaction (how a truncate
tombstones older rows); nothing in the package imports it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from cdc_platform import lake, schemas, unavailable
from cdc_platform.config import PlatformConfig
from cdc_platform.errors import LakeError
from cdc_platform.latest_state.apply import _dead_rows
from cdc_platform.latest_state.compaction import _key_filter, _newest, _tombstone_below
from cdc_platform.latest_state.layout import BASE, LAYER
from cdc_platform.latest_state.rows import Events, build_rows, change_rows, fill_keys, last_per_key, type_rows
from cdc_platform.latest_state.writing import ensure_tables
from cdc_platform.stage import RAW, dead_letter_rows

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
    say = progress or (lambda _m: None)
    t0 = time.perf_counter()
    table = config.table(name)
    raw_path = lake.table_path(config.lake, RAW)
    if not lake.exists(raw_path):
        raise LakeError(f"{config.lake} has no raw_change_events; run `cdc run --config ...` before `cdc rebuild`")
    lake.ensure_table(raw_path, schemas.RAW_CHANGE_EVENTS, schemas.RAW_PARTITION_BY)  # a lake of an earlier version gains new columns
    raw = lake.scan(lake.open_table(raw_path), [f.name for f in schemas.RAW_CHANGE_EVENTS], pc.field("table_id") == table.source)
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

    ensure_tables(config.lake, table)
    path = lake.table_path(config.lake, name)
    state = build_rows(typed, events, sorted(winners + markers), table.key, seq=0)
    state = state.set_column(state.schema.get_field_index(LAYER), LAYER, pa.array([BASE] * state.num_rows, pa.string()))
    if markers and all(k in typed.columns for k in table.key):
        newest = _newest(state.filter(_key_filter(table.key, null=True)))
        keyed = state.filter(_key_filter(table.key, null=False))
        state = pa.concat_tables([_tombstone_below(keyed, newest.to_pylist()[0], table.key, typed.columns), newest])
    lake.with_retries(
        lambda: write_deltalake(lake.open_table(path), state, mode="overwrite", schema_mode="overwrite", partition_by=[LAYER],
                                commit_properties=lake.commit_props(None, None, cdc_operation="rebuild")),
        what=f"rebuild {name}",
    )
    report.rows = state.num_rows
    if table.history:
        hpath = lake.table_path(config.lake, table.history_name)
        hist = build_rows(typed, events, live, table.key, seq=0, history=True)
        lake.with_retries(
            lambda: write_deltalake(lake.open_table(hpath), hist, mode="overwrite", schema_mode="overwrite",
                                    commit_properties=lake.commit_props(None, None, cdc_operation="rebuild")),
            what=f"rebuild {table.history_name}",
        )
        report.history_rows = hist.num_rows
    if typed.dead:
        dead = dead_letter_rows(_dead_rows(events, typed.dead), stage="rebuild", batch_id=None)
        dl = lake.ensure_table(lake.table_path(config.lake, "dead_letter"), schemas.DEAD_LETTER)
        lake.with_retries(lambda: write_deltalake(dl, dead, mode="append"), what="append rebuild dead letters")
    report.seconds = time.perf_counter() - t0
    say(f"rebuilt {name}: {report.rows:,} rows (tombstones included), {report.history_rows:,} history rows, "
        f"{report.dead_letters:,} events dead-lettered, {report.seconds:.1f} s")
    return report
