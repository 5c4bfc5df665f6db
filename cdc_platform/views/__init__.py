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

from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_platform.views import connect_sql as CS
from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.lake.lake_spark import sql_string
from cdc_platform.stages import latest_state as LS
from cdc_platform.stages import transactions as T
from cdc_platform.config import TableConfig, mask_salt
from cdc_platform.errors import LakeError
from cdc_platform.stages.stage import DEAD_LETTER, MARKERS, RAW
from cdc_platform.storage import LakePath
from cdc_platform.stages.unavailable import placeholder_forms

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

def register_lake(spark: SparkSession, lake_dir: LakePath) -> list[str]:
    """Register every table and view of the lake in this session; return the names, tables first.

    Each table is pinned to its version at registration. Tables are pinned downstream first (the
    consistency watermark, then the tables derived from the raw log, then the raw log, markers and
    dead letters), the reverse of the order the stream commits a batch in: a table pinned later is never
    older than one pinned before it, so the raw log holds every event the pinned watermark and
    transactions speak of, and a consistent view never shows a transaction it cannot show whole.
    """
    if not lake_dir.is_dir():
        raise LakeError(f"lake directory {lake_dir} does not exist; run `cdc run` first or pass the right --lake")
    names: list[str] = []
    tables = lake.lake_tables(lake_dir)
    versions = register_tables(spark, lake_dir, tables)
    names.extend(tables)
    names.extend(register_latest_state_views(spark, lake_dir, versions))
    names.extend(register_consistent_views(spark, lake_dir))
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
    register_lake(spark, lake_dir)
    return spark.sql(query)


# --- Latest-state views: the SQL, in one place ----------------------------------------------------------
#
# `<name>__stored` is the physical latest-state table (see the latest_state package): `_layer` 'base' holds one row
# per key as of the last compaction, `_layer` 'delta' the changes appended since. Every view below reads
# it through `<name>`, which folds the two layers; identifiers are always backtick-quoted.

#: Metadata columns of the folded state, in order, after the source columns.
STATE_META = ("_op", "_deleted", "_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id")
#: Metadata columns of the full and clean views (the tombstone flag is always false there).
VIEW_META = ("_op", "_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id")
#: Columns a truncate marker supplies to the rows it tombstones.
_MARKER_META = ("_source_ts", "_transaction_id", "_ingested_at", "_event_id")


def q(name: str) -> str:
    return lake.quote_identifier(name)


def _cols(names: Sequence[str], alias: str | None = None) -> str:
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + q(n) for n in names)


def _keys_present(key: Sequence[str], alias: str | None = None, *, present: bool = True) -> str:
    prefix = f"{alias}." if alias else ""
    test = "IS NOT NULL" if present else "IS NULL"
    return " AND ".join(f"{prefix}{q(k)} {test}" for k in key)


