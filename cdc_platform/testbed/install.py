"""What the test bed needs on the machine, installed from the project's own files.

* JVM side: `jvm/testbed/pom.xml` resolved by the machine's `mvn` (Maven Central) into
  `jvm/testbed/target/` (gitignored): `kafka-libs/` for the broker and Kafka Connect, `plugins/<name>/` for
  Debezium's connectors and Apicurio's Avro converter, and Apicurio Registry's distribution zip, unpacked
  into `apicurio-registry/`. A stamp holding a hash of the poms says the folder is complete.
* Databases: PostgreSQL and MariaDB servers from Debian's packages (`postgresql`, `mariadb-server`),
  installed with apt-get when their programs are missing and this process is root.

Anything that cannot be installed raises `TestbedError` with one line naming what and why.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import pwd
import shutil
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cdc_platform.testbed.errors import TestbedError

REPO = Path(__file__).resolve().parents[2]
JVM_DIR = REPO / "jvm" / "testbed"
TARGET = JVM_DIR / "target"
KAFKA_LIBS = TARGET / "kafka-libs"
PLUGINS = TARGET / "plugins"
PLUGIN_NAMES = ("debezium-postgres", "debezium-mariadb", "apicurio-converter")
REGISTRY_DIST = TARGET / "apicurio-registry-dist"  # the zip as Maven copied it
REGISTRY_HOME = TARGET / "apicurio-registry"  # unpacked: <name>-runner.jar and lib/
#: Apicurio's converter jars carry no ServiceLoader manifest, which Connect's `plugin.discovery=service_load`
#: needs to find a plugin (KIP-898); the bed adds one, as Kafka's `connect-plugin-path sync-manifests` would.
CONVERTER_CLASSES = ("io.apicurio.registry.utils.converter.AvroConverter",)
CONVERTER_MANIFEST = PLUGINS / "apicurio-converter" / "cdc-testbed-service-manifest.jar"
STAMP = TARGET / ".resolved"
MVN_LOG = TARGET / "mvn.log"
APT_LOG = TARGET / "apt.log"

DEBIAN_PACKAGES = ("postgresql", "mariadb-server")

_lock = threading.Lock()
#: How long an apt command waits for another apt process's lock before it fails (seconds).
APT_LOCK_WAIT = 600


@dataclass(frozen=True)
class Programs:
    """Paths of the server programs the test bed runs, and the users to run them as (None: this user)."""

    java: str
    initdb: str
    postgres: str
    mariadb_install_db: str
    mariadbd: str
    postgres_user: str | None
    mariadb_user: str | None


def _poms_hash() -> str:
    digest = hashlib.sha256()
    for pom in sorted(JVM_DIR.glob("**/pom.xml")):
        if TARGET in pom.parents:
            continue
        digest.update(str(pom.relative_to(JVM_DIR)).encode())
        digest.update(pom.read_bytes())
    return digest.hexdigest()


def jars_ready() -> bool:
    return (
        STAMP.is_file()
        and STAMP.read_text(encoding="utf-8").strip() == _poms_hash()
        and any(KAFKA_LIBS.glob("kafka_2.13-*.jar"))
        and all(any((PLUGINS / name).glob("*.jar")) for name in PLUGIN_NAMES)
        and CONVERTER_MANIFEST.is_file()
        and registry_runner() is not None
    )


def registry_runner() -> Path | None:
    """Apicurio Registry's runner jar, once unpacked."""
    found = sorted(REGISTRY_HOME.glob("*-runner.jar"))
    return found[0] if found and (REGISTRY_HOME / "lib").is_dir() else None


def _unpack_registry() -> None:
    zips = sorted(REGISTRY_DIST.glob("*.zip"))
    if not zips:
        raise TestbedError(f"test bed: Maven copied no Apicurio Registry zip into {REGISTRY_DIST} (log: {MVN_LOG})")
    shutil.rmtree(REGISTRY_HOME, ignore_errors=True)
    with zipfile.ZipFile(zips[0]) as dist:
        dist.extractall(REGISTRY_HOME)
    shutil.rmtree(REGISTRY_DIST)  # 142 MB, and Maven's local repository keeps a copy


def _write_converter_manifest() -> None:
    with zipfile.ZipFile(CONVERTER_MANIFEST, "w") as jar:
        jar.writestr("META-INF/services/org.apache.kafka.connect.storage.Converter", "".join(c + "\n" for c in CONVERTER_CLASSES))


