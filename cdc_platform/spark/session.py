"""The Spark session: local by default (or the config's `spark_master`), quiet, and refusing early when
Java or the JVM jars are missing.

One session per process. Spark's first start costs about five seconds here, so the CLI, the tests
(one session-scoped fixture) and Dagster resources all reuse `get_spark()`.

Besides the jars pyspark ships, the session loads the platform's own (delta-spark, Spark's Kafka
source; named in jvm/pom.xml; and the envelope parser built from jvm/parser/) from the folders `make
setup` fills, through `spark.jars`: never `spark.jars.packages`, so starting a session resolves nothing
and needs no network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdc_platform.errors import ConfigError, EnvironmentNotReadyError
from cdc_platform.spark import class_archive

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_HELP = (
    "Java 17 or newer is required (Spark runs on the JVM): install it, e.g. `sudo apt-get install -y "
    "openjdk-17-jre-headless` on Debian/Ubuntu or `brew install openjdk@17` on macOS, then put `java` on "
    "PATH or set JAVA_HOME"
)
MIN_JAVA = 17

# Filled by `make setup` (scripts/resolve_jars.py from jvm/pom.xml); the manifest lists the jars to load.
JARS_DIR = Path(__file__).resolve().parents[2] / "jvm" / "jars"
JARS_MANIFEST = "manifest.json"
#: Hadoop's S3A filesystem and the AWS SDK it needs (jvm/object-store/pom.xml, `make setup-object-store`):
#: loaded only by a session that asks for them, a lake on an object store (storage.py says why).
OBJECT_STORE_JARS_DIR = JARS_DIR.parents[1] / "jvm" / "object-store" / "jars"
#: The envelope parser Spark runs (jvm/parser/, built by `make setup`: cdc_platform/parse/parse_spark.py):
#: loaded by every session, and shipped with the others to a cluster's executors by `spark.jars`.
PARSER_JARS_DIR = JARS_DIR.parents[1] / "jvm" / "parser" / "jars"
#: The platform's extension (jvm/parser, `ChecksumScanExtension`), then Delta's: a query's scan of a small Delta
#: table lists its files from the version's checksum instead of with Delta's file-skipping job (one a scan; a
#: full-view lookup plans five). Listed first so that its rule runs just before Delta's `PrepareDeltaScan` in
#: their shared once-a-query batch. A session without the parser's jar warns once and reads through Delta's path.
DELTA_CONF = {
    "spark.sql.extensions": "cdc.platform.lake.ChecksumScanExtension,io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}

#: Local paths reached through Hadoop's `FileContext` (Delta's log store: commits, checksums, `_last_checkpoint`;
#: the stream's checkpoint: offsets, commits, the file source's log) go through its raw local file system instead
#: of the default checksummed one, which writes a hidden `.NAME.crc` beside every file, reads it back, and renames
#: and deletes it with its file. A batch writes and reads dozens of these small files: a fresh lake's one-batch
#: `cdc run` took 10.12 s instead of 12.51 s without them, 18.9 s of CPU instead of 21.5 (benchmarks/README.md,
#: "Hadoop's checksum files"). `FileSystem`'s `fs.file.impl` stays Hadoop's `LocalFileSystem`: Hadoop, Spark and
#: Hive cast `FileSystem.getLocal` to it (S3A's upload buffers failed with a ClassCastException when it was raw).
#: A lake written before keeps its old side files, still right since those files are never rewritten, except
#: the one beside `_last_checkpoint`, which Delta overwrites: `lake_spark.ensure_table` deletes it, or reads of
#: the table through `FileSystem` would take the stale checksum for corruption. Lakes on an object store or HDFS
#: never had these files.
LOCAL_FILES_CONF = {
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
}


def java_executable() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = Path(home) / "bin" / "java"
        if candidate.is_file():
            return str(candidate)
    return shutil.which("java")


def java_major_version(executable: str) -> int | None:
    try:
        out = subprocess.run([executable, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2) or 0) if major == 1 else major


def require_java() -> None:
    """Raise with one actionable line when no usable Java is installed."""
    exe = java_executable()
    if exe is None:
        raise EnvironmentNotReadyError(f"no `java` found. {JAVA_HELP}")
    major = java_major_version(exe)
    if major is None or major < MIN_JAVA:
        raise EnvironmentNotReadyError(f"{exe} is Java {major or 'of unknown version'}, older than {MIN_JAVA}. {JAVA_HELP}")


def platform_jars(jars_dir: Path | None = None, setup: str = "make setup") -> list[Path]:
    """The jars `make setup` resolved, in the manifest's order; raise with one line when they are not there.

    The manifest, not a directory listing, is the list: a stray or half-copied jar in the folder is
    never loaded, and a jar the manifest names but the folder lacks means setup did not finish.
    """
    folder = jars_dir or JARS_DIR
    manifest = folder / JARS_MANIFEST
    try:
        doc = json.loads(manifest.read_text(encoding="utf-8"))
        jars = [folder / entry["file"] for entry in doc["jars"]]
    except (OSError, ValueError, KeyError, TypeError):
        raise EnvironmentNotReadyError(f"the platform's JVM jars are not in {folder} (no readable {JARS_MANIFEST}): run `{setup}`") from None
    missing = [jar.name for jar in jars if not jar.is_file()]
    if missing or not jars:
        raise EnvironmentNotReadyError(f"{folder} lacks {', '.join(missing) or 'every jar'} listed in its {JARS_MANIFEST}: run `{setup}`")
    return jars


def session_jars(object_store: bool = False) -> list[Path]:
    """Every jar a session loads: the resolved ones, the envelope parser's, and with `object_store` Hadoop's S3A."""
    return platform_jars() + platform_jars(PARSER_JARS_DIR) + (platform_jars(OBJECT_STORE_JARS_DIR, "make setup-object-store") if object_store else [])


_SESSION: SparkSession | None = None
_OBJECT_STORE = False  # whether the running session loaded the object-store jars

#: Start-up settings for a JVM that lives for one short job (a Dagster run: one process, one JVM, then
#: exit), for `get_spark(conf=...)`. Such a run on a small increment is mostly cold code - class loading,
#: planning, code generation - so the JIT's optimising tier (C2) spends more CPU compiling than its code
#: saves before the JVM exits, on a 2-core machine on the same cores as the work; the quick tier alone
#: (C1) and the serial collector cut the sample `cdc_pipeline`'s CPU from 234 s to 144 s. Not for a
#: long-lived stream or server, or a run over millions of rows: there the optimised code pays back.
#: C1 alone gets the JVM's small code cache (48 MB), which one process running the sample's ingest and
#: checks filled ("CodeCache is full. Compiler has been disabled."): from then on new code ran
#: interpreted. 240 MB is what the JVM reserves with both tiers.
SHORT_LIVED_JVM = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=240m"}

#: The JIT's optimising tier (C2) of every session's JVMs, driver and executors, compiles only methods that ran ten
#: times as often as HotSpot's defaults before compiling them (5,000 calls, 15,000 calls and loops, 40,000 loop
#: turns): the rest keeps the quick tier's code. A micro-batch runs hundreds of small queries, Delta commits and
#: log replays, and C2's compiling was a third of a steady small batch's JVM CPU still after ten batches. At these
#: thresholds a steady small batch took 16% less CPU (17.5 s against 20.8 s; 10.8 s wall against 11.7 s) and
#: 200,000 change events 7-29 s less of ~150 s, C2's own CPU down by a quarter to two thirds while the work's own
#: (driver and task threads) did not grow: what it no longer compiles did not run long enough to pay the
#: compiling back (benchmarks/README.md, "C2's thresholds").
#: Administrators' defaults (`defaultJavaOptions`): a user's `extraJavaOptions` come after them and win.
LONG_LIVED_JIT = "-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=6000 -XX:Tier4CompileThreshold=150000 -XX:Tier4BackEdgeThreshold=400000"
#: HotSpot never compiles a method over 8,000 bytes of bytecode (`DontCompileHugeMethods`): it runs interpreted
#: for the JVM's life. Spark's whole-stage code for a Kafka batch's Avro decode and parse is one such method
#: (8,758 bytes), and with the limit off that batch's split took 6.9 s against 8.6 s and `cdc run` 23.1 s
#: against 24.8 s (`avro_vs_json.py --repeat 2`), while the JSON runs, a 1M-event `throughput.py` (211.5-212.0 s
#: against 213.0-215.8 s) and steady small batches were unchanged, the JIT's CPU with them
#: (benchmarks/README.md, "An eighth session on issue 44").
COMPILE_HUGE_METHODS = "-XX:-DontCompileHugeMethods"
JVM_DEFAULTS = {key: f"{LONG_LIVED_JIT} {COMPILE_HUGE_METHODS}" for key in ("spark.driver.defaultJavaOptions", "spark.executor.defaultJavaOptions")}

#: Where Spark runs when neither the config (`spark_master`), a flag (`--master`) nor spark-submit says.
DEFAULT_MASTER = "local[2]"
_LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def submitted() -> bool:
    """True inside `spark-submit`, whose JVM is already up and carries its own --master (PySpark's own test)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def loopback_standalone(master: str) -> bool:
    """A standalone master on this machine's loopback, e.g. the one `cdc_platform.spark.cluster` starts."""
    if not master.startswith("spark://"):
        return False
    hosts = [hp.rsplit(":", 1)[0] for hp in master[len("spark://") :].split(",")]
    return all(h in _LOOPBACK_HOSTS for h in hosts)


def python_daemon(master: str | None) -> dict[str, str]:
    """The session's Python daemon setting for `master`: `spark_daemon` where the executors run this machine's
    environment (local mode, a standalone cluster on loopback), nothing elsewhere.

    Spark's Python workers re-read the directories of pyspark.zip, py4j's zip and the spark-core jar before
    every task on Python 3.11 (88 ms of CPU each); `spark_daemon` reads them only when an archive changed.
    A remote cluster's executors would have to import `cdc_platform` before any `--py-files` arrive, so
    there it is the user's setting (README, "On a cluster").
    """
    if master is not None and (master.startswith("local") or loopback_standalone(master)):
        return {"spark.python.daemon.module": "cdc_platform.spark.spark_daemon"}
    return {}


def get_spark(
    app_name: str = "cdc-platform", master: str | None = None, conf: Mapping[str, str] | None = None, object_store: bool = False
) -> SparkSession:
    """The process-wide session: UI off, two shuffle partitions, UTC, log noise off, Delta on.

    `master` comes from the config (`spark_master`, or `--master`); None means spark-submit's master when
    the process was submitted, else `local[2]`. A process holds one session, so asking for another master
    than the running session's is an error rather than a silent fallback.

    `conf` adds settings for the session's start (e.g. `cdc serve`'s Spark Connect plugin and ports); they
    apply only when this call starts Spark, since a running JVM cannot take start-up settings any more.
    `object_store` loads Hadoop's S3A jars as well, for a lake on an object store (`storage.is_remote`).
    """
    global _SESSION, _OBJECT_STORE
    if _SESSION is not None and _SESSION.sparkContext._jsc is not None:  # type: ignore[attr-defined]
        running = _SESSION.sparkContext.master
        if master is not None and master != running:
            raise ConfigError(
                f"this process already runs a Spark session on {running}; a second one on {master} is not possible "
                "(one SparkContext per process): run the command in a process of its own"
            )
        if object_store:
            require_object_store("the lake")
        return _SESSION
    require_java()
    jars = session_jars(object_store)
    # Executors must run this interpreter (the venv's), not whatever `python3` is first on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Spark's logging config ships with the package; a user's own SPARK_CONF_DIR wins. With `make setup`'s class-data
    # archive the folder is an empty one and the logging config a system property (`class_archive` says why).
    os.environ.setdefault("SPARK_CONF_DIR", class_archive.conf_dir_for_session())
    defaults = dict(JVM_DEFAULTS)
    archive = class_archive.driver_options(os.environ["SPARK_CONF_DIR"])
    if archive:
        defaults["spark.driver.defaultJavaOptions"] = f"{defaults['spark.driver.defaultJavaOptions']} {archive}"
    from pyspark.sql import SparkSession

    if master is None and not submitted():
        master = DEFAULT_MASTER
    builder = SparkSession.builder.appName(app_name)
    if master is not None:  # under spark-submit with no master configured, its --master stands
        builder = builder.master(master)
    if master is not None and loopback_standalone(master):
        # Executors of a cluster on this machine's loopback reach the driver there, whatever the host name resolves to.
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # Delta rebuilds a table's snapshot from its log with a shuffle of this many partitions (default
        # 50); at 50, a read of a 30-commit table here cost 1.3-2.6 s against 0.45-0.55 s at 2 (and the
        # file-list read it replaced, 0.5 s). Every guarded write of a batch rebuilds one (Delta's check of
        # the application transaction); at 1 instead of 2 a small steady batch took 7-17% less CPU in three
        # comparisons (benchmarks/README.md, "A small batch's CPU"). Logs here are small; on a cluster with
        # big logs (tables of very many files) raise it.
        .config("spark.databricks.delta.snapshotPartitions", "1")
        .config("spark.default.parallelism", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        # Adaptive query execution runs every stage of a query with a shuffle as a job of its own and plans
        # the rest again after each: a small steady batch ran 65 jobs with it and 44 without, 9.12 s against
        # 7.62 s and 15.5 s of CPU against 13.4 (benchmarks/README.md, "Adaptive query execution off"). What
        # it adapts to is not here: two shuffle partitions leave nothing to coalesce, and the joins whose
        # small side is known in advance broadcast it by hint. Batches of 100,000 events took the same time.
        # A cluster that raises the shuffle partitions may want it back (README, "On a cluster").
        .config("spark.sql.adaptive.enabled", "false")
        .config("spark.sql.catalogImplementation", "in-memory")
        .config("spark.jars", ",".join(str(jar) for jar in jars))
        # Each micro-batch names its files; past 32 paths Spark lists them with a distributed job, which
        # cost ~0.4 s a batch of 200 local files against ~0.1 s listed in the driver (benchmarks/README.md).
        # On an object store with a real cluster, leave Spark's default (drop this line).
        .config("spark.sql.sources.parallelPartitionDiscovery.threshold", "100000")
        # Delta's VACUUM lists a table's directories with jobs of this many tasks (Spark's default is
        # 10,000, whatever the table's size): 18-47 s per table here for one or two directories, and
        # `cdc maintain` on the demo lake took minutes. At 8 the same VACUUM takes 2-3 s. A cluster
        # vacuuming tables with very many partition directories may want more.
        .config("spark.sql.sources.parallelPartitionDiscovery.parallelism", "8")
        # Spark keeps the classes it compiles for queries in a cache of 100 entries. One micro-batch of a
        # one-table lake generates ~185 distinct classes (the stages' queries, Delta's log replay and
        # commits), so at 100 every batch evicted the last one's and compiled them all again with Janino:
        # ~220 compiles a batch of the sample workload. At 4,000 a batch of a shape seen before compiles 8,
        # and a small batch takes 16% less JVM CPU (benchmarks/small_batches.py; benchmarks/README.md).
        # A class with its source key is ~15-30 KB, so a full cache is ~100 MB of driver (or executor) memory.
        .config("spark.sql.codegen.cache.maxEntries", "4000")
        # `cdc stream` runs the ingest and the stage queries in one application: the fair scheduler shares the
        # cores between their pools (`spark_jobs.in_pool`) instead of running every job first come, first served.
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.scheduler.allocation.file", str(resources.files("cdc_platform").joinpath("spark_conf", "fairscheduler.xml")))
    )
    for key, value in {**defaults, **LOCAL_FILES_CONF, **DELTA_CONF, **python_daemon(master), **(conf or {})}.items():
        builder = builder.config(key, value)
    _SESSION = builder.getOrCreate()
    _OBJECT_STORE = object_store
    return _SESSION


def require_object_store(where: str) -> None:
    """Refuse an object-store path in a session started without the S3A jars, before Hadoop fails on it."""
    if _SESSION is not None and not _OBJECT_STORE:
        raise EnvironmentNotReadyError(
            f"{where} is on an object store, but this process's Spark session was started without Hadoop's S3A jars; "
            "start it with get_spark(object_store=True) (the CLI and Dagster do so when the config's lake is a URL), "
            "after `make setup-object-store`"
        )


def jvm_class(spark: SparkSession, name: str) -> Any | None:
    """A class of the session's JVM by its full name (the platform's own, from the parser's jar), or None when
    the session has no JVM here (Spark Connect) or the class is not loaded (a jar `make setup` has not built).

    Kept per JVM: py4j resolves each part of a name with a round trip, and the lake looks its class up on every
    write."""
    from py4j.java_gateway import JavaClass

    jvm = getattr(spark, "_jvm", None)
    if jvm is None:
        return None
    key = (id(jvm), name)
    if key not in _JVM_CLASSES:
        entry: Any = jvm
        for part in name.split("."):
            entry = getattr(entry, part)
        _JVM_CLASSES[key] = entry if isinstance(entry, JavaClass) else None  # py4j names a class it cannot find as a package
    return _JVM_CLASSES[key]


_JVM_CLASSES: dict[tuple[int, str], Any] = {}


def stop_spark() -> None:
    global _SESSION
    _JVM_CLASSES.clear()  # a later session's gateway may reuse an id of this one's
    if _SESSION is not None:
        _SESSION.stop()
        _SESSION = None
