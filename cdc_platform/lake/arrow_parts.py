"""Rows of Arrow tables carried through Spark as binary parts: how executor stages hand their results on.

Why: a stage's group function (`applyInArrow`) must return one fixed Spark schema, but its results are
several tables of their own shapes (a source table's rows, dead letters, transactions, ...). Each is
encoded as Arrow IPC streams of bounded size (`chunks`) into a `payload` column, stays on the
executors, and is decoded there again (`decoder`, in `mapInArrow`) straight into the Delta write.
Used by `latest_state.staging`, `transactions.buckets` and `latest_state.rebuild_parts`; the two stages
that group by bucket share one shape of part rows (`BUCKET_PARTS`, `part_row`, `part_rows`), and the
latest-state stage's differ only in their group column (`parts_schema`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from cdc_platform.lake.schemas import conform

#: Rows per encoded chunk: bounds one payload (a Spark row) whatever the batch size.
CHUNK_ROWS = 20_000


def encode(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def decode_one(payload: bytes) -> pa.Table:
    return pa.ipc.open_stream(payload).read_all()


def chunks(rows: pa.Table | None, size: int = CHUNK_ROWS) -> list[bytes]:
    """`rows` as encoded payloads of at most `size` rows each (none for no rows)."""
    if rows is None or rows.num_rows == 0:
        return []
    return [encode(rows.slice(start, size)) for start in range(0, rows.num_rows, size)]


def parts_schema(group: pa.Field) -> pa.Schema:
    """The rows a group function returns, after its group's own column: each is one part of the group's
    result, its rows encoded in `payload` (`chunks`), or a small JSON `info` for the driver."""
    return pa.schema([
        group,
        pa.field("part", pa.string()),
        pa.field("chunk", pa.int32()),
        pa.field("payload", pa.binary()),
        pa.field("info", pa.string()),
    ])


#: The part rows of the stages that group by a hashed bucket (the transactions' and the rebuild's).
BUCKET_PARTS = parts_schema(pa.field("bucket", pa.int32()))


def part_row(bucket: int, part: str, chunk: int = 0, payload: bytes | None = None, info: Any = None) -> dict[str, Any]:
    """One `BUCKET_PARTS` row."""
    return {"bucket": bucket, "part": part, "chunk": chunk, "payload": payload,
            "info": None if info is None else json.dumps(info, sort_keys=True)}


def part_rows(bucket: int, part: str, rows: pa.Table | None) -> list[dict[str, Any]]:
    """`rows` as `BUCKET_PARTS` rows of one part, a chunk each (none for no rows)."""
    return [part_row(bucket, part, i, payload) for i, payload in enumerate(chunks(rows))]


def decoder(schema: pa.Schema, constants: Mapping[str, Any] | None = None) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The `mapInArrow` function that turns payloads back into rows of `schema` (on the executors).

    `constants` overrides columns for every row (a value the driver learns only at write time).
    """
    fixed = dict(constants or {})

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            for payload in batch.column(batch.schema.get_field_index("payload")).to_pylist():
                if payload is None:
                    continue
                yield from conform(decode_one(payload), schema, safe=False, constants=fixed).to_batches()

    return run
