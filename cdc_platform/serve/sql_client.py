"""The client side of `cdc serve`: find the lake's running server and run a query on it.

Kept apart from `serve` (which starts Spark and registers the catalog) so that `cdc sql` against a running
server imports only this module, the standard library and a small HiveServer2 client: a point lookup's
whole command then costs the query plus ~0.3 s, where the Spark Connect client alone takes ~1 s to import
(it loads pandas, pyarrow and grpc). The query goes to the server's Thrift JDBC/ODBC endpoint (the
HiveServer2 protocol that BI tools and beeline speak) through `impyla`; notebooks keep using Spark
Connect (`connect_query`, or `SparkSession.builder.remote`).
"""

from __future__ import annotations

import getpass
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_platform.spark.processes import log_tail, pid_alive, port_open
from cdc_platform.spark.spark_errors import ServerSideError
from cdc_platform.storage import LakePath, machine_dir

STATE_FILE = "_serve.json"
#: How long one request to the server may take before the client gives up (the query itself runs
#: asynchronously on the server and is polled, so this bounds one poll or one fetch, not the query).
REQUEST_TIMEOUT = 60
#: HiveServer2 hands nested values over as Spark's text of them; these are turned back into values.
_NESTED = {"ARRAY", "MAP", "STRUCT"}


#: Where `cdc sql` takes a login for a server that asks for one (never from a flag: argv is public).
USER_ENV = "CDC_SERVE_USER"
PASSWORD_ENV = "CDC_SERVE_PASSWORD"
#: A PEM file of the certificate (or its CA) that `cdc sql` trusts for a TLS endpoint, when `_serve.json` names none.
CA_ENV = "CDC_SERVE_CA"
_WILDCARD = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class ServerInfo:
    """What `<lake>/_serve.json` says about the server: enough for a client to reach it, and no secret."""

    pid: int
    lake: str
    schema: str
    host: str
    connect_port: int
    jdbc_port: int
    started_at: str
    connect_host: str | None = None
    connect_token: bool = False  # Spark Connect asks for SPARK_CONNECT_AUTHENTICATE_TOKEN
    jdbc_transport: str = "binary"  # HiveServer2's binary or HTTP transport (`http` whenever it checks a login)
    jdbc_auth: str = "none"  # none, password_file, ldap
    tls: bool = False
    cert: str | None = None  # the certificate (PEM) to trust, when `cdc serve --self-signed` made it
    expose: str = "all"

    @property
    def client_host(self) -> str:
        """The address a client on this machine uses (loopback for a server bound to every address)."""
        return "127.0.0.1" if self.host in _WILDCARD else self.host

    @property
    def connect_url(self) -> str:
        host = self.connect_host or self.host
        host = "127.0.0.1" if host in _WILDCARD else host
        if self.connect_token and host in ("127.0.0.1", "::1"):
            host = "localhost"  # pyspark's client sends a token without TLS to `localhost` only
        return f"sc://{host}:{self.connect_port}"

    @property
    def jdbc_url(self) -> str:
        url = f"jdbc:hive2://{self.client_host}:{self.jdbc_port}/{self.schema}"
        if self.jdbc_transport == "http":
            url += ";transportMode=http;httpPath=cliservice"
        return url + (";ssl=true" if self.tls else "")


class ServerUnavailable(Exception):
    """The server could not be used (gone, or no client library installed): the caller runs locally."""


class LoginRefused(Exception):
    """The server refused the login `cdc sql` offered (a wrong user or password): the caller says so and stops."""


def login(info: ServerInfo, environ: dict[str, str] | None = None) -> tuple[str, str]:
    """(user, password) for the server's JDBC endpoint: from CDC_SERVE_USER and CDC_SERVE_PASSWORD when it
    checks a login; ServerUnavailable, saying what to set, when they are missing."""
    env = os.environ if environ is None else environ
    if info.jdbc_auth == "none":
        return env.get(USER_ENV) or getpass.getuser(), "-"
    user, password = env.get(USER_ENV), env.get(PASSWORD_ENV)
    if not user or not password:
        raise ServerUnavailable(f"the server at {info.jdbc_url} asks for a login ({info.jdbc_auth}); set {USER_ENV} and {PASSWORD_ENV} to use it")
    return user, password


