"""Spark's Python daemon for the platform's sessions: `pyspark.daemon`, whose workers skip Python 3.11's
costly zip-import cache invalidation.

Why: Spark's Python worker calls `importlib.invalidate_caches()` before every task
(`pyspark.worker_util.setup_spark_files`). On Python 3.10 and 3.11 that makes every `zipimporter`
read its archive's directory again (CPython gh-103200, found by a Spark developer; fixed in 3.12 by
making the invalidation lazy, not backported), and Spark puts three archives on a worker's path:
pyspark.zip, py4j's zip and the spark-core jar (5,362 entries). Measured in this project's workers:
88 ms of CPU per task before its work starts, and a micro-batch runs its Python functions (the
parser, the stages' group functions, the parts' decoders) as a few dozen tasks.

What: on Python < 3.12, an archive's directory is read again only when the archive changed on disk
(modification time or size), which is what the invalidation is for. The sessions name this module
as `spark.python.daemon.module` (session.py): Spark starts it as `python -m`, it patches `zipimport`
and runs `pyspark.daemon`, whose forked workers inherit the patch. (`spark.python.worker.module`
would be the narrower hook, but pyspark's daemon takes only modules named `pyspark.*` there.)
Python 3.12 and later only run `pyspark.daemon`.
"""

from __future__ import annotations

import os
import runpy
import sys
import zipimport
from collections.abc import Callable
from typing import Any

#: The attribute a `zipimporter` keeps the (mtime, size) of its archive in, as of its last directory read.
_READ_AT = "_cdc_archive_read_at"


def _archive_stamp(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


def lazy_invalidation(original: Callable[[Any], None]) -> Callable[[Any], None]:
    """`zipimporter.invalidate_caches` that calls `original` (the directory read) only when the archive
    changed since this importer last read it, or when it cannot tell (no stamp: the archive is gone)."""

    def invalidate_caches(self: Any) -> None:
        stamp = _archive_stamp(self.archive)
        if stamp is not None and getattr(self, _READ_AT, None) == stamp:
            return
        original(self)
        setattr(self, _READ_AT, stamp)

    return invalidate_caches


def install() -> None:
    """Patch `zipimporter` on Python < 3.12 (idempotent); the importers already made count as read now."""
    if sys.version_info >= (3, 12) or getattr(zipimport.zipimporter.invalidate_caches, "_cdc_lazy", False):
        return
    patched = lazy_invalidation(zipimport.zipimporter.invalidate_caches)
    patched._cdc_lazy = True  # type: ignore[attr-defined]
    zipimport.zipimporter.invalidate_caches = patched  # type: ignore[method-assign]
    for importer in list(sys.path_importer_cache.values()):
        if isinstance(importer, zipimport.zipimporter):
            setattr(importer, _READ_AT, _archive_stamp(importer.archive))


if __name__ == "__main__":
    install()
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)
