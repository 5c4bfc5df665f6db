"""The lake's driver-side reads through delta-rs, and the registry.

Every table is written through delta-spark (`lake_spark`, the stages, maintenance; a new local table's empty
first commit is delta-rs's, `lake_spark.ensure_table`). What stays here
are the reads a driver answers without a Spark job: a table's version and application transactions
(`already_committed`), its log statistics (rows, files, newest times) for checks, sensors and asset
metadata, and small tables the stages hold on the driver (the transaction state). delta-rs answers
those in milliseconds where a Spark job costs 0.3-2.5 s (README, "Which Delta library, and why").
It reads the tables delta-spark writes as long as they use no feature it lacks; the platform's own
tables are standard Delta tables, and a reader here that meets one it cannot open (a latest-state
table whose odd column names turned on column mapping, say) falls back to Spark.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from cdc_platform.config import LAKE_NAME_RE, PlatformConfig, TableConfig
from cdc_platform.errors import LakeError
from cdc_platform.storage import LakePath, delta_rs_options, ensure_dir, is_remote

REGISTRY_FILE = "_cdc_registry.json"
REGISTRY_VERSION = 1
_DELTA_LOG = "_delta_log"


def newest(*times: dt.datetime | None) -> dt.datetime | None:
    """The latest of some times that may be missing (None when all are)."""
    return max((t for t in times if t is not None), default=None)


def table_path(lake: LakePath, name: str) -> LakePath:
    """The directory of a lake table; refuses any name that could escape the lake."""
    if not LAKE_NAME_RE.match(name):
        raise LakeError(f"{name!r} is not a valid lake table name (lower-case letters, digits, _)")
    path = (lake / name).resolve()
    if path.parent != lake.resolve():
        raise LakeError(f"table {name!r} would resolve outside the lake {lake}")
    return path


def exists(path: LakePath) -> bool:
    if is_remote(path):  # one listing instead of two: there are no directories to ask about first
        return DeltaTable.is_deltatable(str(path), storage_options=delta_rs_options(path))
    return (path / _DELTA_LOG).is_dir() and DeltaTable.is_deltatable(str(path))


#: `appends_from_version_zero` reads at most this many commits (a young table's log); an older log says False.
#: On an object store each commit is a request of its own, so fewer: there the snapshot's listing job costs less.
YOUNG_LOG_COMMITS = 200
YOUNG_REMOTE_LOG_COMMITS = 10


def _commit_file(path: LakePath, version: int) -> LakePath:
    """The log file of the table's commit `version` (Delta names each by its zero-padded number)."""
    return path / _DELTA_LOG / f"{version:020d}.json"


def appends_from_version_zero(path: LakePath, most: int | None = None) -> bool:
    """Whether the table's log still holds every commit from version 0 (at most `most` of them) and none removed a file.

    Then a Delta stream that starts at version 0 (`startingVersion`) reads exactly the rows a stream starting
    from the current snapshot reads, without the snapshot's file listing (a Spark job with a sort; half a
    second per source on a new lake, where every `cdc run` of a test or the demo starts its stage queries).
    A removed file (a compaction, a restore) makes it False: its rows would be read from commits whose files
    a vacuum may have deleted; a missing commit (log cleanup) too. Any doubt answers False, the safe side.
    """
    if most is None:
        most = YOUNG_REMOTE_LOG_COMMITS if is_remote(path) else YOUNG_LOG_COMMITS
    log = path / _DELTA_LOG
    try:
        versions = sorted(int(p.name[:20]) for p in log.iterdir() if len(p.name) == 25 and p.name.endswith(".json") and p.name[:20].isdigit())
        if not versions or len(versions) > most or versions != list(range(len(versions))):
            return False
        for version in versions:
            for line in _commit_file(path, version).read_text(encoding="utf-8").splitlines():
                if line.strip() and "remove" in json.loads(line):
                    return False
    except (OSError, ValueError):
        return False
    return True


class _Handles(threading.local):
    """This thread's open tables: path -> (table, version, stamp of that version's log file)."""

    def __init__(self) -> None:
        self.tables: OrderedDict[str, tuple[DeltaTable, int, tuple[int, int] | None]] = OrderedDict()


_HANDLES = _Handles()
_MAX_HANDLES = 64


def _log_stamp(path: LakePath, version: int) -> tuple[int, int] | None:
    """None for a table on an object store: a HEAD request per open would cost what the kept handle saves,
    so those tables are opened afresh each time (no handle is trusted without its stamp)."""
    if is_remote(path):
        return None
    try:
        st = _commit_file(path, version).stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def open_table(path: LakePath) -> DeltaTable:
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
            table = DeltaTable(key, storage_options=delta_rs_options(path))
        except TableNotFoundError as exc:
            _HANDLES.tables.pop(key, None)
            raise LakeError(f"{path} is not a Delta table; run `cdc run` first to create the lake") from exc
    version = table.version()
    _HANDLES.tables[key] = (table, version, _log_stamp(path, version))
    _HANDLES.tables.move_to_end(key)
    while len(_HANDLES.tables) > _MAX_HANDLES:
        _HANDLES.tables.popitem(last=False)
    return table


def open_snapshot(path: LakePath, version: int) -> DeltaTable:
    """The table at exactly `version` (a reader's pinned snapshot); the kept handle when it is there."""
    table = open_table(path)
    return table if table.version() == version else DeltaTable(str(path), version=version, storage_options=delta_rs_options(path))


