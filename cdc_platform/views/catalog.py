"""The lake in a catalog: every table and view registered once, by name, under one schema (database).

`views.register_lake` gives one session temporary views, re-registered by every process that wants
them; nobody else can see them. This module registers the same names in the session's catalog,
as external Delta tables and persistent views, so that every session of the Spark that owns the
catalog (`cdc serve`: its Spark Connect clients and its JDBC/ODBC clients) reads `<schema>.<name>`
without this project's code.

What a name means is the same as in `views.py`:

* a platform table (`raw_change_events`, `dead_letter`, ...) is the Delta table of its directory;
* a latest-state table's directory is storage, not the table: merge-on-read layers (`_layer` base and
  delta) that only the folding SQL turns into the current state. So the directory is registered as
  `<name>__stored` (as Databricks names the storage behind an `APPLY CHANGES` target), and `<name>`,
  `<name>__full_view`, `<name>__clean_view` (and `<name>_history`, `<name>__consistent_view`) are views.

The views are persistent, so they are planned for any future snapshot: the folding SQL keeps its
delta-layer and truncate parts (`pending=True, truncates=True`), which the temporary views may skip
for the one snapshot they pin. Tables are read at their latest version when a query is planned, and
a new column shows in a table at once; a view's column list is fixed when it is created, so
`lake_fingerprint` tells the owner when to register again (a new table, a changed schema, a changed
registry).

What is registered is `expose`: `all` (every name above) or `clean`, for a server that analysts
reach: only `<name>__clean_view` and `<name>__consistent_view`. Their inputs (the storage, the folded
state, the full view, the raw log and the transaction tables) get no name in the catalog at all: each
clean view is one statement whose inputs are common table expressions over the Delta directories
(`delta.`<location>``), built from the same SQL as the `all` views, so a query that names the raw log,
a full view, a history or a `__stored` table fails as not found. That is a scope of names, not a
sandbox: Spark lets any client of its endpoints read a Delta directory by its path and call Java
through `reflect` (README, "Serving SQL").
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING

from cdc_platform import lake
from cdc_platform.stages import latest_state as LS
from cdc_platform.stages import transactions as T
from cdc_platform.config import CATALOG_SCHEMA_RE, mask_salt
from cdc_platform.errors import ConfigError, LakeError
from cdc_platform.lake.lake_spark import location as location_of
from cdc_platform.lake.lake_spark import sql_string
from cdc_platform.stages.stage import DEAD_LETTER, RAW
from cdc_platform.storage import LakePath
from cdc_platform.views import tail as TV
from cdc_platform.views import consistent_view_sql, sampled_types, stored_view_name
from cdc_platform.views.latest_state_sql import history_sql, latest_state_views
from cdc_platform.views.outbox_sql import latest_event_sql, latest_view_name
from cdc_platform.stages.outbox import event_tables

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

q = lake.quote_identifier


def storage_names(lake_dir: LakePath) -> dict[str, str]:
    """Lake directory name -> catalog name of its Delta table: `<name>__stored` for latest-state storage."""
    present = lake.lake_tables(lake_dir)
    stored: set[str] = set()
    for table in lake.registered_tables(lake_dir):
        stored.add(table.name)
        if table.history:
            stored.add(table.history_name)
    return {name: stored_view_name(name) if name in stored else name for name in present}


def _free_for_view(spark: SparkSession, schema: str, name: str) -> None:
    """Drop the catalog entry of an external table named like a view about to be made: a table's
    directory registered before the lake's registry said it is latest-state storage (its views' name
    is the table's own). Only the entry goes; the data stays at its location, now as `<name>__stored`."""
    if spark.catalog.tableExists(f"{schema}.{name}") and spark.catalog.getTable(f"{schema}.{name}").tableType == "EXTERNAL":
        spark.sql(f"DROP TABLE IF EXISTS {q(schema)}.{q(name)}")


