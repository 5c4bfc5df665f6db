"""Shared fixtures: one Spark session for the whole suite (it costs ~5 s to start), and lake builders."""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, settings

from cdc_platform.config import PlatformConfig, load_config

REPO = Path(__file__).resolve().parents[1]
PEER_DATA = REPO.parent / "shared" / "peer-data"
FLINK = PEER_DATA / "apache-flink"
SCHEMA_EXCLUDE = FLINK / "debezium-postgres-data-schema-exclude.txt"
REPLICA_IDENTITY = FLINK / "debezium-postgres-data-replica-identity.txt"

# Hypothesis: `ci` (the default) is deterministic and small; `HYPOTHESIS_PROFILE=dev` explores new
# examples each run and remembers failures in .hypothesis/; benchmarks/type_fuzz.py runs thousands.
_SLOW_DATA = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("ci", max_examples=15, deadline=None, derandomize=True, database=None, print_blob=False,
                          suppress_health_check=_SLOW_DATA)
settings.register_profile("dev", max_examples=100, deadline=None, suppress_health_check=_SLOW_DATA)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

#: Session fixtures that start servers: under pytest-xdist (`make test` runs two workers) every test that uses
#: one runs in the same worker, so each server starts once per suite, not once per worker.
_SERVER_FIXTURES = ("testbed", "spark_cluster", "s3_server")
#: Modules whose module-scoped fixture runs the pipeline or starts a server (`pipeline_run`: a Dagster run,
#: `served`: `cdc serve`, `e2e`: the type families' run): their tests stay in one worker, so it runs once
#: per suite, not once in each worker that draws one of them (30-47 s each, measured twice before).
_SHARED_FIXTURE_MODULES = ("test_definitions.py", "test_serve.py", "test_serve_security.py", "test_serve_ldap.py",
                           "test_latest_state_type_props.py")


#: Start-up settings of the suite's own session (the `spark` fixture): it lives as long as its pytest worker and
#: runs most of the suite (60% of the suite's CPU is these two JVMs), so the JIT's optimising tier stays (a subset
#: took 366 s with the quick tier alone against 286 s with both), but it compiles only code four times hotter
#: than the platform's long-lived threshold (`session.LONG_LIVED_JIT`): C2 was a fifth of these JVMs' CPU. And
#: the parallel collector: G1's concurrent marking was another tenth, for pauses a test does not notice.
#: Measured on `test_views.py` + `test_bad_input.py`, `-n 2` (load 3-4.5): G1 at the platform's thresholds 206 /
#: 206 / 199 s; parallel collector 190 / 193 / 196 / 194 s; and these thresholds 182 / 174 s (benchmarks/README.md,
#: "A twelfth session"). This overrides the children's defaults below.
SUITE_C2_FACTOR = 4


def long_lived_driver() -> dict[str, str]:
    """`LONG_LIVED_JIT`'s thresholds times `SUITE_C2_FACTOR`, and the parallel collector (see above)."""
    from cdc_platform.spark.session import LONG_LIVED_JIT

    flags = [f"{name}={int(value) * SUITE_C2_FACTOR}" for name, value in (f.split("=") for f in LONG_LIVED_JIT.split())]
    return {"spark.driver.extraJavaOptions": " ".join(["-XX:+UseParallelGC", *flags])}


#: The environment variable PySpark reads the arguments of the `spark-submit` that starts its JVM from.
SUBMIT_ARGS = "PYSPARK_SUBMIT_ARGS"


def children_submit_args() -> str:
    """`spark-submit` arguments giving every child's driver and executors `session.SHORT_LIVED_JVM`'s options."""
    from cdc_platform.spark.session import SHORT_LIVED_JVM

    options = SHORT_LIVED_JVM["spark.driver.extraJavaOptions"]
    wanted = {**SHORT_LIVED_JVM, "spark.executor.extraJavaOptions": options}
    return " ".join([*(f"--conf {shlex.quote(f'{k}={v}')}" for k, v in wanted.items()), "pyspark-shell"])


