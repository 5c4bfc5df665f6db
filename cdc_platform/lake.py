"""The lake's delta-rs side: the stages' writes (until they move to delta-spark, issue 10), the
exactly-once guard, driver-side reads of the log's statistics, and the registry.

Spark reads every table through delta-spark (`lake_spark.read`), and maintenance runs OPTIMIZE and
VACUUM there. delta-rs writes standard Delta tables (protocol 1/2, no column mapping, no deletion
vectors) that delta-spark reads as they are, and keeps writing them after delta-spark's OPTIMIZE and
VACUUM, which change neither protocol nor features.

Exactly once: every commit of the streaming job carries a Delta application transaction
(`<query id>:<table>`, version = micro-batch id). delta-rs records it but does not refuse a repeated or
lower version, so `commit_once` checks the recorded version first. That check and the commit are not
atomic, hence the rule: one writer per application id (one stream per lake).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError

from cdc_platform.config import LAKE_NAME_RE, PlatformConfig, TableConfig
from cdc_platform.errors import LakeError, retry_conflicts

REGISTRY_FILE = "_cdc_registry.json"
REGISTRY_VERSION = 1
_DELTA_LOG = "_delta_log"


def newest(*times: dt.datetime | None) -> dt.datetime | None:
    """The latest of some times that may be missing (None when all are)."""
    return max((t for t in times if t is not None), default=None)


def table_path(lake: Path, name: str) -> Path:
    """The directory of a lake table; refuses any name that could escape the lake."""
    if not LAKE_NAME_RE.match(name):
        raise LakeError(f"{name!r} is not a valid lake table name (lower-case letters, digits, _)")
    path = (lake / name).resolve()
    if path.parent != lake.resolve():
        raise LakeError(f"table {name!r} would resolve outside the lake {lake}")
    return path


def exists(path: Path) -> bool:
    return (path / _DELTA_LOG).is_dir() and DeltaTable.is_deltatable(str(path))


def ensure_table(path: Path, schema: pa.Schema, partition_by: list[str] | None = None) -> DeltaTable:
    """Create an empty table if it is missing, so readers and `cdc sql` see it before any data lands.

    An existing table gets the nullable columns of `schema` it lacks (`add_missing_columns`): a lake
    created by an earlier version keeps working when a platform table gains a column.
    """
    if not exists(path):
        path.mkdir(parents=True, exist_ok=True)
        try:
            DeltaTable.create(str(path), schema, mode="ignore", partition_by=partition_by)
        except DeltaError:
            if not exists(path):  # a concurrent creator won; anything else is a real error
                raise
    table = DeltaTable(str(path))
    return add_missing_columns(path, table, schema)


def add_missing_columns(path: Path, table: DeltaTable, schema: pa.Schema) -> DeltaTable:
    """Add the columns of `schema` that `table` lacks, as one metadata commit; rows already written read them as null.

    Only nullable columns can be added this way (old rows have no value); a missing non-nullable one
    means the lake and this version disagree about more than an added column.
    """
    present = {f.name for f in pa.schema(table.schema().to_arrow())}
    missing = [f for f in schema if f.name not in present]
    if not missing:
        return table
    required = [f.name for f in missing if not f.nullable]
    if required:
        raise LakeError(
            f"{path} lacks the required column(s) {', '.join(required)} of this version of the platform; "
            "it was written by another version: rebuild the lake from its sources"
        )
    from deltalake import Field

    try:
        table.alter.add_columns([Field.from_arrow(f) for f in missing])
    except DeltaError:  # a concurrent setup added them first: fine when they are there now
        table = DeltaTable(str(path))
        if {f.name for f in missing} - {f.name for f in pa.schema(table.schema().to_arrow())}:
            raise
    return DeltaTable(str(path))


class _Handles(threading.local):
    """This thread's open tables: path -> (table, version, stamp of that version's log file)."""

    def __init__(self) -> None:
        self.tables: OrderedDict[str, tuple[DeltaTable, int, tuple[int, int] | None]] = OrderedDict()


_HANDLES = _Handles()
_MAX_HANDLES = 64


def _log_stamp(path: Path, version: int) -> tuple[int, int] | None:
    try:
        st = (path / "_delta_log" / f"{version:020d}.json").stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def open_table(path: Path) -> DeltaTable:
    """The table at its latest version, from this thread's handle when there is one.

    Opening a table replays its log from the last checkpoint (up to 100 commits); a streaming batch
    opens each table several times, and that replay was the largest fixed cost of a small batch
    (17 ms an open at 40 commits, 15 opens a batch). A kept handle only reads the commits that came
    after it. It is kept per thread (handles are mutable) and trusted only while the log file of the
    version it holds is the one it read (same mtime and size): a table deleted and created again at
    the same path, or a log cleaned up under it, gets a fresh open. Callers must treat the handle as
    "latest", not as a pinned snapshot: the next `open_table` of the same path moves it forward.
    """
    key = str(path)
    cached = _HANDLES.tables.get(key)
    table: DeltaTable | None = None
    if cached is not None:
        handle, version, stamp = cached
        current = handle.version()
        if stamp is not None and _log_stamp(path, version) == stamp and (current == version or _log_stamp(path, current) is not None):
            try:
                handle.update_incremental()
                table = handle
            except DeltaError:
                table = None
    if table is None:
        try:
            table = DeltaTable(key)
        except TableNotFoundError as exc:
            _HANDLES.tables.pop(key, None)
            raise LakeError(f"{path} is not a Delta table; run `cdc run` first to create the lake") from exc
    version = table.version()
    _HANDLES.tables[key] = (table, version, _log_stamp(path, version))
    _HANDLES.tables.move_to_end(key)
    while len(_HANDLES.tables) > _MAX_HANDLES:
        _HANDLES.tables.popitem(last=False)
    return table


def open_snapshot(path: Path, version: int) -> DeltaTable:
    """The table at exactly `version` (a reader's pinned snapshot); the kept handle when it is there."""
    table = open_table(path)
    return table if table.version() == version else DeltaTable(str(path), version=version)


def app_id(query_id: str, table: str) -> str:
    return f"{query_id}:{table}"


def already_committed(table: DeltaTable, application: str, version: int) -> bool:
    recorded = table.transaction_version(application)
    return recorded is not None and recorded >= version


def commit_props(application: str | None, version: int | None, **metadata: Any) -> CommitProperties:
    txns = [Transaction(app_id=application, version=version)] if application is not None and version is not None else None
    return CommitProperties(app_transactions=txns, custom_metadata={k: str(v) for k, v in metadata.items()} or None, max_commit_retries=20)


def with_retries(action: Callable[[], Any], *, what: str, attempts: int = 8) -> Any:
    """`errors.retry_conflicts` for delta-rs's conflicts (`CommitFailedError`), e.g. a backfill vs the stream."""
    return retry_conflicts(action, (CommitFailedError,), what=what, attempts=attempts)


def _guarded(application: str | None, version: int | None) -> bool:
    return application is not None and version is not None


def append_once(
    path: Path, data: pa.Table, application: str | None, version: int | None, partition_by: list[str] | None = None, **metadata: Any
) -> bool:
    """Append `data` unless this application already committed `version`; True when it committed.

    Without an application id the append is unguarded (for writes that have no batch id, such as a
    running stream's idle-time expiries); `metadata` goes into the commit's custom metadata.
    """
    table = open_table(path)
    if data.num_rows == 0 or (_guarded(application, version) and already_committed(table, application, version)):  # type: ignore[arg-type]
        return False
    with_retries(
        lambda: write_deltalake(open_table(path), data, mode="append", partition_by=partition_by,
                                commit_properties=commit_props(application, version, **metadata)),
        what=f"append to {path.name}",
    )
    return True


def overwrite_once(path: Path, data: pa.Table, application: str | None, version: int | None, **metadata: Any) -> bool:
    """Replace the table's contents unless this application already committed `version` (small state tables)."""
    if _guarded(application, version) and already_committed(open_table(path), application, version):  # type: ignore[arg-type]
        return False
    with_retries(
        lambda: write_deltalake(open_table(path), data, mode="overwrite", commit_properties=commit_props(application, version, **metadata)),
        what=f"overwrite {path.name}",
    )
    return True


def insert_new_once(
    path: Path,
    data: pa.Table,
    id_column: str,
    partition_column: str,
    application: str,
    version: int,
    range_column: str | None = None,
) -> int | None:
    """MERGE-insert rows whose id is not in the table yet; None when this batch was already committed.

    The predicate names the partitions the batch touches as literals, so delta-rs prunes every other
    partition. Within a partition the join would still read every file's ids, so a batch costs as much
    as the partition is large (0.11 s at 100k rows, 0.74 s at 1M for 10k new rows). `range_column`
    names a column that the id determines (the source position: equal ids have equal positions), and
    the batch's min/max of it become literal bounds too; delta-rs then skips every file whose column
    statistics lie outside them, and a batch of new positions reads only recent files (0.05 s at 1M).
    Bounds are left out when the batch has nulls in the column; the MERGE is then as before, slower
    but exact.
    """
    table = open_table(path)
    if already_committed(table, application, version):
        return None
    if data.num_rows == 0:
        return 0  # nothing to record: a replay of an empty batch writes nothing either
    values = sorted({v for v in data.column(partition_column).to_pylist() if v is not None})
    literals = ", ".join(f"'{v.isoformat()}'" for v in values)
    conditions = [f"t.{partition_column} IN ({literals})"] if literals else []
    if range_column is not None:
        conditions += _range_conditions(data, range_column)
    predicate = " AND ".join([*conditions, f"t.{id_column} = s.{id_column}"])

    def merge() -> dict[str, Any]:
        return (
            open_table(path)
            .merge(source=data, predicate=predicate, source_alias="s", target_alias="t", commit_properties=commit_props(application, version))
            .when_not_matched_insert_all()
            .execute()
        )

    metrics = with_retries(merge, what=f"merge into {path.name}")
    return int(metrics.get("num_target_rows_inserted", 0))


def delta_string(value: str) -> str:
    """A string literal in a delta-rs predicate (DataFusion SQL): quotes doubled, nothing else special."""
    return "'" + value.replace("'", "''") + "'"


def _range_conditions(data: pa.Table, column: str) -> list[str]:
    """`t.col >= lo AND t.col <= hi` over a string column, or nothing when it has nulls (not exact then)."""
    values = data.column(column)
    if values.null_count:
        return []
    bounds = pc.min_max(values).as_py()
    return [f"t.{column} >= {delta_string(bounds['min'])}", f"t.{column} <= {delta_string(bounds['max'])}"]


def scan(
    table: DeltaTable,
    columns: list[str],
    where: Any = None,
    partitions: list[tuple[str, str, Any]] | None = None,
) -> pa.Table:
    """Columns of a table's snapshot, filtered by `where` (a pyarrow expression over `columns`).

    delta-rs MERGE writes parquet files whose string columns are `string_view`, while the table schema
    says `string`; a pyarrow dataset filter bound to one fails on fragments of the other ("no kernel
    matching input types (string, string_view)"). So the filter runs in memory, after the scan has cast
    every file to the table schema; `partitions` (partition columns are not in the files) is pushed down.
    """
    data = table.to_pyarrow_dataset(partitions=partitions).to_table(columns=columns)
    return data if where is None else data.filter(where)


def lake_tables(lake: Path) -> dict[str, Path]:
    """Every Delta table directly under the lake, by name."""
    if not lake.is_dir():
        return {}
    found = {}
    for child in sorted(lake.iterdir()):
        if child.is_dir() and not child.name.startswith(("_", ".")) and (child / _DELTA_LOG).is_dir():
            found[child.name] = child
    return found


# --- Registry -------------------------------------------------------------------------------------

def write_registry(config: PlatformConfig, extra: Mapping[str, Any] | None = None) -> Path:
    """Record what a reader needs to register the lake's tables and views without the config file."""
    config.lake.mkdir(parents=True, exist_ok=True)
    current = read_registry(config.lake)
    tables = {t["name"]: t for t in current.get("tables", [])}
    for t in config.tables:
        tables[t.name] = t.to_registry()
    content = {"version": REGISTRY_VERSION, "tables": [tables[n] for n in sorted(tables)], **(extra or {})}
    return write_json_atomic(config.lake / REGISTRY_FILE, content)


def write_json_atomic(path: Path, content: Any) -> Path:
    """Write JSON beside the target and rename it over, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(content, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def read_registry(lake: Path) -> dict[str, Any]:
    path = lake / REGISTRY_FILE
    if not path.is_file():
        return {}
    try:
        content = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise LakeError(f"{path} is not valid JSON ({exc}); rerun `cdc run --config ...` to rewrite it") from exc
    if content.get("version", 0) > REGISTRY_VERSION:
        raise LakeError(f"{path} was written by a newer cdc-platform (registry version {content['version']}); upgrade")
    return content


def registered_tables(lake: Path) -> tuple[TableConfig, ...]:
    return tuple(TableConfig.from_registry(e) for e in read_registry(lake).get("tables", []))


def quote_identifier(name: str) -> str:
    """Backtick-quote an identifier for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"

