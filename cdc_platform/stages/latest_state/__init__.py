"""Latest state: every configured source table as it is now, kept merge-on-read from the raw change events.

Layout, and why. A MERGE of each batch into the table is copy-on-write: it rewrites every file holding
one of its keys, so with keys spread over the table a 10k-change batch rewrites (nearly) the whole table
and the cost grows with the table. Instead each table `<name>` is one Delta table partitioned by `_layer`:

* `_layer=delta`: every micro-batch *appends* its changes, folded to the last change per key (by source
  position, then `transaction.total_order`, then arrival). An append costs the batch, not the table.
* `_layer=base`: one row per key (live rows and tombstones) plus truncate markers, written by compaction:
  a delta-spark MERGE of the folded delta layer into the base (`_position` decides), then a DELETE of the
  folded delta rows. Compaction runs from `cdc maintain`, and from the stream when the delta layer grows
  past `max(COMPACT_MIN_CHANGES, COMPACT_RATIO x base rows)`, so its amortised cost per change is constant
  and the delta layer a view has to fold stays small.

Where it runs: the executors type and fold each table's events (`staging`, one group per table); the
driver commits with delta-spark (`apply`). The SQL view `<name>` (see `views.latest_state_sql`) folds base
and delta per key; the physical table is registered for SQL as `<name>__stored`; `<name>__full_view` is
the canonical current state.

Ordering is by source position, never `ts_ms`: the higher position wins; two distinct events at an equal
position are ordered by arrival, an identical redelivery changes nothing (see `ordering`). Debezium's
unavailable-value placeholder (PostgreSQL TOAST) never lands: see `unavailable`. Deletes
leave tombstones (`_deleted`), so a stale change can never resurrect a row until maintenance purges
tombstones older than the table's `tombstone_retention`. A truncate is a marker row (key columns null,
`_op` t) that makes every row with a lower position a tombstone. An update whose before key differs from
its after key tombstones the old key at the same position.

Types: with the JSON converter's schema wrapper the Connect schema gives exact types (see
`connect_type`); without it JSON values are inferred (integer -> bigint, other numbers -> double, string,
boolean, objects and arrays -> JSON text). An inferred type only says "an integer" or "a number", so
it lands in a narrower declared column when the values fit (a topic that mixes wrapped and plain lines
keeps the exact types). New columns are added; numeric widening (int8 < int16 < int32 < int64 < double,
float < double, decimals to a wider decimal) rewrites the table once with the wider type; any other
type change dead-letters the event (`incompatible_type`), and `cdc rebuild --table NAME` rebuilds the
table from the raw log, letting the newest type win.

History (`history: true`): `<name>_history` receives every applied change, appended; the SQL view of the
same name derives validity (`_valid_from/_valid_to` position and time) and `_is_current` from the order
of positions, so late events slot into the middle of a history without rewriting it.

Modules, each importing only the ones before it: `layout` (the `_layer` partition and the metadata
columns), `connect_types` (Connect/Debezium and inferred JSON types), `rows` (change rows, typing a batch,
building Arrow), `writing` (creating and widening the tables, stored schemas and values), `compaction`
(fold the delta layer, purge tombstones), `staging` (the executors' part of a batch), `apply` (the stage),
`rebuild` (`cdc rebuild`). This package re-exports what the rest of the
platform uses; its modules import each other directly, never through it.
"""

from __future__ import annotations

from cdc_platform.stages.latest_state.apply import COMPACT_MIN_CHANGES, COMPACT_RATIO, LatestStateStage, apply_table
from cdc_platform.stages.latest_state.compaction import compact, fold_latest, purge_tombstones
from cdc_platform.stages.latest_state.connect_types import BadValue, connect_type, infer_type, join_types, type_name
from cdc_platform.stages.latest_state.layout import BASE, DELTA, HISTORY_META, LAYER, META_FIELDS, STAGE
from cdc_platform.stages.latest_state.rebuild import rebuild_table
from cdc_platform.stages.latest_state.rows import Events, build_rows, change_rows, source_columns, type_rows
from cdc_platform.stages.latest_state.writing import ensure_tables

__all__ = [
    "BASE",
    "BadValue",
    "COMPACT_MIN_CHANGES",
    "COMPACT_RATIO",
    "DELTA",
    "Events",
    "HISTORY_META",
    "LAYER",
    "LatestStateStage",
    "META_FIELDS",
    "STAGE",
    "apply_table",
    "build_rows",
    "change_rows",
    "compact",
    "connect_type",
    "ensure_tables",
    "fold_latest",
    "infer_type",
    "join_types",
    "purge_tombstones",
    "rebuild_table",
    "source_columns",
    "type_name",
    "type_rows",
]
