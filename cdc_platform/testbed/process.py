"""Processes of the test bed: run-time loopback ports, start in a process group of their own, health
waits that notice a dead process, and stop of the whole group (a polite signal, then SIGKILL)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_platform.spark.processes import HOST, free_ports, group_alive, log_tail, port_open, stop_group
from cdc_platform.spark.processes import die_with_parent as _die_with_parent
from cdc_platform.testbed.errors import TestbedError

__all__ = ["HOST", "Service", "free_ports", "group_alive", "log_tail", "port_open", "run", "stop_group"]

def run(cmd: Sequence[str], log: Path, *, user: str | None = None, what: str, timeout: float = 300.0, env: dict[str, str] | None = None) -> None:
    """Run a set-up command to completion, output to `log`; a failure raises one line."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        out.write(f"$ {' '.join(cmd)}\n".encode())
        out.flush()
        try:
            proc = subprocess.run(list(cmd), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, user=user, env=env, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise TestbedError(f"test bed: {what} took more than {timeout:.0f} s (log: {log})") from None
    if proc.returncode != 0:
        raise TestbedError(f"test bed: {what} failed (exit {proc.returncode}): {log_tail(log, 2)} (log: {log})")


@dataclass
class Service:
    """One long-running server process, leader of its own process group."""

    name: str
    log: Path
    stop_signal: int = signal.SIGTERM
    pid: int | None = None
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def launch(
        self,
        cmd: Sequence[str],
        *,
        user: str | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            out.write(f"$ {' '.join(cmd)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                list(cmd),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # own session and process group: stopped as a whole
                user=user,
                env=env,
                cwd=cwd,
                preexec_fn=_die_with_parent(self.stop_signal) if die_with_parent else None,
            )
        self.pid = self.popen.pid

    def _reap(self) -> None:
        if self.popen is not None:
            self.popen.poll()

    def alive(self) -> bool:
        if self.pid is None:
            return False
        self._reap()
        if self.popen is not None and self.popen.returncode is not None:
            return False
        return group_alive(self.pid)

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def wait_until(self, check: Callable[[], bool], what: str, timeout: float) -> None:
        """Poll `check` until it is true; fail at once (one line) if the process dies, or at the timeout."""
        deadline = time.monotonic() + timeout
        last_error: BaseException | None = None
        while True:
            if self.pid is not None and not self.alive():
                code = self.exit_code()
                raise TestbedError(
                    f"test bed: {self.name} exited{'' if code is None else f' with code {code}'} while {what}: "
                    f"{log_tail(self.log)} (log: {self.log})"
                )
            try:
                if check():
                    return
                last_error = None
            except Exception as exc:  # a health check that cannot connect yet
                last_error = exc
            if time.monotonic() > deadline:
                detail = f"; last error: {type(last_error).__name__}: {str(last_error).splitlines()[0] if str(last_error) else ''}" if last_error else ""
                raise TestbedError(f"test bed: {self.name} not ready after {timeout:.0f} s ({what}){detail} (log: {self.log})")
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0, *, kill: bool = False) -> None:
        """Stop politely (the service's own stop signal), or with `kill` as a crash would: SIGKILL, nothing flushed."""
        if self.pid is None:
            return
        stop_group(self.pid, signal.SIGKILL if kill else self.stop_signal, timeout, reap=self._reap)
        self._reap()

    def state(self) -> dict[str, Any]:
        return {"pid": self.pid, "log": str(self.log), "stop_signal": int(self.stop_signal)}

    @classmethod
    def from_state(cls, name: str, state: dict[str, Any]) -> Service:
        return cls(name=name, log=Path(state["log"]), stop_signal=signal.Signals(state["stop_signal"]), pid=state["pid"])
