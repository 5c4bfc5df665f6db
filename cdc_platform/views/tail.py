"""The raw log's tail in a latest-state view: a table's events the fold has not taken yet, as its rows.

Why: the latest-state fold runs as a query of its own over the raw log (`run/stage_queries.py`), on its own
cadence. A change is committed to the raw log first, so `<name>__full_view` reads the stored state (base and
delta layers) plus the events of its source table that landed after the fold's mark (`stage_progress
.applied_through`: every raw-log row ingested up to then is folded), typed in SQL as the stage types them
(`connect_sql`, the consistent views' conversions). A change is visible once the raw log has it; WePay's
`__full_view` over the raw table, with compaction as the optimisation, is the same idea.

The rows here are shaped as the stored rows (source columns, `STATE_META`, `_seq`), one per event:
an insert, update or snapshot read is the row its `after` image gives; a delete a tombstone of its key; an
update that moved its row to another key also a tombstone of the old key (as `rows.change_rows` makes
it); a truncate a marker (key columns null). `_seq` puts every tail row above every stored row, and
`_tail_order` ranks tail rows by arrival (ingest batch, then transaction order, then place in the batch),
so the view's fold orders them as the stage would. A struct the fold's windows order by, not a number of
a window of its own: that window shuffled the raw log's tail by key once more, and a lookup by key paid
for its stages even with nothing in the tail. For each
column Debezium's unavailable-value placeholder can stand in, the row also carries `known_column(i)`: the
value as a struct, or NULL where the event left it out (TOAST); the view takes the key's newest earlier
known value there, as the stage does (`unavailable`).

What the tail does not do that the fold does: dead-letter an event (a value of the wrong type shows as
NULL here until the fold sets it aside), add a column the stored table lacks yet (shown once folded),
or order two distinct events at one position within one ingest batch by more than their `arrival`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from cdc_platform.config import TableConfig
from cdc_platform.lake import quote_identifier as q
from cdc_platform.lake.lake_spark import sql_string
from cdc_platform.stages.unavailable import placeholder_forms
from cdc_platform.views import connect_sql as CS

#: `_seq` of tail rows: above any stored row's (a Delta version of the latest-state table).
TAIL_SEQ_BASE = 1 << 62
#: The metadata columns of stored rows, in order (the view's `STATE_META` and `_seq`).
META = ("_op", "_deleted", "_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id", "_seq")
#: Tail rows' arrival order, after `_seq` (NULL for stored rows): the raw log's ingest batch, the event's order
#: in its transaction, its place in the batch, its id (the stage's order of a key's events in one batch).
TAIL_ORDER = "_tail_order"
TAIL_ORDER_TYPE = "STRUCT<ingested_at: TIMESTAMP, tx: BIGINT, arrival: BIGINT, event_id: STRING>"
_NULL_DECL = "CAST(NULL AS STRUCT<type: STRING, name: STRING, parameters: MAP<STRING, STRING>>)"


def known_column(i: int) -> str:
    """The name of the struct column that carries placeholder column `i`'s known value (see the module doc)."""
    return f"__known{i}"


def placeholder_columns(columns: Mapping[str, str], key: Sequence[str]) -> list[str]:
    """The columns whose value an event may leave out (Debezium's placeholder), in table order."""
    return [name for name, kind in columns.items() if name not in key and CS.placeholder_possible(kind)]


def timestamp_literal(at: dt.datetime) -> str:
    """A UTC instant as a Spark SQL literal, to the microsecond."""
    utc = at.astimezone(dt.timezone.utc)
    return f"TIMESTAMP '{utc.strftime('%Y-%m-%d %H:%M:%S.%f')}+00:00'"