def pytest_configure(config: pytest.Config) -> None:
    """Every Spark the suite starts in a child process - `cdc` commands, streams killed and restarted, the
    cluster test's driver and its executors - starts with `session.SHORT_LIVED_JVM`'s quick JIT tier.

    Each child runs a batch or two and exits: a cold JVM's optimising compiler then costs more CPU than its
    code saves (one cold `cdc run` of 40 generated transactions: 80 s of CPU with both tiers, 43 s with the
    quick one), and the suite is CPU-bound on two cores. The settings reach the children as PySpark's own
    `PYSPARK_SUBMIT_ARGS` (the arguments of the `spark-submit` that starts a PySpark JVM), not as a
    `SPARK_CONF_DIR` of their own: that folder would be on the driver's class path, where the class-data
    archive (`spark.class_archive`) allows no folder with a file in it, and every child would start without it.
    What the children compute does not depend on the JIT tier. The suite's own session (`spark`) starts
    without them.
    """
    os.environ[SUBMIT_ARGS] = children_submit_args()


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook, which reads the group marks to name the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        server = next((f for f in _SERVER_FIXTURES if f in fixtures), None)
        if server is not None:
            item.add_marker(pytest.mark.xdist_group(server))
        elif item.path.name in _SHARED_FIXTURE_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `--dist loadgroup`, every test that starts a server must carry its group in its node id (that is
    how pytest-xdist sends a group to one worker); else each worker would start its own servers, at once."""
    if not session.config.getoption("loadgroup", default=False):
        return
    ungrouped = [item.nodeid for item in session.items
                 if any(f in getattr(item, "fixturenames", ()) for f in _SERVER_FIXTURES) and "@" not in item.nodeid]
    if ungrouped:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(ungrouped)} server test(s) (first: {ungrouped[0]}); "
            "this pytest/pytest-xdist pair does not support --dist loadgroup (see pyproject.toml's pin)"
        )


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from cdc_platform.spark.session import get_spark, stop_spark

    # With Hadoop's S3A jars (`make test` resolves them): the object-store lake's tests share this session,
    # started without the children's quick JIT tier (`pytest_configure`).
    children = os.environ.pop(SUBMIT_ARGS, None)
    try:
        session = get_spark("cdc-platform-tests", object_store=True, conf=long_lived_driver())
    finally:
        if children is not None:
            os.environ[SUBMIT_ARGS] = children
    yield session
    stop_spark()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An S3-compatible server (moto's) on a loopback port chosen at run time, for lakes at s3a:// URLs."""
    from cdc_platform.testbed.object_store import S3Server

    with S3Server.start(tmp_path_factory.mktemp("s3")) as server:
        yield server


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A Spark standalone cluster on loopback (master + two one-core workers), started once and stopped whole.

    Started only by the tests that ask for it. It cannot share this process with the `spark` fixture's
    local session (one SparkContext per process), so tests drive it from a `python -m cdc_platform` child.
    """
    from cdc_platform.spark.cluster import LocalCluster

    cluster = LocalCluster(workers=2, cores=1, memory="1g", work_dir=tmp_path_factory.mktemp("spark-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def peer_files() -> dict[str, Path]:
    for path in (SCHEMA_EXCLUDE, REPLICA_IDENTITY):
        if not path.is_file():
            pytest.fail(f"peer data missing: {path} (the repo expects ../shared/peer-data beside it)")
    return {"schema_exclude": SCHEMA_EXCLUDE, "replica_identity": REPLICA_IDENTITY}


class LakeTemplates:
    """Lakes built once per test process and copied whole (config, landing files, lake) for each test that asks:
    a copy is a directory copy where a build is a `cdc run` (5-15 s on the suite's loaded machine).

    Only for tests that read a lake or change its files without running the pipeline on it again: a copy's
    raw rows and stream checkpoint still name the template's landing files, so a run on the copy would read
    its own landing files as new ones."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._built: set[str] = set()

    def copy(self, name: str, build: Callable[[Path], None], dest: Path) -> Path:
        """`dest` holding a copy of the template `name`, which `build(root)` makes (a cdc.yaml with relative paths)."""
        template = self._root / name
        if name not in self._built:
            shutil.rmtree(template, ignore_errors=True)  # what a build that failed for an earlier test left
            build(template)
            self._built.add(name)
        shutil.copytree(template, dest, dirs_exist_ok=True)
        return dest


@pytest.fixture(scope="session")
def lake_templates(tmp_path_factory: pytest.TempPathFactory) -> LakeTemplates:
    return LakeTemplates(tmp_path_factory.mktemp("lake-templates"))


@pytest.fixture(scope="session")
def lake_at(spark: Any) -> Callable[..., PlatformConfig]:
    """`lake_at(root, tables, lines)`: a cdc.yaml under `root` (relative landing and lake), `lines` landed as one
    file, one `cdc run`; the loaded config. What `make_config`, `land` and `run_pipeline` do, at any root
    (a lake template's, or several in one test)."""
    from cdc_platform.run.ingest import IngestJob

    def build(root: Path, tables: dict[str, dict[str, Any]], lines: list[str]) -> PlatformConfig:
        (root / "landing").mkdir(parents=True, exist_ok=True)
        (root / "cdc.yaml").write_text(yaml.safe_dump({"landing": "landing", "lake": "lake", "tables": tables}), encoding="utf-8")
        (root / "landing" / "part-00001.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        config = load_config(root / "cdc.yaml")
        IngestJob(config).run_available_now(spark)
        return config

    return build


@pytest.fixture
def make_config(tmp_path: Path) -> Callable[..., PlatformConfig]:
    """Write a cdc.yaml under tmp_path and load it; `tables` maps source -> settings."""

    def build(tables: dict[str, dict[str, Any]] | None = None, **extra: Any) -> PlatformConfig:
        (tmp_path / "landing").mkdir(exist_ok=True)
        doc = {"landing": "landing", "lake": "lake", "tables": tables or {}, **extra}
        path = tmp_path / "cdc.yaml"
        path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        return load_config(path)

    return build


@pytest.fixture
def land(tmp_path: Path) -> Callable[..., Path]:
    """Drop a file into the landing directory: `land("name.jsonl", lines_or_text_or_path)`."""
    counter = {"n": 0}

    def put(name: str | None, content: str | list[str] | Path) -> Path:
        landing = tmp_path / "landing"
        landing.mkdir(exist_ok=True)
        counter["n"] += 1
        target = landing / (name or f"part-{counter['n']:05d}.jsonl")
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, Path):
            shutil.copyfile(content, target)
        elif isinstance(content, list):
            target.write_text("\n".join(content) + "\n", encoding="utf-8")
        else:
            target.write_text(content, encoding="utf-8")
        return target

    return put


@pytest.fixture
def run_pipeline(spark: Any) -> Callable[[PlatformConfig], Any]:
    """Run `cdc run` in-process (available-now trigger) over the config's landing directory."""
    from cdc_platform.run.ingest import IngestJob

    def go(config: PlatformConfig) -> Any:
        return IngestJob(config).run_available_now(spark)

    return go


@pytest.fixture
def query(spark: Any) -> Callable[[PlatformConfig | Path, str], list[dict[str, Any]]]:
    """Spark SQL over a lake as `views.sql` runs it (tables, and the views of the tables the SQL names, registered), rows as dicts."""
    from cdc_platform import views

    def q(lake: PlatformConfig | Path, sql: str) -> list[dict[str, Any]]:
        lake_dir = lake.lake if isinstance(lake, PlatformConfig) else lake
        return [r.asDict(recursive=True) for r in views.sql(spark, lake_dir, sql).collect()]

    return q


@pytest.fixture(scope="session")
def testbed() -> Iterator[Any]:
    """The real test bed (issue 11): Kafka broker, Kafka Connect with Debezium, PostgreSQL and MariaDB on
    run-time loopback ports; started once for the tests that ask for it, stopped at the end of the
    session whatever the tests did (and by the kernel if pytest itself dies). Installs what is missing on
    first use (mvn, apt-get); a service that cannot be had fails these tests with one line, never skips."""
    from cdc_platform.testbed import Stack, TestbedError

    failure = None
    try:
        bed = Stack.start()
    except TestbedError as err:
        failure = str(err)
    if failure is not None:
        pytest.fail(failure, pytrace=False)
    try:
        yield bed
    finally:
        bed.stop()
