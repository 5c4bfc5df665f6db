"""`outbox:` in cdc.yaml: services' outbox events, from the outbox table's change events and/or the topics
Debezium's Outbox Event Router writes, landed as one event table per aggregate type (`stages/outbox/`).

Debezium's column names are the defaults (`id`, `aggregatetype`, `aggregateid`, `type`, `payload`), each
overridable, because most outbox tables follow Debezium's documented layout and the ones that do not differ
in a name or two. Checked when the config loads, like every other section: a typo fails with the entry's
name before any Spark starts. `config.PlatformConfig` holds the result as its `outbox` (None: no outbox).

```yaml
outbox:
  table: public.outbox              # the outbox table's change events (its source table id), and/or
  topics: [outbox.event.order]      # the Event Router's topics (read with their headers; `source: kafka`)
  columns: {id: id, aggregate_type: aggregatetype, aggregate_id: aggregateid, type: type, payload: payload,
            timestamp: null, additional: []}
  router: {id_header: id, type_header: eventType, aggregate_type_header: null}
  payload_schema: {order: "order_id bigint, total decimal(12,2)"}   # optional: payload fields as columns
  expectations: {order_created: [public.orders]}                    # the consistency check
```
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdc_platform.config_source import KafkaSourceConfig
from cdc_platform.errors import ConfigError

_KEYS = {"table", "topics", "columns", "router", "payload_schema", "expectations"}
_COLUMN_KEYS = {"id", "aggregate_type", "aggregate_id", "type", "payload", "timestamp", "additional"}
_ROUTER_KEYS = {"id_header", "type_header", "aggregate_type_header"}
_SOURCE_PART_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_$\-]{0,127}$")
_COLUMN_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,127}$")
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._\-]{1,249}$")
_HEADER_RE = re.compile(r"^[^\s]{1,255}$")
OPS = ("c", "u", "d", "r", "t")
#: The table id a routed record of topic T lands under in the raw log: never a real source's (`__` prefix).
ROUTED_PREFIX = "__outbox."


@dataclass(frozen=True)
class OutboxColumns:
    """The outbox table's column names (Debezium's by default); on routed records the same names are the
    fields of the event the ingest builds from the record (`sources/outbox_routed.py`)."""

    id: str = "id"
    aggregate_type: str = "aggregatetype"
    aggregate_id: str = "aggregateid"
    type: str = "type"
    payload: str = "payload"
    timestamp: str | None = None  # optional: a column holding the event's own time
    additional: tuple[str, ...] = ()  # extra columns kept as string columns of the event tables


@dataclass(frozen=True)
class RouterHeaders:
    """Where a routed record carries what is not its key or value: the Event Router puts the event id in
    the header `id`; the event type and other columns go where `table.fields.additional.placement` says
    (`type:header:eventType` in Debezium's examples). The aggregate type is the topic's last `.` part (the
    router's `outbox.event.<aggregatetype>`) unless a header carries it."""

    id_header: str = "id"
    type_header: str = "eventType"
    aggregate_type_header: str | None = None


@dataclass(frozen=True)
class OutboxConfig:
    table: str | None = None  # source table id of the outbox table
    topics: tuple[str, ...] = ()  # Event Router topics
    columns: OutboxColumns = field(default_factory=OutboxColumns)
    router: RouterHeaders = field(default_factory=RouterHeaders)
    #: Per aggregate type (as written, before the table name is made safe): a Spark DDL schema of its payload.
    payload_schema: tuple[tuple[str, str], ...] = ()
    #: Per event type: the source tables (and ops, empty: any) a transaction holding such an event must change.
    expectations: tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = ()

    @property
    def routed_table_ids(self) -> tuple[str, ...]:
        return tuple(ROUTED_PREFIX + t for t in self.topics)

    @property
    def source_table_ids(self) -> tuple[str, ...]:
        """Every raw-log table id whose events are outbox events (the table's and the routed topics')."""
        return ((self.table,) if self.table else ()) + self.routed_table_ids

    def schema_for(self, aggregate_type: str) -> str | None:
        return dict(self.payload_schema).get(aggregate_type)


def parse_outbox(raw: Any, where: str) -> OutboxConfig | None:
    """`outbox:` checked entry by entry; None when the section is absent."""
    if raw is None:
        return None
    entry = f"{where}: outbox"
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{entry} must be a mapping such as `outbox: {{table: public.outbox}}`, got {raw!r}")
    _no_unknown(raw, _KEYS, entry)
    table = raw.get("table")
    if table is not None:
        parts = str(table).split(".") if isinstance(table, str) else []
        if len(parts) != 2 or not all(_SOURCE_PART_RE.match(p) for p in parts):
            raise ConfigError(f"{entry}.table must be '<db-or-schema>.<table>' as the connector names it (e.g. public.outbox), got {table!r}")
    topics = raw.get("topics") or []
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, list) or not all(isinstance(t, str) and _TOPIC_RE.match(t) for t in topics):
        raise ConfigError(f"{entry}.topics must be a list of Kafka topic names (letters, digits, . _ -), got {topics!r}")
    if len(set(topics)) != len(topics):
        raise ConfigError(f"{entry}.topics names a topic twice")
    if table is None and not topics:
        raise ConfigError(f"{entry}: name the outbox table's change events (`table: public.outbox`) or the Event Router's topics "
                          "(`topics: [outbox.event.order]`), or both")
    return OutboxConfig(
        table=table, topics=tuple(topics), columns=_columns(raw.get("columns"), f"{entry}.columns"),
        router=_router(raw.get("router"), f"{entry}.router"), payload_schema=_payload_schema(raw.get("payload_schema"), f"{entry}.payload_schema"),
        expectations=_expectations(raw.get("expectations"), f"{entry}.expectations"),
    )


def check_outbox_source(outbox: OutboxConfig | None, kafka: KafkaSourceConfig | None, where: str) -> None:
    """Routed topics are Kafka records with headers: they need `source: kafka` in the JSON converter's format,
    subscribed to (named in `topics:` or matched by `subscribe_pattern`)."""
    if outbox is None or not outbox.topics:
        return
    kafka_format = None if kafka is None else kafka.format
    if kafka is None:
        raise ConfigError(f"{where}: outbox.topics names Event Router topics, which only a Kafka source reads; set `source: {{kind: kafka, ...}}` "
                          "or name the outbox table's change events with `outbox.table`")
    if kafka_format != "json":
        raise ConfigError(f"{where}: outbox.topics are read as the JSON converter writes them; `format: {kafka_format}` is not supported for "
                          "routed topics yet: capture the outbox table itself (`outbox.table`) instead")
    if kafka.subscribe_pattern is not None:
        unread = [t for t in outbox.topics if not re.fullmatch(kafka.subscribe_pattern, t)]
    else:
        unread = [t for t in outbox.topics if t not in kafka.topics]
    if unread:
        raise ConfigError(f"{where}: outbox.topics {', '.join(unread)} are not read by the Kafka source; add them to `source.topics` "
                          "or widen `source.subscribe_pattern`")


def _no_unknown(raw: Mapping[str, Any], allowed: set[str], entry: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise ConfigError(f"{entry}: unknown key(s) {', '.join(map(str, unknown))}; allowed: {', '.join(sorted(allowed))}")


def _column(value: Any, entry: str) -> str:
    if not isinstance(value, str) or not _COLUMN_RE.match(value):
        raise ConfigError(f"{entry} must be a column name (letters, digits, _ and $, not starting with a digit), got {value!r}")
    return value


def _columns(raw: Any, entry: str) -> OutboxColumns:
    if raw is None:
        return OutboxColumns()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{entry} must be a mapping of Debezium's names to yours, e.g. `{{aggregate_id: order_id}}`, got {raw!r}")
    _no_unknown(raw, _COLUMN_KEYS, entry)
    defaults = OutboxColumns()
    named = {k: _column(raw.get(k, getattr(defaults, k)), f"{entry}.{k}") for k in ("id", "aggregate_type", "aggregate_id", "type", "payload")}
    timestamp = raw.get("timestamp")
    if timestamp is not None:
        timestamp = _column(timestamp, f"{entry}.timestamp")
    additional = raw.get("additional") or []
    if isinstance(additional, str):
        additional = [additional]
    if not isinstance(additional, list):
        raise ConfigError(f"{entry}.additional must be a list of column names, got {additional!r}")
    extra = tuple(_column(c, f"{entry}.additional") for c in additional)
    used = [*named.values(), *([timestamp] if timestamp else []), *extra]
    if len({c.lower() for c in used}) != len(used):
        raise ConfigError(f"{entry}: a column is named twice ({', '.join(used)}); each field needs its own column")
    return OutboxColumns(**named, timestamp=timestamp, additional=extra)


def _router(raw: Any, entry: str) -> RouterHeaders:
    if raw is None:
        return RouterHeaders()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{entry} must be a mapping such as `{{type_header: eventType}}`, got {raw!r}")
    _no_unknown(raw, _ROUTER_KEYS, entry)
    defaults = RouterHeaders()
    values: dict[str, Any] = {}
    for key in _ROUTER_KEYS:
        value = raw.get(key, getattr(defaults, key))
        if value is None and key == "aggregate_type_header":
            values[key] = None
            continue
        if not isinstance(value, str) or not _HEADER_RE.match(value):
            raise ConfigError(f"{entry}.{key} must be a Kafka header name (no spaces), got {value!r}")
        values[key] = value
    return RouterHeaders(**values)


def _payload_schema(raw: Any, entry: str) -> tuple[tuple[str, str], ...]:
    """Per aggregate type a Spark DDL schema (`"order_id bigint, total decimal(12,2)"`). Parsed by Spark when the
    stage starts (`stages.outbox.events.payload_struct`), which names a bad type; here only its shape."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str) and v.strip() for k, v in raw.items()):
        raise ConfigError(f"{entry} must map aggregate types to Spark DDL schemas, e.g. `{{order: \"order_id bigint, total double\"}}`, got {raw!r}")
    return tuple(sorted((k, v.strip()) for k, v in raw.items()))


def _expectations(raw: Any, entry: str) -> tuple[tuple[str, tuple[tuple[str, tuple[str, ...]], ...]], ...]:
    """`{event type: [table ids]}` (any change of each) or `{event type: {table id: [ops]}}`."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{entry} must map event types to the source tables their transaction changes, e.g. "
                          f"`{{order_created: [public.orders]}}`, got {raw!r}")
    out = []
    for event_type, tables in raw.items():
        where = f"{entry}.{event_type}"
        if not isinstance(event_type, str) or not event_type:
            raise ConfigError(f"{entry}: event types must be non-empty strings, got {event_type!r}")
        if isinstance(tables, list):
            tables = {t: [] for t in tables} if all(isinstance(t, str) for t in tables) else None
        if not isinstance(tables, Mapping) or not tables:
            raise ConfigError(f"{where} must be a non-empty list of source table ids or a mapping of table id to ops, got {tables!r}")
        required = []
        for table_id, ops in tables.items():
            parts = str(table_id).split(".")
            if len(parts) != 2 or not all(_SOURCE_PART_RE.match(p) for p in parts):
                raise ConfigError(f"{where}: {table_id!r} is not a source table id '<db-or-schema>.<table>'")
            ops = [] if ops is None else ([ops] if isinstance(ops, str) else ops)
            if not isinstance(ops, list) or not all(o in OPS for o in ops):
                raise ConfigError(f"{where}.{table_id} must list ops among {', '.join(OPS)} (empty: any change), got {ops!r}")
            required.append((str(table_id), tuple(sorted(set(ops)))))
        out.append((event_type, tuple(sorted(required))))
    return tuple(sorted(out))
