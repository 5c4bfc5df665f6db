"""SQL over the lake: every Delta table and view registered as a Spark temp view, by name.

No Hive metastore (its embedded Derby database locks out a second process); instead each session
registers temp views from the lake itself: its tables by directory and its views from the registry
that `cdc run` writes, so a lake can be queried by someone who does not have its config file.

One exception to "a table is a view of its directory": a latest-state table `<name>` (and
`<name>_history`) is stored merge-on-read, so its directory alone is not the current state. Its name is
re-registered as the folded state, and the directory stays reachable as `<name>__stored`.

Every table is read through delta-spark at the version current when it is registered (`versionAsOf`),
so a session's views hold still until it registers the lake again, as they did when they were file
lists; see `register_lake` for the order that keeps views over several tables consistent.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_platform.views import connect_sql as CS
from cdc_platform.views import tail as TV
from cdc_platform.views.outbox_sql import latest_event_sql, latest_view_name
from cdc_platform.views.latest_state_sql import (
    CLEAN_SUFFIX,
    FULL_SUFFIX,
    VIEW_META,
    _cols,
    history_sql,
    latest_state_views,
    masked_expression,
)
from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.lake.lake_spark import sql_string
from cdc_platform.stages import latest_state as LS
from cdc_platform.stages import transactions as T
from cdc_platform.stages.outbox import event_tables
from cdc_platform.config import TableConfig, mask_salt
from cdc_platform.errors import LakeError
from cdc_platform.stages.stage import DEAD_LETTER, MARKERS, RAW
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

def register_lake(spark: SparkSession, lake_dir: LakePath, query: str | None = None) -> list[str]:
    """Register every table and view of the lake in this session; return the names, tables first.

    Each table is pinned to its version at registration. Tables are pinned downstream first (the
    consistency watermark, then the tables derived from the raw log, then the raw log, markers and
    dead letters), the reverse of the order the stream commits a batch in: a table pinned later is never
    older than one pinned before it, so the raw log holds every event the pinned watermark and
    transactions speak of, and a consistent view never shows a transaction it cannot show whole.

    With `query` (the one statement the caller is about to run), every table is still pinned, but only the
    latest-state and consistent views of the tables the statement names are planned (`named_tables`):
    planning a table's views is most of registering it (their SQL analysed by Spark, the tail's facts read
    from the logs), and a query of one table of a lake of ten need not pay for the other nine.
    """
    if not lake_dir.is_dir():
        raise LakeError(f"lake directory {lake_dir} does not exist; run `cdc run` first or pass the right --lake")
    names: list[str] = []
    tables = lake.lake_tables(lake_dir)
    only = None if query is None else named_tables(lake_dir, query)
    mark = lake.applied_through(lake_dir, LS.STAGE)  # before any table is pinned: the stored state then holds at least this much
    versions = register_tables(spark, lake_dir, tables)
    names.extend(tables)
    names.extend(register_latest_state_views(spark, lake_dir, versions, only=only, mark=mark))
    names.extend(register_consistent_views(spark, lake_dir, only=only))
    names.extend(register_outbox_views(spark, lake_dir, tables))
    return names


def named_tables(lake_dir: LakePath, query: str) -> set[str] | None:
    """The latest-state tables of the lake whose name occurs in `query` (any case), or None (all of them) for a
    statement that names none or lists the catalog (`SHOW ...`), whose answer is every name.

    Every view of a table (`<name>`, `<name>__full_view`, `<name>_history`, ...) carries its name, so a
    statement that reads a view names its table. A name inside a longer word counts too: planning a table
    too many is only slower, one too few would leave its views unregistered."""
    text = query.lower()
    if text.lstrip().startswith("show"):
        return None
    named = {t.name for t in lake.registered_tables(lake_dir) if t.name.lower() in text}
    return named or None


def register_outbox_views(spark: SparkSession, lake_dir: LakePath, present: Mapping[str, Any]) -> list[str]:
    """`<aggregatetype>_events__latest_view` for each outbox event table registered (`views.outbox_sql`)."""
    names = []
    for name in sorted(event_tables(lake_dir)):
        if name not in present:
            continue
        view = latest_view_name(name)
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {lake.quote_identifier(view)} AS "
                  f"{latest_event_sql(lake.quote_identifier(name), spark.table(lake.quote_identifier(name)).columns)}")
        names.append(view)
    return names


def register_tables(spark: SparkSession, lake_dir: LakePath, names: Collection[str]) -> dict[str, int]:
    """Register the lake tables `names` (those present) as temp views of their Delta tables, each pinned,
    in `register_lake`'s order; return the pinned versions. For a reader of a few tables (a check), which
    need not pin and plan the whole lake."""
    tables = lake.lake_tables(lake_dir)
    versions: dict[str, int] = {}
    for name in sorted((n for n in names if n in tables), key=_read_rank):
        versions[name], df = lake_spark.pinned(spark, tables[name])
        df.createOrReplaceTempView(lake.quote_identifier(name))
    return versions


def view_text(spark: SparkSession, name: str) -> str | None:
    """The SQL a view of this session was created with (Spark keeps it in the view's catalog entry),
    or None for a view made from a DataFrame or a name that is no view. Classic sessions only (it asks
    the session catalog through the JVM; Spark Connect has no such call)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    ident = jvm.org.apache.spark.sql.catalyst.TableIdentifier.apply(name)
    try:
        meta = spark._jsparkSession.sessionState().catalog().getTempViewOrPermanentTableMetadata(ident)
    except Exception:  # noqa: BLE001 - py4j wraps the catalog's NoSuchTableException
        return None
    text = meta.viewText()
    return str(text.get()) if text.isDefined() else None


#: Tables the stream commits first in a batch; they are pinned last (see `register_lake`).
_UPSTREAM = (RAW, MARKERS, DEAD_LETTER)


def _read_rank(name: str) -> tuple[int, str]:
    return (0 if name == T.WATERMARK else 2 if name in _UPSTREAM else 1, name)


def sql(spark: SparkSession, lake_dir: LakePath, query: str) -> DataFrame:
    """`query` over the lake as it is now: registered again (only the views of the tables it names planned), then run."""
    register_lake(spark, lake_dir, query=query)
    return spark.sql(query)


# --- Registering the latest-state views ------------------------------------------------------------

def stored_view_name(name: str) -> str:
    return f"{name}__stored"


def snapshot_facts(path: Path, version: int, key: Sequence[str]) -> tuple[bool, bool]:
    """(delta rows pending, truncate markers possible) at `version` of a latest-state table, from its log's
    file statistics (partition values, null counts) without reading a row.

    delta-rs reads those from the log in milliseconds; the same answer from Spark (two `LIMIT 1` probes
    on the pinned DataFrame) cost 0.8 s a table here, which doubled the time to register a lake. A
    snapshot delta-rs cannot open (a table feature it lacks) gets (True, True): the full plan, right for
    any snapshot, only slower.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake.exceptions import DeltaError

    try:
        actions = pa.table(lake.open_snapshot(path, version).get_add_actions(flatten=True))
    except (DeltaError, LakeError):
        return True, True
    if actions.num_rows == 0:
        return False, False
    layer = f"partition.{LS.LAYER}"
    pending = layer not in actions.column_names or pc.any(pc.equal(actions.column(layer), LS.DELTA)).as_py() is True
    nulls = f"null_count.{key[0]}" if key else ""
    if not key or nulls not in actions.column_names or actions.column(nulls).null_count:
        return pending, True  # no statistics: assume markers may exist
    return pending, bool(pc.sum(actions.column(nulls)).as_py())


def _columns(stored: DataFrame, meta: Iterable[Any]) -> dict[str, bool]:
    """Source columns of a stored table (its metadata columns left out), each with "is binary"."""
    from pyspark.sql.types import BinaryType

    names = {f.name for f in meta}
    return {f.name: isinstance(f.dataType, BinaryType) for f in stored.schema.fields if f.name not in names}


_UNREAD: Any = object()


def register_latest_state_views(
    spark: SparkSession, lake_dir: LakePath, versions: Mapping[str, int] | None = None, only: Collection[str] | None = None,
    *, mark: dt.datetime | None = _UNREAD,
) -> list[str]:
    """Register `<name>`, `<name>__full_view`, `<name>__clean_view` (and `<name>_history`) for every
    latest-state table in the lake's registry; the physical tables stay reachable as `<...>__stored`.

    Each view is planned for the snapshot it reads: `<name>__stored` is pinned to one version (the one
    `register_lake` registered, given in `versions`, else the current one), and the facts that let the
    SQL skip folding work come from that same version's log, so a commit landing in between can
    neither hide pending changes nor slip past a skipped step.

    The views also read the raw log's events the fold has not taken yet (`views.tail`): those ingested
    after `mark`, the fold's `applied_through`, read before any of these tables is pinned (so the pinned
    state holds everything up to it); the raw log is pinned after them. A snapshot whose raw log has no
    file of the table's events after the mark gets no tail in its plan.
    """
    names: list[str] = []
    if mark is _UNREAD:
        mark = lake.applied_through(lake_dir, LS.STAGE)
    present = lake.lake_tables(lake_dir)
    wanted = [t for t in lake.registered_tables(lake_dir) if t.name in present and (only is None or t.name in only)]
    pinned: list[tuple[TableConfig, int, DataFrame]] = []
    for table in wanted:
        version, snapshot = _pinned(spark, present[table.name], (versions or {}).get(table.name))
        pinned.append((table, version, snapshot))
    raw_version: int | None = None
    if pinned and RAW in present:
        raw_version = (versions or {}).get(RAW)
        if raw_version is None:  # a reader of a few tables: the raw log pinned now, after the stored tables
            raw_version, raw_frame = lake_spark.pinned(spark, present[RAW])
            raw_frame.createOrReplaceTempView(lake.quote_identifier(RAW))
    dead = lake.quote_identifier(DEAD_LETTER) if DEAD_LETTER in present and DEAD_LETTER in (versions or {}) else None
    for table, version, snapshot in pinned:
        stored = stored_view_name(table.name)
        pending, truncates = snapshot_facts(present[table.name], version, table.key)
        types = stored_types(snapshot.schema.fields)
        tail = None
        if raw_version is not None and tail_possible(present[RAW], raw_version, table.source, mark):
            if not all(k in types for k in table.key):  # nothing folded yet: the columns of a sample of its events
                types = sampled_types(spark, lake.quote_identifier(RAW), table)
                snapshot = _with_columns(snapshot, types)
            if all(k in types for k in table.key):
                tail = TV.tail_sql(table, types, lake.quote_identifier(RAW), mark, dead)
        snapshot.createOrReplaceTempView(lake.quote_identifier(stored))
        names.append(stored)
        columns = _columns(snapshot, LS.META_FIELDS)
        statements = latest_state_views(table, columns, stored, salt=mask_salt(table), pending=pending, truncates=truncates,
                                        tail=tail, types=types)
        if table.history and table.history_name in present:
            _, hsnap = _pinned(spark, present[table.history_name], (versions or {}).get(table.history_name))
            hstored = stored_view_name(table.history_name)
            hsnap.createOrReplaceTempView(lake.quote_identifier(hstored))
            names.append(hstored)
            statements.append((table.history_name, history_sql(hstored, list(_columns(hsnap, LS.HISTORY_META)), table.key)))
        for view, sql in statements:
            spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {lake.quote_identifier(view)} AS {sql}")
            if view not in (table.name, table.history_name):
                names.append(view)
    return names


def _with_columns(snapshot: DataFrame, types: Mapping[str, str]) -> DataFrame:
    """A stored snapshot with the source columns it lacks as typed NULLs, source columns first."""
    from pyspark.sql import functions as F

    have = set(snapshot.columns)
    added = [F.lit(None).cast(kind).alias(name) for name, kind in types.items() if name not in have]
    return snapshot.select(*added, *snapshot.columns) if added else snapshot


def tail_possible(raw: Path, version: int, source: str, mark: dt.datetime | None) -> bool:
    """Whether the raw log at `version` may hold events of `source` ingested after `mark`, from its files'
    statistics (a file's newest `ingested_at`, its range of `table_id`) without reading a row. True when the
    statistics cannot tell (or delta-rs cannot open the snapshot): the tail's plan is then kept, only slower."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake.exceptions import DeltaError

    try:
        actions = lake.add_actions(lake.open_snapshot(raw, version))
    except (DeltaError, LakeError):
        return True
    if actions.num_rows == 0:
        return False
    needed = ("max.ingested_at", "min.table_id", "max.table_id")
    if not all(c in actions.column_names for c in needed):
        return True
    newest, low, high = (actions.column(c) for c in needed)
    if mark is not None:
        at = pa.scalar(mark.astimezone(dt.timezone.utc).replace(tzinfo=None), pa.timestamp("us"))
        later = pc.fill_null(pc.greater(newest.cast(pa.timestamp("us")), at), True)
    else:
        later = pa.array([True] * actions.num_rows)
    holds = pc.fill_null(pc.and_(pc.less_equal(low, source), pc.greater_equal(high, source)), True)
    return bool(pc.any(pc.and_(later, holds)).as_py())


def _pinned(spark: SparkSession, path: Path, version: int | None) -> tuple[int, DataFrame]:
    return (version, lake_spark.read(spark, path, version)) if version is not None else lake_spark.pinned(spark, path)


# --- Consistent views: latest state as of the consistency watermark -----------------------------------

def stored_types(schema: Iterable[Any]) -> dict[str, str]:
    """Source columns of a latest-state table (Spark schema fields, metadata left out) -> Spark type name:
    the types a consistent view gives its columns, so that it shows what the full view shows."""
    meta = {f.name for f in LS.META_FIELDS}
    return {f.name: f.dataType.simpleString() for f in schema if f.name not in meta}


def sampled_types(spark: SparkSession, raw: str, table: TableConfig) -> dict[str, str]:
    """Column types for a table whose latest-state table does not exist yet: a sample of its raw events
    typed by the latest state's own code (`type_rows`, the newest type winning as in a rebuild), so the
    consistent view types its columns as the latest state will."""
    from cdc_platform.stages.latest_state import rows as R

    sample = spark.sql(
        f"SELECT op, key, before, after, row_schema, position, tx_total_order FROM {raw} "
        f"WHERE table_id = {sql_string(table.source)} AND after IS NOT NULL LIMIT {SAMPLE_ROWS}"
    ).toArrow()
    events = R.Events(R.fill_keys(sample, table.key))
    changes, _ = R.change_rows(events, table.key)
    typed = R.type_rows(changes, events, {}, table, coerce=True)
    return {name: LS.type_name(kind) for name, kind in typed.columns.items()}


def consistent_view_sql(table: TableConfig, columns: Mapping[str, str], salt: bytes | None = None, *, dead_letters: bool = False) -> str:
    """The latest state of one table as of its source's consistency watermark.

    Visible: an event without transaction metadata at or below the watermark, or any event of a
    transaction in `transactions` whose commit position is at or below it. So a transaction is shown
    whole or not at all, and one that expired incomplete is never shown. Latest per key by position;
    deletes hide the row. Shaped like `<name>__clean_view` (same masking, same metadata columns), so a
    reader can swap one for the other.

    `columns` maps each source column to its Spark type, the latest-state table's (`stored_types`), and
    every event's row image is typed to it as the latest state types it, from the Connect schema the
    event carries (`connect_sql`): a Decimal sent as base64 bytes is the same decimal in both views.
    With `dead_letters` (the lake has a `dead_letter` table) events the latest-state stage dead-lettered
    are left out, as they are of the full view. A visible truncate hides every row whose position is
    below it, as it tombstones them in the latest state. (The search for one is always planned: the
    latest state's markers are purged after `tombstone_retention`, the raw log's rows are not.)

    The raw log keeps events as sent, Debezium's unavailable-value placeholder included (an update that
    left a TOAST value unchanged). A column holding it takes the event's `before` image when that has
    the value (REPLICA IDENTITY FULL), else the key's newest earlier visible value, as the latest-state
    stage does (`unavailable`); a delete forgets the values, and a value known nowhere is NULL.
    """
    q = lake.quote_identifier
    struct = sql_string(CS.row_struct(columns))
    masked = {m.lower() for m in table.mask}
    outer: list[str] = []
    for name, kind in columns.items():
        if name.lower() in masked:
            expr = masked_expression(name, kind == "binary", table.mask_mode, salt)
            if expr is not None:
                outer.append(expr)
        else:
            outer.append(q(name))
    outer += [q(m) for m in VIEW_META]
    # Arrival order of a key's events, oldest first (Spark sorts nulls first ascending, last descending).
    order = ("r.position", "r.tx_total_order", "r.ingested_at", "r.kafka_offset", "r.event_id")
    earlier = f"PARTITION BY r.key ORDER BY {', '.join(order)} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    newest_first = f"PARTITION BY r.key ORDER BY {', '.join(c + ' DESC' for c in order)}"
    # Each column's Connect declaration, read once per event, for the columns whose conversion depends on it.
    declared = {name: f"`__decl{i}`" for i, (name, kind) in enumerate(columns.items()) if CS.needs_declaration(kind)}
    decls = "".join(f", {CS.declaration('`__fields`', name)} AS {alias}" for name, alias in declared.items())
    fields = f", from_json(row_schema, {sql_string(CS.ROW_SCHEMA)}).fields AS `__fields`" if declared else ""
    values = []
    pairs = []  # a placeholder column's two row images, typed by one expression over the pair (as `views.tail` does)
    for i, (name, kind) in enumerate(columns.items()):
        if name in table.key or not CS.placeholder_possible(kind):
            decl = f"r.{declared[name]}" if name in declared else CS.NULL_DECL
            values.append(f"{CS.value_sql(kind, f'r._row.{q(name)}', decl, 'r.after', name)} AS {q(name)}")
            continue
        pairs.append(f"{CS.both_images_sql(kind, name, declared.get(name, CS.NULL_DECL))} AS `__p{i}`")
        known = CS.known_sql(kind, f"r._row.{q(name)}", f"r._before.{q(name)}", f"r.`__p{i}`[0]", f"r.`__p{i}`[1]", "r._row IS NULL")
        values.append(f"last_value({known}, true) OVER ({earlier}).v AS {q(name)}")
    typed_pairs = f", {', '.join(pairs)}" if pairs else ""
    visible = ("JOIN {wm} w ON coalesce(r.source_name, '') = w.source\n"
               "    LEFT JOIN (SELECT transaction_id, max(last_position) AS last_position FROM {tx} GROUP BY transaction_id) t\n"
               "      ON r.transaction_id = t.transaction_id").format(wm=q(T.WATERMARK), tx=q(T.TRANSACTIONS))
    shown = "w.position IS NOT NULL AND CASE WHEN r.transaction_id IS NULL THEN r.position <= w.position ELSE t.last_position <= w.position END"
    cut = (f"CROSS JOIN (SELECT max(r.position) AS position FROM {q(RAW)} r {visible}\n"
           f"    WHERE r.table_id = {sql_string(table.source)} AND r.op = 't' AND {shown}) cut")
    dead = (f"\n    LEFT ANTI JOIN (SELECT event_id FROM {q(DEAD_LETTER)} WHERE stage = {sql_string(LS.STAGE)} AND event_id IS NOT NULL) x"
            "\n      ON r.event_id = x.event_id") if dead_letters else ""
    return f"""
SELECT {', '.join(outer)} FROM (
  SELECT {_cols(list(columns)) + ', ' if columns else ''}`_op`, `_position`, `_source_ts`, `_transaction_id`, `_ingested_at`, `_event_id` FROM (
    SELECT {''.join(v + ', ' for v in values)}r.op AS `_op`,
           r.position AS `_position`, r.source_ts AS `_source_ts`, r.transaction_id AS `_transaction_id`,
           r.ingested_at AS `_ingested_at`, r.event_id AS `_event_id`,
           row_number() OVER ({newest_first}) AS `__rank`
    FROM (
      SELECT *{typed_pairs} FROM (
        SELECT *{decls} FROM (
          SELECT *, from_json(after, {struct}) AS _row, from_json(before, {struct}) AS _before{fields}
          FROM {q(RAW)} WHERE table_id = {sql_string(table.source)}
        )
      )
    ) r
    {visible}{dead}
    WHERE r.key IS NOT NULL AND r.op <> 't' AND {shown}
  ) ranked
  {cut}
  WHERE `__rank` = 1 AND `_op` <> 'd' AND (cut.position IS NULL OR `_position` >= cut.position)
) latest
"""


SAMPLE_ROWS = 1000


def table_frame(spark: SparkSession, lake_dir: LakePath, name: str) -> DataFrame:
    """One lake table as a check reads it: a latest-state table as its folded state (tombstones
    included), any other table as its Delta table. Registers only what that needs (the table's own
    views), not the whole lake: a check of one table should not pin and plan every other."""
    if name in {t.name for t in lake.registered_tables(lake_dir)}:
        register_latest_state_views(spark, lake_dir, only={name})
        return spark.table(lake.quote_identifier(name))
    return lake_spark.read(spark, lake.table_path(lake_dir, name))


def live_rows(spark: SparkSession, lake_dir: LakePath, names: Collection[str]) -> dict[str, int]:
    """Live rows (tombstones excluded) of latest-state tables, counted through their full views in one query."""
    registered = register_latest_state_views(spark, lake_dir, only=set(names))
    present = [n for n in names if f"{n}__full_view" in registered]
    if not present:
        return {}
    union = " UNION ALL ".join(f"SELECT {sql_string(n)} AS name, count(*) AS n FROM {lake.quote_identifier(n + '__full_view')}" for n in present)
    return {r["name"]: int(r["n"]) for r in spark.sql(union).collect()}


def rows_of(view: str) -> str:
    """The view whose rows `view` shows: a clean view's are its full view's (it masks or drops columns,
    never rows), so one count serves both; any other view is its own."""
    if view.endswith(CLEAN_SUFFIX):
        return view[: -len(CLEAN_SUFFIX)] + FULL_SUFFIX
    return view


def count_views(spark: SparkSession, names: Collection[str]) -> dict[str, int]:
    """Rows of each registered view in `names`, in one query that counts each distinct row set once
    (`rows_of`): a full and a clean view fold their table once between them, not twice."""
    sources = sorted({rows_of(n) for n in names})
    if not sources:
        return {}
    union = " UNION ALL ".join(f"SELECT {sql_string(v)} AS view, count(*) AS n FROM {lake.quote_identifier(v)}" for v in sources)
    counts = {r["view"]: int(r["n"]) for r in spark.sql(union).collect()}
    return {n: counts[rows_of(n)] for n in names}


def register_consistent_views(spark: SparkSession, lake_dir: LakePath, only: Collection[str] | None = None) -> list[str]:
    """`<name>__consistent_view` for every configured table (or those in `only`), its columns typed as its
    latest-state table's (the `<name>__stored` view `register_latest_state_views` pinned, so the same snapshot
    the full view reads)."""
    from pyspark.errors import AnalysisException

    present = lake.lake_tables(lake_dir)
    if not all(name in present for name in (RAW, T.TRANSACTIONS, T.WATERMARK)):
        return []
    names = []
    for table in lake.registered_tables(lake_dir):
        if only is not None and table.name not in only:
            continue
        try:
            columns = stored_types(spark.table(lake.quote_identifier(stored_view_name(table.name))).schema.fields)
        except AnalysisException:  # no latest-state table yet
            columns = sampled_types(spark, lake.quote_identifier(RAW), table)
        view = f"{table.name}__consistent_view"
        sql = consistent_view_sql(table, columns, mask_salt(table), dead_letters=DEAD_LETTER in present)
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {lake.quote_identifier(view)} AS {sql}")
        names.append(view)
    return names
