"""Dagster code location for the CDC platform (`dagster dev -w workspace.yaml`)."""

from __future__ import annotations

from dagster_project.definitions import build_defs

defs = build_defs()

__all__ = ["build_defs", "defs"]
