"""The physical layout every part of the latest-state package agrees on.

The stage's name, the `_layer` partition and its two values, the metadata columns of `<name>` and
`<name>_history`, and the names a source column may not take. They live apart so that typing, writing,
the stage, compaction and rebuild share one definition without importing one another (and the SQL
views read the same names through the package).
"""

from __future__ import annotations

import pyarrow as pa

from cdc_platform.lake import schemas

STAGE = "latest_state"
TS = schemas.TS

LAYER = "_layer"
BASE = "base"
DELTA = "delta"

#: Metadata columns of the latest-state table, after the source columns.
META_FIELDS: tuple[pa.Field, ...] = (
    pa.field("_op", pa.string()),
    pa.field("_deleted", pa.bool_()),
    pa.field("_position", pa.string()),
    pa.field("_source_ts", TS),
    pa.field("_transaction_id", pa.string()),
    pa.field("_ingested_at", TS),
    pa.field("_event_id", pa.string()),
    pa.field("_seq", pa.int64()),  # order of application: the Delta version that appended the row
    pa.field(LAYER, pa.string()),
)
#: Extra ordering columns of `<name>_history` (which has no `_layer`).
HISTORY_EXTRA: tuple[pa.Field, ...] = (pa.field("_tx_order", pa.int64()), pa.field("_batch_order", pa.int64()))
HISTORY_META: tuple[pa.Field, ...] = tuple(f for f in META_FIELDS if f.name != LAYER) + HISTORY_EXTRA
RESERVED = frozenset(f.name for f in META_FIELDS + HISTORY_EXTRA)
