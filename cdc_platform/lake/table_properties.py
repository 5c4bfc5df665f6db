"""The Delta table properties a table the platform creates gets (`lake_spark.ensure_table`): its checkpoint
interval and the columns Delta keeps file statistics for. Apart from the writes because both are decided
from the table's name and schema alone, before any Delta call.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

#: The checkpoint intervals a table draws from (`checkpoint_interval`): primes, so that two tables drawing
#: different ones checkpoint in the same batch only once every product of the two (143 batches or more).
CHECKPOINT_INTERVALS = (11, 13, 17, 19, 23, 29)


def checkpoint_interval(name: str) -> int:
    """The `delta.checkpointInterval` a new table of this name gets: one of `CHECKPOINT_INTERVALS`, by a
    stable hash of the name.

    Delta checkpoints a table after a commit whose version is a multiple of its interval (default 10),
    ~1 s of a busy two-core machine each. A stream commits to each of its tables once a batch, and a
    lake's tables are created together, so at one interval every table checkpointed in the same batch:
    every tenth small steady batch took 13.6-18.2 s against ~9.5 (benchmarks/README.md, "Staggered
    checkpoints"). Drawn intervals spread them over the batches. Longer ones cost a batch nothing here:
    a guarded append replaying up to 49 commits of JSON cost less than one reading a checkpoint and up
    to 9 (means of 0.63-0.71 s against 0.74-0.81 s). A reader opening the table cold reads at most 28
    commit files after the checkpoint instead of 9.
    """
    return CHECKPOINT_INTERVALS[zlib.crc32(name.encode()) % len(CHECKPOINT_INTERVALS)]


#: Delta's table property naming the columns it collects file statistics for (instead of the first 32).
STATS_COLUMNS_PROPERTY = "delta.dataSkippingStatsColumns"


def stats_columns(schema: StructType, partition_by: Sequence[str], unskipped: Sequence[str]) -> list[str] | None:
    """The columns of `schema` Delta should keep file statistics for when `unskipped` are left out (None: no
    list, Delta's default). Partition columns are skipped by their values, and Delta refuses statistics on
    them and on booleans and nested types, so the list holds the top-level strings, numbers, dates and times."""
    from pyspark.sql.types import DateType, NumericType, StringType, TimestampNTZType, TimestampType

    if not unskipped:
        return None
    leave = set(unskipped) | set(partition_by)
    kinds = (StringType, NumericType, DateType, TimestampType, TimestampNTZType)
    return [f.name for f in schema.fields if f.name not in leave and isinstance(f.dataType, kinds)]
