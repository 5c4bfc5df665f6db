"""`cdc serve` for other machines, tested on 127.0.0.1 only: a server with Spark Connect's token, JDBC logins
from the password file over TLS (a `--self-signed` keystore) and `expose: clean`; every refusal the issue
names (missing or wrong token, wrong password, unknown user, a plain-text client, hidden names), a storm of
failed logins, the failed-login log lines, and no secret in a log, `_serve.json` or the lake. The refusal of a
non-loopback address is checked without any socket. LDAP logins: test_serve_ldap.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform.cli import main
from cdc_platform.config import load_config
from cdc_platform.config_serve import ServeConfig
from cdc_platform.errors import ConfigError, ServeError
from cdc_platform.serve import passwords, security, sql_client
from cdc_platform.serve.sql_client import ServerInfo, ServerUnavailable
from cdc_platform.spark.processes import die_with_parent, free_ports, stop_group
from tests.cdc_platform.test_serve import CDC, PEOPLE, START_TIMEOUT, land_and_run, warmed_log

SCHEMA = "lakehouse"
TOKEN = "connect-token-7c1e9a4b2f"
PASSWORD = "ann-password-93c1"
SALT = "pepper-for-the-clean-views"
STORM = 200


def write_secured_config(root: Path, serve: dict[str, Any]) -> Path:
    (root / "landing").mkdir(parents=True, exist_ok=True)
    path = root / "cdc.yaml"
    path.write_text(yaml.safe_dump({"landing": "landing", "lake": "lake", "catalog": {"schema": SCHEMA}, "serve": serve,
                                    "tables": {"shop.people": {"key": ["id"], "mask": ["email"]}}}), encoding="utf-8")
    return path


def owner_only(path: Path, text: str) -> Path:
    path.write_text(text + "\n", encoding="utf-8")
    path.chmod(0o600)
    return path


@dataclass
class Served:
    root: Path
    info: ServerInfo
    log: Path


@contextmanager
def start_server(root: Path, config: Path, *flags: str, env: dict[str, str] | None = None, expose: str = "all",
                 log_name: str = "serve.log", warm_up: bool = False) -> Iterator[Served]:
    """`cdc serve` as a user starts it, in a process group of its own, stopped whole even when a test fails.

    Without its warm-up query unless asked (`--no-warm-up`): these tests are about logins and names, and the suite's
    two cores are better spent on them; the `secured` server warms up, through its clean view."""
    connect_port, jdbc_port = free_ports(2)
    log = root / log_name
    environ = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONNECT_AUTHENTICATE_TOKEN", "CDC_SERVE_KEYSTORE_PASSWORD")}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(CDC), "serve", "--config", str(config), "--connect-port", str(connect_port), "--jdbc-port", str(jdbc_port),
                                 "--poll-interval", "2", *([] if warm_up else ["--no-warm-up"]), *flags], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent(), env={**environ, "CDC_MASK_SALT": SALT, **(env or {})})
    try:
        try:
            info = sql_client.wait_for_state(root / "lake", proc.poll, log, START_TIMEOUT, expose)
        except ServerUnavailable as exc:
            pytest.fail(str(exc))
        yield Served(root, info, log)
    finally:
        stop_group(proc.pid, reap=proc.poll)
        proc.wait(timeout=30)
        print(f"cdc serve log:\n{log.read_text(errors='replace')[-3000:]}")


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[Served]:
    """Token from an owner-only file, JDBC logins from the password file, TLS from `--self-signed`, `expose: clean`."""
    root = tmp_path_factory.mktemp("secured")
    config = write_secured_config(root, {"expose": "clean", "jdbc_auth": "password_file", "connect_token_file": "connect.token"})
    land_and_run(spark, config, "part-00001.jsonl", PEOPLE)
    owner_only(root / "connect.token", TOKEN)
    passwords.add_user(root / "serve-users", "ann", PASSWORD, iterations=2_000)  # few rounds: the storm below stays quick
    with start_server(root, config, "--self-signed", expose="clean", warm_up=True) as served:
        yield served


CONNECT_CLIENT = """
import json, sys
from pyspark.sql import SparkSession
try:
    spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
    print(json.dumps([r.asDict() for r in spark.sql(sys.argv[2]).collect()], default=str))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


