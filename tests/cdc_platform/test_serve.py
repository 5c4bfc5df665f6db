"""`cdc serve` and the catalog: a real server subprocess on free loopback ports, queried over Spark Connect
(from fresh processes), over JDBC (beeline), and by `cdc sql`; the catalog follows new columns and tables;
every failure path (no server, a stale state file, no Connect client, a taken port) gives the promised outcome.
"""

from __future__ import annotations

import csv
import io
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform.serve import sql_client
from cdc_platform.cli import main
from cdc_platform.config import load_config
from cdc_platform.errors import ConfigError
from cdc_platform.spark.processes import HOST, die_with_parent, free_ports, stop_group
from cdc_platform.serve.server import Server
from cdc_platform.serve.sql_client import STATE_FILE, ServerInfo, ServerUnavailable
from tests.cdc_platform.test_latest_state import ev

BIN = Path(sys.executable).parent
CDC = BIN / "cdc"
SCHEMA = "lakehouse"  # not the default: the config's catalog.schema must reach the server, JDBC URL included
START_TIMEOUT = 300.0

PEOPLE = [ev("c", pos=10 + i, table="people", after={"id": i, "name": n, "email": f"{n}@example.com"}) for i, n in enumerate(["ann", "bob", "cy"])]
CHANGES = [ev("u", pos=20, table="people", after={"id": 1, "name": "bobby", "email": "b@example.com"}), ev("d", pos=21, table="people", before={"id": 2})]


def write_config(root: Path, tables: dict[str, Any]) -> Path:
    (root / "landing").mkdir(parents=True, exist_ok=True)
    path = root / "cdc.yaml"
    path.write_text(yaml.safe_dump({"landing": "landing", "lake": "lake", "tables": tables, "catalog": {"schema": SCHEMA}}), encoding="utf-8")
    return path


def land_and_run(spark: Any, config_path: Path, name: str, lines: list[str]) -> None:
    """What the `land` and `run_pipeline` fixtures do, for a lake that lives as long as the module's server."""
    from cdc_platform.run.ingest import IngestJob

    config = load_config(config_path)
    target = config.landing / name
    tmp = target.with_name(f".{name}.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.rename(target)
    IngestJob(config).run_available_now(spark)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[tuple[Path, ServerInfo]]:
    """A lake (people: three rows, an update, a delete) and `cdc serve` on it, stopped whole even when a test fails."""
    root = tmp_path_factory.mktemp("served")
    config_path = write_config(root, {"shop.people": {"key": ["id"], "mask": ["email"]}})
    land_and_run(spark, config_path, "part-00001.jsonl", PEOPLE + CHANGES)
    connect_port, jdbc_port = free_ports(2)
    log = root / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(CDC), "serve", "--config", str(config_path), "--connect-port", str(connect_port), "--jdbc-port", str(jdbc_port),
             "--poll-interval", "1"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent(),
        )
    lake_dir = root / "lake"
    try:
        try:
            info = sql_client.wait_for_state(lake_dir, proc.poll, log, START_TIMEOUT)
        except ServerUnavailable as exc:
            pytest.fail(str(exc))
        yield root, info
    finally:
        stop_group(proc.pid, reap=proc.poll)
        proc.wait(timeout=30)
        print(f"cdc serve log:\n{log.read_text(errors='replace')[-3000:]}")


CONNECT_CLIENT = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
print(json.dumps([[r.asDict() for r in spark.sql(sql).collect()] for sql in sys.argv[2:]], default=str))
"""


def try_connect_queries(url: str, *sqls: str) -> list[list[dict[str, Any]]] | str:
    """Queries from one fresh process that knows nothing of this project: plain pyspark, a Spark Connect URL.

    Returns each query's rows, or the client's error output when one failed. One process for several
    queries: each process pays pyspark's import and a new session (~1.5-2 s a process, measured alone)."""
    done = subprocess.run([sys.executable, "-c", CONNECT_CLIENT, url, *sqls], capture_output=True, text=True, timeout=180, cwd="/")
    if done.returncode != 0:
        return done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def connect_queries(url: str, *sqls: str) -> list[list[dict[str, Any]]]:
    answer = try_connect_queries(url, *sqls)
    assert not isinstance(answer, str), answer[:1500] + " ... " + answer[-500:]
    return answer


