"""PostgreSQL (logical replication on) and MariaDB (row binlog, GTIDs) from Debian's packages, each a
fresh cluster in a folder of the test bed, on a loopback port, run as the package's system user when
this process is root (neither server runs as root).

Each database gets the user `cdc` (password `cdc`) and a database `cdc` it owns; that is what the
Debezium connectors and the tests use. PostgreSQL's `cdc` has REPLICATION; its superuser `postgres`
(password `postgres`) can create publications FOR ALL TABLES. MariaDB's `cdc` has all privileges."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_platform.testbed.errors import TestbedError
from cdc_platform.testbed.process import HOST, Service, port_open, run

USER = "cdc"
PASSWORD = "cdc"
DATABASE = "cdc"


def _hand_over(path: Path, user: str | None) -> None:
    """Create `path` for `user` and check that user can reach it (every parent must be searchable)."""
    path.mkdir(parents=True, exist_ok=True)
    if user is None:
        return
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)
    probe = subprocess.run(["test", "-w", str(path)], user=user, check=False)
    if probe.returncode != 0:
        raise TestbedError(
            f"test bed: user {user!r} cannot write {path} (a parent folder is not searchable by others); "
            "put the bed elsewhere: CDC_TESTBED_DIR=/tmp/... for the tests, "
            "`python -m cdc_platform.testbed start --dir /tmp/...` instead of make stack"
        )


@dataclass
class Postgres:
    root: Path
    port: int
    initdb: str
    postgres: str
    user: str | None = None  # OS user to run as
    service: Service | None = None

    superuser = "postgres"
    superuser_password = "postgres"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def dsn(self, user: str = USER, password: str = PASSWORD, dbname: str = DATABASE) -> str:
        return f"host={HOST} port={self.port} user={user} password={password} dbname={dbname}"

    @property
    def url(self) -> str:
        return f"postgresql://{USER}:{PASSWORD}@{HOST}:{self.port}/{DATABASE}"

    def prepare(self) -> None:
        _hand_over(self.root, self.user)
        pwfile = self.root / "pwfile"
        pwfile.write_text(self.superuser_password + "\n", encoding="utf-8")
        if self.user:
            entry = pwd.getpwnam(self.user)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        run(
            [
                self.initdb, "-D", str(self.data), "-U", self.superuser, f"--pwfile={pwfile}",
                "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync",
            ],
            self.root / "initdb.log",
            user=self.user,
            what="PostgreSQL initdb",
            timeout=120,
        )
        pwfile.unlink()

    def launch(self, die_with_parent: bool = True) -> None:
        # SIGINT: PostgreSQL's fast shutdown (SIGTERM would wait for clients such as Debezium to leave).
        self.service = Service("postgresql", self.root / "postgres.log", stop_signal=signal.SIGINT)
        settings = {
            "listen_addresses": HOST,
            "port": self.port,
            "unix_socket_directories": str(self.root),
            "wal_level": "logical",
            "max_wal_senders": 10,
            "max_replication_slots": 10,
            "shared_buffers": "64MB",
            "max_connections": 60,
            "fsync": "off",  # a test bed: an OS crash is not among its faults
            "full_page_writes": "off",
            "logging_collector": "off",
            "log_min_messages": "warning",
            "timezone": "UTC",
        }
        cmd = [self.postgres, "-D", str(self.data)]
        for key, value in settings.items():
            cmd += ["-c", f"{key}={value}"]
        self.service.launch(cmd, user=self.user, cwd=self.root, die_with_parent=die_with_parent)

    def connect(self, user: str = USER, password: str = PASSWORD, dbname: str = DATABASE, autocommit: bool = True) -> Any:
        import psycopg

        return psycopg.connect(self.dsn(user, password, dbname), autocommit=autocommit, connect_timeout=5)

    def _answers(self) -> bool:
        if not port_open(self.port):
            return False
        with self.connect(self.superuser, self.superuser_password, "postgres") as conn:
            return conn.execute("select 1").fetchone() == (1,)

    def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.service is not None
        self.service.wait_until(self._answers, "waiting for PostgreSQL to accept connections", timeout)
        with self.connect(self.superuser, self.superuser_password, "postgres") as conn:
            if conn.execute("select 1 from pg_roles where rolname = %s", (USER,)).fetchone() is None:
                conn.execute(f"create role {USER} login replication password '{PASSWORD}'")
                conn.execute(f"create database {DATABASE} owner {USER}")
            level = conn.execute("show wal_level").fetchone()
        if level != ("logical",):
            raise TestbedError(f"test bed: PostgreSQL runs with wal_level={level}, not logical")

    def slot_active(self, slot: str) -> bool:
        """True once a replication slot exists and a walsender streams from it (Debezium is streaming)."""
        with self.connect(self.superuser, self.superuser_password, "postgres") as conn:
            row = conn.execute("select active from pg_replication_slots where slot_name = %s", (slot,)).fetchone()
        return bool(row and row[0])


@dataclass
class MariaDB:
    root: Path
    port: int
    install_db: str
    mariadbd: str
    user: str | None = None
    server_id: int = 1
    service: Service | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket(self) -> Path:
        return self.root / "mariadb.sock"

    @property
    def url(self) -> str:
        return f"mysql://{USER}:{PASSWORD}@{HOST}:{self.port}/{DATABASE}"

    def prepare(self) -> None:
        _hand_over(self.root, self.user)
        _hand_over(self.data, self.user)
        basedir = Path(self.mariadbd).resolve().parents[1]  # /usr/sbin/mariadbd -> /usr
        run(
            [
                self.install_db, "--no-defaults", f"--datadir={self.data}", f"--basedir={basedir}",
                "--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve",
                "--innodb-buffer-pool-size=32M",
            ],
            self.root / "install-db.log",
            user=self.user,
            what="mariadb-install-db",
            timeout=180,
        )

    def launch(self, die_with_parent: bool = True) -> None:
        self.service = Service("mariadb", self.root / "mariadb.log")
        cmd = [
            self.mariadbd,
            "--no-defaults",
            f"--datadir={self.data}",
            f"--socket={self.socket}",
            f"--pid-file={self.root / 'mariadb.pid'}",
            f"--port={self.port}",
            f"--bind-address={HOST}",
            "--skip-name-resolve",
            f"--server-id={self.server_id}",
            f"--log-bin={self.data / 'binlog'}",
            "--binlog-format=ROW",
            "--binlog-row-image=FULL",
            "--gtid-strict-mode=ON",
            "--log-basename=testbed",
            "--innodb-buffer-pool-size=64M",
            "--innodb-log-file-size=48M",
            "--innodb-flush-log-at-trx-commit=2",
            "--performance-schema=OFF",
            "--max-connections=60",
            "--default-time-zone=+00:00",
            "--character-set-server=utf8mb4",
            "--collation-server=utf8mb4_general_ci",
        ]
        self.service.launch(cmd, user=self.user, cwd=self.root, die_with_parent=die_with_parent)

    def connect(self, user: str = USER, password: str = PASSWORD, database: str | None = DATABASE, autocommit: bool = True) -> Any:
        import pymysql

        return pymysql.connect(host=HOST, port=self.port, user=user, password=password, database=database, autocommit=autocommit, connect_timeout=5)

    def _root(self) -> Any:
        import pymysql

        return pymysql.connect(unix_socket=str(self.socket), user="root", password="", autocommit=True, connect_timeout=5)

    def _answers(self) -> bool:
        if not port_open(self.port):
            return False
        with self._root() as conn, conn.cursor() as cur:
            cur.execute("select 1")
            return cur.fetchone() == (1,)

    def wait_ready(self, timeout: float = 60.0) -> None:
        assert self.service is not None
        self.service.wait_until(self._answers, "waiting for MariaDB to accept connections", timeout)
        with self._root() as conn, conn.cursor() as cur:
            cur.execute(f"create user if not exists '{USER}'@'%' identified by '{PASSWORD}'")
            cur.execute(f"grant all privileges on *.* to '{USER}'@'%'")
            cur.execute(f"create database if not exists {DATABASE}")
            cur.execute("select @@log_bin, @@binlog_format, @@binlog_row_image")
            settings = cur.fetchone()
        if settings != (1, "ROW", "FULL"):
            raise TestbedError(f"test bed: MariaDB runs with log_bin, binlog_format, binlog_row_image = {settings}, not (1, ROW, FULL)")

    def binlog_dump_active(self) -> bool:
        """True once a replication client (Debezium's binlog reader) is attached to the binlog."""
        with self._root() as conn, conn.cursor() as cur:
            cur.execute("select count(*) from information_schema.processlist where command like 'Binlog Dump%'")
            row = cur.fetchone()
        return bool(row and row[0])


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
