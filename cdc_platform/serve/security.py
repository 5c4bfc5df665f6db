"""Who may reach `cdc serve`, and how: its addresses, logins, TLS, and the secrets they need.

* Addresses. Both endpoints listen on loopback unless `serve.host` (`--host`) says otherwise; an address
  that is not loopback is refused, before any socket opens, unless both endpoints check a login.
* Spark Connect checks Spark's own pre-shared token (`SPARK_CONNECT_AUTHENTICATE_TOKEN`, Spark 4's
  `spark.connect.authenticate.token`): Spark's server reads it from the environment it inherits, so
  it is never a Spark setting a client could list. Spark's server has no TLS; pyspark's client sends a
  token only over TLS (or to `localhost`), so a remote notebook reaches it through a TLS proxy (README).
* The Thrift JDBC/ODBC endpoint checks a user and password with HiveServer2's CUSTOM authentication and
  the platform's class (jvm/serve-auth): against the password file (`passwords`) or an LDAP directory.
  With a login it speaks HiveServer2's HTTP transport: only there does the login check run where the
  client's address is known, which the failed-login log line needs. TLS is HiveServer2's own
  (`hive.server2.use.SSL`) from a keystore the user names, or one `--self-signed` makes with keytool.
* Secrets (the token, the keystore's password) come from the environment or owner-only files and go to
  the JVM at run time, never to cdc.yaml, `_serve.json`, a log or the lake.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_platform.config_serve import CONNECT_TOKEN_ENV, KEYSTORE_PASSWORD_ENV, ServeConfig
from cdc_platform.errors import ConfigError, EnvironmentNotReadyError, ServeError
from cdc_platform.serve.passwords import check_owner_only

REPO = Path(__file__).resolve().parents[2]
#: The CUSTOM authentication provider's jar, built by `make setup` (scripts/resolve_jars.py --serve-auth).
AUTH_JAR = REPO / "jvm" / "serve-auth" / "target" / "cdc-serve-auth.jar"
AUTH_CLASS = "cdcplatform.serve.ServeAuthenticator"
#: HiveServer2's HTTP path, as Hive, Spark and BI tools default it.
HTTP_PATH = "cliservice"
#: The files `--self-signed` writes: the keystore, its password (owner-only), the certificate clients trust.
SELF_SIGNED = ("keystore.p12", "keystore.password", "cert.pem", "truststore.p12")


@dataclass(frozen=True)
class Secrets:
    """What the server needs that nobody else may read; held in memory only (repr hides the values)."""

    connect_token: str | None = None
    keystore_password: str | None = None

    def __repr__(self) -> str:
        return f"Secrets(connect_token={'set' if self.connect_token else None}, keystore_password={'set' if self.keystore_password else None})"


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (a name is resolved; nothing is bound or contacted)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError as exc:
        raise ConfigError(f"serve host {host!r} is neither an IP address nor a name this machine resolves ({exc})") from None
    return bool(found) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in found)


def read_secret_file(path: Path, what: str) -> str:
    check_owner_only(path, what)
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise ConfigError(f"{what} {path} is empty")
    return value


def resolve_secrets(config: ServeConfig, environ: dict[str, str] | None = None) -> Secrets:
    """The token and the keystore's password, from owner-only files when the config names them, else the environment."""
    env = os.environ if environ is None else environ
    token = read_secret_file(config.connect_token_file, "the Spark Connect token file") if config.connect_token_file else env.get(CONNECT_TOKEN_ENV) or None
    if token is not None and len(token) < 16:
        raise ConfigError("the Spark Connect token must have at least 16 characters (e.g. `openssl rand -hex 24`)")
    password = None
    if config.keystore is not None:
        if config.keystore_password_file is not None:
            password = read_secret_file(config.keystore_password_file, "the keystore password file")
        else:
            password = env.get(KEYSTORE_PASSWORD_ENV) or None
        if password is None:
            raise ConfigError(f"serve.keystore {config.keystore} needs its password: set {KEYSTORE_PASSWORD_ENV} or `serve.keystore_password_file`")
        if not config.keystore.is_file():
            raise ConfigError(f"serve.keystore {config.keystore} does not exist (`cdc serve --self-signed` makes one for trying)")
    return Secrets(token, password)


def check_exposure(config: ServeConfig, found: Secrets) -> None:
    """Refuse to listen beyond loopback unless both endpoints check a login (called before any socket opens)."""
    if config.jdbc_auth == "password_file" and config.password_file is not None:
        check_owner_only(config.password_file, "the password file (`cdc serve-user add NAME` creates it)")
    if config.jdbc_auth != "none" and not AUTH_JAR.is_file():
        raise EnvironmentNotReadyError(f"the JDBC login check's jar {AUTH_JAR} is missing; run `make setup`")
    open_hosts = [h for h in dict.fromkeys((config.host, config.connect_address)) if not is_loopback(h)]
    if not open_hosts:
        return
    missing = []
    if found.connect_token is None:
        missing.append(f"a Spark Connect token ({CONNECT_TOKEN_ENV}, or serve.connect_token_file)")
    if config.jdbc_auth == "none":
        missing.append("a JDBC login check (serve.jdbc_auth: password_file or ldap)")
    if missing:
        raise ServeError(f"refusing to listen on {', '.join(open_hosts)} without authentication; configure {' and '.join(missing)}, "
                         "or serve on 127.0.0.1")


