"""The `cdc` CLI: its names and output formats are a public interface that external checks call."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.cli import build_parser, describe_error, format_rows, main
from tests.testbed.streaming import StreamProcess

REPO = Path(__file__).resolve().parents[2]
CDC = Path(sys.executable).parent / "cdc"


def test_format_rows() -> None:
    cols = ["id", "name", "seen"]
    rows = [(1, "a,b", None), (2, 'q"uote', {"k": 1})]
    assert json.loads(format_rows(cols, rows, "json")) == [{"id": 1, "name": "a,b", "seen": None}, {"id": 2, "name": 'q"uote', "seen": {"k": 1}}]
    assert format_rows(cols, rows, "csv").splitlines() == ["id,name,seen", '1,"a,b",', '2,"q""uote","{""k"": 1}"']
    table = format_rows(cols, rows, "table")
    assert "| 1  | a,b    | NULL     |" in table and '| 2  | q"uote | {"k": 1} |' in table and table.endswith("(2 rows)")
    assert format_rows(["n"], [], "json") == "[]"


def test_run_then_sql_in_process(tmp_path: Path, spark, peer_files, capsys) -> None:
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "a.jsonl").write_bytes(peer_files["replica_identity"].read_bytes())
    config = tmp_path / "cdc.yaml"
    config.write_text("landing: landing\nlake: lake\ntables:\n  inventory.products: {key: [id]}\n")
    assert main(["run", "--config", str(config)]) == 0
    assert "15 new change events, 1 dead letters" in capsys.readouterr().err
    assert main(["run", "--config", str(config)]) == 0
    assert "0 batch(es)" in capsys.readouterr().err
    assert main(["sql", "--lake", str(tmp_path / "lake"), "--format", "json", "SELECT reason_code FROM dead_letter"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"reason_code": "delete_without_row"}]
    assert main(["sql", "--lake", str(tmp_path / "lake"), "--format", "csv", "SELECT count(*) AS n FROM raw_change_events"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "15"]


def test_errors_are_one_line_and_exit_2(tmp_path: Path, capsys) -> None:
    assert main(["run", "--config", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: config file") and "Traceback" not in err
    assert main(["sql", "--lake", str(tmp_path / "nolake"), "SELECT 1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: lake directory") and "run `cdc run` first" in err
    (tmp_path / "gen" / "landing").mkdir(parents=True)
    (tmp_path / "gen" / "landing" / "x.jsonl").write_text("{}\n")
    assert main(["generate", "--out", str(tmp_path / "gen")]) == 2
    assert "already contains files" in capsys.readouterr().err


def test_installed_entry_point_generate_stream_stopped_by_ctrl_c_and_sql(tmp_path: Path) -> None:
    """The real console script, as a user or an external check runs it (one Spark start per call):
    `cdc generate`, `cdc stream` stopped by Ctrl-C while its first batch runs, then `cdc sql`.

    Ctrl-C is SIGINT to the process group, as a terminal sends it. Before `processes.stop_on_signals`,
    PySpark's SIGINT handler called the JVM inside the main thread's pending Py4J call: Py4J stack traces,
    then `error: unexpected Py4JError ... a defect of the platform` and exit 2, with the batch cancelled.
    Now that batch commits, the stream stops and exits 0, and the lake holds every change event once.
    """
    from cdc_platform.config import load_config
    from tests.cdc_platform.test_generate import distinct_changes, read_landing

    env = {k: v for k, v in os.environ.items() if k != "CDC_CONFIG"}
    out = subprocess.run([str(CDC), "generate", "--out", str(tmp_path / "w"), "--transactions", "40"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    config = tmp_path / "w" / "cdc.yaml"
    assert config.is_file()
    env["CDC_CONFIG"] = str(config)
    checkpoint = load_config(config).checkpoint_dir
    log = tmp_path / "stream.log"
    stream = StreamProcess([str(CDC), "stream", "--trigger-interval", "1 second"], log, env=env)
    stream.start()
    try:
        deadline = time.monotonic() + 240
        while not (checkpoint / "offsets" / "0").exists():  # batch 0 planned: its foreachBatch is running (or about to)
            assert stream.alive() and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        in_flight = not (checkpoint / "commits" / "0").exists()
        assert stream.stop(timeout=120) == 0, log.read_text()
    finally:
        stream.kill()
    text = log.read_text()
    assert "stopping after the current batch" in text and "Traceback" not in text and "error:" not in text, text
    assert not in_flight or "batch 0:" in text, "the batch in flight when Ctrl-C came commits before the stream stops"
    assert "Setting default log level" not in text
    sql = subprocess.run([str(CDC), "sql", "--lake", str(tmp_path / "w" / "lake"), "--format", "json",
                          "SELECT count(*) AS n, count(DISTINCT event_id) AS ids FROM raw_change_events"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert sql.returncode == 0, sql.stderr
    # Batch 0 holds every file of the sample (fewer than max_files_per_trigger), so the lake is complete.
    expected = len(distinct_changes(read_landing(tmp_path / "w" / "landing")))
    assert json.loads(sql.stdout) == [{"n": expected, "ids": expected}] and expected > 40


def test_missing_java_stops_with_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_platform.errors import EnvironmentNotReadyError
    from cdc_platform.spark.session import require_java

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnvironmentNotReadyError, match="openjdk-17-jre-headless"):
        require_java()
    script = subprocess.run([sys.executable, str(REPO / "scripts" / "check_java.py")], capture_output=True, text=True,
                            env={"PATH": str(tmp_path)})
    assert script.returncode == 1
    assert script.stderr.count("\n") == 1 and "Java 17 or newer is required" in script.stderr


def test_old_java_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_platform.errors import EnvironmentNotReadyError
    from cdc_platform.spark.session import require_java

    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho \'java version "1.8.0_381"\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(EnvironmentNotReadyError, match="Java 8, older than 17"):
        require_java()


def test_master_flag_reaches_the_config_and_a_second_master_is_refused(tmp_path: Path, spark, capsys) -> None:
    from cdc_platform.cli import _config, build_parser
    from cdc_platform.spark.session import get_spark, loopback_standalone

    config = tmp_path / "cdc.yaml"
    config.write_text("landing: landing\nlake: lake\nspark_master: spark://10.0.0.5:7077\n")
    for command in ("run", "stream"):
        args = build_parser().parse_args([command, "--config", str(config), "--master", "spark://127.0.0.1:7077"])
        assert _config(args).spark_master == "spark://127.0.0.1:7077"
    assert _config(build_parser().parse_args(["run", "--config", str(config)])).spark_master == "spark://10.0.0.5:7077"
    assert loopback_standalone("spark://127.0.0.1:7077") and loopback_standalone("spark://localhost:1,127.0.0.1:2")
    assert not loopback_standalone("spark://10.0.0.5:7077") and not loopback_standalone("local[2]")
    # This process holds the suite's local session: another master needs a process of its own, and says so.
    assert get_spark(master=spark.sparkContext.master) is spark
    assert main(["sql", "--lake", str(tmp_path), "--master", "spark://127.0.0.1:7077", "SELECT 1"]) == 2
    assert "a second one on spark://127.0.0.1:7077 is not possible" in capsys.readouterr().err
    assert main(["sql", "--lake", str(tmp_path), "--master", "spark:/x", "SELECT 1"]) == 2
    assert "--master must be a Spark master URL" in capsys.readouterr().err


# --- every error is one line and exit 2 -----------------------------------------------------------------

@pytest.fixture(scope="module")
def sample_lake(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Path:
    """A small generated sample, run once: a real lake with latest-state tables and views to query wrongly."""
    out = tmp_path_factory.mktemp("cli-lake")
    assert main(["generate", "--out", str(out), "--transactions", "30"]) == 0
    assert main(["run", "--config", str(out / "cdc.yaml")]) == 0
    return out / "lake"


def error_lines(err: str) -> list[str]:
    """stderr without the `[cdc]` progress lines: what is left must be the one `error:` line."""
    return [line for line in err.splitlines() if line.strip() and not line.startswith("[cdc] ")]


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("SELEC * FROM dead_letter", "syntax error in the query at or near 'SELEC' (line 1, position 1)"),
        ("SELECT * FROM customers__full_view WHERE id =", "syntax error in the query at or near end of input"),
        ("SELECT nope FROM customers__full_view", "unknown column `nope`; the columns nearest by name are"),
        ("SELECT * FROM customer__full_view", "unknown table or view `customer__full_view`: did you mean `customers__full_view`"),
        # It names `customers` (so only its views are planned) and mistypes another table's: the error still knows every name.
        ("SELECT * FROM customers__full_view JOIN charge__full_view USING (id)", "did you mean `charges__full_view`"),
        ("SELECT * FROM no_such_table", "unknown table or view `no_such_table`: the lake has"),
        ("SELECT no_such_function(1)", "unknown function `no_such_function`"),
        ("SELECT raise_error('boom') FROM customers__full_view", "boom (Spark USER_RAISED_EXCEPTION)"),
        ("SELECT CAST(name AS INT) FROM customers__full_view", 'cannot be cast to "INT"'),
    ],
)
def test_sql_errors_are_one_line_and_exit_2(sample_lake: Path, capfd: pytest.CaptureFixture[str], query: str, words: str) -> None:
    """capfd, not capsys: the JVM writes to the process's stderr directly, and must not have printed its stack."""
    assert main(["sql", "--lake", str(sample_lake), query]) == 2
    out, err = capfd.readouterr()
    assert out == ""
    lines = error_lines(err)
    assert len(lines) == 1, err[-3000:]
    assert lines[0].startswith("error: ") and words in lines[0], lines[0]
    assert "Traceback" not in err and "\tat " not in err and "JVM" not in err


