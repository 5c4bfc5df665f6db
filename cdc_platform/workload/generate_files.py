"""How the sample workload's lines become files: Debezium's MySQL envelope schema, Kafka's JSON converter
output, and one writer per topic that injects the faults real pipelines see.

Split from `generate.py`, which simulates the source database: this side knows nothing of customers or
charges beyond the Connect schema, only lines, files and faults (redeliveries, truncated lines,
tombstones after deletes, held-back late events, schema-wrapped files). Files are written under a
hidden `.tmp` name and renamed, as the README asks of anything that lands while a stream may be reading.
"""

from __future__ import annotations

import heapq
import json
import os
import random
from pathlib import Path
from typing import Any

CONNECTOR_VERSION = "2.7.3.Final"
TOPIC_PREFIX = "payments"  # Debezium `topic.prefix`, also `source.name`
DATABASE = "payments"
SERVER_ID = 223344
SERVER_UUID = "8c1f2e3a-0b1c-11ef-9a43-0242ac120002"
TX_PER_BINLOG = 5000
BINLOG_FIRST_EVENT_POS = 197  # after the magic header, format description and previous-GTIDs events

DUPLICATE_RATE = 0.005
MALFORMED_RATE = 1 / 25_000
SCHEMA_FILE_RATE = 0.05

Row = dict[str, Any]
# (table, op, before, after, late role: "" | "hold" | "arm")
Change = tuple[str, str, "Row | None", "Row | None", str]


def topic_for(table: str) -> str:
    """Debezium's default topic name: `<topic.prefix>.<database>.<table>`."""
    return f"{TOPIC_PREFIX}.{DATABASE}.{table}"


def customers_connect_schema() -> dict[str, Any]:
    """The Connect schema the JSON converter emits for the customers envelope when schemas are on.

    Matches Debezium 2.7's MySQL shape so a parser that types rows from the schema sees the real thing.
    """

    def col(kind: str, name: str, optional: bool = False) -> dict[str, Any]:
        return {"type": kind, "optional": optional, "field": name}

    row_fields = [
        col("int32", "id"),
        col("string", "name"),
        col("string", "email"),
        col("string", "country"),
        col("int64", "created_at"),
    ]

    def row_image(field_name: str) -> dict[str, Any]:
        return {
            "type": "struct",
            "fields": row_fields,
            "optional": True,
            "name": f"{topic_for('customers')}.Value",
            "field": field_name,
        }

    source = {
        "type": "struct",
        "fields": [
            col("string", "version"),
            col("string", "connector"),
            col("string", "name"),
            col("int64", "ts_ms"),
            {
                "type": "string",
                "optional": True,
                "name": "io.debezium.data.Enum",
                "version": 1,
                "parameters": {
                    "allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
                },
                "default": "false",
                "field": "snapshot",
            },
            col("string", "db"),
            col("string", "sequence", True),
            col("string", "table", True),
            col("int64", "server_id"),
            col("string", "gtid", True),
            col("string", "file"),
            col("int64", "pos"),
            col("int32", "row"),
            col("int64", "thread", True),
            col("string", "query", True),
        ],
        "optional": False,
        "name": "io.debezium.connector.mysql.Source",
        "field": "source",
    }
    transaction = {
        "type": "struct",
        "fields": [col("string", "id"), col("int64", "total_order"), col("int64", "data_collection_order")],
        "optional": True,
        "name": "event.block",
        "version": 1,
        "field": "transaction",
    }
    return {
        "type": "struct",
        "fields": [row_image("before"), row_image("after"), source, col("string", "op"), col("int64", "ts_ms", True), transaction],
        "optional": False,
        "name": f"{topic_for('customers')}.Envelope",
        "version": 1,
    }


def _dumps(obj: Any) -> str:
    """Compact JSON as Kafka's JsonConverter writes it (no spaces, ASCII only)."""
    return json.dumps(obj, separators=(",", ":"))


