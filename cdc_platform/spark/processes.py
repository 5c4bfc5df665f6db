"""Local server processes on loopback: the one set of helpers the test bed and the local Spark cluster share.

Every server a test, a benchmark or `make stack` starts listens on 127.0.0.1 on a port the OS handed out,
leads a process group of its own (so stopping it stops its children: executors, Python workers), and is
sent a signal by the kernel when the thread that started it dies, even by SIGKILL, so nothing outlives
the run that needed it. Also how a long-running command turns Ctrl-C and `kill PID` into a clean stop
(`stop_on_signals`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
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


@contextlib.contextmanager
def stop_on_signals(
    on_first: Callable[[], None] | None = None, on_second: Callable[[], None] | None = None,
    signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM),
) -> Iterator[threading.Event]:
    """Ctrl-C (and `kill PID`) set the event the block's job polls, instead of raising wherever the main thread is.

    Why not let Ctrl-C raise: the main thread of a Spark job spends its time inside a Py4J call to the JVM
    (`awaitTermination`), and PySpark's own SIGINT handler calls the JVM again on that same connection
    (`cancelAllJobs`): Py4J refuses the reentrant call, and the job ended in stack traces and a Py4JError
    instead of stopping, and cancelled the batch in flight. With the event the job finishes that batch and
    stops on its own. A second signal calls `on_second` (default: raise `KeyboardInterrupt`), for when the
    batch takes too long.
    Outside the main thread (Python allows signal handlers only there) the event is never set by a signal.
    """
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            if on_second is None:
                raise KeyboardInterrupt
            on_second()
            return
        stop.set()
        if on_first is not None:
            on_first()

    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
