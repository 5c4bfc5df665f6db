"""What the end-to-end tests share: `IngestJob` streaming in the test's process, as `cdc stream` does,
with a wait for a condition on the lake that fails at once when the stream does; and `cdc stream` as a
child process, for the tests that kill it or stop it as a user does."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cdc_platform.config import PlatformConfig
from cdc_platform.errors import LakeError
from cdc_platform.run.ingest import IngestJob
from cdc_platform.lake import REGISTRY_FILE
from cdc_platform.spark.processes import die_with_parent, stop_group


def rows_once_set_up(query: Callable[[PlatformConfig, str], list[dict[str, Any]]], cfg: PlatformConfig, sql: str) -> list[dict[str, Any]] | None:
    """`query(cfg, sql)`, or None while the stream is still setting the lake up: no registry yet, or one naming
    tables not created yet (it is written first) or a view with no change landed yet."""
    from pyspark.errors import AnalysisException

    if not (cfg.lake / REGISTRY_FILE).is_file():
        return None
    try:
        return query(cfg, sql)
    except (AnalysisException, LakeError):
        return None


class Running:
    """`IngestJob` streaming in this process (what `cdc stream` does), with a wait for a lake condition."""

    def __init__(self, spark: Any, cfg: PlatformConfig) -> None:
        self.job = IngestJob(cfg)
        self.streaming = self.job.start_streaming(spark, interval="1 second")
        self.query = self.streaming.query

    def wait(self, what: str, condition: Callable[[], bool], timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.job._failure is not None:
                raise self.job._failure
            assert self.query.isActive, f"the stream stopped: {self.query.exception()}"
            if condition():
                return
            assert time.monotonic() < deadline, f"{what}: not reached after {timeout:.0f} s (stage failures: {self.streaming.stage_failures()})"
            time.sleep(2.0)

    def stop(self) -> None:
        self.streaming.stop()  # after the batches in flight: `query.stop()` alone interrupts a batch (CI saw it)
        if self.job._failure is not None:
            raise self.job._failure


class StreamProcess:
    """A `cdc stream` child in its own process group, so a SIGKILL takes its JVM and Python workers with it, and
    gone with pytest even when the run is interrupted (`die_with_parent`). `stop` is a Ctrl-C to the group, as a
    terminal sends it: the stream finishes the batch in flight and exits."""

    def __init__(self, argv: list[str], log: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.argv, self.log, self.env, self.cwd = argv, log, env, cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=self.env,
                                         cwd=self.cwd, preexec_fn=die_with_parent())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.proc is not None:
            stop_group(self.proc.pid, signal.SIGKILL, reap=self.proc.poll)
            self.proc.wait()

    def stop(self, timeout: float = 60.0) -> int | None:
        """Ctrl-C, then its exit code once the whole group is gone (SIGKILL after `timeout` seconds: -9)."""
        if self.proc is None:
            return None
        stop_group(self.proc.pid, signal.SIGINT, timeout=timeout, reap=self.proc.poll)
        return self.proc.wait()

    def tail(self) -> str:
        return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
