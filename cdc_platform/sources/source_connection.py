"""Reading a source table from the database itself, for coverage against the live source.

Stripe's coverage SLO compares the lake with the source database, not with the lake's own log. The
comparison is only fair for rows the lake could know: so every read here runs inside one consistent
snapshot and returns, beside the rows, the source's log position *at that snapshot*, written in the
lake's position format (`envelope._position`: PostgreSQL LSN, MySQL/MariaDB binlog file index, offset
and row). A lake row at a higher position was changed after the read and is left out of the compare.

Reads go through the ordinary Python drivers (psycopg for PostgreSQL, PyMySQL for MariaDB and MySQL),
installed with the `sources` extra: a check reads one table at a time, a driver needs no JVM artifact
on a cluster, and the snapshot and its position take two statements in the same transaction, which
Spark's JDBC reader cannot do. Credentials come from the environment (`${VAR}` in the config); nothing
of the connection is written to the lake.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cdc_platform.errors import CdcError, ConfigError

#: Database kinds and the Debezium connector whose positions the lake holds for them.
KINDS = {"postgresql": "postgresql", "postgres": "postgresql", "mariadb": "mariadb", "mysql": "mysql"}
DEFAULT_PORTS = {"postgresql": 5432, "mariadb": 3306, "mysql": 3306}
#: How long after a first compare the keys that differed are read again (the stream may only be behind).
DEFAULT_RECHECK_SECONDS = 30.0
_KEYS = {"kind", "host", "port", "database", "user", "password", "recheck_after", "connect_timeout"}
_ENV_REF_RE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_BINLOG_INDEX_RE = re.compile(r"(\d+)$")
#: Rows fetched from the source at a time: what the driver holds of a table while it streams it on.
CHUNK_ROWS = 50_000

#: What a read hands each chunk of rows to, with the columns they have (`read_table_chunks`).
Sink = Callable[[tuple[str, ...], list[tuple[Any, ...]]], None]


class SourceConnectionError(CdcError):
    """The source database named by `source_connection` cannot be reached or read; the message says which
    and what to check (address, credentials, the table's name, the driver)."""


@dataclass(frozen=True)
class SourceConnection:
    """Where the live source is read (`source_connection:` in cdc.yaml)."""

    kind: str  # postgresql | mariadb | mysql (the Debezium connector of the lake's positions)
    host: str
    port: int
    database: str
    user: str
    password: str = field(repr=False)
    recheck_after: float = DEFAULT_RECHECK_SECONDS
    connect_timeout: float = 10.0

    def describe(self) -> str:
        return f"{self.kind}://{self.user}@{self.host}:{self.port}/{self.database}"


@dataclass(frozen=True)
class SourceRead:
    """Rows of one consistent read of a source table (all, or one bucket's share), with the log position it saw."""

    position: str  # in the lake's `_position` format
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]


@dataclass(frozen=True)
class SourceScan:
    """One consistent read of a source table whose rows went to a sink, chunk by chunk: what is left of it."""

    position: str  # in the lake's `_position` format
    columns: tuple[str, ...]
    rows: int  # how many rows the sink was handed


class _SinkFailed(Exception):
    """Internal: the sink raised while a read was under way; its error is raised as it is, not as the source's."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def parse_source_connection(value: Any, where: str, environ: Mapping[str, str] | None = None) -> SourceConnection | None:
    """`source_connection:` of cdc.yaml; user and password must be `${VAR}` references to the environment."""
    if value is None:
        return None
    env = os.environ if environ is None else environ
    entry = f"{where}: source_connection"
    if not isinstance(value, dict):
        raise ConfigError(f"{entry} must be a mapping such as {{kind: postgresql, host: db, database: app, "
                          "user: '${CDC_SOURCE_USER}', password: '${CDC_SOURCE_PASSWORD}'}")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise ConfigError(f"{entry}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}")
    kind = KINDS.get(str(value.get("kind", "")).lower())
    if kind is None:
        raise ConfigError(f"{entry}.kind must be one of postgresql, mariadb, mysql, got {value.get('kind')!r}")
    for required in ("host", "database", "user", "password"):
        if not isinstance(value.get(required), str) or not value[required]:
            raise ConfigError(f"{entry}.{required} is required (a string)")

    def secret(name: str) -> str:
        m = _ENV_REF_RE.match(value[name])
        if m is None:
            raise ConfigError(f"{entry}.{name} must come from the environment, written as '${{VAR}}' (e.g. '${{CDC_SOURCE_{name.upper()}}}'); "
                              "credentials are never kept in the config file")
        if m.group(1) not in env:
            raise ConfigError(f"{entry}.{name} refers to ${{{m.group(1)}}}, which is not set in the environment; export it before starting")
        return env[m.group(1)]

    port = value.get("port", DEFAULT_PORTS[kind])
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise ConfigError(f"{entry}.port must be a TCP port number, got {port!r}")
    numbers = {}
    for name, default in (("recheck_after", DEFAULT_RECHECK_SECONDS), ("connect_timeout", 10.0)):
        n = value.get(name, default)
        if not isinstance(n, (int, float)) or isinstance(n, bool) or n < 0:
            raise ConfigError(f"{entry}.{name} must be a number of seconds, got {n!r}")
        numbers[name] = float(n)
    return SourceConnection(kind=kind, host=value["host"], port=port, database=value["database"], user=secret("user"),
                            password=secret("password"), **numbers)


def pg_lsn_position(lsn: str) -> str:
    """PostgreSQL's `X/Y` LSN text as the lake's position of a change at that LSN (`envelope._position`)."""
    hi, lo = lsn.split("/")
    return f"{(int(hi, 16) << 32) | int(lo, 16):020d}"


def binlog_position(file: str, pos: int) -> str:
    """A binlog file and offset as the lake's position of the first row there (`envelope._position`)."""
    m = _BINLOG_INDEX_RE.search(file)
    return f"{int(m.group(1)) if m else 0:010d}{int(pos):020d}{0:010d}"