def test_verbose_shows_the_python_and_jvm_stack_then_the_error_line(sample_lake: Path, capfd: pytest.CaptureFixture[str]) -> None:
    for argv in (["sql", "--verbose"], ["--verbose", "sql"], ["-v", "sql"]):
        assert main([*argv, "--lake", str(sample_lake), "SELECT nope FROM customers__full_view"]) == 2
        err = capfd.readouterr().err
        assert "Traceback (most recent call last)" in err and "AnalysisException" in err
        assert "JVM stack:" in err and "\tat org.apache.spark" in err
        assert err.rstrip().splitlines()[-1].startswith("error: unknown column `nope`")


def test_spark_errors_outside_cdc_sql_are_phrased_too(spark: Any) -> None:
    """`cdc run` and the others reach `main` with Spark's own exception: the same words, one line."""
    for query, words in (("SELEC 1", "syntax error in the query at or near 'SELEC'"),
                         ("SELECT * FROM nowhere_at_all", "unknown table or view `nowhere_at_all`"),
                         ("SELECT 1/0", "Division by zero")):
        with pytest.raises(Exception) as caught:
            spark.sql(query).collect()
        text = describe_error(caught.value)
        assert words in text and "\n" not in text, text


def test_other_failures_are_one_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def boom(args: argparse.Namespace) -> int:
        raise TypeError("an unexpected thing\nwith a second line")

    def disk(args: argparse.Namespace) -> int:
        raise PermissionError(13, "Permission denied", str(tmp_path / "lake"))

    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    def run_with(func: Any, *extra: str) -> int:
        parser = build_parser()
        args = parser.parse_args(["maintain", *extra, "--lake", str(tmp_path)])
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", lambda self, argv=None, namespace=None: args)
        args.func = func
        try:
            return main([])
        finally:
            monkeypatch.undo()

    assert run_with(boom) == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: unexpected TypeError: an unexpected thing; this is a defect of the platform: "
        "run the command again with --verbose and report the stack"]
    assert run_with(boom, "--verbose") == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("error: unexpected TypeError")
    assert run_with(disk) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"error: Permission denied: {tmp_path / 'lake'} (a file or the disk failed; check the path and space, then run again)"]
    assert run_with(interrupted) == 130
    assert capsys.readouterr().err == "error: interrupted (Ctrl-C)\n"


