"""The driver JVM's class-data archive (`spark.class_archive`): used only where Java can map it, and mapped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdc_platform.spark import class_archive


@pytest.fixture
def archive_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "class archive"  # a space: the options quote the paths
    monkeypatch.setattr(class_archive, "ARCHIVE_DIR", folder)
    monkeypatch.setattr(class_archive, "ARCHIVE", folder / "spark.jsa")
    monkeypatch.setattr(class_archive, "EMPTY_CONF_DIR", folder / "conf")
    return folder


def test_the_archive_is_mapped_only_with_the_platforms_empty_config_folder(archive_dir: Path) -> None:
    package = str(class_archive.package_conf_dir())
    assert class_archive.driver_options(None) == "" and class_archive.conf_dir_for_session() == package, "no archive yet"
    conf = class_archive.prepare_conf_dir()
    (archive_dir / "spark.jsa").write_bytes(b"archive")
    assert class_archive.conf_dir_for_session() == str(conf)
    options = class_archive.driver_options(str(conf))
    assert f'-XX:SharedArchiveFile="{archive_dir / "spark.jsa"}"' in options
    assert f"-Dlog4j2.configurationFile={class_archive.logging_config()}" in options, "the logging config, no longer on the class path"
    assert "-Xlog:cds=off" in options.split(), "a JVM that cannot map it says nothing"
    assert class_archive.driver_options(None) == options
    assert class_archive.driver_options(package) == "", "a user's SPARK_CONF_DIR (or the package's) is on the class path: no archive"
    (conf / "spark-defaults.conf").write_text("spark.x 1\n")
    assert class_archive.driver_options(str(conf)) == "" and class_archive.conf_dir_for_session() == package, "a folder with a file"
    training = class_archive.driver_options(None, training=archive_dir / "new.jsa")
    assert f'-XX:ArchiveClassesAtExit="{archive_dir / "new.jsa"}"' in training and "SharedArchiveFile" not in training


def test_a_new_process_maps_the_archive_setup_wrote_and_stays_quiet(tmp_path: Path) -> None:
    """`make setup` wrote the archive (scripts/build_class_archive.py); a new process's session maps Spark's classes
    from it (Java's class-loading log names the archive as their source) and Spark's logging config still applies."""
    assert class_archive.ARCHIVE.is_file(), "make setup writes jvm/class-archive/spark.jsa"
    log = tmp_path / "classes.log"
    code = (
        "from cdc_platform.spark.session import get_spark\n"
        f"spark = get_spark('archive-test', conf={{'spark.driver.extraJavaOptions': '-Xlog:class+load=info:file={log}'}})\n"
        "print(spark.range(3).count())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "PYSPARK_SUBMIT_ARGS")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "3"
    loaded = [line for line in log.read_text(encoding="utf-8").splitlines() if " org.apache.spark.SparkContext " in line]
    assert loaded and "shared objects file (top)" in loaded[0], loaded
    assert not [line for line in done.stderr.splitlines() if " INFO " in line], "Spark's INFO lines are off, as the package's logging config says"
