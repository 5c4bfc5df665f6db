"""An LDAP directory for the tests of `cdc serve`'s JDBC logins: OpenLDAP's `slapd` from Debian's packages,
a fresh database in a folder of its own, listening on a loopback port chosen at run time.

Its people (`uid=NAME,ou=people,dc=cdc,dc=test`, each with a salted SHA-1 `userPassword` as OpenLDAP's
slappasswd writes it) are loaded with `slapadd` before the server starts, so nothing binds as an
administrator over the network. `slapd` is installed with apt-get when it is missing and this process is
root, as the databases are (`install.py`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cdc_platform.testbed import install
from cdc_platform.testbed.errors import TestbedError
from cdc_platform.testbed.process import HOST, Service, free_ports, port_open, run

SUFFIX = "dc=cdc,dc=test"
PEOPLE = f"ou=people,{SUFFIX}"
USER_DN_PATTERN = f"uid=%s,{PEOPLE}"
SCHEMAS = ("core", "cosine", "inetorgperson")
PACKAGES = ("slapd",)


def _find(name: str) -> str | None:
    return next((str(p) for p in (Path("/usr/sbin") / name, Path("/usr/bin") / name) if p.is_file()), None) or shutil.which(name)


def ensure_slapd() -> tuple[str, str]:
    """(slapd, slapadd): found, or installed from Debian's packages; one line when neither is possible."""
    with install._installing():
        if not (_find("slapd") and _find("slapadd")):
            install._apt_install(PACKAGES)
        slapd, slapadd = _find("slapd"), _find("slapadd")
        if not (slapd and slapadd):
            raise TestbedError(f"test bed: slapd/slapadd not found after installing {', '.join(PACKAGES)}")
        return slapd, slapadd


def ssha(password: str) -> str:
    """`{SSHA}` as slappasswd writes it: base64 of SHA-1(password + salt) + salt."""
    salt = os.urandom(8)
    return "{SSHA}" + base64.b64encode(hashlib.sha1(password.encode() + salt).digest() + salt).decode()


def ldif(people: Mapping[str, str]) -> str:
    entries = [f"dn: {SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\ndc: cdc\no: cdc test\n",
               f"dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people\n"]
    for name, password in people.items():
        entries.append(f"dn: uid={name},{PEOPLE}\nobjectClass: inetOrgPerson\nuid: {name}\ncn: {name}\nsn: {name}\n"
                       f"userPassword: {ssha(password)}\n")
    return "\n".join(entries)


@dataclass
class Directory:
    root: Path
    port: int
    service: Service | None = None

    @property
    def url(self) -> str:
        return f"ldap://{HOST}:{self.port}"

    def prepare(self, slapadd: str, people: Mapping[str, str]) -> Path:
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        conf = self.root / "slapd.conf"
        schema_dir = Path("/etc/ldap/schema")
        conf.write_text(
            "".join(f"include {schema_dir / s}.schema\n" for s in SCHEMAS)
            + f"pidfile {self.root / 'slapd.pid'}\nmodulepath /usr/lib/ldap\nmoduleload back_mdb\n"
            + f"database mdb\nmaxsize 10485760\ndirectory {data}\nsuffix \"{SUFFIX}\"\n"
            # Anyone may bind (that is the login check); nobody may read a password, and nothing else is needed.
            + "access to attrs=userPassword by anonymous auth by * none\naccess to * by * none\n",
            encoding="utf-8",
        )
        entries = self.root / "people.ldif"
        entries.write_text(ldif(people), encoding="utf-8")
        run([slapadd, "-f", str(conf), "-l", str(entries)], self.root / "slapadd.log", what="slapadd", timeout=60)
        entries.unlink()
        return conf

    def launch(self, slapd: str, conf: Path) -> None:
        self.service = Service("slapd", self.root / "slapd.log", stop_signal=signal.SIGTERM)
        # -d 0: stay in the foreground (so the service owns the process) and log nothing but errors.
        self.service.launch([slapd, "-f", str(conf), "-h", f"ldap://{HOST}:{self.port}/", "-d", "0"], cwd=self.root)
        self.service.wait_until(lambda: port_open(self.port), "waiting for slapd to listen", 30)

    def stop(self) -> None:
        if self.service is not None:
            self.service.stop()


@contextmanager
def directory(root: Path, people: Mapping[str, str]) -> Iterator[Directory]:
    """A running directory holding `people` (name -> password), stopped when the block ends."""
    slapd, slapadd = ensure_slapd()
    found = Directory(root, free_ports(1)[0])
    conf = found.prepare(slapadd, people)
    try:
        found.launch(slapd, conf)
        yield found
    finally:
        found.stop()
