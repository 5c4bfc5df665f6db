"""Read a generated workload back from its landing files, so `cdc generate --append` can continue it.

The files are the only record of what the generator wrote (a seed alone would not do: the landing may
have been generated with another seed, or appended to before), so the increment starts from what they
say: the last image of every row by binlog position (a delete leaves the key deleted), the highest id
per table, the last GTID, binlog file, position and commit time, and each topic's last file number.
Lines that are not change events or markers (truncated lines, tombstones) are skipped, as the pipeline
dead-letters or counts them. Pure Python; knows nothing of the simulator, only of Debezium's envelope.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_platform.errors import ConfigError

_PART = re.compile(r"^part-(\d{5,})\.jsonl$")
_GTID_NUMBER = re.compile(r":(\d+)$")

Position = tuple[int, int, int]


@dataclass
class Recovered:
    """The source database and its binlog cursor as the landing files leave them."""

    rows: dict[str, dict[int, dict[str, Any] | None]] = field(default_factory=dict)  # table -> id -> last image (None: deleted)
    next_id: dict[str, int] = field(default_factory=dict)
    next_gtid: int = 0
    last_commit_ms: int = 0
    binlog_index: int = 0
    binlog_pos: int = 0
    tx_in_file: int = 0  # transactions already in the last binlog file (it rotates after a fixed number)
    next_file: dict[str, int] = field(default_factory=dict)  # topic folder -> first free part number


def _lines(path: Path) -> Iterable[dict[str, Any]]:
    for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            obj = json.loads(text)
        except ValueError:
            continue  # a truncated line: the generator's injected fault
        if isinstance(obj, dict):
            if set(obj) == {"schema", "payload"}:
                obj = obj["payload"]
            if isinstance(obj, dict):
                yield obj


def _position(source: dict[str, Any]) -> Position:
    return int(str(source["file"]).rsplit(".", 1)[1]), int(source["pos"]), int(source.get("row") or 0)


def recover(landing: Path, tables: Iterable[str], marker_topic: str, topic_for: Any) -> Recovered:
    """The state of the generated database in `landing`; raise when there is nothing generated to continue."""
    tables = tuple(tables)
    if not landing.is_dir():
        raise ConfigError(f"{landing} does not exist: nothing to append to; write the workload first with `cdc generate --out DIR`")
    state = Recovered(rows={t: {} for t in tables}, next_id={t: 1 for t in tables})
    last: dict[tuple[str, int], Position] = {}
    gtids_in_file: dict[int, set[str]] = {}
    max_gtid = -1
    events = 0
    topics = {topic_for(t): t for t in tables}
    for folder in sorted(p for p in landing.iterdir() if p.is_dir()):
        numbers = [int(m.group(1)) for p in folder.iterdir() if (m := _PART.match(p.name))]
        state.next_file[folder.name] = max(numbers) + 1 if numbers else 0
        if folder.name != marker_topic and folder.name not in topics:
            continue
        for path in sorted(folder.glob("part-*.jsonl")):
            for obj in _lines(path):
                if "status" in obj and "id" in obj:  # a BEGIN/END marker
                    m = _GTID_NUMBER.search(str(obj["id"]))
                    if m:
                        max_gtid = max(max_gtid, int(m.group(1)))
                    if isinstance(obj.get("ts_ms"), int):
                        state.last_commit_ms = max(state.last_commit_ms, obj["ts_ms"])
                    continue
                source = obj.get("source")
                table = source.get("table") if isinstance(source, dict) else None
                if table not in state.rows or obj.get("op") not in ("c", "u", "d", "r"):
                    continue
                image = obj.get("after") if obj["op"] != "d" else obj.get("before")
                if not isinstance(image, dict) or not isinstance(image.get("id"), int):
                    continue
                events += 1
                key = image["id"]
                pos = _position(source)
                if pos >= last.get((table, key), (-1, -1, -1)):
                    last[(table, key)] = pos
                    state.rows[table][key] = None if obj["op"] == "d" else obj["after"]
                state.next_id[table] = max(state.next_id[table], key + 1)
                if (pos[0], pos[1]) > (state.binlog_index, state.binlog_pos):
                    state.binlog_index, state.binlog_pos = pos[0], pos[1]
                gtid = source.get("gtid")
                if gtid:
                    gtids_in_file.setdefault(pos[0], set()).add(str(gtid))
                if isinstance(source.get("ts_ms"), int):
                    state.last_commit_ms = max(state.last_commit_ms, source["ts_ms"])
    if events == 0 or max_gtid < 0:
        raise ConfigError(
            f"{landing} holds no generated workload (no change events and transaction markers of the sample database) "
            "to append to; write one first with `cdc generate --out DIR`"
        )
    state.next_gtid = max_gtid + 1
    state.tx_in_file = len(gtids_in_file.get(state.binlog_index, ()))
    return state