def beeline(jdbc_url: str, sql: str) -> list[dict[str, str]]:
    import pyspark

    env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent)}
    done = subprocess.run([str(BIN / "beeline"), "-u", jdbc_url, "--silent=true", "--showHeader=true", "--outputformat=csv2", "-e", sql],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-2000:]
    # csv2 output; beeline prints its prompt (`0: jdbc:hive2://...> `) before the header line.
    lines = [line.split("> ", 1)[1] if line.startswith("0: jdbc") else line for line in done.stdout.splitlines()]
    lines = [line for line in lines if line and not line.startswith("WARNING")]
    return list(csv.DictReader(io.StringIO("\n".join(lines))))


def test_the_catalog_from_a_fresh_spark_connect_session(served: tuple[Path, ServerInfo]) -> None:
    _, info = served
    assert info.schema == SCHEMA and info.connect_url == f"sc://{HOST}:{info.connect_port}"
    rows, shown, stored, full, clean, consistent, clean_all = connect_queries(
        info.connect_url,
        f"SELECT id, name FROM {SCHEMA}.people__full_view ORDER BY id",
        f"SHOW TABLES IN {SCHEMA}",
        f"SELECT DISTINCT _layer FROM {SCHEMA}.people__stored",
        f"SELECT * FROM {SCHEMA}.people__full_view LIMIT 1",
        f"SELECT email FROM {SCHEMA}.people__clean_view",
        f"SELECT * FROM {SCHEMA}.people__consistent_view ORDER BY id",
        f"SELECT * FROM {SCHEMA}.people__clean_view ORDER BY id",
    )
    assert rows == [{"id": 0, "name": "ann"}, {"id": 1, "name": "bobby"}]  # the update shown, the delete hidden
    assert {"people", "people__full_view", "people__clean_view", "people__stored", "people__consistent_view",
            "raw_change_events", "dead_letter", "transactions"} <= {r["tableName"] for r in shown}
    # The storage is named as storage: its layers are visible there, and only there.
    assert stored and {r["_layer"] for r in stored} <= {"base", "delta"}
    assert "_layer" not in full[0] and "_deleted" not in full[0]
    assert all("@example.com" not in str(r["email"]) for r in clean)
    # The consistent view is a persistent view too, typing the raw log in SQL alone (connect_sql): the same rows.
    assert consistent == clean_all


def warmed_log(log: Path) -> str:
    """A server's log once it tells how its warm-up query ended (`Server.warm_up`, in the background)."""
    deadline = time.monotonic() + START_TIMEOUT
    while "warmed up in" not in (text := log.read_text(errors="replace")) and "warm-up query failed" not in text:
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(0.5)
    return text


def test_a_ready_server_warms_up_with_a_lookup_through_a_full_view(served: tuple[Path, ServerInfo]) -> None:
    """Once ready, the server runs one lookup through a full view in the background (its log says so), so a
    user's first query meets a warm JVM; the state file was written before it, not held back by it."""
    root, _ = served
    text = warmed_log(root / "serve.log")
    assert f"s: SELECT * FROM `{SCHEMA}`.`people__full_view` WHERE `id` IS NULL" in text, text[-3000:]
    assert text.index("spark connect: sc://") < text.index("warmed up in"), "ready before the warm-up ended"


def test_the_warm_up_looks_up_a_null_key_through_a_latest_state_view(tmp_path: Path) -> None:
    from cdc_platform import lake
    from cdc_platform.views.catalog import warm_up_sql

    config = load_config(write_config(tmp_path, {"shop.people": {"key": ["id", "region"], "mask": ["email"]}, "shop.cards": {"key": ["number"]}}))
    lake.write_registry(config)
    people = "SELECT * FROM `cdc`.`{}` WHERE `id` IS NULL AND `region` IS NULL"
    assert warm_up_sql(config.lake, "cdc", ["people", "people__full_view", "people__clean_view"]) == people.format("people__full_view")
    assert warm_up_sql(config.lake, "cdc", ["people__clean_view"]) == people.format("people__clean_view")  # `expose: clean`
    assert warm_up_sql(config.lake, "cdc", ["cards__full_view"]) == "SELECT * FROM `cdc`.`cards__full_view` WHERE `number` IS NULL"
    assert warm_up_sql(config.lake, "cdc", ["raw_change_events"]) is None  # nothing registered to warm up through


