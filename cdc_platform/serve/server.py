"""`cdc serve`: one long-lived Spark for the lake that owns its catalog and answers SQL from other processes.

Why one service rather than a shared metastore database: Spark's embedded metastore (Derby) admits one
process, and a metastore on PostgreSQL would need a database server, a JDBC driver pyspark does not
ship, and every process (the stream, Dagster, each `cdc sql`) to start Spark with Hive support and keep
the views in step with schema changes while racing each other. Here one process registers the lake
(`catalog.register_catalog`) in its own in-memory catalog, re-registers it when the lake's tables or
schemas change (`catalog.lake_fingerprint`, polled), and others reach it through the two endpoints
pyspark ships:

* Spark Connect (gRPC), for notebooks: `SparkSession.builder.remote("sc://host:port")`;
* the Spark Thrift server (HiveServer2 protocol), for JDBC/ODBC clients and `cdc sql`: `jdbc:hive2://host:port/<schema>`.

The catalog lives as long as the server: the lake (its Delta logs and `_cdc_registry.json`) is the
persistent record, and each start registers it again from there. Both endpoints listen on loopback
unless `serve.host` says otherwise, which needs a login on both (`security`: Spark Connect's token, a
password file or LDAP for JDBC, TLS); `serve.expose: clean` registers only the masked views.

The server writes `<lake>/_serve.json` (pid, schema, ports) once both endpoints answer, and removes it
when it stops; `cdc sql` reads it (`sql_client`) to find the server, and falls back to a local session when the file
is missing or names a server that is gone.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from cdc_platform import lake
from cdc_platform.config_serve import CONNECT_TOKEN_ENV, ServeConfig
from cdc_platform.views.catalog import lake_fingerprint, register_catalog, warm_up_sql
from cdc_platform.errors import ServeError
from cdc_platform.spark.processes import HOST, port_open
from cdc_platform.serve import security
from cdc_platform.serve.sql_client import ServerInfo, find_server, read_state, state_path
from cdc_platform.storage import LakePath, is_remote, machine_dir

#: The server's own files (warehouse folder, Hive scratch space): in the lake's private area, or on this machine
#: for a lake on an object store (`storage.machine_dir`).
WORK_DIR = "_serve"
#: Spark Connect's and HiveServer2's usual ports, so clients' defaults work.
DEFAULT_CONNECT_PORT = 15002
DEFAULT_JDBC_PORT = 10000
#: How often the server checks the lake for new tables and changed schemas (seconds).
DEFAULT_POLL_INTERVAL = 5.0
#: How long to wait for both endpoints to accept connections after Spark started.
READY_TIMEOUT = 120.0
_THRIFT = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


def port_free(port: int, host: str = HOST) -> bool:
    """True when a server could listen on host:port now (a port in TIME_WAIT counts as free, as servers reuse it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(host: str, ports: Mapping[str, int]) -> None:
    """Refuse, before Spark starts, ports that are taken (or equal): one line naming the port and the flag to change."""
    if len(set(ports.values())) != len(ports):
        raise ServeError(f"the ports must differ, got {', '.join(f'{flag} {port}' for flag, port in ports.items())}")
    for flag, port in ports.items():
        if not 0 < port < 65536:
            raise ServeError(f"{flag} must be a TCP port from 1 to 65535, got {port}")
        if not port_free(port, host):
            raise ServeError(f"port {port} on {host} is in use (another `cdc serve`, or another program): stop it or pass another {flag}")


def server_conf(serve: ServeConfig, connect_port: int, jdbc_port: int, work_dir: Path) -> dict[str, str]:
    """Spark settings for the server's session: Spark Connect as a plugin, the Thrift server's address,
    transport, login check and TLS (`security.thrift_conf`). No secret is a setting (`security.apply_to_jvm`).

    The platform's jars (delta-spark, and the login check's) also go on the driver's class path: the Thrift
    server runs its sessions on threads whose class loader does not see `spark.jars`, and Delta's catalog
    class must load there (without it every JDBC connection fails with ClassNotFoundException DeltaCatalog).
    """
    from cdc_platform.spark.session import platform_jars

    scratch = work_dir / "hive-scratch"
    jars = [str(jar) for jar in platform_jars()] + ([str(security.AUTH_JAR)] if serve.jdbc_auth != "none" else [])
    return {
        "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
        "spark.connect.grpc.binding.address": serve.connect_address,
        "spark.connect.grpc.binding.port": str(connect_port),
        **security.thrift_conf(serve, jdbc_port),
        "spark.hadoop.hive.exec.scratchdir": str(scratch),
        "spark.hadoop.hive.exec.local.scratchdir": str(scratch / "local"),
        "spark.hadoop.hive.downloaded.resources.dir": str(scratch / "resources"),
        "spark.sql.warehouse.dir": str(work_dir / "warehouse"),
        "spark.driver.extraClassPath": os.pathsep.join(jars),
    }


def _reachable(host: str) -> str:
    """The address this machine reaches a server bound to `host` at: loopback for a wildcard address."""
    return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


class Server:
    """The serving process's state: its Spark session, the Thrift server, the names it registered."""

    def __init__(
        self,
        lake_dir: LakePath,
        schema: str,
        *,
        serve: ServeConfig | None = None,
        connect_port: int = DEFAULT_CONNECT_PORT,
        jdbc_port: int = DEFAULT_JDBC_PORT,
        master: str | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        progress: Callable[[str], None] = lambda _: None,
        warm_up: bool = True,
    ) -> None:
        self.lake_dir = lake_dir.resolve()
        self.schema = schema
        self.serve = serve or ServeConfig(host=HOST)
        self.host = self.serve.host
        self.connect_port = connect_port
        self.jdbc_port = jdbc_port
        self.master = master
        self.poll_interval = poll_interval
        self.progress = progress
        #: Whether `start` runs `warm_up` in the background once the server is ready (`cdc serve --no-warm-up`: not).
        self.warm_up_on_start = warm_up
        self.spark: Any = None
        self.thrift: Any = None
        self.names: list[str] = []
        self.fingerprint: str | None = None
        self.info: ServerInfo | None = None
        #: The certificate (PEM) clients trust, when `--self-signed` made the keystore; `_serve.json` names it.
        self.cert: Path | None = None

    def start(self) -> ServerInfo:
        """Start Spark with both endpoints, register the catalog, and write the state file once both answer."""
        from cdc_platform.spark.session import get_spark

        if not self.lake_dir.is_dir():
            raise ServeError(f"lake directory {self.lake_dir} does not exist; run `cdc run` first or pass the right --lake/--config")
        running, _ = find_server(self.lake_dir, self.serve.expose)
        if running is not None:
            raise ServeError(f"a server (pid {running.pid}) already serves this lake at {running.connect_url} (expose: {running.expose}); "
                             f"stop it first (Ctrl-C, or kill {running.pid})")
        found = security.resolve_secrets(self.serve)
        security.check_exposure(self.serve, found)  # before any socket opens
        if self.serve.connect_address == self.host:
            check_ports(self.host, {"--connect-port": self.connect_port, "--jdbc-port": self.jdbc_port})
        else:
            check_ports(self.serve.connect_address, {"--connect-port": self.connect_port})
            check_ports(self.host, {"--jdbc-port": self.jdbc_port})
        work_dir = machine_dir(self.lake_dir) / WORK_DIR
        for folder in ("warehouse", "hive-scratch/local", "hive-scratch/resources"):  # Hive logs an error per session without them
            (work_dir / folder).mkdir(parents=True, exist_ok=True)
        if found.connect_token is not None:
            os.environ[CONNECT_TOKEN_ENV] = found.connect_token  # Spark's server reads it from the environment it inherits
        self.progress(f"starting Spark ({self.master or 'local[2]'}) with Spark Connect on {self.serve.connect_address}:{self.connect_port} "
                      f"({'token required' if found.connect_token else 'no token'}) ...")
        self.spark = get_spark("cdc-serve", master=self.master, conf=server_conf(self.serve, self.connect_port, self.jdbc_port, work_dir),
                               object_store=is_remote(self.lake_dir))
        self.refresh(force=True)
        transport = security.jdbc_transport(self.serve)
        tls = self.serve.keystore is not None
        self.progress(f"starting the Thrift JDBC/ODBC server on {self.host}:{self.jdbc_port} ({transport} transport, "
                      f"login: {self.serve.jdbc_auth}, {'TLS' if tls else 'no TLS'}) ...")
        security.apply_to_jvm(self.spark, self.serve, found)
        jvm = self.spark.sparkContext._jvm
        self.thrift = getattr(jvm, _THRIFT).startWithContext(self.spark._jsparkSession.sqlContext())
        self._wait_ready()
        self.info = ServerInfo(
            pid=os.getpid(), lake=str(self.lake_dir), schema=self.schema, host=self.host, connect_port=self.connect_port,
            jdbc_port=self.jdbc_port, started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            connect_host=self.serve.connect_address, connect_token=found.connect_token is not None, jdbc_transport=transport,
            jdbc_auth=self.serve.jdbc_auth, tls=tls, cert=str(self.cert) if self.cert else None, expose=self.serve.expose,
        )
        lake.write_json_atomic(state_path(self.lake_dir, self.serve.expose), asdict(self.info))
        if self.warm_up_on_start:
            threading.Thread(target=self.warm_up, name="cdc-serve-warm-up", daemon=True).start()
        return self.info

    def warm_up(self) -> float | None:
        """Run `catalog.warm_up_sql`'s lookup once, so a user's first query meets a warm JVM and Delta's state
        read (`cdc serve` starts it in the background once ready: clients are not held back by it); its seconds,
        or None when there was nothing to run or it failed. A failure is reported and changes nothing: the
        server keeps serving, and the user's own first query is merely as slow as it would have been."""
        sql = warm_up_sql(self.lake_dir, self.schema, self.names)
        if sql is None or self.spark is None:
            return None
        t0 = time.monotonic()
        try:
            self.spark.sql(sql).collect()
        except Exception as exc:  # noqa: BLE001 - a warm-up that fails leaves the server as it was
            if self.spark is not None:  # not while stopping: Spark's shutdown fails the query, and that is no news
                first = str(exc).splitlines()[0] if str(exc) else ""
                self.progress(f"warm-up query failed (the server keeps serving): {type(exc).__name__}: {first[:300]}")
            return None
        seconds = time.monotonic() - t0
        self.progress(f"warmed up in {seconds:.1f} s: {sql}")
        return seconds

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        for port, what, host in ((self.connect_port, "Spark Connect", self.serve.connect_address), (self.jdbc_port, "the Thrift JDBC/ODBC server", self.host)):
            while not port_open(port, _reachable(host)):
                if time.monotonic() > deadline:
                    raise ServeError(f"{what} did not start listening on {host}:{port} within {READY_TIMEOUT:.0f} s; run with --verbose and check Spark's log")
                time.sleep(0.2)

    def refresh(self, force: bool = False) -> bool:
        """Register the catalog again when the lake changed (new table, new column, new registry); True if it did."""
        fingerprint = lake_fingerprint(self.lake_dir)
        if not force and fingerprint == self.fingerprint:
            return False
        self.names = register_catalog(self.spark, self.lake_dir, self.schema, previous=self.names, progress=self.progress,
                                      expose=self.serve.expose)
        self.fingerprint = fingerprint
        return True

    def serve_forever(self, stop: threading.Event, timeout: float | None = None) -> None:
        """Keep the catalog current until `stop` is set (or `timeout` seconds pass).

        A failed refresh (say a table caught mid-creation) is reported and retried at the next poll: the
        endpoints keep serving the catalog as it was.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not stop.is_set():
            wait = self.poll_interval if deadline is None else min(self.poll_interval, max(0.0, deadline - time.monotonic()))
            if stop.wait(wait) or (deadline is not None and time.monotonic() >= deadline):
                return
            try:
                self.refresh()
            except Exception as exc:  # noqa: BLE001 - the server outlives one bad poll; the next one retries
                self.progress(f"catalog refresh failed, keeping the previous catalog and retrying: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    def stop(self) -> None:
        """Remove the state file (if it is ours), stop the Thrift server and Spark (and with it Spark Connect)."""
        from cdc_platform.spark.session import stop_spark

        current = read_state(self.lake_dir, self.serve.expose)
        if current is not None and current.pid == os.getpid():
            state_path(self.lake_dir, self.serve.expose).unlink(missing_ok=True)
        # Ctrl-C in a terminal (or a signal to the process group) reaches Spark's JVM too, which may be gone
        # by now; stopping is then already done, and a dead py4j gateway is no error of the user's.
        if self.thrift is not None:
            try:
                self.thrift.stop()
            except Exception:  # noqa: BLE001 - stopping anyway; Spark's stop below ends its threads
                pass
            self.thrift = None
        if self.spark is not None:
            try:
                stop_spark()
            except Exception:  # noqa: BLE001 - see above
                pass
            self.spark = None
