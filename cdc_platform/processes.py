"""Local server processes on loopback: the one set of helpers the test bed and the local Spark cluster share.

Every server a test, a benchmark or `make stack` starts listens on 127.0.0.1 on a port the OS handed out,
leads a process group of its own (so stopping it stops its children: executors, Python workers), and is
sent a signal by the kernel when the thread that started it dies, even by SIGKILL, so nothing outlives
the run that needed it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports the OS has just handed out (held together, so no two are equal)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((HOST, 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def port_open(port: int | None, host: str = HOST) -> bool:
    if port is None:
        return False
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """preexec_fn: the kernel sends `sig` to the child when the thread that started it dies (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)

    def setup() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return setup


def _answers(send: Callable[[int, int], None], target: int) -> bool:
    """Signal 0 checks existence only; a process we may not signal still exists."""
    try:
        send(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    return _answers(os.killpg, pgid)


def pid_alive(pid: int) -> bool:
    return _answers(os.kill, pid)


def stop_group(pgid: int, sig: int = signal.SIGTERM, timeout: float = 20.0, reap: Callable[[], Any] | None = None, kill_wait: float = 5.0) -> None:
    """Send `sig` to the process group, wait until it is gone, then SIGKILL whatever is left.

    `reap` polls our own child: a zombie leader still counts as a member of its group until reaped.
    """
    for signum, wait in ((sig, timeout), (signal.SIGKILL, kill_wait)):
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if reap is not None:
                reap()
            if not group_alive(pgid):
                return
            time.sleep(0.1)


def log_tail(path: Path, lines: int = 1) -> str:
    """The last non-blank line(s) of a log, for an error message of one line."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "no log"
    found = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(found[-lines:]) if found else "empty log"