def tail_sql(table: TableConfig, columns: Mapping[str, str], raw: str, applied_through: dt.datetime | None,
             dead_letter: str | None = None, stage: str = "latest_state") -> str:
    """SQL of `table`'s raw-log events after `applied_through` (all of them when None) as stored rows.

    `columns` maps each source column of the stored table to its Spark type; `raw` is the raw log's
    (quoted) name; `dead_letter`, when given, is the dead-letter table's, whose events of `stage` are
    left out (a stale mark may bring back events the fold already set aside).
    """
    key = list(table.key)
    struct = sql_string(CS.row_struct(columns))
    declared = {name: f"`__decl{i}`" for i, (name, kind) in enumerate(columns.items()) if CS.needs_declaration(kind)}
    decls = "".join(f", {CS.declaration('`__fields`', name)} AS {alias}" for name, alias in declared.items())
    fields = f", from_json(row_schema, {sql_string(CS.ROW_SCHEMA)}).fields AS `__fields`" if declared else ""
    scalars, shaped = placeholder_forms()
    forms = ", ".join(sql_string(f) for f in sorted(scalars | shaped))
    after = f"r.ingested_at > {timestamp_literal(applied_through)}" if applied_through is not None else "true"
    dead = (f"\n      AND r.event_id NOT IN (SELECT event_id FROM {dead_letter} WHERE stage = {sql_string(stage)} AND event_id IS NOT NULL)"
            if dead_letter else "")
    base = f"""SELECT *{decls} FROM (
      SELECT r.*, from_json(CASE WHEN r.op = 'd' THEN r.key ELSE r.after END, {struct}) AS _row,
             from_json(r.before, {struct}) AS _before{fields}
      FROM {raw} r
      WHERE r.table_id = {sql_string(table.source)} AND {after} AND (r.key IS NOT NULL OR r.op = 't') AND r.op <> 'm'{dead}
    )"""

    def decl(name: str) -> str:
        return f"b.{declared[name]}" if name in declared else _NULL_DECL

    def typed(name: str, image: str = "_row", text: str = "b.after") -> str:
        return CS.value_sql(columns[name], f"b.{image}.{q(name)}", decl(name), text, name)

    holes = placeholder_columns(columns, key)
    meta = ("b.op AS `_op`, {deleted} AS `_deleted`, b.position AS `_position`, b.source_ts AS `_source_ts`, "
            "b.transaction_id AS `_transaction_id`, b.ingested_at AS `_ingested_at`, b.event_id AS `_event_id`, "
            f"CAST({TAIL_SEQ_BASE} AS BIGINT) AS `_seq`, named_struct('ingested_at', b.ingested_at, 'tx', b.tx_total_order, "
            f"'arrival', b.arrival, 'event_id', b.event_id) AS {q(TAIL_ORDER)}")

    def known(name: str) -> str:
        kind = columns[name]
        text, old_text = CS.raw_text(kind, f"b._row.{q(name)}"), CS.raw_text(kind, f"b._before.{q(name)}")
        return (f"CASE WHEN b.op = 'd' THEN named_struct('v', CAST(NULL AS {kind})) "
                f"WHEN {text} IS NULL OR {text} NOT IN ({forms}) THEN named_struct('v', {typed(name)}) "
                f"WHEN {old_text} IS NOT NULL AND {old_text} NOT IN ({forms}) THEN named_struct('v', {typed(name, '_before', 'b.before')}) END")

    # The change itself (an upsert, a delete's tombstone, or a truncate's marker).
    values = []
    for name, kind in columns.items():
        if name in key:
            values.append(f"CASE WHEN b.op = 't' THEN CAST(NULL AS {kind}) ELSE {typed(name)} END AS {q(name)}")
        elif name in holes:
            values.append(f"CASE WHEN b.op IN ('d', 't') THEN CAST(NULL AS {kind}) ELSE {known(name)}.v END AS {q(name)}")
        else:
            values.append(f"CASE WHEN b.op IN ('d', 't') THEN CAST(NULL AS {kind}) ELSE {typed(name)} END AS {q(name)}")
    knowns = [f"CASE WHEN b.op = 't' THEN CAST(NULL AS STRUCT<v: {columns[n]}>) ELSE {known(n)} END AS {known_column(i)}"
              for i, n in enumerate(holes)]
    change_meta = meta.format(deleted="b.op IN ('d', 't')")
    change = f"SELECT {', '.join([*values, change_meta, *knowns])}\n    FROM ({base}) b"
    if not key:
        return change
    # An update whose `before` holds another key moved its row: the old key gets a tombstone at the same position.
    old_keys = [f"{typed(k, '_before', 'b.before')} AS {q(k)}" if k in key else f"CAST(NULL AS {kind}) AS {q(k)}"
                for k, kind in columns.items()]
    gone = [f"named_struct('v', CAST(NULL AS {columns[n]})) AS {known_column(i)}" for i, n in enumerate(holes)]
    before_key = " AND ".join(f"{typed(k, '_before', 'b.before')} IS NOT NULL" for k in key)
    moved = " OR ".join(f"NOT ({typed(k, '_before', 'b.before')} <=> {typed(k)})" for k in key)
    tombstones = (f"SELECT {', '.join([*old_keys, meta.format(deleted='true'), *gone])}\n    FROM ({base}) b\n"
                  f"    WHERE b.op = 'u' AND b._before IS NOT NULL AND {before_key} AND ({moved})")
    return f"{change}\n    UNION ALL\n    {tombstones}"