def _first_error(log: str) -> str:
    for line in log.splitlines():
        if line.startswith("[ERROR]") and len(line) > 10:
            return line.removeprefix("[ERROR]").strip()
    lines = [line for line in log.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def ensure_jars() -> None:
    """Resolve the test bed's jars with `mvn` unless the stamp says they are there for these poms."""
    with _lock:
        if jars_ready():
            return
        if not (JVM_DIR / "pom.xml").is_file():
            raise TestbedError(f"test bed: {JVM_DIR / 'pom.xml'} is missing (the test bed runs from a source checkout)")
        mvn = shutil.which("mvn")
        if mvn is None:
            raise TestbedError("test bed: Maven (`mvn`) is not on PATH; install it (Debian: apt-get install maven)")
        for folder in (KAFKA_LIBS, PLUGINS, REGISTRY_DIST, REGISTRY_HOME):
            shutil.rmtree(folder, ignore_errors=True)
        TARGET.mkdir(parents=True, exist_ok=True)
        # -U: a "not found" cached by an earlier attempt (a registry that refused an artifact that day)
        # would otherwise stick until Maven's update interval passes.
        cmd = [mvn, "-B", "-U", "-f", str(JVM_DIR / "pom.xml"), "dependency:copy-dependencies"]
        proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
        MVN_LOG.write_text(proc.stdout + proc.stderr, encoding="utf-8")
        if proc.returncode != 0:
            raise TestbedError(f"test bed: Maven could not resolve jvm/testbed: {_first_error(proc.stdout + proc.stderr)} (log: {MVN_LOG})")
        _unpack_registry()
        _write_converter_manifest()
        STAMP.write_text(_poms_hash() + "\n", encoding="utf-8")
        if not jars_ready():
            raise TestbedError(f"test bed: Maven finished but {TARGET} lacks the broker's, a plugin's or the registry's jars (log: {MVN_LOG})")


def _find_pg_bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(Path(p).parts[4]) if Path(p).parts[4].isdigit() else 0)
    return found[-1] if found else shutil.which(name)


def _find(name: str, *dirs: str) -> str | None:
    for folder in dirs:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def _locate() -> dict[str, str | None]:
    return {
        "java": shutil.which("java"),
        "initdb": _find_pg_bin("initdb"),
        "postgres": _find_pg_bin("postgres"),
        "mariadb_install_db": _find("mariadb-install-db", "/usr/bin", "/usr/local/bin") or _find("mysql_install_db", "/usr/bin"),
        "mariadbd": _find("mariadbd", "/usr/sbin", "/usr/bin") or _find("mysqld", "/usr/sbin"),
    }


def _apt_install(packages: tuple[str, ...]) -> None:
    if shutil.which("apt-get") is None:
        raise TestbedError(f"test bed: {', '.join(packages)} not installed and there is no apt-get here; install PostgreSQL and MariaDB servers")
    if os.geteuid() != 0:
        raise TestbedError(f"test bed: PostgreSQL/MariaDB servers not installed; run: sudo apt-get install -y {' '.join(packages)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    TARGET.mkdir(parents=True, exist_ok=True)
    with APT_LOG.open("a", encoding="utf-8") as log:
        for cmd in (
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "update", "-q"],
            ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "-q", "--no-install-recommends", *packages],
        ):
            deadline = time.monotonic() + APT_LOCK_WAIT
            while True:
                log.write(f"$ {' '.join(cmd)}\n")
                log.flush()
                start = log.tell()
                proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, check=False)
                log.flush()
                if proc.returncode == 0 or time.monotonic() > deadline or not _held_lock(APT_LOG, start):
                    break
                time.sleep(5)  # another apt (outside this project) holds its lock: wait for it
            if proc.returncode != 0:
                tail = [line for line in APT_LOG.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
                raise TestbedError(f"test bed: `{' '.join(cmd)}` failed: {tail[-1] if tail else 'no output'} (log: {APT_LOG})")


def _held_lock(log: Path, since: int) -> bool:
    """Whether the apt run logged from byte `since` failed only because another apt held a lock."""
    with log.open("rb") as f:
        f.seek(since)
        text = f.read().decode("utf-8", errors="replace")
    return "Could not get lock" in text


def _user(name: str) -> str | None:
    """The user a database server runs as: this one, unless we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(name)
    except KeyError:
        raise TestbedError(f"test bed: system user {name!r} is missing (Debian's package creates it); reinstall the package") from None
    return name


@contextlib.contextmanager
def _installing() -> Iterator[None]:
    """Hold the install step for this process's threads and for every other process (pytest-xdist
    workers, a `make stack` beside the tests): two `apt-get update`s at once make the second fail at
    once on apt's list lock, which `DPkg::Lock::Timeout` does not cover."""
    TARGET.mkdir(parents=True, exist_ok=True)
    with _lock, (TARGET / ".install.lock").open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def ensure_programs() -> Programs:
    """Locate (and install when missing) the server programs; raise one line when that is impossible."""
    with _installing():
        found = _locate()  # after the lock: another process may have installed them meanwhile
        missing = [name for key, name in (("initdb", "postgresql"), ("mariadbd", "mariadb-server"), ("mariadb_install_db", "mariadb-server")) if not found[key]]
        if missing:
            _apt_install(tuple(dict.fromkeys(missing)))
            found = _locate()
        if not found["java"]:
            raise TestbedError("test bed: `java` is not on PATH (Kafka needs Java 17+)")
        for key, value in found.items():
            if not value:
                raise TestbedError(f"test bed: {key.replace('_', '-')} not found after installing {', '.join(DEBIAN_PACKAGES)}")
        return Programs(
            java=str(found["java"]),
            initdb=str(found["initdb"]),
            postgres=str(found["postgres"]),
            mariadb_install_db=str(found["mariadb_install_db"]),
            mariadbd=str(found["mariadbd"]),
            postgres_user=_user("postgres"),
            mariadb_user=_user("mysql"),
        )


def ensure_installed() -> Programs:
    """Everything the test bed needs: jars and programs (idempotent; fast when all is there)."""
    ensure_jars()
    return ensure_programs()