def add_actions(table: DeltaTable) -> pa.Table:
    """A snapshot's data files with their partition values and statistics (`partition.<col>`, `min.<col>`, ...)."""
    return pa.table(table.get_add_actions(flatten=True))


def row_count(path: LakePath) -> int | None:
    """The table's rows from its log alone (the sum of its files' `numRecords`), or None when the log cannot say
    (a file written without statistics; deletion vectors, which a file's count does not subtract; a table
    delta-rs cannot read).

    Milliseconds through delta-rs, against ~0.7 s for Spark's `count(*)` of a small table (its snapshot, file
    skipping and count jobs): `cdc demo` counts a dozen tables that way after the pipeline."""
    import pyarrow.compute as pc

    try:
        table = open_table(path)
        if "deletionVectors" in (table.protocol().reader_features or []):
            return None
        actions = add_actions(table)
    except DeltaError:  # a table feature delta-rs cannot read: Spark counts it
        return None
    if actions.num_rows == 0:
        return 0
    if "num_records" not in actions.column_names or actions.column("num_records").null_count:
        return None
    return int(pc.sum(actions.column("num_records")).as_py())


def column_max(path: LakePath, column: str, where: tuple[str, str] | None = None) -> Any:
    """The largest value of a column from file statistics (None for an empty table or missing stats), over the
    files of one partition value when `where` is (partition column, value)."""
    import pyarrow.compute as pc

    actions = add_actions(open_table(path))
    name = f"max.{column}"
    if actions.num_rows == 0 or name not in actions.column_names:
        return None
    values = actions.column(name)
    if where is not None:
        partition = f"partition.{where[0]}"
        if partition not in actions.column_names:
            return None
        values = values.filter(pc.equal(actions.column(partition), where[1]))
    found = pc.max(values).as_py()
    if isinstance(found, dt.datetime) and found.tzinfo is None:
        found = found.replace(tzinfo=dt.timezone.utc)
    return found


def applied_through(lake: LakePath, query: str) -> dt.datetime | None:
    """How far a stage query has applied the raw log (`stage_progress.applied_through`, the newest `ingested_at`
    of the raw-log rows it has taken), from file statistics; None before its first batch or without the table."""
    path = table_path(lake, "stage_progress")
    if not exists(path):
        return None
    found = column_max(path, "applied_through", ("query", query))
    return found if isinstance(found, dt.datetime) else None


def app_id(query_id: str, table: str) -> str:
    return f"{query_id}:{table}"


def already_committed(table: DeltaTable, application: str, version: int) -> bool:
    recorded = table.transaction_version(application)
    return recorded is not None and recorded >= version


def scan(
    table: DeltaTable,
    columns: list[str],
    where: Any = None,
    partitions: list[tuple[str, str, Any]] | None = None,
) -> pa.Table:
    """Columns of a table's snapshot, filtered by `where` (a pyarrow expression over `columns`).

    Files written by delta-rs MERGE (lakes from before the write path moved to delta-spark) have
    `string_view` string columns while the table schema says `string`; a pyarrow dataset filter bound
    to one fails on fragments of the other ("no kernel matching input types (string, string_view)").
    So the filter runs in memory, after the scan has cast every file to the table schema; `partitions`
    (partition columns are not in the files) is pushed down.
    """
    data = table.to_pyarrow_dataset(partitions=partitions).to_table(columns=columns)
    return data if where is None else data.filter(where)


def lake_tables(lake: LakePath) -> dict[str, LakePath]:
    """Every Delta table directly under the lake, by name."""
    if is_remote(lake):  # one listing of `*/_delta_log` instead of two requests per entry
        logs = lake.glob(f"*/{_DELTA_LOG}")
        return {log.parent.name: log.parent for log in sorted(logs, key=str) if not log.parent.name.startswith(("_", "."))}
    if not lake.is_dir():
        return {}
    found = {}
    for child in sorted(lake.iterdir()):
        if child.is_dir() and not child.name.startswith(("_", ".")) and (child / _DELTA_LOG).is_dir():
            found[child.name] = child
    return found


# --- Registry -------------------------------------------------------------------------------------

def write_registry(config: PlatformConfig, extra: Mapping[str, Any] | None = None) -> LakePath:
    """Record what a reader needs to register the lake's tables and views without the config file."""
    ensure_dir(config.lake)
    current = read_registry(config.lake)
    tables = {t["name"]: t for t in current.get("tables", [])}
    for t in config.tables:
        tables[t.name] = t.to_registry()
    content = {"version": REGISTRY_VERSION, "tables": [tables[n] for n in sorted(tables)], **(extra or {})}
    return write_json_atomic(config.lake / REGISTRY_FILE, content)


def write_json_atomic(path: LakePath, content: Any) -> LakePath:
    """Write JSON beside the target and rename it over, so a reader never sees half a file.

    On an object store a PUT is atomic already (a reader sees the old object or the new one), and a
    rename would be a copy: the file is written in place there."""
    if is_remote(path):
        path.write_text(json.dumps(content, indent=2, sort_keys=True), encoding="utf-8")
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}-")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(content, fh, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return path


def read_registry(lake: LakePath) -> dict[str, Any]:
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


def registered_tables(lake: LakePath) -> tuple[TableConfig, ...]:
    return tuple(TableConfig.from_registry(e) for e in read_registry(lake).get("tables", []))


def quote_identifier(name: str) -> str:
    """Backtick-quote an identifier for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"