def lake_fingerprint(lake_dir: LakePath) -> str:
    """A digest that changes when the catalog must be registered again.

    It covers the registry (tables, keys, masks), the set of table directories, and the schema of every
    Delta table (from its newest metadata, via delta-rs: no Spark job), and the latest-state fold's mark
    (where the views' raw-log tail starts). Other data commits that keep the schema do not change it:
    registered tables read their latest version anyway.
    """
    digest = hashlib.sha256()
    digest.update(json.dumps(lake.read_registry(lake_dir), sort_keys=True).encode())
    digest.update(str(lake.applied_through(lake_dir, LS.STAGE)).encode())  # the latest-state views' tail starts there
    for name, path in sorted(lake.lake_tables(lake_dir).items()):
        digest.update(name.encode())
        try:
            digest.update(lake.open_table(path).schema().to_json().encode())
        except (LakeError, OSError):  # a table being created right now: its next poll sees it whole
            digest.update(b"?")
    return digest.hexdigest()


def _check_schema(schema: str) -> None:
    if not CATALOG_SCHEMA_RE.match(schema):
        raise ConfigError(f"catalog schema {schema!r} is not a usable name: lower-case letters, digits and _, starting with a letter")


#: What a server registers: every table and view, or only the masked ones (`serve.expose` in cdc.yaml).
EXPOSE_ALL = "all"
EXPOSE_CLEAN = "clean"
EXPOSE_CHOICES = (EXPOSE_ALL, EXPOSE_CLEAN)


def path_relation(location: str) -> str:
    """A Delta directory as a relation in SQL, with no name in the catalog."""
    return f"delta.{q(location)}"


def inlined(sql: str, inputs: Sequence[tuple[str, str]]) -> str:
    """`sql` with each (name, SQL) of `inputs` defined before it as a common table expression: the names it
    reads resolve to those definitions (a CTE shadows the catalog), so none of them needs to be registered."""
    ctes = ",\n".join(f"{q(name)} AS (\n{body.strip()}\n)" for name, body in inputs)
    return f"WITH {ctes}\nSELECT * FROM (\n{sql.strip()}\n)"


def warm_up_sql(lake_dir: LakePath, schema: str, names: Collection[str]) -> str | None:
    """A lookup through one latest-state view of the catalog that runs the view's whole plan and reads next to
    nothing, or None when the catalog holds no such view.

    Why: a new server's first query pays for the JIT's cold code and Delta's first reconstruction of each table's
    state; on the demo's lake a full-view lookup took 11.9 s as the first query against 3.9-5.3 s after it
    (`benchmarks/point_lookup.py`, its `first`). `cdc serve` runs this once in the background when it is ready, so
    a user's first query meets a warm server. The key IS NULL matches no stored row but a truncate's marker, so
    the stored table's statistics skip most files; the table's raw-log tail is what is read. Through the clean
    view (`expose: clean`) the filter is the same: a key column is never masked (the config refuses it).
    """
    for table in lake.registered_tables(lake_dir):
        for view in (f"{table.name}__full_view", f"{table.name}__clean_view"):
            if view in names:
                where = " AND ".join(f"{q(k)} IS NULL" for k in table.key)
                return f"SELECT * FROM {q(schema)}.{q(view)} WHERE {where}"
    return None


