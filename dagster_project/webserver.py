"""Start the Dagster webserver for a lake on loopback and wait until it answers.

Shared by the UI test (GraphQL) and `scripts/screenshot_asset_graph.py` (headless Chromium), so both
exercise the same thing a person gets from `make ui`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cdc_platform.config import CONFIG_ENV_VAR
from cdc_platform.errors import EnvironmentNotReadyError

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def serve(config_path: Path, port: int | None = None, timeout: float = 180.0, *, daemon: bool = False) -> Iterator[str]:
    """Run `dagster-webserver -w workspace.yaml` for `config_path`; yield its base URL; stop it after.

    With `daemon`, run `dagster dev` (webserver and daemon, as `make ui` does) instead: launched runs
    are queued (the instance's pools need the queued run coordinator) and only the daemon starts them.
    """
    port = port or free_port()
    home = Path(tempfile.mkdtemp(prefix="cdc-dagster-home-"))
    (home / "dagster.yaml").write_text((REPO / "dagster_project" / "dagster.yaml").read_text())
    env = os.environ | {CONFIG_ENV_VAR: str(config_path), "DAGSTER_HOME": str(home)}
    bin_dir = Path(sys.executable).parent
    command = [str(bin_dir / "dagster"), "dev"] if daemon else [str(bin_dir / "dagster-webserver")]
    log = open(home / "webserver.log", "w")
    proc = subprocess.Popen([*command, "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise EnvironmentNotReadyError(f"dagster-webserver exited with {proc.returncode}; see {home / 'webserver.log'}")
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=5) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise EnvironmentNotReadyError(f"dagster-webserver did not answer on {url} within {timeout:.0f} s; see {home / 'webserver.log'}")
            time.sleep(1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def graphql(url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    body = json.dumps({"query": query, "variables": variables or {}}).encode()
    req = urllib.request.Request(f"{url}/graphql", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        payload = json.loads(resp.read())
    if payload.get("errors"):
        raise RuntimeError(f"GraphQL errors: {payload['errors']}")
    return payload["data"]