def connect_answer(url: str, sql: str, token: str | None, env_extra: dict[str, str] | None = None) -> Any:
    """A notebook on another machine, as far as loopback allows: plain pyspark, the token from Spark's own variable."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_AUTHENTICATE_TOKEN"} | (env_extra or {})
    if token is not None:
        env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = token
    done = subprocess.run([sys.executable, "-c", CONNECT_CLIENT, url, sql], capture_output=True, text=True, timeout=300, cwd="/", env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("[", "{"))]
    assert lines, done.stderr[-2000:]
    return json.loads(lines[-1])


def jdbc(info: ServerInfo, user: str, password: str, sql: str, *, tls: bool = True) -> list[tuple[Any, ...]]:
    """A BI tool's connection: HiveServer2 over HTTP with TLS, a user and a password (impyla, as `cdc sql` uses it)."""
    from impala.dbapi import connect

    conn = connect(host="127.0.0.1", port=info.jdbc_port, auth_mechanism="PLAIN", user=user, password=password, use_http_transport=True,
                   http_path="cliservice", use_ssl=tls, ca_cert=info.cert if tls else None, timeout=60, retries=1)
    try:
        cursor = conn.cursor(configuration={"use:database": info.schema})
        cursor.execute(sql)
        return [tuple(r) for r in cursor.fetchall()]
    finally:
        try:
            conn.close()
        except Exception:  # noqa: BLE001 - impyla's close after a refused login fails on the session it never had
            pass


def refused(info: ServerInfo, user: str, password: str, **kw: Any) -> str:
    try:
        jdbc(info, user, password, "SELECT 1", **kw)
    except Exception as exc:  # noqa: BLE001 - the refusal's kind is what the caller checks
        return f"{type(exc).__name__}: {exc}"
    raise AssertionError(f"{user}/{password!r} was let in")


def test_spark_connect_needs_the_token(secured: Served) -> None:
    info = secured.info
    assert info.connect_token and info.connect_url.startswith("sc://localhost:")  # pyspark sends a token without TLS to localhost only
    query = f"SELECT id, name FROM {SCHEMA}.people__clean_view ORDER BY id"
    assert connect_answer(info.connect_url, query, TOKEN) == [{"id": 0, "name": "ann"}, {"id": 1, "name": "bob"}, {"id": 2, "name": "cy"}]
    missing = connect_answer(info.connect_url, query, None)
    assert "No authentication token provided" in missing["error"], missing
    wrong = connect_answer(info.connect_url, query, "not-the-token-at-all")
    assert "Invalid authentication token" in wrong["error"], wrong


def test_spark_connect_behind_the_readmes_tls_proxy(secured: Served, tmp_path: Path) -> None:
    """nginx terminating TLS in front of the loopback port (README): the token crosses TLS, a wrong one is refused
    and the proxy's log names the refused call's client and its gRPC status (16, UNAUTHENTICATED)."""
    from cdc_platform.testbed.tls_proxy import grpc_tls_proxy

    with grpc_tls_proxy(tmp_path / "proxy", secured.info.connect_port) as proxy:
        trust = {"GRPC_DEFAULT_SSL_ROOTS_FILE_PATH": str(proxy.cert)}
        assert connect_answer(proxy.url, f"SELECT count(*) AS n FROM {SCHEMA}.people__clean_view", TOKEN, trust) == [{"n": 3}]
        wrong = connect_answer(proxy.url, "SELECT 1", "not-the-token-at-all", trust)
        assert "Invalid authentication token" in wrong["error"], wrong
        log = proxy.access_log.read_text()
    refusals = [line for line in log.splitlines() if "grpc-status=16/" in line]
    assert refusals and all(line.startswith("127.0.0.1:") for line in refusals) and TOKEN not in log, log


