"""The driver JVM's class-data archive: Java's own AppCDS, so a new process's Spark starts in half the time.

Why: every `cdc` command, Dagster run and child of the test suite is a new JVM that loads and verifies the same
~20,000 classes of Spark, Delta and the platform before its first query. Java 13+ can write the classes a run
loaded to an archive at its exit (`-XX:ArchiveClassesAtExit`) and map them, already parsed and verified, into
the next JVM (`-XX:SharedArchiveFile`). `make setup` writes the archive with one training run
(`scripts/build_class_archive.py`: a small `cdc run` and a view query); measured on this machine, a cold process's
Spark start went from 8.6-9.1 s to 4.1-5.5 s and its first small `cdc run` from 40-41 s to 28-31 s in all
(benchmarks/README.md, "A seventeenth session").

The archive holds the exact class path it was written with, and Java refuses a directory on it that holds any
file. Spark puts `SPARK_CONF_DIR` first on the driver's class path, so a session that uses the archive points
`SPARK_CONF_DIR` at an empty folder beside the archive and names Spark's logging config with a system property
instead (`log4j2.configurationFile`). A user's own `SPARK_CONF_DIR` wins and the archive is then left out; a
JVM whose jars or Java differ from the archive's (a `pip install` after setup, another JDK) maps nothing and
starts as it would without it, silently (`-Xlog:cds=off`), so the archive can make a start faster, never fail it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

#: Where `make setup` writes the archive, and the empty folder that stands for `SPARK_CONF_DIR` with it.
ARCHIVE_DIR = Path(__file__).resolve().parents[2] / "jvm" / "class-archive"
ARCHIVE = ARCHIVE_DIR / "spark.jsa"
EMPTY_CONF_DIR = ARCHIVE_DIR / "conf"
#: Without these the JVM prints a warning on every start whose class path differs from the archive's.
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def package_conf_dir() -> Path:
    """The package's Spark config folder (logging config, fair scheduler pools): `SPARK_CONF_DIR` without the archive."""
    return Path(str(resources.files("cdc_platform").joinpath("spark_conf")))


def logging_config() -> Path:
    return package_conf_dir() / "log4j2.properties"


def usable(conf_dir: str | None) -> bool:
    """Whether a driver started with `SPARK_CONF_DIR=conf_dir` (None: unset) can map the archive: the archive is
    there and the config folder is the platform's empty one (or unset, and then it will be)."""
    if not ARCHIVE.is_file() or not EMPTY_CONF_DIR.is_dir() or any(EMPTY_CONF_DIR.iterdir()):
        return False
    return conf_dir is None or Path(conf_dir) == EMPTY_CONF_DIR


def driver_options(conf_dir: str | None, *, training: Path | None = None) -> str:
    """The driver's Java options for the archive: map it (or, with `training`, write one there at exit), with
    Spark's logging config named, since the config folder is empty. "" when the archive cannot be used."""
    if training is None and not usable(conf_dir):
        return ""
    archive = f"-XX:ArchiveClassesAtExit={_quoted(training)}" if training is not None else f"-XX:SharedArchiveFile={_quoted(ARCHIVE)}"
    return f"{archive} {QUIET} -Dlog4j2.configurationFile={_quoted(logging_config())}"


def conf_dir_for_session() -> str:
    """The `SPARK_CONF_DIR` a session starts with when the user set none: the empty folder when the archive is
    usable, else the package's config folder."""
    return str(EMPTY_CONF_DIR) if usable(None) else str(package_conf_dir())


def prepare_conf_dir() -> Path:
    """Create the empty config folder (the archive's training run and `usable` need it)."""
    EMPTY_CONF_DIR.mkdir(parents=True, exist_ok=True)
    return EMPTY_CONF_DIR


def _quoted(path: Path) -> str:
    """A path as Spark's launcher splits Java options (quotes keep a space inside one option)."""
    text = str(path)
    return f'"{text}"' if any(ch.isspace() for ch in text) else text