#: A lake may have two servers at once, one per exposure: the owners' (`all`) and the analysts' (`clean`).
EXPOSURES = ("all", "clean")


def state_path(lake_dir: LakePath, expose: str = "all") -> Path:
    """The state file of the lake's server of one exposure: `_serve.json` (all), `_serve.clean.json` (clean)."""
    return machine_dir(lake_dir) / (STATE_FILE if expose == "all" else STATE_FILE.replace(".json", f".{expose}.json"))


def read_state(lake_dir: LakePath, expose: str = "all") -> ServerInfo | None:
    """The state file's server, or None when there is none or it is unreadable (a client then runs locally)."""
    try:
        doc = json.loads(state_path(lake_dir, expose).read_text(encoding="utf-8"))
        return ServerInfo(**{k: doc[k] for k in ServerInfo.__dataclass_fields__ if k in doc})
    except (OSError, ValueError, KeyError, TypeError):
        return None


def wait_for_state(lake_dir: LakePath, exited: Callable[[], int | None], log: Path, timeout: float, expose: str = "all") -> ServerInfo:
    """The state a `cdc serve` started in another process writes once it is ready (for scripts, tests and
    benchmarks that start one). `exited` is the process's `poll`; ServerUnavailable, with the tail of its
    `log`, when it exits or `timeout` seconds pass first."""
    deadline = time.monotonic() + timeout
    while (info := read_state(lake_dir, expose)) is None:
        if exited() is not None or time.monotonic() > deadline:
            raise ServerUnavailable(f"cdc serve did not start (exit {exited()}): {log_tail(log, 5)}")
        time.sleep(0.5)
    return info


def find_server(lake_dir: LakePath, expose: str | None = None) -> tuple[ServerInfo | None, str | None]:
    """(the running server for this lake, None) or (None, why there is none to use, or None if none was ever started).

    `expose` None: the owners' server (`all`) when one runs, else the analysts' (`clean`)."""
    why_not: str | None = None
    for kind in (expose,) if expose else EXPOSURES:
        info = read_state(lake_dir, kind)
        if info is None:
            continue
        path = state_path(lake_dir, kind)
        if not pid_alive(info.pid):
            why_not = why_not or f"{path} names a server (pid {info.pid}) that is no longer running"
        elif not port_open(info.jdbc_port, info.client_host):
            why_not = why_not or f"the server of {path} (pid {info.pid}) does not answer on {info.jdbc_url}"
        else:
            return info, None
    return None, why_not