def test_no_warm_up_is_a_flag_of_serve() -> None:
    from cdc_platform.cli import build_parser

    assert build_parser().parse_args(["serve"]).no_warm_up is False
    assert build_parser().parse_args(["serve", "--no-warm-up"]).no_warm_up is True


def test_a_failed_warm_up_is_reported_and_changes_nothing(tmp_path: Path) -> None:
    from cdc_platform import lake

    config = load_config(write_config(tmp_path, {"shop.people": {"key": ["id"]}}))
    lake.write_registry(config)

    class Refusing:
        def sql(self, sql: str) -> Any:
            raise RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] people__full_view\nmore lines")

    said: list[str] = []
    server = Server(config.lake, "cdc", progress=said.append)
    server.names = ["people__full_view"]
    assert server.warm_up() is None  # no Spark yet: nothing to run
    server.spark = Refusing()
    assert server.warm_up() is None
    assert said == ["warm-up query failed (the server keeps serving): RuntimeError: [TABLE_OR_VIEW_NOT_FOUND] people__full_view"]


def test_the_views_over_jdbc(served: tuple[Path, ServerInfo]) -> None:
    _, info = served
    assert info.jdbc_url == f"jdbc:hive2://{HOST}:{info.jdbc_port}/{SCHEMA}"
    rows = beeline(info.jdbc_url, "SELECT id, name FROM people__full_view ORDER BY id")  # the URL's schema is the current one
    assert rows == [{"id": "0", "name": "ann"}, {"id": "1", "name": "bobby"}]
    assert beeline(info.jdbc_url, f"SELECT count(*) AS n FROM {SCHEMA}.raw_change_events") == [{"n": "5"}]
    assert beeline(info.jdbc_url, "SELECT id, name FROM people__consistent_view ORDER BY id") == rows


def cdc_sql(*argv: str) -> subprocess.CompletedProcess[str]:
    """`cdc sql` as a user's shell runs it."""
    return subprocess.run([str(CDC), "sql", *argv], capture_output=True, text=True, timeout=600)


def test_cdc_sql_uses_the_server(served: tuple[Path, ServerInfo]) -> None:
    """Through the server, as a user's shell runs it; the local path's answers are compared in the next test."""
    root, info = served
    # One run: benchmarks/point_lookup.py times `cdc sql` end to end; a test only checks who answered and what.
    done = cdc_sql("--lake", str(root / "lake"), "SELECT id, name FROM people__full_view WHERE id = 1")
    assert done.returncode == 0, done.stderr
    assert f"answered by cdc serve (pid {info.pid})" in done.stderr and "starting Spark" not in done.stderr
    assert "bobby" in done.stdout
    # Qualified names work through the server; errors stay one line and exit 2.
    qualified = cdc_sql("--lake", str(root / "lake"), "--format", "json", f"SELECT count(*) AS n FROM {SCHEMA}.people__full_view")
    assert json.loads(qualified.stdout) == [{"n": 2}]
    for query, expected in [("SELECT nosuch FROM people__full_view", "error: unknown column `nosuch`; the columns nearest by name are"),
                            ("SELECT * FROM peple__full_view", "error: unknown table or view `peple__full_view`: did you mean `people__full_view`"),
                            ("SELEC 1", "error: syntax error in the query at or near 'SELEC'"),
                            ("SELECT 1/0", "error: Division by zero.")]:
        wrong = cdc_sql("--lake", str(root / "lake"), query)
        assert wrong.returncode == 2 and wrong.stderr.strip().startswith(expected), wrong.stderr
        assert len([line for line in wrong.stderr.splitlines() if line.strip()]) == 1, wrong.stderr


