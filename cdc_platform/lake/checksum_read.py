"""A pinned read of a small lake table from the file list its version checksum keeps (jvm/parser's `ChecksumRead`).

Why this exists: the first query over a table version this process has not scanned plans its scan by
reconstructing the version's state from the Delta log, a Spark job of its own; every commit makes a new
version, and every reader pins the versions it reads, so each `cdc sql`, check or view registration paid one
such job per table. In `cdc demo`'s counting five of
them ran one after another, 5.9 s of 9.6 s, on tables of a few kilobytes. Each commit's checksum already lists
a small table's files (Delta's `allFilesInCrc`), and Delta reads a known list of files with its own
`DeltaLog.createDataFrame`; that is what `ChecksumRead` does, for tables of at most 16 MiB (Delta's statistics
skipping is what a read from the list gives up; below that size reading every file costs less than the
reconstruction). Anything else, and a session without the class (Spark Connect, an older jar), reads through
Delta's own path: the rows are the same either way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cdc_platform.spark.session import jvm_class

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: The JVM class, loaded with the parser's jar.
CHECKSUM_READ = "cdc.platform.lake.ChecksumRead"
#: The session setting that turns these reads off (`false`), as a benchmark's variant compares
#: (`small_batches.py --variant deltareads=spark.cdc.read.fromChecksum=false`).
CHECKSUM_READ_CONF = "spark.cdc.read.fromChecksum"
#: The session setting for the largest table, in bytes of data files, read from its checksum's list (default 16 MiB).
CHECKSUM_READ_MAX_BYTES_CONF = "spark.cdc.read.fromChecksum.maxBytes"


def listed_frame(spark: SparkSession, where: str, version: int) -> DataFrame | None:
    """Version `version` of the table at `where` (a location as Spark takes it) read from its checksum's file
    list, or None when it is read through Delta's own path (module doc). A failure here (a version that does
    not exist, say) is None too: Delta's own read then raises its own error for it."""
    from py4j.protocol import Py4JError
    from pyspark.sql import DataFrame

    entry = jvm_class(spark, CHECKSUM_READ)
    if entry is None:
        return None
    try:
        frame = entry.frame(spark._jsparkSession, where, int(version))  # type: ignore[attr-defined]
    except Py4JError:
        return None
    return None if frame is None else DataFrame(frame, spark)
