"""The latest-state views' SQL, in one place: `<name>`, `<name>__full_view`, `<name>__clean_view`, `<name>_history`.

Pure text: no Spark, no lake. `views` registers these for a session and `views.catalog` in a catalog; both
plan them over the stored table (`<name>__stored`) and, for `<name>`, the raw log's tail (`views.tail`).
Identifiers are always backtick-quoted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cdc_platform import lake
from cdc_platform.config import TableConfig
from cdc_platform.views import tail as TV


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


def latest_state_sql(stored: str, columns: Sequence[str], key: Sequence[str], *, pending: bool = True, truncates: bool = True,
                     tail: TV.TailSql | None = None, types: Mapping[str, str] | None = None) -> str:
    """The current state with tombstones: base and delta layers (and the raw log's tail) folded by the highest
    `_position` per key.

    One window over both layers picks each key's newest row. At an equal position the distinct event
    that arrived later wins, and a copy of a stored event counts as that event's first arrival, so a
    redelivery changes nothing (`ordering`: the same rule as compaction; base rows were appended before
    every delta row, so a base row is never a later arrival). A truncate marker (key columns null, `_op`
    t) turns every row below its position into a tombstone.

    `tail` (`views.tail.tail_sql`, with `types`, each column's Spark type) adds the raw log's events
    the fold has not taken yet, as rows of the same shape: they take part in the same window, after every
    stored row of their key, and a column an event left out (Debezium's placeholder) takes the key's newest
    earlier value from a second window over the same partitions.

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
    ctes: list[str] = []
    source = q(stored)
    marks = f"{q(stored)} WHERE `_op` = 't' AND {_keys_present(key, present=False)}"
    # A key's rows in the order they arrived: stored rows by `_seq`, the tail's after them by `_tail_order` (`views.tail`).
    arrived, first = "`_seq` ASC", "min(`_seq`)"
    # One shuffle by the key serves both windows (the first alone would partition by all three columns)...
    spread = f" DISTRIBUTE BY {_cols(key)}"
    if tail is not None:
        pending = truncates = True
        holes = TV.placeholder_columns({c: (types or {}).get(c, "string") for c in columns}, key)
        ctes.append(f"`__rows` AS (\n{_with_tail(stored, columns, key, tail.rows, types or {}, holes)}\n)")
        source = "`__rows`"
        # The truncate markers come from a union of their own, not from `__rows`: Spark keeps a CTE read twice
        # (InlineCTE) and pushes no filter into it, so a lookup by key would fold every key (3-5 s on the demo's
        # lake against 0.3 s for the stored table); read once each, the key's filter reaches the stored table's files.
        # The tail's side is its markers alone (`TailSql.markers`), not a second copy of its typed rows.
        meta = _cols(["_position", *_MARKER_META])
        marks = f"(SELECT {meta} FROM {marks} UNION ALL SELECT {meta} FROM (\n{tail.markers}\n))"
        rows = [*rows, TV.TAIL_ORDER]
        arrived = f"`_seq` ASC, {q(TV.TAIL_ORDER)} ASC"
        first = f"min(named_struct('s', `_seq`, 'o', {q(TV.TAIL_ORDER)}))"
        if holes:  # ...unless `__rows`' own window (the placeholders' earlier values) has shuffled by the key already
            spread = ""
    if pending:
        ctes.append(f"""`__folded` AS (
  SELECT {_cols(rows)} FROM (
    SELECT {_cols(rows)}, row_number() OVER (PARTITION BY {_cols(key)} ORDER BY `_position` DESC, `__first` DESC, {arrived}) AS `__rank`
    FROM (
      SELECT {_cols(rows)}, {first} OVER (PARTITION BY {_cols(key)}, `_position`, `_event_id`) AS `__first`
      FROM (SELECT {_cols(rows)} FROM {source} WHERE {_keys_present(key)}{spread})
    )
  ) WHERE `__rank` = 1
)""")
    else:
        ctes.append(f"""`__folded` AS (
  SELECT {_cols(rows)} FROM {q(stored)} WHERE `_layer` = 'base' AND {_keys_present(key)}
)""")
    if not truncates:
        return f"WITH {', '.join(ctes)}\nSELECT {_cols([*columns, *STATE_META])} FROM `__folded`"
    cut = "f.`_position` < t.`_position`"
    out = [f"f.{q(c)}" if c in key else f"CASE WHEN {cut} THEN NULL ELSE f.{q(c)} END AS {q(c)}" for c in columns]
    out += [f"CASE WHEN {cut} THEN 't' ELSE f.`_op` END AS `_op`", f"CASE WHEN {cut} THEN true ELSE f.`_deleted` END AS `_deleted`",
            f"CASE WHEN {cut} THEN t.`_position` ELSE f.`_position` END AS `_position`"]
    out += [f"CASE WHEN {cut} THEN t.{q(c)} ELSE f.{q(c)} END AS {q(c)}" for c in _MARKER_META]
    marker = ", ".join(["max(`_position`) AS `_position`", *(f"max_by({q(c)}, `_position`) AS {q(c)}" for c in _MARKER_META)])
    ctes.append(f"""`__truncate` AS (
  SELECT {marker} FROM {marks}
)""")
    return f"""
WITH {', '.join(ctes)}
SELECT {', '.join(out)}
FROM `__folded` f CROSS JOIN `__truncate` t
"""


def _with_tail(stored: str, columns: Sequence[str], key: Sequence[str], tail: str, types: Mapping[str, str], holes: Sequence[str]) -> str:
    """The stored rows and the tail's, one shape; placeholder columns of tail rows (`holes`) filled from the key's earlier rows."""
    rows = [*columns, *STATE_META, "_seq"]
    order = q(TV.TAIL_ORDER)
    stored_order = f"CAST(NULL AS {TV.TAIL_ORDER_TYPE}) AS {order}"
    if not holes:
        return f"SELECT {_cols(rows)}, {stored_order} FROM {q(stored)}\nUNION ALL\nSELECT {_cols(rows)}, {order} FROM (\n    {tail}\n)"
    known = [TV.known_column(i) for i in range(len(holes))]
    stored_known = [f"CASE WHEN `_deleted` THEN named_struct('v', CAST(NULL AS {types[n]})) ELSE named_struct('v', {q(n)}) END AS {k}"
                    for n, k in zip(holes, known)]
    union = (f"SELECT {_cols(rows)}, {stored_order}, {', '.join(stored_known)} FROM {q(stored)}\n"
             f"  UNION ALL\n  SELECT {_cols(rows)}, {order}, {', '.join(known)} FROM (\n    {tail}\n  )")
    filled = {n: f"(last_value({k}, true) OVER `__earlier`).v AS {q(n)}" for n, k in zip(holes, known)}
    select = [filled.get(c, q(c)) for c in columns] + [q(m) for m in (*STATE_META, "_seq", TV.TAIL_ORDER)]
    return (f"SELECT {', '.join(select)} FROM (\n  {union}\n)\n"
            f"WINDOW `__earlier` AS (PARTITION BY {_cols(key)} ORDER BY `_position`, `_seq`, {order} ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)")


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
            f"SELECT {''.join(q(c) + ', ' for c in columns)}`_op`, `_position` AS `_valid_from_position`, `_source_ts` AS `_valid_from_ts`, "
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
    table: TableConfig, columns: Mapping[str, bool], stored: str, salt: bytes | None, *, pending: bool = True, truncates: bool = True,
    tail: TV.TailSql | None = None, types: Mapping[str, str] | None = None,
) -> list[tuple[str, str]]:
    """(view name, SQL) for `<name>`, `<name>__full_view` and `<name>__clean_view`, in dependency order.

    `columns` maps source column names to whether the column is binary (binary columns hash their bytes);
    `tail` and `types` add the raw log's not-yet-folded events (`latest_state_sql`).
    """
    names = list(columns)
    full = f"{table.name}{FULL_SUFFIX}"
    typed = [(c, bool(binary)) for c, binary in columns.items()]
    return [
        (table.name, latest_state_sql(stored, names, table.key, pending=pending, truncates=truncates, tail=tail, types=types)),
        (full, full_view_sql(table.name, names)),
        (f"{table.name}{CLEAN_SUFFIX}", clean_view_sql(full, typed, table.mask, table.mask_mode, salt)),
    ]
