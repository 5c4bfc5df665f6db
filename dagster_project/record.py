"""Record what a lake holds as asset materialisations in a Dagster instance, without running a job.

`make demo` runs the pipeline with `cdc demo`, outside Dagster; without this the UI would show every
asset as never materialised although the lake is full. This reports one runless materialisation per
lake table (Dagster's `report_runless_asset_event`), with the metadata the pipeline's own run gives:
row count and column schema from the Delta log (no Spark), live rows of latest-state tables from the
demo's counts (`demo-counts.json`) when there are some.

    python -m dagster_project.record --config .cdc-demo/cdc.yaml --home .dagster_home
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from cdc_platform import checks, lake
from cdc_platform.config import load_config
from cdc_platform.workload.demo import COUNTS_FILE

REPO = Path(__file__).resolve().parents[1]


def record_lake(config_path: Path, home: Path) -> list[str]:
    """Report a materialisation of every asset whose table is in the lake; return their names."""
    from dagster import AssetMaterialization, DagsterInstance

    from dagster_project import metadata as md
    from dagster_project.assets import ingest_specs, source_time_columns

    config = load_config(config_path)
    home.mkdir(parents=True, exist_ok=True)
    if not (home / "dagster.yaml").is_file():
        shutil.copy(REPO / "dagster_project" / "dagster.yaml", home / "dagster.yaml")
    counts_file = config_path.parent / COUNTS_FILE
    counts: dict[str, int] = json.loads(counts_file.read_text(encoding="utf-8")) if counts_file.is_file() else {}
    present = lake.lake_tables(config.lake)
    source_time = source_time_columns(config)
    recorded: list[str] = []
    with DagsterInstance.from_config(str(home)) as instance:
        for spec in ingest_specs(config):
            name = spec.key.path[-1]
            if name not in present:
                continue
            live = counts.get(f"{name}/live")
            meta = md.table_metadata(present[name], rows=live)
            if live is not None:
                meta["stored_rows"] = counts.get(f"{name}/stored", 0)
            if name == "dead_letter":
                meta["newest_dead_letters"] = md.dead_letter_sample(config.lake)
            if name in source_time:
                meta |= md.source_time(checks.table_source_time(config.lake, name, source_time[name]))
            meta["recorded_by"] = "make demo (the lake as `cdc demo` left it)"
            instance.report_runless_asset_event(AssetMaterialization(asset_key=spec.key, metadata=meta))
            recorded.append(name)
    return recorded


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Record a lake's tables as materialisations in a Dagster instance.")
    parser.add_argument("--config", type=Path, required=True, help="the lake's cdc.yaml")
    parser.add_argument("--home", type=Path, default=REPO / ".dagster_home", help="DAGSTER_HOME of the instance (default: make ui's, .dagster_home)")
    args = parser.parse_args(argv)
    names = record_lake(args.config, args.home)
    print(f"recorded {len(names)} tables as materialised in the Dagster instance at {args.home} (see them with `make ui`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
