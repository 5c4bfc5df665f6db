"""The password file of `cdc serve`'s JDBC/ODBC endpoint, for sites without an LDAP directory.

One line per user, `NAME:pbkdf2-sha256:ITERATIONS:SALT:HASH` (salt and hash in base64): PBKDF2 with
HMAC-SHA-256, a random 16-byte salt per user, as NIST SP 800-132 describes it. Python writes it
(`hashlib.pbkdf2_hmac`, `cdc serve-user add`) and the server's JVM class checks logins against it
(`javax.crypto`'s PBKDF2WithHmacSHA256, jvm/serve-auth): two standard implementations of one
algorithm, no hashing code of our own. The file is written atomically and owner-only (0600); the
server refuses one that others may read, and reads it at every login, so a user added or removed
takes effect without a restart.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cdc_platform.errors import ConfigError

SCHEME = "pbkdf2-sha256"
#: PBKDF2 rounds for a new entry. Each login costs the server one hash, 0.3-0.5 s of one core in a warm JVM
#: on this loaded 2-core machine, and every `cdc sql` is a new login, so this is fewer than OWASP's 600,000
#: for PBKDF2-HMAC-SHA-256: slow for a guesser all the same, and a storm of failed logins slows only itself.
#: Hive's HTTP transport hands a logged-in client a signed cookie, so a session's later requests cost no hash.
ITERATIONS = 210_000
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
MIN_PASSWORD = 8


def check_owner_only(path: Path, what: str) -> None:
    """Refuse a secret's file that is not a regular file of this user with no access for group or others."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{what} {path} is not a regular file")
    if info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise ConfigError(f"{what} {path} must belong to this user and be readable by it only (mode {oct(info.st_mode & 0o777)}): "
                          f"chmod 600 {path}")


def entry(name: str, password: str, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    """One line of the file for `name` (without the newline)."""
    check_name(name)
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations)
    return f"{name}:{SCHEME}:{iterations}:{base64.b64encode(salt).decode()}:{base64.b64encode(digest).decode()}"


def check_name(name: str) -> str:
    if not NAME_RE.match(name):
        raise ConfigError(f"user name {name!r} is not usable: letters, digits and . _ @ -, starting with a letter or digit, at most 64")
    return name


def read_entries(path: Path) -> dict[str, str]:
    """name -> its line; {} when the file does not exist yet."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.strip().split(":")
        if len(parts) != 5 or parts[1] != SCHEME:
            raise ConfigError(f"{path}:{number} is not a line `NAME:{SCHEME}:ITERATIONS:SALT:HASH`; fix or remove it")
        out[parts[0]] = line.strip()
    return out


def verify(path: Path, name: str, password: str) -> bool:
    """Whether `password` is `name`'s (what the server's JVM class decides, here for tests and tools)."""
    line = read_entries(path).get(name)
    if line is None:
        return False
    _, _, iterations, salt, digest = line.split(":")
    actual = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), base64.b64decode(salt), int(iterations))
    return hmac.compare_digest(actual, base64.b64decode(digest))


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One writer of the file at a time (two `cdc serve-user add` at once would lose one's line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write(path: Path, lines: dict[str, str]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write("".join(f"{line}\n" for _, line in sorted(lines.items())))
        out.flush()
        os.fsync(out.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def add_user(path: Path, name: str, password: str, iterations: int = ITERATIONS) -> bool:
    """Add `name` or set its new password; True when it replaced an entry."""
    check_name(name)
    if len(password) < MIN_PASSWORD:
        raise ConfigError(f"the password must have at least {MIN_PASSWORD} characters")
    with _locked(path):
        if path.exists():
            check_owner_only(path, "the password file")
        lines = read_entries(path)
        replaced = name in lines
        lines[name] = entry(name, password, iterations)
        _write(path, lines)
    return replaced


def remove_user(path: Path, name: str) -> bool:
    """Remove `name`; False when it was not there."""
    with _locked(path):
        lines = read_entries(path)
        if name not in lines:
            return False
        del lines[name]
        _write(path, lines)
    return True


def read_password(prompt: Callable[[str], str] | None = None) -> str:
    """The new password: asked twice on a terminal (not echoed), else the first line of standard input.
    Never an argument: argv is visible to every user of the machine (`ps`) and kept in shell histories."""
    if sys.stdin.isatty():
        import getpass

        ask = prompt or getpass.getpass
        first = ask("new password: ")
        if ask("again: ") != first:
            raise ConfigError("the two passwords differ; nothing was changed")
        return first
    line = sys.stdin.readline()
    if not line:
        raise ConfigError("no password on standard input (pipe one line, or run on a terminal to be asked)")
    return line.rstrip("\r\n")