def jdbc_transport(config: ServeConfig) -> str:
    return "binary" if config.jdbc_auth == "none" else "http"


def thrift_conf(config: ServeConfig, jdbc_port: int) -> dict[str, str]:
    """Spark settings (`spark.hadoop.hive.server2.*`) of the Thrift server: transport, login check, TLS; no secret."""
    transport = jdbc_transport(config)
    conf = {
        "spark.hadoop.hive.server2.thrift.bind.host": config.host,
        "spark.hadoop.hive.server2.transport.mode": transport,
        f"spark.hadoop.hive.server2.thrift.{'http.' if transport == 'http' else ''}port": str(jdbc_port),
    }
    if transport == "http":
        conf["spark.hadoop.hive.server2.thrift.http.path"] = HTTP_PATH
        conf["spark.hadoop.hive.server2.authentication"] = "CUSTOM"
    if config.keystore is not None:
        conf["spark.hadoop.hive.server2.use.SSL"] = "true"
        conf["spark.hadoop.hive.server2.keystore.path"] = str(config.keystore)
    return conf


def system_properties(config: ServeConfig) -> dict[str, str]:
    """JVM system properties the login check reads: Hive's providers read a fresh HiveConf, which takes
    system properties but not Spark's settings; none of these is a secret."""
    if config.jdbc_auth == "none":
        return {}
    props = {"hive.server2.custom.authentication.class": AUTH_CLASS, "cdc.serve.auth": config.jdbc_auth}
    if config.keystore is None:
        # The session cookie Hive hands a logged-in client is marked Secure by default, so a Java client would
        # never return it over plain HTTP and would log in (hash or LDAP bind) again at every request.
        props["hive.server2.thrift.http.cookie.is.secure"] = "false"
    if config.jdbc_auth == "password_file":
        props["cdc.serve.password_file"] = str(config.password_file)
    else:
        props["hive.server2.authentication.ldap.url"] = str(config.ldap_url)
        if config.ldap_user_dn_pattern:
            props["hive.server2.authentication.ldap.userDNPattern"] = config.ldap_user_dn_pattern
        if config.ldap_base_dn:
            props["hive.server2.authentication.ldap.baseDN"] = config.ldap_base_dn
    return props


def apply_to_jvm(spark: Any, config: ServeConfig, found: Secrets) -> None:
    """Hand the running driver what must not be a Spark setting: the login check's properties, and the
    keystore's password into the Hadoop configuration the Thrift server reads (held in memory only)."""
    jvm = spark.sparkContext._jvm
    for key, value in system_properties(config).items():
        jvm.java.lang.System.setProperty(key, value)
    if found.keystore_password is not None:
        spark.sparkContext._jsc.hadoopConfiguration().set("hive.server2.keystore.password", found.keystore_password)


def self_signed(folder: Path, hosts: list[str]) -> tuple[Path, Path, Path]:
    """A keystore with a new self-signed certificate for `hosts`, made with the JDK's keytool, for trying TLS:
    (keystore, its owner-only password file, the certificate in PEM for clients). Kept when it exists."""
    keystore, password_file, cert, truststore = (folder / name for name in SELF_SIGNED)
    if keystore.is_file() and password_file.is_file() and cert.is_file():
        return keystore, password_file, cert
    keytool = shutil.which("keytool") or (str(Path(os.environ["JAVA_HOME"]) / "bin" / "keytool") if os.environ.get("JAVA_HOME") else None)
    if keytool is None or not Path(keytool).exists():
        raise EnvironmentNotReadyError("`keytool` (the JDK's) is not on PATH; install a JDK 17 or point serve.keystore at a keystore")
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    for stale in (keystore, password_file, cert, truststore):
        stale.unlink(missing_ok=True)
    password = secrets.token_urlsafe(24)
    fd = os.open(password_file, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(password + "\n")
    names = sorted(set(hosts) | {"localhost", "127.0.0.1"})
    san = ",".join(f"ip:{h}" if _is_ip(h) else f"dns:{h}" for h in names if h not in ("0.0.0.0", "::"))
    env = {**os.environ, "CDC_KEYTOOL_PASSWORD": password}  # `:env`: the password never appears in argv
    steps = [
        ["-genkeypair", "-alias", "cdc-serve", "-keyalg", "RSA", "-keysize", "3072", "-validity", "365", "-dname", "CN=cdc serve",
         "-ext", f"SAN={san}", "-keystore", str(keystore), "-storetype", "PKCS12", "-storepass:env", "CDC_KEYTOOL_PASSWORD"],
        ["-exportcert", "-rfc", "-alias", "cdc-serve", "-keystore", str(keystore), "-storepass:env", "CDC_KEYTOOL_PASSWORD", "-file", str(cert)],
        # A truststore for Java clients (beeline, BI tools): public, so its password is the well-known `changeit`.
        ["-importcert", "-noprompt", "-alias", "cdc-serve", "-file", str(cert), "-keystore", str(truststore), "-storetype", "PKCS12",
         "-storepass", "changeit"],
    ]
    for args in steps:
        done = subprocess.run([keytool, *args], capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, check=False)
        if done.returncode != 0:
            raise ServeError(f"keytool {args[0]} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    os.chmod(keystore, 0o600)
    return keystore, password_file, cert


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True