def test_cdc_sql_answers_alike_through_the_server_and_locally(served: tuple[Path, ServerInfo], capsys: pytest.CaptureFixture[str]) -> None:
    """The server's JDBC endpoint hands nested values over as text; `cdc sql` gives back the same values
    as a local session, in every output format. (In this process: the local runs share the suite's Spark.)"""
    root, _ = served
    query = ("SELECT id, name, named_struct('a', id, 'b', name) AS s, array(id, 2) AS a, map('k', name) AS m, "
             "CAST(1.50 AS DECIMAL(10, 2)) AS d, DATE'2024-01-02' AS dt, TIMESTAMP'2024-01-02 03:04:05.5' AS ts, "
             "X'CAFE' AS bin, true AS b, CAST(NULL AS STRING) AS n FROM people__full_view ORDER BY id")
    lake_dir = str(root / "lake")
    for fmt in ("json", "csv", "table"):
        assert main(["sql", "--lake", lake_dir, "--format", fmt, query]) == 0
        remote, remote_err = capsys.readouterr()
        assert "local Spark session" not in remote_err, remote_err
        assert fmt != "table" or "answered by cdc serve" in remote_err, remote_err  # only the table format says who answered
        assert main(["sql", "--lake", lake_dir, "--local", "--format", fmt, query]) == 0
        local, _ = capsys.readouterr()
        assert remote == local, f"{fmt}:\n{remote}\n!=\n{local}"


def test_the_catalog_follows_new_columns_and_new_tables(served: tuple[Path, ServerInfo], spark: Any) -> None:
    root, info = served
    config_path = root / "cdc.yaml"
    doc = yaml.safe_load(config_path.read_text())
    doc["tables"]["shop.orders"] = {"key": ["id"]}
    config_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    land_and_run(spark, config_path, "part-00002.jsonl", [
        ev("c", pos=30, table="people", after={"id": 5, "name": "dee", "email": "d@example.com", "city": "Utrecht"}),
        ev("c", pos=31, table="orders", after={"id": 1, "total": 12}),
    ])
    # The server polls the lake; it may have registered the views while the run above was still committing
    # (orders answering from the raw log's tail, people's view still of its base's schema without `city`,
    # which the view gains when the fold's new schema is seen), and registers them again on its next poll.
    # So the test waits for each answer itself, not for a name to appear or for one table to stand for both.
    expected = {
        f"SELECT id, total FROM {SCHEMA}.orders__full_view": [{"id": 1, "total": 12}],
        f"SELECT id, city FROM {SCHEMA}.people__full_view WHERE id IN (0, 5) ORDER BY id": [{"id": 0, "city": None}, {"id": 5, "city": "Utrecht"}],
    }
    deadline = time.monotonic() + 120
    while (answer := try_connect_queries(info.connect_url, *expected)) != list(expected.values()):
        assert time.monotonic() < deadline, f"{list(expected)} never answered as landed; last answers: {str(answer)[:1500]} ... {str(answer)[-500:]}"
        time.sleep(1)


# --- failure paths: no server, a stale one, no client, a taken port --------------------------------------

@pytest.fixture
def small_lake(lake_templates: Any, spark: Any, tmp_path: Path) -> Path:
    """A lake of three people, each test's own copy (these tests change its files, never run the pipeline on it)."""

    def build(root: Path) -> None:
        land_and_run(spark, write_config(root, {"shop.people": {"key": ["id"]}}), "part-00001.jsonl", PEOPLE)

    return lake_templates.copy("serve-people", build, tmp_path) / "lake"


