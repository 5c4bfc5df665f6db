"""The whole test bed: Kafka broker, Kafka Connect with Debezium, PostgreSQL, MariaDB and a schema
registry (Apicurio), started together on run-time loopback ports and stopped together.

Start order: the independent set-ups (broker storage format, initdb, mariadb-install-db) run in
parallel; the servers are launched, Connect follows as soon as the broker answers, and every
service is health-checked with a real request before `Stack.start` returns. Any failure stops whatever
had started and raises `TestbedError` (one line)."""

from __future__ import annotations

import atexit
import json
import os
import random
import re
import shutil
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_platform.testbed import install
from cdc_platform.testbed.databases import DATABASE, PASSWORD, USER, MariaDB, Postgres
from cdc_platform.testbed.kafka import MARIADB_CONNECTOR, POSTGRES_CONNECTOR, Broker, Connect
from cdc_platform.testbed.process import HOST, Service, free_ports, group_alive, stop_group
from cdc_platform.testbed.registry import Registry

DIR_ENV = "CDC_TESTBED_DIR"  # parent folder for the fixtures' test beds (default: the system temp dir)
KEEP_ENV = "CDC_TESTBED_KEEP"  # set to 1: leave a test bed's folder (logs, data) behind after stopping


@dataclass
class Stack:
    root: Path
    broker: Broker
    connect: Connect
    postgres: Postgres
    mariadb: MariaDB
    registry: Registry
    timings: dict[str, float] = field(default_factory=dict)
    _die_with_parent: bool = field(default=True, repr=False)
    _stopped: bool = field(default=False, repr=False)
    _stop_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- start -------------------------------------------------------------------------------------------
    @classmethod
    def start(cls, root: Path | None = None, *, die_with_parent: bool = True) -> Stack:
        """Install what is missing, then start every service; `root` (default: a new temp folder) holds
        configs, data and logs. With `die_with_parent` (tests) the servers also die with this process."""
        t0 = time.monotonic()
        programs = install.ensure_installed()
        t_installed = time.monotonic()
        if root is None:
            parent = os.environ.get(DIR_ENV) or None
            if parent:
                Path(parent).mkdir(parents=True, exist_ok=True)
            root = Path(tempfile.mkdtemp(prefix="cdc-testbed-", dir=parent))
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o755)
        broker_port, controller_port, connect_port, pg_port, maria_port, registry_port = free_ports(6)
        broker = Broker(root / "kafka", broker_port, controller_port, java=programs.java)
        stack = cls(
            root=root,
            broker=broker,
            connect=Connect(root / "connect", connect_port, broker.bootstrap, java=programs.java),
            postgres=Postgres(root / "postgres", pg_port, programs.initdb, programs.postgres, user=programs.postgres_user),
            mariadb=MariaDB(root / "mariadb", maria_port, programs.mariadb_install_db, programs.mariadbd, user=programs.mariadb_user),
            registry=Registry(root / "registry", registry_port, java=programs.java),
        )
        stack.timings["install"] = t_installed - t0
        stack._die_with_parent = die_with_parent
        if die_with_parent:
            atexit.register(stack.stop)
        try:
            stack._start(die_with_parent)
        except BaseException:
            stack.stop(keep=True)
            raise
        stack.timings["total"] = time.monotonic() - t0
        return stack

    def _start(self, die_with_parent: bool) -> None:
        t = time.monotonic()
        with ThreadPoolExecutor(max_workers=4) as pool:
            jobs = [pool.submit(s.prepare) for s in (self.broker, self.postgres, self.mariadb, self.connect, self.registry)]
            errors = [job.exception() for job in jobs]
        for error in errors:
            if error is not None:
                raise error
        self.timings["prepare"] = time.monotonic() - t
        # Launched from this thread: a child's parent-death signal follows the thread that forked it.
        t = time.monotonic()
        self.broker.launch(die_with_parent)
        self.postgres.launch(die_with_parent)
        self.mariadb.launch(die_with_parent)
        self.registry.launch(die_with_parent)
        self.broker.wait_ready()
        self.timings["broker"] = time.monotonic() - t
        self.connect.launch(die_with_parent)
        self.postgres.wait_ready()
        self.timings["postgres"] = time.monotonic() - t
        self.mariadb.wait_ready()
        self.timings["mariadb"] = time.monotonic() - t
        self.connect.wait_ready()
        self.timings["connect"] = time.monotonic() - t
        self.registry.wait_ready()
        self.timings["registry"] = time.monotonic() - t

    # -- faults ------------------------------------------------------------------------------------------
    def restart(self, service: str, timeout: float = 120.0, *, kill: bool = False) -> float:
        """Stop one service (its whole process group, politely, or with `kill` by SIGKILL as a crash would)
        and start it again on the same port with the same data; returns the seconds it took. `service`:
        "connect", "broker", "postgres", "mariadb", "registry" (its schemas stay: the store is a file).
        Connect's connectors come back by themselves (distributed mode keeps configs and offsets in Kafka).
        Call from the thread that started the bed (the parent-death signal follows that thread)."""
        part = {"connect": self.connect, "broker": self.broker, "postgres": self.postgres, "mariadb": self.mariadb,
                "registry": self.registry}[service]
        assert part.service is not None
        t = time.monotonic()
        part.service.stop(kill=kill)
        part.launch(self._die_with_parent)
        part.wait_ready(timeout)
        return time.monotonic() - t

    # -- stop --------------------------------------------------------------------------------------------
    def services(self) -> list[Service]:
        return [s for s in (self.connect.service, self.broker.service, self.mariadb.service, self.postgres.service,
                            self.registry.service) if s is not None]

    def stop(self, keep: bool | None = None) -> None:
        """Stop every process group (Connect first, so connectors leave cleanly; then the rest together).
        Idempotent. The folder is removed unless `keep` (default: CDC_TESTBED_KEEP set)."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        if self.connect.service is not None:
            self.connect.service.stop()
        rest = [s for s in (self.broker.service, self.mariadb.service, self.postgres.service, self.registry.service) if s is not None]
        threads = [threading.Thread(target=s.stop) for s in rest]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if keep is None:
            keep = bool(os.environ.get(KEEP_ENV))
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what a user or a test needs -----------------------------------------------------------------------
    def endpoints(self) -> dict[str, str]:
        return {
            "kafka": self.broker.bootstrap,
            "connect": self.connect.url,
            "postgres": self.postgres.url,
            "mariadb": self.mariadb.url,
            "schema_registry": self.registry.url,
        }

    def postgres_connector(self, topic_prefix: str, tables: list[str] | None = None, **overrides: Any) -> dict[str, Any]:
        """Config of Debezium's PostgreSQL connector for this bed (pgoutput, transaction metadata on).

        `tables` are `schema.table` names; its publication is created for exactly those (filtered), owned
        by the connector's user `cdc`. For a publication FOR ALL TABLES pass
        publication_autocreate_mode="all_tables" with database_user="postgres" (the superuser)."""
        slot = re.sub(r"[^a-z0-9_]", "_", topic_prefix.lower())
        config: dict[str, Any] = {
            "connector.class": POSTGRES_CONNECTOR,
            "tasks.max": 1,
            "plugin.name": "pgoutput",
            "database.hostname": HOST,
            "database.port": self.postgres.port,
            "database.user": USER,
            "database.password": PASSWORD,
            "database.dbname": DATABASE,
            "topic.prefix": topic_prefix,
            "slot.name": f"{slot}_slot",
            "publication.name": f"{slot}_publication",
            "publication.autocreate.mode": "filtered",
            "provide.transaction.metadata": "true",
            "snapshot.mode": "initial",
        }
        if tables:
            config["table.include.list"] = ",".join(tables)
        return _override(config, overrides)

    def mariadb_connector(self, topic_prefix: str, tables: list[str] | None = None, **overrides: Any) -> dict[str, Any]:
        """Config of Debezium's MariaDB connector for this bed (binlog reader, transaction metadata on,
        schema history in a Kafka topic of the bed). `tables` are `db.table` names (db is `cdc`)."""
        config: dict[str, Any] = {
            "connector.class": MARIADB_CONNECTOR,
            "tasks.max": 1,
            "database.hostname": HOST,
            "database.port": self.mariadb.port,
            "database.user": USER,
            "database.password": PASSWORD,
            "database.server.id": random.randint(10_000, 4_000_000_000),
            "database.include.list": DATABASE,
            "topic.prefix": topic_prefix,
            "schema.history.internal.kafka.bootstrap.servers": self.broker.bootstrap,
            "schema.history.internal.kafka.topic": f"{topic_prefix}.schema-history",
            "provide.transaction.metadata": "true",
            "snapshot.mode": "initial",
        }
        if tables:
            config["table.include.list"] = ",".join(tables)
        return _override(config, overrides)

    def wait_streaming(self, connector_config: dict[str, Any], timeout: float = 60.0) -> None:
        """After `connect.register`: wait until the connector reads the database's log (PostgreSQL: its
        slot is active; MariaDB: a binlog dump is attached), so a change made now is streamed, not
        snapshotted. (MariaDB's check is "a binlog reader is attached": with two MariaDB connectors
        running, it cannot tell which.)"""
        if connector_config["connector.class"] == POSTGRES_CONNECTOR:
            slot = connector_config["slot.name"]
            assert self.postgres.service is not None
            self.postgres.service.wait_until(lambda: self.postgres.slot_active(slot), f"waiting for slot {slot} to stream", timeout)
        else:
            assert self.mariadb.service is not None
            self.mariadb.service.wait_until(self.mariadb.binlog_dump_active, "waiting for a binlog reader", timeout)

    # -- state for `make stack` (the processes outlive the command that started them) ----------------------
    def to_state(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "endpoints": self.endpoints(),
            "ports": {
                "kafka": self.broker.port,
                "kafka_controller": self.broker.controller_port,
                "connect": self.connect.port,
                "postgres": self.postgres.port,
                "mariadb": self.mariadb.port,
                "schema_registry": self.registry.port,
            },
            "avro_converter": self.registry.avro_converter_config(),
            "services": {s.name: s.state() for s in self.services()},
            "timings": {k: round(v, 1) for k, v in self.timings.items()},
        }


def _override(config: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Keyword overrides with `_` for `.` (snapshot_mode="no_data"); a key with dots via a dict splat."""
    for key, value in overrides.items():
        config[key if "." in key else key.replace("_", ".")] = value
    return config


# -- `python -m cdc_platform.testbed start|status|stop` state file ---------------------------------------
def read_state(state_file: Path) -> dict[str, Any] | None:
    try:
        return json.loads(state_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def state_status(state: dict[str, Any]) -> dict[str, bool]:
    return {name: bool(s.get("pid")) and group_alive(int(s["pid"])) for name, s in state.get("services", {}).items()}


def stop_state(state: dict[str, Any]) -> None:
    """Stop the process groups a state file names: Connect first, then the others together."""
    services = state.get("services", {})

    def stop(name: str) -> None:
        svc = services[name]
        if svc.get("pid"):
            stop_group(int(svc["pid"]), signal.Signals(int(svc.get("stop_signal", signal.SIGTERM))))

    if "kafka connect" in services:
        stop("kafka connect")
    threads = [threading.Thread(target=stop, args=(name,)) for name in services if name != "kafka connect"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
