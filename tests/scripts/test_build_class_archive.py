"""scripts/build_class_archive.py: a training run that fails, or a Java that writes no archive, leaves no archive
(sessions then start without one) and does not stop `make setup`; a written one is swapped in whole. (The real
training runs in `make setup`; `tests/cdc_platform/test_class_archive.py` holds a new process to the archive it wrote.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from cdc_platform.spark import class_archive

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_class_archive", REPO / "scripts" / "build_class_archive.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    folder = tmp_path / "class-archive"
    monkeypatch.setattr(class_archive, "ARCHIVE_DIR", folder)
    monkeypatch.setattr(class_archive, "ARCHIVE", folder / "spark.jsa")
    monkeypatch.setattr(class_archive, "EMPTY_CONF_DIR", folder / "conf")
    monkeypatch.setattr(module, "DUMP_SECONDS", 5)
    return module


def test_a_failed_training_run_leaves_no_archive_and_says_why(builder: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    class_archive.prepare_conf_dir()
    class_archive.ARCHIVE.write_bytes(b"an old archive")  # never left beside jars it no longer matches
    monkeypatch.setattr(builder, "TRAINING", "import sys\nsys.stderr.write('Java said no\\n')\nsys.exit(3)\n")
    assert builder.main() == 0, "setup goes on"
    assert not class_archive.ARCHIVE.exists()
    assert "no class-data archive: the training run failed (Java said no)" in capsys.readouterr().out
    assert class_archive.conf_dir_for_session() == str(class_archive.package_conf_dir())


def test_a_java_that_writes_no_archive_leaves_none(builder: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # The "JVM" is this short-lived child itself: it has exited by the time its pid is waited for, having written nothing.
    monkeypatch.setattr(builder, "TRAINING", "import json, os\nprint(json.dumps({'jvm_pid': os.getpid()}))\n")
    assert builder.build() is None
    assert not class_archive.ARCHIVE.exists() and not (class_archive.ARCHIVE_DIR / "spark.jsa.partial").exists()
    assert "this Java wrote none" in capsys.readouterr().out


def test_a_written_archive_is_swapped_in(builder: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    code = ("import json, os, sys\nfrom pathlib import Path\n"
            "Path(sys.argv[2]).write_bytes(b'classes')\nprint(json.dumps({'jvm_pid': os.getpid()}))\n")
    monkeypatch.setattr(builder, "TRAINING", code)
    assert builder.build() == class_archive.ARCHIVE
    assert class_archive.ARCHIVE.read_bytes() == b"classes"
    assert class_archive.usable(None), "the empty config folder is there too"
