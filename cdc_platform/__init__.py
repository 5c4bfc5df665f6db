"""Lakehouse change-data-capture platform: Debezium change events -> Spark -> Delta tables -> SQL views."""

from __future__ import annotations

from cdc_platform.config import PlatformConfig, TableConfig, load_config
from cdc_platform.errors import CdcError, CommitConflictError, ConfigError, EnvironmentNotReadyError, LakeError

__all__ = [
    "CdcError",
    "CommitConflictError",
    "ConfigError",
    "EnvironmentNotReadyError",
    "LakeError",
    "PlatformConfig",
    "TableConfig",
    "load_config",
]
__version__ = "0.1.0"
