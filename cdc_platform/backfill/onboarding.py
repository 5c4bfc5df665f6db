"""Onboarding a source table while the stream runs: add it under `tables:` in cdc.yaml, and the next
micro-batch keeps its latest state, with nothing of its past lost.

Every event of every source table lands in the raw log whether the table is configured or not (the
`unconfigured_source_tables` sensor lists those that are not). So a table configured late already has
its history in the lake: onboarding builds its latest state from the raw log first (`rebuild_table`,
the same fold `cdc rebuild` runs) and then lets the stream apply every later batch to it. A table
configured while the stream was stopped is built by `cdc rebuild --table NAME` (the same fold).

Only additions apply while the stream runs. A changed entry (another key, a new name) or a removed one
changes what the lake already holds and is left for a restart with `cdc rebuild`; so are the other
settings of the file. Each is said once, through the job's progress messages.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import pyarrow as pa

from cdc_platform import lake
from cdc_platform.config import PlatformConfig, TableConfig, load_config
from cdc_platform.errors import CdcError
from cdc_platform.stages.stage import RAW
from cdc_platform.storage import LakePath


def raw_log_has_rows(lake_dir: LakePath) -> bool:
    """Whether the raw log holds any event (a fresh lake's has none: nothing to build from)."""
    path = lake.table_path(lake_dir, RAW)
    return lake.exists(path) and pa.table(lake.open_table(path).get_add_actions(flatten=True)).num_rows > 0


def build_from_raw_log(config: PlatformConfig, tables: Sequence[TableConfig], progress: Callable[[str], None]) -> list[str]:
    """Build the latest state of each of `tables` that has none yet from the raw log; the names built."""
    from cdc_platform.stages.latest_state import rebuild_table  # the latest-state package, not the job: no cycle

    todo = [t for t in tables if not lake.exists(lake.table_path(config.lake, t.name))]
    if not todo or not raw_log_has_rows(config.lake):
        return []
    for table in todo:
        progress(f"onboarding {table.source} as {table.name}: building its latest state from the raw log ...")
        rebuild_table(config, table.name, progress=progress)
    return [t.name for t in todo]


@dataclass
class ConfigWatch:
    """Notices edits of the config file between micro-batches and returns the config with tables added."""

    config: PlatformConfig
    progress: Callable[[str], None]
    _text: str | None = None
    _said: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._text = self._read()

    def _read(self) -> str | None:
        path = self.config.source_file
        try:
            return path.read_text(encoding="utf-8") if path is not None else None
        except OSError:
            return None

    def _say_once(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            self.progress(message)

    def poll(self) -> PlatformConfig | None:
        """The current config plus every table added to the file since the last poll; None when none was."""
        text = self._read()
        if text is None or text == self._text:
            return None
        self._text = text
        try:
            edited = load_config(self.config.source_file)
        except CdcError as exc:
            self._say_once(f"the edited config is not used, the stream goes on with the one it started with: {exc}")
            return None
        current = {t.source: t for t in self.config.tables}
        added = [t for t in edited.tables if t.source not in current]
        for t in edited.tables:
            if t.source in current and t != current[t.source]:
                self._say_once(f"the change to tables.{t.source} applies at the next start (then run `cdc rebuild --table {t.name}`)")
        for source in sorted(set(current) - {t.source for t in edited.tables}):
            self._say_once(f"tables.{source} was removed from the config; the stream keeps its latest state until the next start")
        names = {t.name for t in self.config.tables}
        clash = [t for t in added if t.name in names]
        for t in clash:
            self._say_once(f"tables.{t.source} is not onboarded: its name {t.name!r} is taken by another table; set `name:`")
        added = [t for t in added if t not in clash]
        if not added:
            return None
        self.config = replace(self.config, tables=self.config.tables + tuple(added))
        return self.config