def test_jdbc_logins_over_tls(secured: Served) -> None:
    info = secured.info
    assert (info.jdbc_transport, info.jdbc_auth, info.tls) == ("http", "password_file", True)
    assert info.jdbc_url.endswith(f"/{SCHEMA};transportMode=http;httpPath=cliservice;ssl=true")
    assert jdbc(info, "ann", PASSWORD, "SELECT id, name FROM people__clean_view ORDER BY id") == [(0, "ann"), (1, "bob"), (2, "cy")]
    assert "401" in refused(info, "ann", "not-her-password")
    assert "401" in refused(info, "nobody", PASSWORD)
    assert "401" in refused(info, "ann", "")
    plain = refused(info, "ann", PASSWORD, tls=False)  # a client that does not speak TLS gets no answer it can read
    assert "401" not in plain and ("BadStatusLine" in plain or "RemoteDisconnected" in plain or "Connection" in plain), plain
    log = secured.log.read_text(errors="replace")
    assert "failed login for user 'ann' from 127.0.0.1:" in log and ": wrong password" in log
    assert "failed login for user 'nobody' from 127.0.0.1:" in log and "no such user in the password file" in log


def test_beeline_as_the_readme_shows(secured: Served) -> None:
    """Hive's JDBC driver (pyspark's beeline): HTTP transport, TLS trusting `--self-signed`'s truststore, the password from a file."""
    import pyspark

    password_file = owner_only(secured.root / "ann.password", PASSWORD)
    truststore = secured.root / "serve-tls" / "truststore.p12"
    url = f"{secured.info.jdbc_url};sslTrustStore={truststore};trustStorePassword=changeit"
    env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent)}
    done = subprocess.run([str(CDC.parent / "beeline"), "-u", url, "-n", "ann", "-w", str(password_file), "--silent=true",
                           "--outputformat=csv2", "-e", "SELECT count(*) AS n FROM people__clean_view"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0 and "\n3" in done.stdout, (done.stdout + done.stderr)[-2000:]


def test_a_user_added_while_serving_logs_in(secured: Served) -> None:
    """`cdc serve-user add` reads the password from standard input (never argv) into the file the server reads at each login."""
    done = subprocess.run([str(CDC), "serve-user", "add", "bea", "--config", str(secured.root / "cdc.yaml")], input="bea-password-5\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (secured.root / "serve-users").stat().st_mode & 0o777 == 0o600
    assert jdbc(secured.info, "bea", "bea-password-5", "SELECT 1") == [(1,)]
    listed = subprocess.run([str(CDC), "serve-user", "list", "--config", str(secured.root / "cdc.yaml")], capture_output=True, text=True)
    assert listed.stdout.split() == ["ann", "bea"]


def test_expose_clean_hides_every_other_name(secured: Served) -> None:
    info = secured.info
    tables = {row[1] for row in jdbc(info, "ann", PASSWORD, f"SHOW TABLES IN {SCHEMA}")}
    assert tables == {"people__clean_view", "people__consistent_view"}
    for name in ("raw_change_events", "people", "people__full_view", "people__stored", "dead_letter", "transactions"):
        for reference in (name, f"{SCHEMA}.{name}"):
            with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
                jdbc(info, "ann", PASSWORD, f"SELECT * FROM {reference}")
        answer = connect_answer(info.connect_url, f"SELECT * FROM {SCHEMA}.{name}", TOKEN)
        assert "TABLE_OR_VIEW_NOT_FOUND" in answer["error"], answer
    emails = [row[0] for row in jdbc(info, "ann", PASSWORD, "SELECT email FROM people__clean_view UNION ALL SELECT email FROM people__consistent_view")]
    assert len(emails) == 6 and all(len(e) == 64 and "@" not in e for e in emails)  # salted hashes, never the address
    # Its warm-up query went through the one kind of view it registers, by the key no statistics have to read.
    text = warmed_log(secured.log)
    assert f"s: SELECT * FROM `{SCHEMA}`.`people__clean_view` WHERE `id` IS NULL" in text, text[-3000:]


def test_a_storm_of_failed_logins_leaves_the_server_answering(secured: Served) -> None:
    info = secured.info
    before = secured.log.read_text(errors="replace").count("failed login for user")
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        # Mostly wrong passwords of a real user; one in ten an unknown name, which costs the server a full-strength hash.
        answers = list(pool.map(lambda i: refused(info, f"guess{i}" if i % 10 == 0 else "ann", f"guess-{i}"), range(STORM)))
    storm = time.monotonic() - t0
    assert all("401" in a for a in answers)
    t1 = time.monotonic()
    assert jdbc(info, "ann", PASSWORD, "SELECT count(*) FROM people__clean_view") == [(3,)]
    print(f"\n{STORM} failed logins (4 at a time) in {storm:.1f} s; the good login after them answered in {time.monotonic() - t1:.2f} s")
    deadline = time.monotonic() + 10
    while secured.log.read_text(errors="replace").count("failed login for user") < before + STORM and time.monotonic() < deadline:
        time.sleep(0.2)
    assert secured.log.read_text(errors="replace").count("failed login for user") >= before + STORM


def test_cdc_sql_with_credentials(secured: Served) -> None:
    lake = str(secured.root / "lake")
    base = {k: v for k, v in os.environ.items() if not k.startswith("CDC_SERVE_")}
    with_login = subprocess.run([str(CDC), "sql", "--lake", lake, "--format", "json", "SELECT count(*) AS n FROM people__clean_view"],
                                capture_output=True, text=True, timeout=300, env={**base, "CDC_SERVE_USER": "ann", "CDC_SERVE_PASSWORD": PASSWORD})
    assert with_login.returncode == 0 and json.loads(with_login.stdout) == [{"n": 3}], with_login.stderr
    assert "local Spark session" not in with_login.stderr
    wrong = subprocess.run([str(CDC), "sql", "--lake", lake, "SELECT 1"], capture_output=True, text=True, timeout=300,
                           env={**base, "CDC_SERVE_USER": "ann", "CDC_SERVE_PASSWORD": "nope-nope"})
    assert wrong.returncode == 2 and wrong.stderr.strip().splitlines()[-1].startswith("error: the server at jdbc:hive2://127.0.0.1:"), wrong.stderr
    assert "refused the login of 'ann'" in wrong.stderr and "nope-nope" not in wrong.stderr
    info, _ = sql_client.find_server(secured.root / "lake")
    assert info is not None and info.expose == "clean"
    with pytest.raises(ServerUnavailable, match="asks for a login"):
        sql_client.login(info, {})


def test_no_secret_in_the_log_the_state_file_or_the_lake(secured: Served) -> None:
    keystore_password = (secured.root / "serve-tls" / "keystore.password").read_text().strip()
    assert (secured.root / "serve-tls" / "keystore.password").stat().st_mode & 0o777 == 0o600
    state = sql_client.state_path(secured.root / "lake", "clean").read_text()
    assert json.loads(state)["cert"] == str(secured.root / "serve-tls" / "cert.pem")
    texts = {"serve.log": secured.log.read_bytes(), "_serve.json": state.encode()}
    for path in (secured.root / "lake").rglob("*"):
        if path.is_file():
            texts[str(path)] = path.read_bytes()
    assert len(texts) > 20
    for secret in (TOKEN, PASSWORD, keystore_password, "bea-password-5", "not-her-password", SALT):
        leaked = [where for where, data in texts.items() if secret.encode() in data]
        assert not leaked, f"{secret[:4]}... found in {leaked}"


def test_owners_run_a_second_server_with_every_name(secured: Served) -> None:
    """The analysts' server (`expose: clean`) and the owners' (`--expose all`) serve one lake at once, each with
    its own state file; `cdc sql` on the machine prefers the owners'. Logins and the token are the config's."""
    lake = secured.root / "lake"
    with start_server(secured.root, secured.root / "cdc.yaml", "--expose", "all", log_name="owners.log") as owners:
        assert owners.info.expose == "all" and not owners.info.tls and sql_client.state_path(lake, "all").is_file()
        assert jdbc(owners.info, "ann", PASSWORD, "SELECT email FROM people__full_view WHERE id = 0", tls=False) == [("ann@example.com",)]
        with pytest.raises(Exception, match="TABLE_OR_VIEW_NOT_FOUND"):
            jdbc(secured.info, "ann", PASSWORD, "SELECT email FROM people__full_view WHERE id = 0")
        found, _ = sql_client.find_server(lake)
        assert found is not None and found.pid == owners.info.pid
    assert not sql_client.state_path(lake, "all").exists() and sql_client.state_path(lake, "clean").is_file()
    assert "warm" not in owners.log.read_text(errors="replace")  # started with --no-warm-up (`start_server`)


# --- without a server: what is refused before anything starts ------------------------------------------------

def test_a_non_loopback_host_without_logins_is_refused_before_any_socket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    config = write_secured_config(tmp_path, {})
    (tmp_path / "lake").mkdir()

    def no_socket(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a socket was opened before the refusal")

    monkeypatch.setattr(socket, "socket", no_socket)
    monkeypatch.delenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", raising=False)
    assert main(["serve", "--config", str(config), "--host", "192.0.2.10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: refusing to listen on 192.0.2.10 without authentication; configure a Spark Connect token "
                   "(SPARK_CONNECT_AUTHENTICATE_TOKEN, or serve.connect_token_file) and a JDBC login check "
                   "(serve.jdbc_auth: password_file or ldap), or serve on 127.0.0.1"]
    monkeypatch.setenv("SPARK_CONNECT_AUTHENTICATE_TOKEN", TOKEN)
    assert main(["serve", "--config", str(config), "--host", "0.0.0.0"]) == 2
    assert "configure a JDBC login check" in capsys.readouterr().err
    assert not (tmp_path / "lake" / "_serve").exists() and not (tmp_path / "serve-tls").exists()


def test_exposure_rules() -> None:
    token = security.Secrets(connect_token=TOKEN)
    security.check_exposure(ServeConfig(), security.Secrets())  # loopback: no login needed
    security.check_exposure(ServeConfig(host="::1"), security.Secrets())
    with pytest.raises(ServeError, match="refusing to listen on 10.1.2.3 without authentication; configure a JDBC login check"):
        security.check_exposure(ServeConfig(host="127.0.0.1", connect_host="10.1.2.3"), token)
    with pytest.raises(ServeError, match="configure a Spark Connect token"):
        security.check_exposure(ServeConfig(host="0.0.0.0", jdbc_auth="ldap", ldap_url="ldap://x", ldap_base_dn="dc=x"), security.Secrets())
    security.check_exposure(ServeConfig(host="0.0.0.0", jdbc_auth="ldap", ldap_url="ldap://x", ldap_base_dn="dc=x"), token)
    assert "connect-token" not in repr(token)


def test_secrets_never_come_from_cdc_yaml(tmp_path: Path) -> None:
    for key, words in (("connect_token", "SPARK_CONNECT_AUTHENTICATE_TOKEN"), ("keystore_password", "CDC_SERVE_KEYSTORE_PASSWORD"),
                       ("ldap_password", "cdc serve-user add"), ("client_secret", "never from cdc.yaml")):
        write_secured_config(tmp_path, {key: "hunter2"})
        with pytest.raises(ConfigError, match=f"`serve.{key}` would put a secret in cdc.yaml in plain text; .*{words}"):
            load_config(tmp_path / "cdc.yaml")
    write_secured_config(tmp_path, {"jdbc_auth": "ldap"})
    with pytest.raises(ConfigError, match="needs `serve.ldap_url"):
        load_config(tmp_path / "cdc.yaml")
    write_secured_config(tmp_path, {"jdbc_auth": "ldap", "ldap_url": "ldap://127.0.0.1:1", "ldap_user_dn_pattern": "uid=x,dc=y"})
    with pytest.raises(ConfigError, match="must hold %s"):
        load_config(tmp_path / "cdc.yaml")


def test_secret_files_must_be_owner_only(tmp_path: Path) -> None:
    token = owner_only(tmp_path / "token", TOKEN)
    assert security.resolve_secrets(ServeConfig(connect_token_file=token), {}).connect_token == TOKEN
    token.chmod(0o644)
    with pytest.raises(ConfigError, match=r"must belong to this user and be readable by it only \(mode 0o644\): chmod 600"):
        security.resolve_secrets(ServeConfig(connect_token_file=token), {})
    with pytest.raises(ConfigError, match="at least 16 characters"):
        security.resolve_secrets(ServeConfig(), {"SPARK_CONNECT_AUTHENTICATE_TOKEN": "short"})
    with pytest.raises(ConfigError, match="needs its password: set CDC_SERVE_KEYSTORE_PASSWORD"):
        security.resolve_secrets(ServeConfig(keystore=tmp_path / "ks.p12"), {})


def test_the_password_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "users"
    assert passwords.add_user(path, "ann", PASSWORD) is False
    assert path.stat().st_mode & 0o777 == 0o600
    line = path.read_text()
    assert PASSWORD not in line and line.startswith(f"ann:pbkdf2-sha256:{passwords.ITERATIONS}:")
    assert passwords.verify(path, "ann", PASSWORD) and not passwords.verify(path, "ann", PASSWORD + "x") and not passwords.verify(path, "bo", PASSWORD)
    assert passwords.add_user(path, "ann", "another-one", iterations=1_000) is True and passwords.verify(path, "ann", "another-one")
    with pytest.raises(ConfigError, match="at least 8 characters"):
        passwords.add_user(path, "bea", "short")
    with pytest.raises(ConfigError, match="is not usable"):
        passwords.add_user(path, "bad:name", PASSWORD)
    assert passwords.remove_user(path, "ann") and not passwords.remove_user(path, "ann")
    path.write_text("garbage\n")
    with pytest.raises(ConfigError, match=":1 is not a line"):
        passwords.read_entries(path)
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO(""))
    with pytest.raises(ConfigError, match="no password on standard input"):
        passwords.read_password()


def test_serve_user_takes_no_password_from_argv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve-user", "add", "ann", PASSWORD, "--password-file", str(tmp_path / "users")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: `cdc serve-user` takes no password on the command line") and PASSWORD not in err
    assert not (tmp_path / "users").exists()


def test_what_serve_needs_on_the_machine_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cdc_platform.errors import EnvironmentNotReadyError

    ldap = ServeConfig(jdbc_auth="ldap", ldap_url="ldap://127.0.0.1:1", ldap_base_dn="dc=x")
    monkeypatch.setattr(security, "AUTH_JAR", tmp_path / "missing.jar")
    with pytest.raises(EnvironmentNotReadyError, match="missing.jar is missing; run `make setup`"):
        security.check_exposure(ldap, security.Secrets())
    users = tmp_path / "users"
    users.write_text("")
    users.chmod(0o640)
    with pytest.raises(ConfigError, match="the password file .* chmod 600"):
        security.check_exposure(ServeConfig(jdbc_auth="password_file", password_file=users), security.Secrets())
    monkeypatch.setattr(security.shutil, "which", lambda _: None)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(EnvironmentNotReadyError, match="`keytool` .* is not on PATH"):
        security.self_signed(tmp_path / "tls", ["127.0.0.1"])


def test_cli_refusals_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_secured_config(tmp_path, {"keystore": "ks.p12"})
    (tmp_path / "lake").mkdir()
    assert main(["serve", "--config", str(config), "--self-signed"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --self-signed makes a keystore, but serve.keystore already names {tmp_path / 'ks.p12'}; use one or the other"]
    assert main(["serve-user", "remove", "nobody", "--password-file", str(tmp_path / "users")]) == 2
    assert capsys.readouterr().err.strip() == f"error: no user 'nobody' in {tmp_path / 'users'}"
    assert main(["serve-user", "add", "--password-file", str(tmp_path / "users")]) == 2
    assert "needs the user's NAME" in capsys.readouterr().err