def latest_state_sql(stored: str, columns: Sequence[str], key: Sequence[str], *, pending: bool = True, truncates: bool = True) -> str:
    """The current state with tombstones: base and delta layers folded by the highest `_position` per key.

    One window over both layers picks each key's newest row. At an equal position the distinct event
    that arrived later wins, and a copy of a stored event counts as that event's first arrival, so a
    redelivery changes nothing (`ordering`: the same rule as compaction; base rows were appended before
    every delta row, so a base row is never a later arrival). A truncate marker (key columns null, `_op`
    t) turns every row below its position into a tombstone.

    Why one window and not a join of the two layers: a filter on the key columns (a point lookup, the
    common query from a BI tool or `cdc sql`) is pushed below a window partitioned by the key, so the
    lookup reads only the files whose statistics can hold the key and runs as a few small jobs. The join
    form needed a broadcast per side and ran 14 jobs for one lookup (1.1 to 1.8 s against 0.4 s); it
    saved a shuffle of the base on full scans (at 10M rows a full count took 3.1 s against 7.0 s now; README).

    `pending=False` (no delta rows in the registered snapshot) and `truncates=False` (no markers in it)
    drop the parts of the plan that would find nothing; the caller decides from the same snapshot's log.
    """
    if not key or not all(k in columns for k in key):
        # No keyed row has landed yet (e.g. only a truncate): an empty state with the right columns.
        return f"SELECT {_cols([*columns, *STATE_META])} FROM {q(stored)} WHERE false"
    rows = [*columns, *STATE_META, "_seq"]
    if pending:
        # One shuffle by the key serves both windows (the first alone would partition by all three columns).
        folded = f"""`__folded` AS (
  SELECT {_cols(rows)} FROM (
    SELECT {_cols(rows)}, row_number() OVER (PARTITION BY {_cols(key)} ORDER BY `_position` DESC, `__first` DESC, `_seq` ASC) AS `__rank`
    FROM (
      SELECT {_cols(rows)}, min(`_seq`) OVER (PARTITION BY {_cols(key)}, `_position`, `_event_id`) AS `__first`
      FROM (SELECT {_cols(rows)} FROM {q(stored)} WHERE {_keys_present(key)} DISTRIBUTE BY {_cols(key)})
    )
  ) WHERE `__rank` = 1
)"""
    else:
        folded = f"""`__folded` AS (
  SELECT {_cols(rows)} FROM {q(stored)} WHERE `_layer` = 'base' AND {_keys_present(key)}
)"""
    if not truncates:
        return f"WITH {folded}\nSELECT {_cols([*columns, *STATE_META])} FROM `__folded`"
    cut = "f.`_position` < t.`_position`"
    out = [f"f.{q(c)}" if c in key else f"CASE WHEN {cut} THEN NULL ELSE f.{q(c)} END AS {q(c)}" for c in columns]
    out += [f"CASE WHEN {cut} THEN 't' ELSE f.`_op` END AS `_op`", f"CASE WHEN {cut} THEN true ELSE f.`_deleted` END AS `_deleted`",
            f"CASE WHEN {cut} THEN t.`_position` ELSE f.`_position` END AS `_position`"]
    out += [f"CASE WHEN {cut} THEN t.{q(c)} ELSE f.{q(c)} END AS {q(c)}" for c in _MARKER_META]
    marker = ", ".join(["max(`_position`) AS `_position`", *(f"max_by({q(c)}, `_position`) AS {q(c)}" for c in _MARKER_META)])
    return f"""
WITH {folded},
`__truncate` AS (
  SELECT {marker} FROM {q(stored)} WHERE `_op` = 't' AND {_keys_present(key, present=False)}
)
SELECT {', '.join(out)}
FROM `__folded` f CROSS JOIN `__truncate` t
"""


def full_view_sql(state: str, columns: Sequence[str]) -> str:
    """`<name>__full_view`: the latest state without tombstones, source columns first (WePay's full view)."""
    return f"SELECT {_cols([*columns, *VIEW_META])} FROM {q(state)} WHERE NOT `_deleted`"


def masked_expression(column: str, binary: bool, mode: str, salt: bytes | None) -> str | None:
    """How `<name>__clean_view` shows a masked column; None means the column is left out.

    `hash`: hex SHA-256 of salt + value (the value as text, or the bytes of a binary column), so equal
    values still join across tables and views sharing the salt. The salt comes from the environment
    variable the table names (`mask_salt_env`), never from the lake; without it the column is shown as
    NULL, so a lake queried without the salt shows removal rather than a guessable unsalted hash.
    `remove`: the column is not in the view at all.
    """
    if mode == "remove":
        return None
    if salt is None:
        return f"CAST(NULL AS STRING) AS {q(column)}"
    value = q(column) if binary else f"CAST(CAST({q(column)} AS STRING) AS BINARY)"
    return f"CASE WHEN {q(column)} IS NULL THEN NULL ELSE sha2(concat(unhex('{salt.hex()}'), {value}), 256) END AS {q(column)}"


def clean_view_sql(full: str, columns: Sequence[tuple[str, bool]], mask: Sequence[str], mode: str, salt: bytes | None) -> str:
    """`<name>__clean_view`: the full view with every `mask:` column hashed or removed.

    Masked names match case-insensitively, as Spark resolves them, so `Email` cannot slip past `email`.
    """
    masked = {m.lower() for m in mask}
    select: list[str] = []
    for name, binary in columns:
        if name.lower() in masked:
            expr = masked_expression(name, binary, mode, salt)
            if expr is not None:
                select.append(expr)
        else:
            select.append(q(name))
    select += [q(m) for m in VIEW_META]
    return f"SELECT {', '.join(select)} FROM {q(full)}"