def test_a_table_registered_before_the_registry_named_it_becomes_its_views(small_lake: Path, spark: Any) -> None:
    """`cdc serve` polled while a run was creating `people` and before the lake's registry named it latest-state
    storage, so it registered the directory as the plain table `people`; every later refresh then failed
    (EXPECT_VIEW_NOT_TABLE) and the views never came. Now the registry is written before the tables, and a
    plain table in the way of a view is dropped from the catalog (its data stays) and the views made."""
    from cdc_platform import lake
    from cdc_platform.views.catalog import register_catalog

    for temp in [t.name for t in spark.catalog.listTables() if t.isTemporary]:  # other tests' session views, which `cdc serve` has not
        spark.catalog.dropTempView(temp)
    registry = lake.read_registry(small_lake)
    (small_lake / lake.REGISTRY_FILE).write_text(json.dumps({**registry, "tables": []}), encoding="utf-8")
    first = register_catalog(spark, small_lake, "race")
    assert "people" in first and spark.catalog.getTable("race.people").tableType == "EXTERNAL"
    (small_lake / lake.REGISTRY_FILE).write_text(json.dumps(registry), encoding="utf-8")
    register_catalog(spark, small_lake, "race", previous=first)
    assert spark.catalog.getTable("race.people").tableType == "VIEW"
    rows = spark.sql("SELECT id, name FROM race.people__full_view ORDER BY id").collect()
    assert [(r["id"], r["name"]) for r in rows] == [(0, "ann"), (1, "bob"), (2, "cy")]
    assert spark.sql("SELECT count(*) AS n FROM race.people__stored").first()["n"] == 3  # the storage, registered by its own name


