"""The `cdc` CLI: its names and output formats are a public interface that external checks call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdc_platform.cli import format_rows, main

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
    assert "run `cdc run` first" in capsys.readouterr().err
    (tmp_path / "gen" / "landing").mkdir(parents=True)
    (tmp_path / "gen" / "landing" / "x.jsonl").write_text("{}\n")
    assert main(["generate", "--out", str(tmp_path / "gen")]) == 2
    assert "already contains files" in capsys.readouterr().err


def test_installed_entry_point_generate_run_and_sql(tmp_path: Path) -> None:
    """The real console script, as a user or an external check runs it (one Spark start per call)."""
    env = {k: v for k, v in os.environ.items() if k != "CDC_CONFIG"}
    out = subprocess.run([str(CDC), "generate", "--out", str(tmp_path / "w"), "--transactions", "40"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "w" / "cdc.yaml").is_file()
    env["CDC_CONFIG"] = str(tmp_path / "w" / "cdc.yaml")
    run = subprocess.run([str(CDC), "run"], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "batch 0:" in run.stderr and "Setting default log level" not in run.stderr
    sql = subprocess.run([str(CDC), "sql", "--lake", str(tmp_path / "w" / "lake"), "--format", "json",
                          "SELECT count(*) AS events FROM raw_change_events"], capture_output=True, text=True, env=env, timeout=300)
    assert sql.returncode == 0, sql.stderr
    assert json.loads(sql.stdout)[0]["events"] > 40


def test_missing_java_stops_with_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_platform.errors import EnvironmentNotReadyError
    from cdc_platform.session import require_java

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
    from cdc_platform.session import require_java

    fake = tmp_path / "bin" / "java"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho \'java version "1.8.0_381"\' >&2\n')
    fake.chmod(0o755)
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(EnvironmentNotReadyError, match="Java 8, older than 17"):
        require_java()


def test_master_flag_reaches_the_config_and_a_second_master_is_refused(tmp_path: Path, spark, capsys) -> None:
    from cdc_platform.cli import _config, build_parser
    from cdc_platform.session import get_spark, loopback_standalone

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
