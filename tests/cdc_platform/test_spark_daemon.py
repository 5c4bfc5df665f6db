"""`spark_daemon`: Spark's Python workers read a zip archive's directory again only when the archive changed."""

from __future__ import annotations

import os
import sys
import zipfile
import zipimport
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.spark.spark_daemon import lazy_invalidation


def _zip(path: Path, names: list[str]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name in names:
            z.writestr(f"{name}.py", f"VALUE = {name!r}\n")


def test_the_directory_is_read_again_only_when_the_archive_changed(tmp_path: Path) -> None:
    archive = tmp_path / "lib.zip"
    _zip(archive, ["first"])
    reads: list[str] = []

    def original(importer: Any) -> None:
        reads.append(importer.archive)
        zipimport.zipimporter.invalidate_caches(importer)

    invalidate = lazy_invalidation(original)
    importer = zipimport.zipimporter(str(archive))
    invalidate(importer)  # never stamped: read
    invalidate(importer)
    invalidate(importer)
    assert len(reads) == 1

    _zip(archive, ["first", "second"])  # a new archive at the same path: other size, other mtime
    os.utime(archive, ns=(1, 1))
    invalidate(importer)
    assert len(reads) == 2
    assert importer.find_spec("second") is not None, "the new directory was read"
    invalidate(importer)
    assert len(reads) == 2

    archive.unlink()  # gone: nothing to compare with, so the original decides
    invalidate(importer)
    invalidate(importer)
    assert len(reads) == 4


def test_the_sessions_python_workers_run_under_the_daemon(spark: Any) -> None:
    """The wiring: the suite's session (session.get_spark's settings) starts its workers from spark_daemon,
    so a task finds `zipimporter` patched (on Python < 3.12) and an invalidation costs no directory read."""
    import pyarrow as pa

    def probe(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import importlib
        import time
        import zipimport as zi

        for _ in batches:
            pass
        zips = sum(isinstance(v, zi.zipimporter) for v in sys.path_importer_cache.values())
        t = time.perf_counter()
        for _ in range(20):
            importlib.invalidate_caches()
        per_call_ms = (time.perf_counter() - t) * 1000 / 20
        yield pa.RecordBatch.from_pydict({"patched": [bool(getattr(zi.zipimporter.invalidate_caches, "_cdc_lazy", False))],
                                          "zips": [zips], "ms": [per_call_ms]})

    row = spark.range(1).coalesce(1).mapInArrow(probe, "patched boolean, zips long, ms double").collect()[0]
    if sys.version_info >= (3, 12):
        pytest.skip("Python 3.12+ invalidates zip caches lazily itself; the daemon leaves zipimport alone")
    assert row["patched"], "the workers did not start from cdc_platform.spark.spark_daemon"
    assert row["zips"] >= 2, "pyspark.zip and py4j's zip are on a worker's path: what the patch is for"
    print(f"a worker's importlib.invalidate_caches(): {row['ms']:.2f} ms a call over {row['zips']} zip importers")


def test_the_daemon_is_asked_for_only_where_executors_run_this_machines_environment() -> None:
    from cdc_platform.spark.session import python_daemon

    ours = {"spark.python.daemon.module": "cdc_platform.spark.spark_daemon"}
    for master in ("local[2]", "local", "local[*]", "spark://127.0.0.1:7077", "spark://localhost:7077,127.0.0.1:7078"):
        assert python_daemon(master) == ours, master
    for master in ("spark://10.0.0.5:7077", "spark://spark-master:7077", "yarn", "k8s://https://k8s:443", None):
        assert python_daemon(master) == {}, master  # None: under spark-submit, its settings stand