def split_name(source_table: str, kind: str, database: str) -> tuple[str, str]:
    """Debezium's `schema.table` (PostgreSQL) or `database.table` (MariaDB/MySQL) as a qualified name."""
    parts = source_table.split(".")
    if len(parts) == 1:
        return ("public" if kind == "postgresql" else database), parts[0]
    return parts[-2], parts[-1]


def quote(name: str, kind: str) -> str:
    if kind == "postgresql":
        return '"' + name.replace('"', '""') + '"'
    return "`" + name.replace("`", "``") + "`"


def _key_filter(key: Sequence[str], n: int, kind: str, mark: str) -> str:
    cols = ", ".join(quote(k, kind) for k in key)
    one = "(" + ", ".join([mark] * len(key)) + ")"
    return f" WHERE ({cols}) IN ({', '.join([one] * n)})"


@contextmanager
def connect(conn: SourceConnection, *, read_only: bool = True) -> Iterator[Any]:
    """A DB-API connection to the source, its session in UTC: read-only REPEATABLE READ on PostgreSQL unless
    `read_only` is false (the repair writes its signals through it); autocommit off."""
    try:
        if conn.kind == "postgresql":
            import psycopg

            with psycopg.connect(host=conn.host, port=conn.port, dbname=conn.database, user=conn.user, password=conn.password,
                                 connect_timeout=max(1, int(conn.connect_timeout)), options="-c TimeZone=UTC") as c:
                if read_only:
                    c.isolation_level, c.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
                yield c
        else:
            import pymysql

            c = pymysql.connect(host=conn.host, port=conn.port, database=conn.database, user=conn.user, password=conn.password,
                                connect_timeout=max(1, int(conn.connect_timeout)), autocommit=False, init_command="SET time_zone = '+00:00'")
            try:
                yield c
            finally:
                c.close()
    except ImportError as e:
        raise SourceConnectionError(f"reading {conn.kind} needs its Python driver ({e.name}): pip install 'cdc-platform[sources]'") from e


def read_table_chunks(conn: SourceConnection, source_table: str, sink: Sink, key: Sequence[str] = (),
                      key_values: Sequence[Sequence[Any]] | None = None, *, chunk_rows: int = CHUNK_ROWS) -> SourceScan:
    """Every row of `source_table` (or only those whose key is in `key_values`), handed to `sink` at most
    `chunk_rows` at a time while the read's transaction stays open, with the log position of the snapshot
    they were read in. PostgreSQL: REPEATABLE READ, whose snapshot is taken by the first statement, which
    also reads `pg_current_wal_lsn()`. MariaDB/MySQL: `START TRANSACTION WITH CONSISTENT SNAPSHOT` and the
    binlog position of that snapshot (MariaDB's `binlog_snapshot_*`). Both stream from the server (a
    server-side cursor, an unbuffered one), so a table of any size passes through one chunk at a time.

    The database's errors become `SourceConnectionError`; the sink's own errors are raised as they are.
    """
    if key_values is not None and not key_values:
        return SourceScan("", (), 0)
    schema, table = split_name(source_table, conn.kind, conn.database)
    name = f"{quote(schema, conn.kind)}.{quote(table, conn.kind)}"
    mark = "%s"
    where = _key_filter(key, len(key_values), conn.kind, mark) if key_values is not None else ""
    params = [v for row in key_values for v in row] if key_values is not None else []

    def guarded(columns: tuple[str, ...], chunk: list[tuple[Any, ...]]) -> None:
        try:
            sink(columns, chunk)
        except BaseException as error:
            raise _SinkFailed(error) from error

    try:
        with connect(conn) as c:
            if conn.kind == "postgresql":
                return _read_postgres(c, name, where, params, guarded, chunk_rows)
            return _read_binlog_source(c, name, where, params, guarded, chunk_rows)
    except _SinkFailed as failed:
        raise failed.error from None
    except SourceConnectionError:
        raise
    except Exception as e:  # the driver's own errors: one line naming the source and the table
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SourceConnectionError(f"cannot read {source_table} from {conn.describe()}: {first}; "
                                    "check source_connection in the config and the credentials in its environment variables") from e


