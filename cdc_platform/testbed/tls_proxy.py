"""A TLS proxy in front of Spark Connect, as the README tells a user to run one: nginx (Debian's `nginx-light`)
terminating TLS with HTTP/2 and passing the gRPC calls to Spark Connect's loopback port (`grpc_pass`).

Spark's Connect server has no TLS, and pyspark's client sends its token only over TLS (or to `localhost`),
so a notebook on another machine needs this. The test bed's proxy listens on a loopback port chosen at
run time, with a certificate `openssl` makes for `localhost` and 127.0.0.1, and logs every call with the
client's address and its gRPC status (16: UNAUTHENTICATED), which Spark itself does not log.
"""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cdc_platform.testbed import install
from cdc_platform.testbed.errors import TestbedError
from cdc_platform.testbed.process import HOST, Service, free_ports, port_open, run

PACKAGES = ("nginx-light",)
#: One line per call: who, what, HTTP status and the upstream's gRPC status, from its headers (a call refused at
#: once is a "trailers-only" answer: a refused token logs `grpc-status=16/-`) or its trailers (`-/0`: done).
LOG_FORMAT = "'$remote_addr:$remote_port \"$request\" $status grpc-status=$upstream_http_grpc_status/$upstream_trailer_grpc_status'"


def ensure_nginx() -> tuple[str, str]:
    """(nginx, openssl): found, or nginx installed from Debian's packages (as root)."""
    with install._installing():
        if not shutil.which("nginx") and not Path("/usr/sbin/nginx").is_file():
            install._apt_install(PACKAGES)
        nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").is_file() else None)
        openssl = shutil.which("openssl")
        if not nginx or not openssl:
            raise TestbedError(f"test bed: nginx or openssl not found after installing {', '.join(PACKAGES)}")
        return nginx, openssl


@dataclass
class TlsProxy:
    root: Path
    port: int
    cert: Path
    access_log: Path
    service: Service | None = None

    @property
    def url(self) -> str:
        return f"sc://localhost:{self.port}/;use_ssl=true"


def _config(root: Path, port: int, upstream: int, cert: Path, key: Path) -> str:
    temp = root / "tmp"
    temp.mkdir(parents=True, exist_ok=True)
    user = "user root root;\n" if os.geteuid() == 0 else ""  # its workers write under this (private) folder
    temps = "".join(f"  {kind}_temp_path {temp / kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""{user}worker_processes 1;
pid {root / 'nginx.pid'};
error_log {root / 'error.log'} warn;
events {{ worker_connections 64; }}
http {{
  log_format grpc {LOG_FORMAT};
  access_log {root / 'access.log'} grpc;
{temps}  server {{
    listen {HOST}:{port} ssl http2;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    location / {{ grpc_pass grpc://{HOST}:{upstream}; }}
  }}
}}
"""


@contextmanager
def grpc_tls_proxy(root: Path, upstream_port: int) -> Iterator[TlsProxy]:
    """nginx on a free loopback port, TLS in front of `upstream_port`; stopped when the block ends."""
    nginx, openssl = ensure_nginx()
    root.mkdir(parents=True, exist_ok=True)
    cert, key = root / "cert.pem", root / "key.pem"
    run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2",
         "-subj", "/CN=localhost", "-addext", f"subjectAltName=DNS:localhost,IP:{HOST}"], root / "openssl.log", what="openssl req")
    port = free_ports(1)[0]
    conf = root / "nginx.conf"
    conf.write_text(_config(root, port, upstream_port, cert, key), encoding="utf-8")
    proxy = TlsProxy(root, port, cert, root / "access.log")
    proxy.service = Service("nginx", root / "nginx.log", stop_signal=signal.SIGQUIT)  # SIGQUIT: nginx's graceful stop
    proxy.service.launch([nginx, "-c", str(conf), "-p", str(root), "-g", "daemon off;"], cwd=root)
    try:
        proxy.service.wait_until(lambda: port_open(port), "waiting for nginx to listen", 30)
        yield proxy
    finally:
        proxy.service.stop()