class TopicWriter:
    """Appends one topic's lines to `part-NNNNN.jsonl` files, injecting that topic's faults.

    Faults are inserted only between "units" (an event plus its tombstone), so a delete is always
    followed directly by its `null`. Lines are buffered one file at a time and serialised at flush,
    because whether a customers file uses the schema-wrapped converter is decided per file.
    """

    def __init__(
        self,
        directory: Path,
        cap: int,
        rng: random.Random,
        schema: dict[str, Any] | None = None,
        faults: bool = True,
        first_file: int = 0,
    ) -> None:
        self.directory = directory
        self.cap = cap
        self.rng = rng
        self.faults = faults
        self._schema_prefix = '{"schema":' + _dumps(schema) + ',"payload":' if schema is not None else None
        self._wrapped_any = False
        self._buffer: list[Any] = []  # dict line | None (tombstone) | ("trunc", dict)
        self.file_index = first_file  # index of the file the buffer will become (an increment continues the numbering)
        self.lines = 0
        self._dups: list[tuple[int, int, Row]] = []  # heap of (due line, seq, envelope)
        self._dup_seq = 0
        self._held: list[list[Any]] = []  # [key, envelope, file index of the newer update or None]
        self.duplicates = 0
        self.duplicates_scheduled = 0
        self.malformed = 0
        self.tombstones = 0
        self.files = 0
        self.last_candidate: Row | None = None  # latest envelope usable for a forced fault

    # -- low level -------------------------------------------------------------------------------
    def _put(self, item: Any) -> None:
        if len(self._buffer) >= self.cap:
            self._flush(last_chance=False)
        self._buffer.append(item)
        self.lines += 1

    def _encode(self, env: Row, wrap: bool) -> str:
        if wrap:
            return self._schema_prefix + _dumps(env) + "}"  # type: ignore[operator]
        return _dumps(env)

    def _flush(self, last_chance: bool) -> None:
        if not self._buffer:
            return
        wrap = False
        if self._schema_prefix is not None:
            # At least one wrapped file per topic: the last regular file if chance picked none before it.
            wrap = self.rng.random() < SCHEMA_FILE_RATE or (last_chance and not self._wrapped_any)
            self._wrapped_any = self._wrapped_any or wrap
        out: list[str] = []
        for item in self._buffer:
            if item is None:
                out.append("null")
            elif type(item) is tuple:
                text = self._encode(item[1], wrap)
                out.append(text[: len(text) // 2])
            else:
                out.append(self._encode(item, wrap))
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"part-{self.file_index:05d}.jsonl"
        if path.exists():  # an increment continues the numbering; it never rewrites a file a stream may have read
            raise FileExistsError(f"{path} exists already; the writer would overwrite landed input")
        tmp = path.with_name(f".{path.name}.tmp")  # Spark's file source skips names starting with '.'
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write("\n".join(out))
            fh.write("\n")
        os.replace(tmp, path)
        self._buffer = []
        self.file_index += 1
        self.files += 1

    def _boundary(self) -> None:
        """Release redeliveries that are due and held-back events whose newer update is in an earlier file."""
        while self._dups and self._dups[0][0] <= self.lines:
            self._put(heapq.heappop(self._dups)[2])
            self.duplicates += 1
        if self._held:
            keep: list[list[Any]] = []
            for held in self._held:
                if held[2] is not None and self.file_index > held[2]:
                    self._put(held[1])
                else:
                    keep.append(held)
            self._held = keep

    # -- public --------------------------------------------------------------------------------
    def add_marker(self, marker: Row) -> None:
        self._put(marker)

    def schedule_duplicate(self, env: Row, due_line: int, delay_ms: int) -> None:
        dup = dict(env)
        dup["ts_ms"] = env["ts_ms"] + delay_ms
        heapq.heappush(self._dups, (due_line, self._dup_seq, dup))
        self._dup_seq += 1
        self.duplicates_scheduled += 1

    def add_change(self, env: Row, key: int, late: str = "") -> None:
        self._boundary()
        if late == "hold":
            self._held.append([key, env, None])
            return
        is_delete = env["op"] == "d"
        rng = self.rng
        if self.faults and rng.random() < MALFORMED_RATE:
            self._put(("trunc", env))  # a partial write, then the retried full line
            self.malformed += 1
        self._put(env)
        if is_delete:
            self._put(None)
            self.tombstones += 1
        if late == "arm":
            for held in self._held:
                if held[0] == key and held[2] is None:
                    held[2] = self.file_index
        elif not is_delete:
            self.last_candidate = env
            if self.faults and rng.random() < DUPLICATE_RATE:
                self.schedule_duplicate(env, self.lines + rng.randint(1, 2 * self.cap), rng.randint(1_000, 30_000))

    def add_truncated(self, env: Row) -> None:
        self._boundary()
        self._put(("trunc", env))
        self.malformed += 1

    def close(self) -> None:
        self._boundary()
        while self._dups:
            self._put(heapq.heappop(self._dups)[2])
            self.duplicates += 1
        for held in self._held:
            if held[2] is not None and self.file_index <= held[2]:
                # Start a new file so the late event really lands later. The guaranteed schema-wrapped
                # file is this full one, not the late event's own, so the two faults stay separable.
                self._flush(last_chance=True)
            self._put(held[1])
        self._held = []
        self._flush(last_chance=True)


class Binlog:
    """The source's binlog cursor (file, position, GTID, commit clock) and how one transaction is written.

    One class for a fresh workload and for an increment, so an increment continues exactly where the
    files stop: later transactions get higher GTIDs, later positions and later commit times.
    """

    def __init__(self, index: int, pos: int, tx_in_file: int, next_gtid: int, commit_ms: int) -> None:
        self.index = index
        self.pos = pos
        self.tx_in_file = tx_in_file
        self.next_gtid = next_gtid
        self.commit = commit_ms

    @property
    def file(self) -> str:
        return f"mysql-bin.{self.index:06d}"

    def begin(self, rng: random.Random) -> int:
        """Start the next transaction (rotating the binlog every TX_PER_BINLOG); return its commit time."""
        if self.tx_in_file >= TX_PER_BINLOG:
            self.index += 1
            self.pos = BINLOG_FIRST_EVENT_POS
            self.tx_in_file = 0
        self.tx_in_file += 1
        self.commit += rng.randint(50, 600)
        return self.commit

    def write(self, changes: list[Change], rng: random.Random, writers: dict[str, TopicWriter], tx_writer: TopicWriter) -> int:
        """Write one transaction's BEGIN, change events and END; return the number of change events."""
        commit = self.commit
        gtid = f"{SERVER_UUID}:{self.next_gtid}"
        self.next_gtid += 1
        thread = rng.randint(8, 40)
        delay = rng.randint(10, 490)
        self.pos += 65 + rng.randint(70, 90)  # GTID event, then the BEGIN query event
        tx_writer.add_marker({"status": "BEGIN", "id": gtid, "ts_ms": commit, "event_count": None, "data_collections": None})
        per_table: dict[str, int] = {}
        for order, (table, op, before, after, late) in enumerate(changes, 1):
            dc_order = per_table.get(table, 0) + 1
            per_table[table] = dc_order
            self.pos += rng.randint(50, 80)  # table map event
            source = {
                "version": CONNECTOR_VERSION, "connector": "mysql", "name": TOPIC_PREFIX, "ts_ms": commit,
                "snapshot": "false", "db": DATABASE, "sequence": None, "table": table, "server_id": SERVER_ID,
                "gtid": gtid, "file": self.file, "pos": self.pos, "row": 0, "thread": thread, "query": None,
            }
            self.pos += rng.randint(90, 420)  # the rows event itself
            env = {
                "before": before,
                "after": after,
                "source": source,
                "op": op,
                "ts_ms": commit + delay + min(order - 1, 9),
                "transaction": {"id": gtid, "total_order": order, "data_collection_order": dc_order},
            }
            key = (after if after is not None else before)["id"]  # type: ignore[index]
            writers[table].add_change(env, key, late)
        self.pos += 31  # XID event
        tx_writer.add_marker(
            {
                "status": "END",
                "id": gtid,
                "ts_ms": commit,
                "event_count": len(changes),
                "data_collections": [
                    {"data_collection": f"{DATABASE}.{table}", "event_count": n} for table, n in per_table.items()
                ],
            }
        )
        return len(changes)