def write_state(lake_dir: Path, pid: int, jdbc_port: int) -> None:
    """A state file naming `pid` and `jdbc_port`, the endpoint `cdc sql` uses (Spark Connect's port one above it)."""
    info = ServerInfo(pid=pid, lake=str(lake_dir), schema="cdc", host=HOST, connect_port=jdbc_port + 1, jdbc_port=jdbc_port,
                      started_at="2026-01-01T00:00:00+00:00")
    (lake_dir / STATE_FILE).write_text(json.dumps(info.__dict__), encoding="utf-8")


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_cdc_sql_without_a_server_runs_locally(small_lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sql", "--lake", str(small_lake), "--format", "json", "SELECT count(*) AS n FROM people__full_view"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == [{"n": 3}] and "cdc serve" not in err


@pytest.mark.parametrize("state", ["dead pid", "closed port", "garbage"])
def test_cdc_sql_falls_back_when_the_state_file_names_no_live_server(small_lake: Path, state: str, capsys: pytest.CaptureFixture[str]) -> None:
    if state == "dead pid":
        write_state(small_lake, dead_pid(), free_ports(1)[0])
    elif state == "closed port":
        write_state(small_lake, os.getpid(), free_ports(1)[0])
    else:
        (small_lake / STATE_FILE).write_text("{not json", encoding="utf-8")
    assert main(["sql", "--lake", str(small_lake), "SELECT count(*) AS n FROM people__full_view"]) == 0
    out, err = capsys.readouterr()
    assert "| 3 " in out
    expected = {"dead pid": "no longer running", "closed port": "does not answer", "garbage": None}[state]
    if expected:
        assert expected in err and "running the query in a local Spark session" in err


@pytest.fixture
def listener(small_lake: Path) -> Iterator[socket.socket]:
    """A live pid and an open JDBC port in the lake's state file, where nothing speaks HiveServer2: every
    connection is accepted and closed at once."""
    server = socket.create_server((HOST, 0))
    port = server.getsockname()[1]
    write_state(small_lake, os.getpid(), port)

    def refuse() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.close()

    threading.Thread(target=refuse, daemon=True).start()
    try:
        yield server
    finally:
        server.close()


def test_cdc_sql_falls_back_without_the_hiveserver2_client(small_lake: Path, listener: socket.socket, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "impala.dbapi", None)  # `import impala.dbapi` now raises ImportError
    info, _ = sql_client.find_server(small_lake)
    assert info is not None
    with pytest.raises(ServerUnavailable, match=r"pip install impyla"):
        sql_client.remote_query(info, "SELECT 1")
    assert main(["sql", "--lake", str(small_lake), "SELECT count(*) AS n FROM people__full_view"]) == 0
    out, err = capsys.readouterr()
    assert "| 3 " in out and "HiveServer2 client is not installed" in err and "local Spark session" in err


def test_cdc_sql_falls_back_when_the_port_speaks_no_hiveserver2(small_lake: Path, listener: socket.socket, capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    assert main(["sql", "--lake", str(small_lake), "SELECT count(*) AS n FROM people__full_view"]) == 0
    out, err = capsys.readouterr()
    assert "| 3 " in out and "does not answer" in err and "local Spark session" in err
    assert time.monotonic() - t0 < sql_client.REQUEST_TIMEOUT  # refused at once, not after a time-out


def test_the_spark_connect_client_missing_is_unavailable(small_lake: Path, listener: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark.sql.connect.utils as connect_utils

    def missing(_: str) -> None:
        raise ImportError("No module named 'grpc_status'")

    monkeypatch.setattr(connect_utils, "check_dependencies", missing)
    info, _ = sql_client.find_server(small_lake)
    assert info is not None
    with pytest.raises(ServerUnavailable, match=r"pip install 'cdc-platform\[connect\]'"):
        sql_client.connect_query(info, "SELECT 1")


def test_serve_refuses_a_port_in_use_in_one_line(small_lake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listener = socket.create_server((HOST, 0))
    taken = listener.getsockname()[1]
    try:
        free = free_ports(1)[0]
        assert main(["serve", "--lake", str(small_lake), "--connect-port", str(free), "--jdbc-port", str(taken)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: port {taken} on {HOST} is in use (another `cdc serve`, or another program): stop it or pass another --jdbc-port"]
        assert main(["serve", "--lake", str(small_lake), "--connect-port", str(free), "--jdbc-port", str(free)]) == 2
        assert "the ports must differ" in capsys.readouterr().err
        # A live server for the lake (its pid alive, its JDBC port answering) is named rather than fought.
        write_state(small_lake, os.getpid(), taken)
        assert main(["serve", "--lake", str(small_lake), "--connect-port", str(free), "--jdbc-port", str(free + 1)]) == 2
        assert f"a server (pid {os.getpid()}) already serves this lake" in capsys.readouterr().err
    finally:
        listener.close()
    assert not (small_lake / "_serve").exists()  # refused before anything was written


def test_serve_without_a_lake_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--lake", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"error: lake directory {tmp_path / 'nope'} does not exist; run `cdc run` first or pass the right --lake/--config"]


def test_stop_removes_only_its_own_state_file(tmp_path: Path) -> None:
    write_state(tmp_path, os.getpid(), 1)
    Server(tmp_path, "cdc").stop()
    assert not (tmp_path / STATE_FILE).exists()
    write_state(tmp_path, dead_pid(), 1)  # another server's file (say, one that started after this one)
    Server(tmp_path, "cdc").stop()
    assert (tmp_path / STATE_FILE).exists()


def test_catalog_schema_in_the_config(tmp_path: Path) -> None:
    (tmp_path / "cdc.yaml").write_text("landing: l\nlake: k\n", encoding="utf-8")
    assert load_config(tmp_path / "cdc.yaml").catalog.schema == "cdc"
    (tmp_path / "cdc.yaml").write_text("landing: l\nlake: k\ncatalog: {schema: shop_lake}\n", encoding="utf-8")
    assert load_config(tmp_path / "cdc.yaml").catalog.schema == "shop_lake"
    for bad, words in (("{schema: Shop-Lake}", "catalog.schema` must be a lower-case name"), ("{scheme: x}", "unknown key(s) catalog.scheme"),
                       ("cdc", "`catalog` must be a mapping")):
        (tmp_path / "cdc.yaml").write_text(f"landing: l\nlake: k\ncatalog: {bad}\n", encoding="utf-8")
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)")):
            load_config(tmp_path / "cdc.yaml")


def test_waiting_for_a_server_that_exits_says_why(tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    log.write_text("starting\nerror: port 15002 is taken\n", encoding="utf-8")
    with pytest.raises(ServerUnavailable, match=r"did not start \(exit 2\): .*port 15002 is taken"):
        sql_client.wait_for_state(tmp_path, lambda: 2, log, timeout=30)
    with pytest.raises(ServerUnavailable, match=r"did not start \(exit None\)"):
        sql_client.wait_for_state(tmp_path, lambda: None, log, timeout=0)
