"""SQL over the lake: every Delta table and view registered as a Spark temp view, by name.

No Hive metastore (its embedded Derby database locks out a second process); instead each session
registers temp views from the lake itself: its tables by directory and its views from the registry
that `cdc run` writes, so a lake can be queried by someone who does not have its config file.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_platform import lake
from cdc_platform.errors import LakeError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: View builders: each takes (spark, lake dir) and registers views, returning their names. Later stages
#: (latest state, transactions) add theirs here so `cdc sql` and Dagster register everything in one call.
VIEW_REGISTRARS: list[Callable[[SparkSession, Path], list[str]]] = []


def register_lake(spark: SparkSession, lake_dir: Path) -> list[str]:
    """Register every table and view of the lake in this session; return the names, tables first."""
    if not lake_dir.is_dir():
        raise LakeError(f"lake directory {lake_dir} does not exist; run `cdc run` first or pass the right --lake")
    names: list[str] = []
    for name, path in lake.lake_tables(lake_dir).items():
        lake.read_table(spark, path).createOrReplaceTempView(lake.quote_identifier(name))
        names.append(name)
    for registrar in VIEW_REGISTRARS:
        names.extend(registrar(spark, lake_dir))
    return names


def sql(spark: SparkSession, lake_dir: Path, query: str) -> DataFrame:
    register_lake(spark, lake_dir)
    return spark.sql(query)
