"""SQL over the lake: every Delta table and view registered as a Spark temp view, by name.

No Hive metastore (its embedded Derby database locks out a second process); instead each session
registers temp views from the lake itself: its tables by directory and its views from the registry
that `cdc run` writes, so a lake can be queried by someone who does not have its config file.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cdc_platform import lake
from cdc_platform.errors import LakeError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Stage modules that define views: each may expose `register_views(spark, lake_dir) -> list[str]`,
#: so `cdc sql` and Dagster register every table and view of a lake with one call.
VIEW_MODULES: tuple[str, ...] = ("cdc_platform.latest_state", "cdc_platform.transactions")


def _registrars() -> list[Callable[[SparkSession, Path], list[str]]]:
    found = []
    for name in VIEW_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        registrar = getattr(module, "register_views", None)
        if registrar is not None:
            found.append(registrar)
    return found


def register_lake(spark: SparkSession, lake_dir: Path) -> list[str]:
    """Register every table and view of the lake in this session; return the names, tables first."""
    if not lake_dir.is_dir():
        raise LakeError(f"lake directory {lake_dir} does not exist; run `cdc run` first or pass the right --lake")
    names: list[str] = []
    for name, path in lake.lake_tables(lake_dir).items():
        lake.read_table(spark, path).createOrReplaceTempView(lake.quote_identifier(name))
        names.append(name)
    for registrar in _registrars():
        names.extend(registrar(spark, lake_dir))
    return names


def sql(spark: SparkSession, lake_dir: Path, query: str) -> DataFrame:
    register_lake(spark, lake_dir)
    return spark.sql(query)