def history_sql(stored: str, columns: Sequence[str], key: Sequence[str]) -> str:
    """`<name>_history` (SCD2): every version of every key with its validity and a current flag.

    Versions are the applied changes in position order; a version is valid from its position until the
    next change to the same key (or a truncate in between) and is current while nothing follows it.
    Deletes and truncates close a version and open none. Two changes with the same key and position
    are one version: the first applied, as in the latest state.
    """
    if not key or not all(k in columns for k in key):
        return (
            f"SELECT {_cols(columns)}, `_op`, `_position` AS `_valid_from_position`, `_source_ts` AS `_valid_from_ts`, "
            "`_position` AS `_valid_to_position`, `_source_ts` AS `_valid_to_ts`, true AS `_is_current`, "
            f"`_transaction_id`, `_ingested_at`, `_event_id` FROM {q(stored)} WHERE false"
        )
    rows = [*columns, "_op", "_deleted", "_position", "_source_ts", "_transaction_id", "_ingested_at", "_event_id"]
    return f"""
WITH `__versions` AS (
  SELECT {_cols(rows)} FROM (
    SELECT {_cols(rows)}, row_number() OVER (
      PARTITION BY {_cols(key)}, `_position` ORDER BY `_seq` ASC, `_tx_order` DESC NULLS LAST, `_batch_order` DESC) AS `__dup`
    FROM {q(stored)} WHERE {_keys_present(key)}
  ) WHERE `__dup` = 1
),
`__ordered` AS (
  SELECT *, lead(`_position`) OVER w AS `__next_position`, lead(`_source_ts`) OVER w AS `__next_ts`
  FROM `__versions` WINDOW w AS (PARTITION BY {_cols(key)} ORDER BY `_position`)
),
`__truncates` AS (
  SELECT DISTINCT `_position` AS `__t_position`, `_source_ts` AS `__t_ts` FROM {q(stored)}
  WHERE `_op` = 't' AND {_keys_present(key, present=False)}
),
`__bounded` AS (
  SELECT o.*, t.`__t_position`, t.`__t_ts`,
         row_number() OVER (PARTITION BY {_cols(key, 'o')}, o.`_position` ORDER BY t.`__t_position` ASC NULLS LAST) AS `__first_cut`
  FROM `__ordered` o LEFT JOIN `__truncates` t
    ON t.`__t_position` > o.`_position` AND (o.`__next_position` IS NULL OR t.`__t_position` < o.`__next_position`)
)
SELECT {_cols(columns)}, `_op`,
       `_position` AS `_valid_from_position`, `_source_ts` AS `_valid_from_ts`,
       coalesce(`__t_position`, `__next_position`) AS `_valid_to_position`,
       CASE WHEN `__t_position` IS NOT NULL THEN `__t_ts` ELSE `__next_ts` END AS `_valid_to_ts`,
       `__t_position` IS NULL AND `__next_position` IS NULL AS `_is_current`,
       `_transaction_id`, `_ingested_at`, `_event_id`
FROM `__bounded` WHERE `__first_cut` = 1 AND NOT `_deleted`
"""


FULL_SUFFIX = "__full_view"
CLEAN_SUFFIX = "__clean_view"


def latest_state_views(
    table: TableConfig, columns: Mapping[str, bool], stored: str, salt: bytes | None, *, pending: bool = True, truncates: bool = True
) -> list[tuple[str, str]]:
    """(view name, SQL) for `<name>`, `<name>__full_view` and `<name>__clean_view`, in dependency order.

    `columns` maps source column names to whether the column is binary (binary columns hash their bytes).
    """
    names = list(columns)
    full = f"{table.name}{FULL_SUFFIX}"
    typed = [(c, bool(binary)) for c, binary in columns.items()]
    return [
        (table.name, latest_state_sql(stored, names, table.key, pending=pending, truncates=truncates)),
        (full, full_view_sql(table.name, names)),
        (f"{table.name}{CLEAN_SUFFIX}", clean_view_sql(full, typed, table.mask, table.mask_mode, salt)),
    ]


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


