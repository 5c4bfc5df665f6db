"""What the end-to-end tests share: `IngestJob` streaming in the test's process, as `cdc stream` does,
with a wait for a condition on the lake that fails at once when the stream does."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cdc_platform.config import PlatformConfig
from cdc_platform.errors import LakeError
from cdc_platform.ingest import IngestJob
from cdc_platform.lake import REGISTRY_FILE


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
        self.query = self.job.start(spark, available_now=False, interval="1 second")

    def wait(self, what: str, condition: Callable[[], bool], timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.job._failure is not None:
                raise self.job._failure
            assert self.query.isActive, f"the stream stopped: {self.query.exception()}"
            if condition():
                return
            assert time.monotonic() < deadline, f"{what}: not reached after {timeout:.0f} s"
            time.sleep(2.0)

    def stop(self) -> None:
        self.job.stop_after_batch(self.query)  # `query.stop()` alone interrupts a batch in flight (CI saw it)
        if self.job._failure is not None:
            raise self.job._failure
