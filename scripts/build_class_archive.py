"""Write the driver JVM's class-data archive (`cdc_platform.spark.class_archive`) for `make setup`.

One training run in a child process: a Spark session started with `-XX:ArchiveClassesAtExit`, a small generated
workload through `cdc run`'s job and a query of its views (the classes every `cdc` command, Dagster run and test
child loads), then the JVM's exit, when Java writes the classes it loaded. The archive is written beside the old
one and swapped in whole. Best effort: a Java that cannot write one (no base archive in its runtime, say) leaves
no archive, and sessions start as they did without it; `make setup` goes on.

    .venv/bin/python scripts/build_class_archive.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cdc_platform.spark import class_archive

#: What the training run does, in its own process (its JVM's exit writes the archive).
TRAINING = """
import json, sys
from pathlib import Path
from cdc_platform.config import load_config
from cdc_platform.run.ingest import IngestJob
from cdc_platform.spark import class_archive
from cdc_platform.spark.session import get_spark, stop_spark
from cdc_platform.views import register_lake
from cdc_platform.workload.generate import generate_workload

root, archive = Path(sys.argv[1]), Path(sys.argv[2])
spark = get_spark("cdc-class-archive", conf={"spark.driver.extraJavaOptions": class_archive.driver_options(None, training=archive)})
sample = generate_workload(root / "sample", transactions=20, seed=7, track_state=False)
config = load_config(sample.config_path, lake=root / "lake", landing=sample.landing_dir)
IngestJob(config).run_available_now(spark)
register_lake(spark, config.lake)
for table in config.tables:
    spark.sql(f"SELECT * FROM `{table.name}__full_view` LIMIT 5").collect()
pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())
stop_spark()
print(json.dumps({"jvm_pid": pid}))
"""
#: How long the JVM may take to write the archive once its Python has exited.
DUMP_SECONDS = 180


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def build() -> Path | None:
    """Train and swap the archive in; None (and no archive) when the JVM wrote none."""
    class_archive.ARCHIVE.unlink(missing_ok=True)  # a session must not map the old one while it writes the new one
    class_archive.prepare_conf_dir()
    with tempfile.TemporaryDirectory(prefix="cdc-class-archive-") as work:
        written = class_archive.ARCHIVE_DIR / "spark.jsa.partial"
        written.unlink(missing_ok=True)
        env = {**os.environ, "SPARK_CONF_DIR": str(class_archive.EMPTY_CONF_DIR)}
        done = subprocess.run([sys.executable, "-c", TRAINING, work, str(written)], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"no class-data archive: the training run failed ({(done.stderr.strip().splitlines() or ['?'])[-1]})")
            return None
        pid = json.loads(done.stdout.strip().splitlines()[-1])["jvm_pid"]
        deadline = time.monotonic() + DUMP_SECONDS
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid) or not written.is_file() or written.stat().st_size == 0:
            print("no class-data archive: this Java wrote none (Spark starts without one, as before)")
            written.unlink(missing_ok=True)
            return None
        os.replace(written, class_archive.ARCHIVE)
    return class_archive.ARCHIVE


def main() -> int:
    t = time.perf_counter()
    print("writing the JVM's class-data archive (one small training run) ...", flush=True)
    archive = build()
    if archive is not None:
        print(f"{archive.relative_to(class_archive.ARCHIVE_DIR.parents[1])}: {archive.stat().st_size / 2**20:.0f} MB "
              f"({time.perf_counter() - t:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
