"""What real Debezium connectors emit besides row changes, and what the platform does with each.

Why a module of its own: these records share the topics (a subscribe pattern such as `pg\\..*` or
`mdb.*` easily covers them) and the JSON converter with change events, but they are not changes to a
table. Before, each of them landed in `dead_letter`, which buried real dead letters under noise and made a
transaction that carried a logical-decoding message look incomplete. The decisions, per Debezium's
documentation and what Debezium 3.5 was seen to emit on the test bed:

* **Heartbeats** (`__debezium-heartbeat.<prefix>`, value `{"ts_ms": ...}`, schema
  `io.debezium.connector.common.Heartbeat`): a liveness signal that moves the connector's offsets while
  captured tables are idle. Nothing to store; counted per batch (`pipeline_metrics.stage_figures`
  `ingest.heartbeats`), and its `ts_ms` (when the connector sent it) recorded as the batch's
  `newest_heartbeat_ts`: the freshness checks read it, so an idle source whose connector keeps
  sending heartbeats is not judged stale for lack of changes.
* **Schema-change records** (MySQL/MariaDB `<prefix>` topic, and the internal schema-history topic:
  `ddl`, `tableChanges`, `databaseName`): the platform takes every table's schema from the row images
  (and the Connect schema beside them), so the DDL text adds nothing it acts on. Counted
  (`ingest.schema_changes`) and ignored; never dead letters.
* **Logical-decoding messages** (PostgreSQL `pg_logical_emit_message`, topic `<prefix>.message`,
  `op` m, with a `message` block `{prefix, content}`): kept in the raw log (they are part of the source's
  log and may carry meaning for a consumer) under the table id `MESSAGES`, with their LSN as position
  and their transaction block, but never applied to a latest-state table. A transactional message is
  counted by Debezium in its transaction's END marker under a data-collection name that is a Java
  object's `toString` (`...LogicalDecodingMessageMonitor$LogicalDecodingMessageId@1a2b3c`, a different
  hash on every connector run); `marker_collection` maps that name to `MESSAGES`, so the transaction's
  per-table counts match the events that landed and the transaction is complete.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The table id of logical-decoding messages in the raw log (no source table carries such a name:
#: table ids are `<schema-or-db>.<table>`).
MESSAGES = "__debezium_messages"

HEARTBEAT = "heartbeat"
SCHEMA_CHANGE = "schema_change"
#: The kinds of control record, each counted in the batch's metrics as `ingest.<kind>s`.
KINDS = (HEARTBEAT, SCHEMA_CHANGE)

_HEARTBEAT_SCHEMA = "io.debezium.connector.common.Heartbeat"
_MESSAGE_COLLECTION = "io.debezium.connector.postgresql.LogicalDecodingMessageMonitor$LogicalDecodingMessageId"
_SCHEMA_CHANGE_FIELDS = frozenset({"ddl", "tableChanges"})


def control_kind(payload: Mapping[str, Any], schema: Any) -> str | None:
    """`HEARTBEAT` or `SCHEMA_CHANGE` when the (unwrapped) record is one, else None.

    A heartbeat is recognised by its schema name when the converter wrote schemas, else by its shape:
    an object whose only field is `ts_ms` (no change event, marker or schema change is that small). A
    schema-change record has `ddl` or `tableChanges` and no `op` (a change event never has those).
    """
    if isinstance(schema, Mapping) and schema.get("name") == _HEARTBEAT_SCHEMA:
        return HEARTBEAT
    if len(payload) == 1 and "ts_ms" in payload:
        return HEARTBEAT
    if "op" not in payload and not _SCHEMA_CHANGE_FIELDS.isdisjoint(payload):
        return SCHEMA_CHANGE
    return None


def is_message(env: Mapping[str, Any]) -> bool:
    """A logical-decoding message: `op` m with Debezium's `message` block."""
    return env.get("op") == "m" and isinstance(env.get("message"), Mapping)


def marker_collection(name: str) -> str:
    """The data-collection name an END marker gives, with logical-decoding messages named `MESSAGES`."""
    return MESSAGES if name.startswith(_MESSAGE_COLLECTION) else name


def merge_collections(collections: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """`marker_collection` over an END marker's counts, summing entries that now share a name."""
    out: dict[str, int] = {}
    for name, count in collections:
        key = marker_collection(name)
        out[key] = out.get(key, 0) + count
    return list(out.items())
