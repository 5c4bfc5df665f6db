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
from typing import NamedTuple

from cdc_platform.config import TableConfig
from cdc_platform.lake import quote_identifier as q
from cdc_platform.lake.lake_spark import sql_string
from cdc_platform.views import connect_sql as CS

#: `_seq` of tail rows: above any stored row's (a Delta version of the latest-state table).
TAIL_SEQ_BASE = 1 << 62
#: The metadata columns of stored rows, in order (the view's `STATE_META` and `_seq`).
META = ("_op", "_deleted", "_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id", "_seq")
#: Tail rows' arrival order, after `_seq` (NULL for stored rows): the raw log's ingest batch, the event's order
#: in its transaction, its place in the batch, its id (the stage's order of a key's events in one batch).
TAIL_ORDER = "_tail_order"
TAIL_ORDER_TYPE = "STRUCT<ingested_at: TIMESTAMP, tx: BIGINT, arrival: BIGINT, event_id: STRING>"


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


class TailSql(NamedTuple):
    """A table's raw-log tail as two queries: `rows` shaped as stored rows, and `markers`, its truncate markers alone
    (`_position` and the columns a marker gives the rows it tombstones), so the view's search for markers reads
    neither the typed values nor a copy of `rows` (a CTE read twice is kept whole and takes no filter)."""

    rows: str
    markers: str


def tail_sql(table: TableConfig, columns: Mapping[str, str], raw: str, applied_through: dt.datetime | None,
             dead_letter: str | None = None, stage: str = "latest_state") -> TailSql:
    """SQL of `table`'s raw-log events after `applied_through` (all of them when None) as stored rows.

    `columns` maps each source column of the stored table to its Spark type; `raw` is the raw log's
    (quoted) name; `dead_letter`, when given, is the dead-letter table's, whose events of `stage` are
    left out (a stale mark may bring back events the fold already set aside).

    Each value is typed once per row image, in a projection of its own that the rest refer to by name, and
    a moved key's tombstone comes out of the same scan as its change (a generator): the typed conversions
    are long SQL (`connect_sql`), and Spark analyses and optimises every copy of them on each query, so
    copies cost a lookup seconds of planning before any task runs.
    """
    key = list(table.key)
    struct = sql_string(CS.row_struct(columns))
    declared = {name: f"`__decl{i}`" for i, (name, kind) in enumerate(columns.items()) if CS.needs_declaration(kind)}
    decls = "".join(f", {CS.declaration('`__fields`', name)} AS {alias}" for name, alias in declared.items())
    fields = f", from_json(row_schema, {sql_string(CS.ROW_SCHEMA)}).fields AS `__fields`" if declared else ""
    after = f"r.ingested_at > {timestamp_literal(applied_through)}" if applied_through is not None else "true"
    dead = (f"\n      AND r.event_id NOT IN (SELECT event_id FROM {dead_letter} WHERE stage = {sql_string(stage)} AND event_id IS NOT NULL)"
            if dead_letter else "")
    mine = f"r.table_id = {sql_string(table.source)} AND {after}"
    markers = (f"SELECT r.position AS `_position`, r.source_ts AS `_source_ts`, r.transaction_id AS `_transaction_id`, "
               f"r.ingested_at AS `_ingested_at`, r.event_id AS `_event_id`\n    FROM {raw} r WHERE {mine} AND r.op = 't'{dead}")
    base = f"""SELECT *{decls} FROM (
      SELECT r.*, from_json(CASE WHEN r.op = 'd' THEN r.key ELSE r.after END, {struct}) AS _row,
             from_json(r.before, {struct}) AS _before{fields}
      FROM {raw} r
      WHERE {mine} AND (r.key IS NOT NULL OR r.op = 't') AND r.op <> 'm'{dead}
    )"""
    holes = placeholder_columns(columns, key)
    names = {name: i for i, name in enumerate(columns)}

    def decl(name: str) -> str:
        return declared[name] if name in declared else CS.NULL_DECL

    # A column whose `before` image counts too (a key, a placeholder column) is typed by one expression over both
    # images (`__p<i>`, `connect_sql.both_images_sql`), not two copies of it.
    both = [name for name in columns if name in key or name in holes]

    def now(name: str) -> str:  # the value the event's image gives, typed (`_row`: its `after`, or a delete's key)
        return f"`__p{names[name]}`[0]" if name in both else f"`__a{names[name]}`"

    def old(name: str) -> str:  # the value its `before` image gives, typed
        return f"`__p{names[name]}`[1]"

    typed = [f"{CS.value_sql(kind, f'_row.{q(name)}', decl(name), 'after', name)} AS {now(name)}"
             for name, kind in columns.items() if name not in both]
    pairs = [f"{CS.both_images_sql(columns[name], name, decl(name))} AS `__p{names[name]}`" for name in both]

    def known(name: str) -> str:
        value = CS.known_sql(columns[name], f"_row.{q(name)}", f"_before.{q(name)}", now(name), old(name), forgotten="op = 'd'")
        return f"{value} AS `__k{names[name]}`"

    level = [*(known(n) for n in holes)]
    # An update whose `before` holds another key moved its row: the old key gets a tombstone at the same position
    # (`__gone`), as `rows.change_rows` makes it; every other event is its one row.
    if key:
        before_key = " AND ".join(f"{old(k)} IS NOT NULL" for k in key)
        moved = " OR ".join(f"NOT ({old(k)} <=> {now(k)})" for k in key)
        level.append(f"explode(IF(op = 'u' AND _before IS NOT NULL AND {before_key} AND ({moved}), array(false, true), array(false))) AS `__gone`")
    else:
        level.append("false AS `__gone`")
    gone, cleared = "b.`__gone`", "b.`__gone` OR b.op IN ('d', 't')"
    values = []
    for name, kind in columns.items():
        if name in key:
            values.append(f"CASE WHEN {gone} THEN b.{old(name)} WHEN b.op = 't' THEN CAST(NULL AS {kind}) ELSE b.{now(name)} END AS {q(name)}")
        elif name in holes:
            values.append(f"CASE WHEN {cleared} THEN CAST(NULL AS {kind}) ELSE b.`__k{names[name]}`.v END AS {q(name)}")
        else:
            values.append(f"CASE WHEN {cleared} THEN CAST(NULL AS {kind}) ELSE b.{now(name)} END AS {q(name)}")
    meta = (f"b.op AS `_op`, {cleared} AS `_deleted`, b.position AS `_position`, b.source_ts AS `_source_ts`, "
            "b.transaction_id AS `_transaction_id`, b.ingested_at AS `_ingested_at`, b.event_id AS `_event_id`, "
            f"CAST({TAIL_SEQ_BASE} AS BIGINT) AS `_seq`, named_struct('ingested_at', b.ingested_at, 'tx', b.tx_total_order, "
            f"'arrival', b.arrival, 'event_id', b.event_id) AS {q(TAIL_ORDER)}")
    knowns = [f"CASE WHEN {gone} THEN named_struct('v', CAST(NULL AS {columns[n]})) WHEN b.op = 't' THEN CAST(NULL AS STRUCT<v: {columns[n]}>) "
              f"ELSE b.`__k{names[n]}` END AS {known_column(i)}" for i, n in enumerate(holes)]
    first = ", ".join([*typed, *pairs])
    second = ", ".join(level)
    rows = (f"SELECT {', '.join([*values, meta, *knowns])}\n    FROM (\n    SELECT *, {second} FROM (\n"
            f"    SELECT *, {first} FROM ({base})\n    )) b")
    return TailSql(rows, markers)
