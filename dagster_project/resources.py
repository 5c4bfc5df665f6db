"""Dagster resources: narrow interfaces over the platform's config and Spark session.

`CdcResource` is the only way assets and checks reach the platform: it loads the typed config once and
hands out the process-wide Spark session. Tests swap in a resource pointing at a temporary config.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from dagster import ConfigurableResource

from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class CdcResource(ConfigurableResource):
    """The platform for one lake, from one `cdc.yaml`."""

    config_path: str
    expectations_dir: str | None = None

    @cached_property
    def config(self) -> PlatformConfig:
        return load_config(self.config_path)

    def spark(self) -> SparkSession:
        from cdc_platform.spark.session import SHORT_LIVED_JVM, get_spark

        # A run is one process with its own JVM, gone when the run ends (see SHORT_LIVED_JVM).
        return get_spark("cdc-dagster", master=self.config.spark_master, conf=SHORT_LIVED_JVM, object_store=self.config.lake_is_remote)

    @property
    def lake(self) -> LakePath:
        return self.config.lake

    def expectations(self) -> Path | None:
        return Path(self.expectations_dir) if self.expectations_dir else None
