"""`serve:` in cdc.yaml: where `cdc serve` listens, who may log in, over what, and what it shows.

Only names and paths live here. Secrets never do: the Spark Connect token comes from Spark's own
`SPARK_CONNECT_AUTHENTICATE_TOKEN` or an owner-only file (`connect_token_file`), the keystore's password
from `CDC_SERVE_KEYSTORE_PASSWORD` or an owner-only file; passwords of JDBC users are salted hashes in
the platform's password file (`cdc serve-user add`) or live in the LDAP directory. A key that looks like
a secret is refused with the way to give it instead (`serve.secrets` reads them when the server starts).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_platform.errors import ConfigError

LOOPBACK = "127.0.0.1"
EXPOSE_CHOICES = ("all", "clean")
JDBC_AUTH_CHOICES = ("none", "password_file", "ldap")
#: The password file `cdc serve-user add` writes when `serve.password_file` names none: beside cdc.yaml.
DEFAULT_PASSWORD_FILE = "serve-users"
CONNECT_TOKEN_ENV = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # Spark's own name, read by Spark's server and its client
KEYSTORE_PASSWORD_ENV = "CDC_SERVE_KEYSTORE_PASSWORD"

_KEYS = {"host", "connect_host", "expose", "jdbc_auth", "password_file", "ldap_url", "ldap_user_dn_pattern", "ldap_base_dn",
         "connect_token_file", "keystore", "keystore_password_file"}
_SECRET_HINTS = {
    "token": f"the Spark Connect token comes from {CONNECT_TOKEN_ENV} or an owner-only file named by `connect_token_file`",
    "password": f"the keystore's password comes from {KEYSTORE_PASSWORD_ENV} or an owner-only file named by `keystore_password_file`; "
                "JDBC users' passwords go into the password file with `cdc serve-user add NAME`",
    "secret": "secrets come from the environment or owner-only files, never from cdc.yaml",
}


@dataclass(frozen=True)
class ServeConfig:
    """`cdc serve`'s settings. Defaults: loopback, every name exposed, no login (as before this section existed)."""

    host: str = LOOPBACK
    #: Spark Connect's address when it differs from `host`: e.g. loopback behind a TLS proxy on this machine
    #: (Spark's Connect server has no TLS of its own) while the JDBC endpoint, which has, listens on the network.
    connect_host: str | None = None
    expose: str = "all"
    jdbc_auth: str = "none"
    password_file: Path | None = None
    ldap_url: str | None = None
    #: Hive's `hive.server2.authentication.ldap.userDNPattern`: `uid=%s,ou=people,dc=example,dc=org` (`:`-separated list).
    ldap_user_dn_pattern: str | None = None
    #: Hive's `...ldap.baseDN`: a user binds as `uid=NAME,<base DN>` when no pattern is given.
    ldap_base_dn: str | None = None
    connect_token_file: Path | None = None
    keystore: Path | None = None
    keystore_password_file: Path | None = None

    @property
    def connect_address(self) -> str:
        return self.connect_host or self.host


def _string(raw: Mapping[str, Any], key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: `serve.{key}` must be a non-empty string, got {value!r}")
    return value.strip()


def _choice(value: str | None, key: str, choices: tuple[str, ...], default: str, where: str) -> str:
    if value is None:
        return default
    if value not in choices:
        raise ConfigError(f"{where}: `serve.{key}` must be one of {', '.join(choices)}, got {value!r}")
    return value


def parse_serve(raw: Any, where: str, base: Path) -> ServeConfig:
    """The `serve:` mapping; relative paths resolve against the config file's folder."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: `serve` must be a mapping such as `serve: {{host: 0.0.0.0, jdbc_auth: ldap}}`, got {raw!r}")
    for key in sorted(set(raw) - _KEYS):
        hint = next((h for word, h in _SECRET_HINTS.items() if word in key.lower() and not key.endswith("_file")), None)
        if hint:
            raise ConfigError(f"{where}: `serve.{key}` would put a secret in cdc.yaml in plain text; {hint}")
        raise ConfigError(f"{where}: unknown key serve.{key}; allowed: {', '.join(sorted(_KEYS))}")

    def path(key: str) -> Path | None:
        value = _string(raw, key, where)
        return None if value is None else (base / Path(value).expanduser()).resolve()

    jdbc_auth = _choice(_string(raw, "jdbc_auth", where), "jdbc_auth", JDBC_AUTH_CHOICES, "none", where)
    config = ServeConfig(
        host=_string(raw, "host", where) or LOOPBACK,
        connect_host=_string(raw, "connect_host", where),
        expose=_choice(_string(raw, "expose", where), "expose", EXPOSE_CHOICES, "all", where),
        jdbc_auth=jdbc_auth,
        password_file=path("password_file") or (base / DEFAULT_PASSWORD_FILE).resolve(),
        ldap_url=_string(raw, "ldap_url", where),
        ldap_user_dn_pattern=_string(raw, "ldap_user_dn_pattern", where),
        ldap_base_dn=_string(raw, "ldap_base_dn", where),
        connect_token_file=path("connect_token_file"),
        keystore=path("keystore"),
        keystore_password_file=path("keystore_password_file"),
    )
    if jdbc_auth == "ldap":
        if not config.ldap_url or not config.ldap_url.startswith(("ldap://", "ldaps://")):
            raise ConfigError(f"{where}: `serve.jdbc_auth: ldap` needs `serve.ldap_url: ldap://HOST:PORT` (or ldaps://), got {config.ldap_url!r}")
        if not (config.ldap_user_dn_pattern or config.ldap_base_dn):
            raise ConfigError(f"{where}: `serve.jdbc_auth: ldap` needs `serve.ldap_user_dn_pattern` (e.g. uid=%s,ou=people,dc=example,dc=org) "
                              "or `serve.ldap_base_dn`")
        if config.ldap_user_dn_pattern and "%s" not in config.ldap_user_dn_pattern:
            raise ConfigError(f"{where}: `serve.ldap_user_dn_pattern` must hold %s where the user name goes, got {config.ldap_user_dn_pattern!r}")
    return config