def _stream(cur: Any, columns: tuple[str, ...], sink: Sink, chunk_rows: int) -> int:
    """Every row the cursor's statement returns, to the sink in chunks; how many there were."""
    n = 0
    while True:
        chunk = [tuple(bytes(v) if isinstance(v, memoryview) else v for v in row) for row in cur.fetchmany(chunk_rows)]
        if not chunk:
            return n
        n += len(chunk)
        sink(columns, chunk)


def _read_postgres(c: Any, name: str, where: str, params: list[Any], sink: Sink, chunk_rows: int) -> SourceScan:
    # The first statement of the REPEATABLE READ transaction takes its snapshot, and reads the LSN with it.
    (lsn,) = c.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    with c.cursor(name="cdc_coverage") as cur:  # server-side: rows stream in batches, not all at once
        cur.execute(f"SELECT * FROM {name}{where}", params)
        columns = tuple(d.name for d in cur.description or ())
        n = _stream(cur, columns, sink, chunk_rows)
    c.rollback()
    return SourceScan(pg_lsn_position(lsn), columns, n)


def _read_binlog_source(c: Any, name: str, where: str, params: list[Any], sink: Sink, chunk_rows: int) -> SourceScan:
    import pymysql.cursors

    with c.cursor() as cur:
        cur.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
        cur.execute("SHOW STATUS LIKE 'binlog_snapshot_%'")  # MariaDB: the binlog position of this very snapshot
        status = dict(cur.fetchall())
        if "Binlog_snapshot_file" not in status:  # MySQL has no such status: the position right after the snapshot
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
            status = {"Binlog_snapshot_file": row[0], "Binlog_snapshot_position": row[1]} if row else {}
        if not status.get("Binlog_snapshot_file"):
            raise SourceConnectionError("the source has no binary log (log_bin is off), so its rows cannot be placed against the lake's "
                                        "binlog positions; Debezium needs log_bin=ON and binlog_format=ROW anyway")
    with c.cursor(pymysql.cursors.SSCursor) as cur:  # unbuffered: the rows stream from the server as they are fetched
        cur.execute(f"SELECT * FROM {name}{where}", params)
        columns = tuple(d[0] for d in cur.description or ())
        n = _stream(cur, columns, sink, chunk_rows)
    c.rollback()
    return SourceScan(binlog_position(status["Binlog_snapshot_file"], int(status["Binlog_snapshot_position"])), columns, n)


def column_types(conn: SourceConnection, source_table: str) -> dict[str, str]:
    """Each column of `source_table` with its type as `information_schema.columns.data_type` names it (lower case);
    empty when the table is not there (or not visible to the user)."""
    schema, table = split_name(source_table, conn.kind, conn.database)
    try:
        with connect(conn) as c, c.cursor() as cur:
            cur.execute("SELECT column_name, data_type FROM information_schema.columns WHERE table_schema = %s AND table_name = %s",
                        (schema, table))
            found = {str(name): str(kind).lower() for name, kind in cur.fetchall()}
            c.rollback()
            return found
    except SourceConnectionError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SourceConnectionError(f"cannot read the columns of {source_table} from {conn.describe()}: {first}; "
                                    "check source_connection in the config and the credentials in its environment variables") from e


def current_position(conn: SourceConnection) -> str:
    """The source's log position now, in the lake's position format: every change committed from now on, and every
    row an incremental snapshot emits from now on, is placed at or above it (PostgreSQL: `pg_current_wal_lsn()`;
    MariaDB/MySQL: the end of the binary log, `SHOW MASTER STATUS`)."""
    try:
        with connect(conn) as c, c.cursor() as cur:
            if conn.kind == "postgresql":
                cur.execute("SELECT pg_current_wal_lsn()::text")
                (lsn,) = cur.fetchone()
                c.rollback()
                return pg_lsn_position(lsn)
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
            c.rollback()
    except SourceConnectionError:
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SourceConnectionError(f"cannot read the log position of {conn.describe()}: {first}; check source_connection in the config") from e
    if not row:
        raise SourceConnectionError("the source has no binary log (log_bin is off), so its rows cannot be placed against the lake's "
                                    "binlog positions; Debezium needs log_bin=ON and binlog_format=ROW anyway")
    return binlog_position(row[0], int(row[1]))