def register_catalog(
    spark: SparkSession, lake_dir: LakePath, schema: str, previous: Collection[str] = (), progress: Callable[[str], None] | None = None,
    expose: str = EXPOSE_ALL,
) -> list[str]:
    """Register every table and view of the lake under `schema` in this session's catalog; return the names.

    Idempotent: tables are created if missing and views replaced, so calling it again after the lake
    changed brings the catalog up to date. Names of `previous` (what the last call returned) that the lake
    no longer has are dropped; nothing else is, so a view a user created in the schema stays, and a table
    is only ever dropped from the catalog, never its data (every table here is external, at its location). Leaves the session's current schema set to `schema`: the persistent views' SQL names their
    inputs unqualified, and Spark resolves those in the schema that was current when the view was created.
    With `expose="clean"` only the clean and consistent views are registered, their inputs inlined (module doc).
    """
    import pyarrow as pa

    _check_schema(schema)
    if expose not in EXPOSE_CHOICES:
        raise ConfigError(f"expose must be one of {', '.join(EXPOSE_CHOICES)}, got {expose!r}")
    clean = expose == EXPOSE_CLEAN
    if not lake_dir.is_dir():
        raise LakeError(f"lake directory {lake_dir} does not exist; run `cdc run` first or pass the right --lake")
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {q(schema)} COMMENT {sql_string(f'cdc-platform lake {lake_dir}')}")
    spark.sql(f"USE {q(schema)}")
    present = lake.lake_tables(lake_dir)
    names: list[str] = []
    locations: dict[str, str] = {}  # catalog name of a table -> its location
    for directory, name in storage_names(lake_dir).items():
        locations[name] = location_of(present[directory])  # a bucket's S3A options are set on the way
        if not clean:
            spark.sql(f"CREATE TABLE IF NOT EXISTS {q(schema)}.{q(name)} USING delta LOCATION {sql_string(locations[name])}")
            names.append(name)
    views: list[tuple[str, str]] = []
    stored_types: dict[str, dict[str, str]] = {}  # table -> source column -> Spark type, for its consistent view
    # The fold's mark, read before the views are made: a view made with an older mark reads more of the raw
    # log's tail than it needs (never less), so the serve's refresh makes them again as the mark moves on.
    mark = lake.applied_through(lake_dir, LS.STAGE)
    # An `expose: clean` server registers no tables, so its views read the raw log by its path.
    raw = (path_relation(locations[RAW]) if clean else f"{q(schema)}.{q(RAW)}") if RAW in locations else None
    dead = (path_relation(locations[DEAD_LETTER]) if clean else f"{q(schema)}.{q(DEAD_LETTER)}") if DEAD_LETTER in locations else None
    for table in lake.registered_tables(lake_dir):
        if table.name not in present:
            continue
        columns = LS.source_columns(pa.schema(lake.open_table(present[table.name]).schema().to_arrow()))
        stored_types[table.name] = {name: LS.type_name(kind) for name, kind in columns.items()}
        types = stored_types[table.name]
        tail = TV.tail_sql(table, types, raw, mark, dead) if RAW in present and all(k in types for k in table.key) else None
        state = latest_state_views(table, columns, stored_view_name(table.name), mask_salt(table), pending=True, truncates=True,
                                   tail=tail, types=types)
        if clean:
            stored = stored_view_name(table.name)
            *inputs, (view, sql) = state
            views.append((view, inlined(sql, [(stored, f"SELECT * FROM {path_relation(locations[stored])}"), *inputs])))
            continue
        views += state
        if table.history and table.history_name in present:
            hschema = pa.schema(lake.open_table(present[table.history_name]).schema().to_arrow())
            hcols = LS.source_columns(hschema, LS.HISTORY_META)
            views.append((table.history_name, history_sql(stored_view_name(table.history_name), list(hcols), table.key)))
    if all(name in present for name in (RAW, T.TRANSACTIONS, T.WATERMARK)):
        raw_inputs = [(name, f"SELECT * FROM {path_relation(locations[name])}") for name in (RAW, T.TRANSACTIONS, T.WATERMARK, DEAD_LETTER)
                      if name in locations]
        for table in lake.registered_tables(lake_dir):
            raw = path_relation(locations[RAW]) if clean else f"{q(schema)}.{q(RAW)}"
            types = stored_types.get(table.name) or sampled_types(spark, raw, table)
            sql = consistent_view_sql(table, types, mask_salt(table), dead_letters=DEAD_LETTER in present)
            views.append((f"{table.name}__consistent_view", inlined(sql, raw_inputs) if clean else sql))
    if not clean:  # event tables are not masked: an `expose: clean` server shows none of them
        for name in sorted(event_tables(lake_dir)):
            if name in present:
                columns = [f.name for f in lake.open_table(present[name]).schema().to_arrow()]
                views.append((latest_view_name(name), latest_event_sql(f"{q(schema)}.{q(name)}", columns)))
    for view, sql in views:
        _free_for_view(spark, schema, view)
        spark.sql(f"CREATE OR REPLACE VIEW {q(schema)}.{q(view)} AS {sql}")
        names.append(view)
    stale = sorted(set(previous) - set(names))
    for name in stale:
        if not spark.catalog.tableExists(f"{schema}.{name}"):
            continue
        kind = spark.catalog.getTable(f"{schema}.{name}").tableType
        if kind in ("VIEW", "EXTERNAL"):
            spark.sql(f"DROP {'VIEW' if kind == 'VIEW' else 'TABLE'} IF EXISTS {q(schema)}.{q(name)}")
    if progress is not None:
        dropped = f", dropped {', '.join(stale)}" if stale else ""
        scope = " (expose: clean, the masked views only)" if clean else ""
        progress(f"catalog: {len(names)} tables and views under `{schema}`{scope}{dropped}")
    return names
