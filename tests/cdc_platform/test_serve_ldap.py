"""`cdc serve` with JDBC logins checked by an LDAP directory (OpenLDAP's slapd from the test bed, on a loopback
port) through Hive's own LDAP provider: a wrong password and an unknown user are refused and logged with the
client's address, the right one queries; Spark Connect's token comes from Spark's own environment variable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdc_platform.testbed.ldap import USER_DN_PATTERN, directory
from tests.cdc_platform.test_serve import PEOPLE, land_and_run
from tests.cdc_platform.test_serve_security import SCHEMA, TOKEN, Served, connect_answer, jdbc, refused, start_server, write_secured_config

LDAP_PASSWORD = "lee-ldap-password-4"


@pytest.fixture(scope="module")
def ldap_served(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("ldap-served")
    with directory(root / "slapd", {"lee": LDAP_PASSWORD, "max": "max-ldap-password-2"}) as found:
        config = write_secured_config(root, {"jdbc_auth": "ldap", "ldap_url": found.url, "ldap_user_dn_pattern": USER_DN_PATTERN})
        land_and_run(spark, config, "part-00001.jsonl", PEOPLE)
        with start_server(root, config, env={"SPARK_CONNECT_AUTHENTICATE_TOKEN": TOKEN}) as served:
            yield served


def test_ldap_logins(ldap_served: Served) -> None:
    info = ldap_served.info
    assert (info.jdbc_transport, info.jdbc_auth, info.tls, info.expose) == ("http", "ldap", False, "all")
    assert jdbc(info, "lee", LDAP_PASSWORD, "SELECT id, name FROM people__full_view ORDER BY id", tls=False) == [(0, "ann"), (1, "bob"), (2, "cy")]
    assert "401" in refused(info, "lee", "not-lees-password", tls=False)
    assert "401" in refused(info, "nobody", LDAP_PASSWORD, tls=False)
    assert "401" in refused(info, "max", LDAP_PASSWORD, tls=False)  # another user's password
    log = ldap_served.log.read_text(errors="replace")
    for user in ("lee", "nobody", "max"):
        assert f"failed login for user '{user}' from 127.0.0.1:" in log and "LDAP refused it" in log
    assert LDAP_PASSWORD not in log and "not-lees-password" not in log and TOKEN not in log


def test_spark_connect_token_from_the_environment(ldap_served: Served) -> None:
    info = ldap_served.info
    assert connect_answer(info.connect_url, f"SELECT count(*) AS n FROM {SCHEMA}.people__full_view", TOKEN) == [{"n": 3}]
    assert "Invalid authentication token" in connect_answer(info.connect_url, "SELECT 1", TOKEN[::-1])["error"]


def test_the_directory_holds_no_clear_password(ldap_served: Served) -> None:
    data = b"".join(p.read_bytes() for p in (ldap_served.root / "slapd").rglob("*") if p.is_file())
    assert LDAP_PASSWORD.encode() not in data