def register_latest_state_views(
    spark: SparkSession, lake_dir: LakePath, versions: Mapping[str, int] | None = None, only: Collection[str] | None = None
) -> list[str]:
    """Register `<name>`, `<name>__full_view`, `<name>__clean_view` (and `<name>_history`) for every
    latest-state table in the lake's registry; the physical tables stay reachable as `<...>__stored`.

    Each view is planned for the snapshot it reads: `<name>__stored` is pinned to one version (the one
    `register_lake` registered, given in `versions`, else the current one), and the facts that let the
    SQL skip folding work come from that same version's log, so a commit landing in between can
    neither hide pending changes nor slip past a skipped step.
    """
    names: list[str] = []
    present = lake.lake_tables(lake_dir)
    for table in lake.registered_tables(lake_dir):
        if table.name not in present or (only is not None and table.name not in only):
            continue
        version, snapshot = _pinned(spark, present[table.name], (versions or {}).get(table.name))
        stored = stored_view_name(table.name)
        snapshot.createOrReplaceTempView(lake.quote_identifier(stored))
        names.append(stored)
        pending, truncates = snapshot_facts(present[table.name], version, table.key)
        columns = _columns(snapshot, LS.META_FIELDS)
        statements = latest_state_views(table, columns, stored, salt=mask_salt(table), pending=pending, truncates=truncates)
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
    scalars, shaped = placeholder_forms()
    forms = ", ".join(sql_string(f) for f in sorted(scalars | shaped))
    # Arrival order of a key's events, oldest first (Spark sorts nulls first ascending, last descending).
    order = ("r.position", "r.tx_total_order", "r.ingested_at", "r.kafka_offset", "r.event_id")
    earlier = f"PARTITION BY r.key ORDER BY {', '.join(order)} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW"
    newest_first = f"PARTITION BY r.key ORDER BY {', '.join(c + ' DESC' for c in order)}"
    # Each column's Connect declaration, read once per event, for the columns whose conversion depends on it.
    declared = {name: f"`__decl{i}`" for i, (name, kind) in enumerate(columns.items()) if CS.needs_declaration(kind)}
    decls = "".join(f", {CS.declaration('`__fields`', name)} AS {alias}" for name, alias in declared.items())
    fields = f", from_json(row_schema, {sql_string(CS.ROW_SCHEMA)}).fields AS `__fields`" if declared else ""
    values = []
    for name, kind in columns.items():
        decl = f"r.{declared[name]}" if name in declared else "CAST(NULL AS STRUCT<type: STRING, name: STRING, parameters: MAP<STRING, STRING>>)"
        col, old = f"r._row.{q(name)}", f"r._before.{q(name)}"
        typed = CS.value_sql(kind, col, decl, "r.after", name)
        if name in table.key or not CS.placeholder_possible(kind):
            values.append(f"{typed} AS {q(name)}")
            continue
        text, old_text = CS.raw_text(kind, col), CS.raw_text(kind, old)
        known = (f"CASE WHEN r._row IS NULL THEN named_struct('v', CAST(NULL AS {kind})) "
                 f"WHEN {text} IS NULL OR {text} NOT IN ({forms}) THEN named_struct('v', {typed}) "
                 f"WHEN {old_text} IS NOT NULL AND {old_text} NOT IN ({forms}) THEN named_struct('v', {CS.value_sql(kind, old, decl, 'r.before', name)}) END")
        values.append(f"last_value({known}, true) OVER ({earlier}).v AS {q(name)}")
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
      SELECT *{decls} FROM (
        SELECT *, from_json(after, {struct}) AS _row, from_json(before, {struct}) AS _before{fields}
        FROM {q(RAW)} WHERE table_id = {sql_string(table.source)}
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


def register_consistent_views(spark: SparkSession, lake_dir: LakePath) -> list[str]:
    """`<name>__consistent_view` for every configured table, its columns typed as its latest-state table's
    (the `<name>__stored` view `register_latest_state_views` pinned, so the same snapshot the full view reads)."""
    from pyspark.errors import AnalysisException

    present = lake.lake_tables(lake_dir)
    if not all(name in present for name in (RAW, T.TRANSACTIONS, T.WATERMARK)):
        return []
    names = []
    for table in lake.registered_tables(lake_dir):
        try:
            columns = stored_types(spark.table(lake.quote_identifier(stored_view_name(table.name))).schema.fields)
        except AnalysisException:  # no latest-state table yet
            columns = sampled_types(spark, lake.quote_identifier(RAW), table)
        view = f"{table.name}__consistent_view"
        sql = consistent_view_sql(table, columns, mask_salt(table), dead_letters=DEAD_LETTER in present)
        spark.sql(f"CREATE OR REPLACE TEMPORARY VIEW {lake.quote_identifier(view)} AS {sql}")
        names.append(view)
    return names