def remote_query(info: ServerInfo, query: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    """(columns, rows) of `query` run by the server over its JDBC/ODBC (HiveServer2) endpoint, in the lake's schema.

    Values come back as the Spark Connect client would give them (nested values as lists and dicts
    where Spark's text of them is JSON). Raises ServerUnavailable when the client library is missing or
    the server does not answer, and `spark_errors.ServerSideError` (Spark's error class and message)
    when the query itself fails.
    """
    try:
        from impala.dbapi import connect
        from impala.error import HiveServer2Error, OperationalError
    except ImportError as exc:
        raise ServerUnavailable(f"the HiveServer2 client is not installed ({exc}); `pip install impyla` to use the server") from exc
    user, password = login(info)
    http = info.jdbc_transport == "http"
    try:
        conn = connect(host=info.client_host, port=info.jdbc_port, auth_mechanism="PLAIN", user=user, password=password,
                       use_http_transport=http, http_path="cliservice" if http else "", use_ssl=info.tls,
                       ca_cert=(info.cert or os.environ.get(CA_ENV)) if info.tls else None,
                       timeout=REQUEST_TIMEOUT, retries=1)  # one attempt: a server that is gone means run locally
        # `use:database` makes the lake's schema current when the session opens: no `USE` round trip.
        cursor = conn.cursor(configuration={"use:database": info.schema})
    except Exception as exc:  # impyla raises thrift's TTransportException, socket errors or its own
        if "401" in str(exc) or "Unauthorized" in str(exc):
            raise LoginRefused(f"the server at {info.jdbc_url} refused the login of {user!r} ({USER_ENV}, {PASSWORD_ENV}); "
                               "check them (the server's log names every failed login)") from None
        raise ServerUnavailable(f"the server at {info.jdbc_url} does not answer ({type(exc).__name__}: {str(exc)[:200]})") from exc
    try:
        try:
            cursor.execute(query)
        except (HiveServer2Error, OperationalError) as exc:
            raise ServerSideError(str(exc)) from None  # the JVM stack of the server's thread says nothing to the user
        description = cursor.description or []
        rows = cursor.fetchall() if description else []
    finally:
        try:
            cursor.close()
            conn.close()
        except Exception:  # noqa: BLE001 - the answer is in hand; a failed goodbye changes nothing
            pass
    columns = [d[0] for d in description]
    nested = [i for i, d in enumerate(description) if str(d[1]).upper() in _NESTED]
    if nested:
        rows = [tuple(_nested_value(v) if i in nested else v for i, v in enumerate(row)) for row in rows]
    return columns, [tuple(r) for r in rows]


def _nested_value(value: Any) -> Any:
    """Spark's text of an array, map or struct as the value it stands for; kept as text when it is not JSON
    (a map with non-string keys prints as `{1:"x"}`)."""
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def query_lake_server(lake_dir: LakePath, query: str, say: Callable[[str], None]) -> tuple[list[str], list[tuple[Any, ...]], ServerInfo] | None:
    """(columns, rows, server) of `query` run on the lake's running `cdc serve` (no Spark start, no registering),
    or None: run it locally.

    A server named in the lake's state file that is gone, does not answer, or cannot be reached for lack
    of its client library is not an error: `say` tells why, and the caller runs the query in a local
    session. A refused login or a failing query is (`QueryError`, with the lake's names when a name was
    unknown).
    """
    from cdc_platform.errors import QueryError
    from cdc_platform.spark import spark_errors

    info, why_not = find_server(lake_dir)
    if info is None:
        if why_not:
            say(f"{why_not}; running the query in a local Spark session")
        return None
    try:
        columns, rows = remote_query(info, query)
    except ServerUnavailable as exc:
        say(f"{exc}; running the query in a local Spark session")
        return None
    except LoginRefused as exc:
        raise QueryError(str(exc)) from None
    except ServerSideError as exc:
        names = table_names(info) if spark_errors.unknown_relation(exc) else []
        raise QueryError(spark_errors.describe(exc, names)) from exc
    return columns, rows, info


def table_names(info: ServerInfo) -> list[str]:
    """The tables and views the server registers under the lake's schema (for suggestions); [] when it cannot say."""
    try:
        _, rows = remote_query(info, f"SHOW TABLES IN `{info.schema}`")
    except Exception:  # noqa: BLE001 - the names only sharpen an error message
        return []
    return [str(r[1]) for r in rows if len(r) > 1]


def connect_query(info: ServerInfo, query: str) -> tuple[list[str], list[tuple[Any, ...]], Any]:
    """(columns, rows, session) of `query` run over Spark Connect, in the lake's schema: what a notebook does.

    Raises ServerUnavailable when the Spark Connect client is missing or the server does not answer.
    """
    try:
        from pyspark.sql import SparkSession
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies("pyspark.sql.connect.session")
    except ImportError as exc:
        raise ServerUnavailable(f"the Spark Connect client is not installed ({exc}); `pip install 'cdc-platform[connect]'` to use it") from exc
    try:
        spark = SparkSession.builder.remote(info.connect_url).getOrCreate()
        spark.sql(f"USE `{info.schema}`")
    except Exception as exc:
        if not _connect_unavailable(exc):
            raise
        raise ServerUnavailable(f"the server at {info.connect_url} does not answer ({type(exc).__name__})") from exc
    df = spark.sql(query)
    rows = [tuple(r) for r in df.collect()]
    return list(df.columns), rows, spark


def _connect_unavailable(exc: BaseException) -> bool:
    text = str(exc)
    return type(exc).__name__ in ("SparkConnectGrpcException", "RpcError", "_InactiveRpcError") and (
        "UNAVAILABLE" in text or "failed to connect" in text.lower() or "Connection refused" in text
    )