@pytest.mark.parametrize("argv", [["bogus"], [], ["sql"], ["generate", "--out", "x", "--transactions", "many"], ["run", "--nope"]])
def test_usage_errors_are_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "--help`)" in err, err


# --- help and version ---------------------------------------------------------------------------------

def test_version_comes_from_the_installed_package(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as stopped:
        main(["--version"])
    assert stopped.value.code == 0
    assert capsys.readouterr().out == f"cdc {version('cdc-platform')}\n"
    done = subprocess.run([str(CDC), "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout == f"cdc {version('cdc-platform')}\n"


def test_every_command_and_option_has_help_with_its_default() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    summaries = {a.dest: a.help for a in sub._choices_actions}
    assert set(sub.choices) == {"run", "stream", "sql", "serve", "serve-user", "generate", "demo", "rebuild", "maintain", "repair", "backfill"}
    for name, command in sub.choices.items():
        assert summaries[name] and command.description, name
        for action in command._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            where = f"cdc {name} {action.option_strings or action.dest}"
            assert action.help, where
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                assert "(default: %(default)" in action.help, where  # the printed default is the real one
            elif action.option_strings and not action.required:
                assert "default" in action.help, where  # what happens without the flag
        assert "%(" not in command.format_help()
    top = parser.format_help()
    assert "--version" in top and "--verbose" in top and all(f"    {n}" in top for n in sub.choices)


def test_repair_and_backfill_say_what_they_need(tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """`cdc repair` needs the live source (before Spark starts); `cdc backfill` a lake and a table's snapshot."""
    (tmp_path / "cdc.yaml").write_text("landing: landing\nlake: lake\ntables: {payments.customers: {key: [id]}}\n", encoding="utf-8")
    assert main(["repair", "--config", str(tmp_path / "cdc.yaml")]) == 2
    assert "error: cdc repair compares the lake with the live source" in capsys.readouterr().err
    assert main(["repair", "--config", str(tmp_path / "cdc.yaml"), "--table", "nope"]) == 2
    assert "error: no configured table is named 'nope' (configured: customers)" in capsys.readouterr().err
    assert main(["backfill", "--config", str(tmp_path / "cdc.yaml"), "--table", "customers"]) == 2
    assert "has no raw_change_events yet; run `cdc run` once before a backfill" in capsys.readouterr().err


# --- the demo and a second run --------------------------------------------------------------------------

def test_demo_names_what_it_counts_and_its_commands_work_as_printed(tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CDC_MASK_SALT", raising=False)
    assert main(["demo", "--dir", "demo", "--transactions", "40"]) == 0
    out = capsys.readouterr().out
    assert "open transactions; beside them the stage's state remembers" in out and "finished ones" in out
    assert "live rows (`customers__full_view`); the Delta table stores" in out and "tombstones of deleted rows" in out
    assert "`NAME__consistent_view` them as of the source's consistency watermark" in out, "named, not counted (a cold fold each)"
    assert "customers__clean_view shows `email` as NULL: the column is masked" in out and "$CDC_MASK_SALT, which is not set" in out
    total, _, phases = out.strip().splitlines()[-1].partition(" s in all: ")
    assert "counting what landed" in phases and float(total) >= sum(float(p.split()[-2]) for p in phases.rstrip(".").split(", ")) - 0.05 * len(phases.split(", "))  # each figure rounded to 0.1 s
    commands = [line.strip() for line in out[out.index("Try next:"):].splitlines()[1:4]]
    assert len(commands) == 3
    for command in commands:
        argv = shlex.split(command)
        program = argv[0]
        assert program == "cdc" and shutil.which("cdc") or os.access(program, os.X_OK), f"{program} does not run as printed"
        assert main(argv[1:]) == 0, command  # same working directory: the printed relative lake path resolves
    capsys.readouterr()


def test_demo_never_deletes_a_folder_it_did_not_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("precious")
    assert main(["demo", "--dir", str(tmp_path / "mine")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no cdc.yaml written by `cdc demo`" in err
    assert (tmp_path / "mine" / "thesis.tex").read_text() == "precious"
    (tmp_path / "file").write_text("x")
    assert main(["demo", "--dir", str(tmp_path / "file")]) == 2
    assert "is not a directory" in capsys.readouterr().err



@pytest.mark.parametrize("transactions, quick", [(500, True), (50_000, True), (50_001, False)])
def test_the_demo_starts_a_short_lived_jvm_for_a_sample_of_its_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   transactions: int, quick: bool) -> None:
    """The demo is one job in a JVM that exits after it: up to `DEMO_QUICK_JIT_TRANSACTIONS` it asks for the JIT's
    quick tier alone (`session.SHORT_LIVED_JVM`), beyond that for the long-lived defaults (no `conf`)."""
    from cdc_platform import cli
    from cdc_platform.spark import session

    class Started(Exception):
        pass

    asked: dict[str, Any] = {}

    def fake_spark(app_name: str = "", master: str | None = None, conf: Any = None, object_store: bool = False) -> Any:
        asked["conf"] = conf
        raise Started

    monkeypatch.setattr(session, "get_spark", fake_spark)
    monkeypatch.setattr(cli, "_generate", lambda out, n, seed: argparse.Namespace(config_path=_tiny_config(tmp_path)))
    with pytest.raises(Started):
        cli.cmd_demo(argparse.Namespace(dir=str(tmp_path / "demo"), transactions=transactions, seed=7))
    assert asked["conf"] == (session.SHORT_LIVED_JVM if quick else None)


def _tiny_config(root: Path) -> Path:
    (root / "landing").mkdir(exist_ok=True)
    path = root / "cdc.yaml"
    path.write_text("landing: landing\nlake: lake\ntables: {}\n", encoding="utf-8")
    return path


def full_views(query: Any, lake: Path) -> dict[str, dict[int, dict[str, Any]]]:
    views = {}
    for table in ("customers", "charges", "refunds"):
        rows = query(lake, f"SELECT * FROM {table}__full_view")
        views[table] = {r["id"]: {k: v for k, v in r.items() if not k.startswith("_")} for r in rows}
    return views


def test_generate_append_then_a_second_run_lands_the_increment(tmp_path: Path, spark: Any, query: Any,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from cdc_platform import checks
    from tests.cdc_platform.test_generate import distinct_changes, in_history_order, read_landing, row_key

    config = str(tmp_path / "cdc.yaml")
    assert main(["generate", "--out", str(tmp_path), "--transactions", "80"]) == 0
    assert main(["run", "--config", config]) == 0
    first = full_views(query, tmp_path / "lake")
    assert main(["generate", "--out", str(tmp_path), "--transactions", "80"]) == 2
    assert "already contains files" in capsys.readouterr().err
    assert main(["generate", "--out", str(tmp_path), "--append", "--transactions", "80"]) == 0
    assert "wrote an increment of" in capsys.readouterr().err
    assert main(["run", "--config", config]) == 0
    second = full_views(query, tmp_path / "lake")

    expected: dict[str, dict[int, Any]] = {"customers": {}, "charges": {}, "refunds": {}}
    for line in in_history_order(distinct_changes(read_landing(tmp_path / "landing"))):
        expected[line.obj["source"]["table"]][row_key(line.obj)] = line.obj["after"]
    for table, rows in expected.items():
        assert second[table] == {k: v for k, v in rows.items() if v is not None}, table
    customers_before, customers_after = first["customers"], second["customers"]
    assert any(k in customers_after and customers_after[k] != v for k, v in customers_before.items()), "updates are visible"
    assert set(customers_before) - set(customers_after) or set(first["charges"]) - set(second["charges"]), "deletes are hidden"
    assert set(customers_after) - set(customers_before), "new rows are present"
    outcome = checks.completeness(spark, tmp_path / "lake", 60)
    assert outcome.passed, outcome.description
    transactions = query(tmp_path / "lake", "SELECT count(*) AS n FROM transactions")[0]["n"]
    assert transactions == 160


def test_append_without_a_workload_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", "--out", str(tmp_path / "empty"), "--append"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nothing to append to" in err
