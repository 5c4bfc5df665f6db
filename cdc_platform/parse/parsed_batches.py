"""The parser's rows as Arrow: a line's row dicts to `PARSED` batches, and a parsed table split by kind.

`envelope` turns one line into one row (a dict); this module is where rows meet Arrow, in both places
that parse: the executors (`parse_arrow_batches`, what `parse_spark` runs in `mapInArrow`) and the driver
(`split_parsed`: a backfill's snapshot rows, and the tools and tests that hold a parsed batch in Arrow,
shaped to the raw log's, the markers' and the dead letters' schemas as the stream's split shapes them).
"""

from __future__ import annotations

import datetime as dt
import gc
import operator
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.lake import schemas
from cdc_platform.parse.envelope import KeySpec, parse_bytes, parse_line, parse_lines
from cdc_platform.lake.schemas import KAFKA_ORIGIN_COLUMNS, PARSED, RECORD_KEY_COLUMN, REJECT_CODE, REJECT_REASON
from cdc_platform.stages.stage import ParsedBatch

#: The keys of each kind of row `parse_line` returns, in its order. `rows_to_batch` relies on them only
#: after checking that every row has exactly these keys; any other row takes the general path.
_ROW_KEYS: dict[str, tuple[str, ...]] = {
    "change": (
        "kind", "event_id", "event_date", "table_id", "source_connector", "source_name", "source_db", "source_schema",
        "source_table", "op", "key", "before", "after", "row_schema", "position", "position_kind", "source_ts",
        "envelope_ts", "snapshot", "transaction_id", "transaction_raw_id", "tx_total_order", "tx_collection_order",
        "source_file", "line",
    ),
    "marker": (
        "kind", "marker_id", "marker_date", "transaction_id", "transaction_raw_id", "status", "event_count",
        "data_collections", "marker_shape", "marker_ts", "source_file", "line",
    ),
    "dead_letter": ("kind", "line", "source_file", "reason_code", "reason", "table_id"),
    "tombstone": ("kind", "line", "source_file"),
    "control": ("kind", "line", "source_file", "reason_code", "source_ts"),
}
_ROW_GETTERS = {kind: operator.itemgetter(*names) for kind, names in _ROW_KEYS.items()}
_KEY_COUNTS = {kind: len(names) for kind, names in _ROW_KEYS.items()}
_NULL_ROWS = {kind: dict.fromkeys(names) for kind, names in _ROW_KEYS.items()}
_KIND_OF = operator.itemgetter("kind")


def rows_to_batch(rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """`RecordBatch.from_pylist(rows, schema=PARSED)` (missing keys are null, unknown keys ignored), faster.

    `from_pylist` looks every schema column up in every dict, one cell at a time. A batch is nearly
    all one kind of row (a file holds change events or markers), and rows of one kind share their
    keys, so those keys are read at C speed (`itemgetter`, transposed by `zip`); the few rows of other
    kinds are padded to the same keys, and the columns only they have are read with `dict.get`.
    """
    try:
        kinds = list(map(_KIND_OF, rows))
        if list(map(len, rows)) != list(map(_KEY_COUNTS.__getitem__, kinds)):
            raise KeyError("a row with other keys than parse_line gives its kind")
        main = max(set(kinds), key=kinds.count) if rows else "tombstone"
        others = [i for i, kind in enumerate(kinds) if kind != main]
        padded = list(rows) if others else rows
        extra: set[str] = set()
        for i in others:
            kind = kinds[i]
            _ROW_GETTERS[kind](rows[i])  # with the count checked above: exactly the keys of its kind
            padded[i] = _NULL_ROWS[main] | rows[i]
            extra.update(_ROW_KEYS[kind])
        names = _ROW_KEYS[main]
        columns: dict[str, Sequence[Any]] = dict(zip(names, zip(*map(_ROW_GETTERS[main], padded))))
    except (KeyError, TypeError):  # a row without a known `kind`, or not shaped as parse_line makes them
        return pa.RecordBatch.from_pylist(rows, schema=PARSED)
    for name in extra.difference(names):
        columns[name] = [row.get(name) for row in padded]
    n = len(rows)
    arrays = [pa.array(columns[f.name], f.type) if f.name in columns else pa.nulls(n, f.type) for f in PARSED]
    return pa.RecordBatch.from_arrays(arrays, schema=PARSED)


def parse_arrow_batches(batches: Iterator[pa.RecordBatch], keys: KeySpec) -> Iterator[pa.RecordBatch]:
    """(value, source_file) batches in, `PARSED` batches out, one row per line: what the ingest job's parser runs.

    Lines from Kafka carry more columns (`sources.py`): the record key (`RECORD_KEY_COLUMN`), used as a
    file dump's key is, and the record's origin (`schemas.KAFKA_ORIGIN_COLUMNS`), copied to the output
    row as it is. Any other column is ignored, and without them the origin columns are null. A record
    the source rejected (`schemas.REJECT_CODE`: an Avro record it could not decode) is not parsed: it
    is a dead letter with the source's code and reason, its value (base64) as the line.

    The cyclic garbage collector is paused while a batch is parsed: parsing creates no cycles, but
    its thousands of live dicts made the collector's repeated full scans a large share of the time.
    """
    for batch in batches:
        files = batch.column("source_file").to_pylist()
        names = batch.schema.names
        record_keys = _record_keys(batch.column(RECORD_KEY_COLUMN)) if RECORD_KEY_COLUMN in names else None
        rejects = _rejects(batch) if REJECT_CODE in names else {}
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            try:
                values = batch.column("value").to_pylist()
                for i in rejects:
                    values[i] = None  # not parsed: its row is the dead letter below
                rows = parse_lines(values, files, keys, record_keys)
            except UnicodeDecodeError:  # Spark's text source (and a Kafka value cast to string) passes bytes through unchecked
                raw = batch.column("value").cast(pa.binary()).to_pylist()
                rows = [_tombstone_or_bytes(None if i in rejects else b, f, keys, k)
                        for i, (b, f, k) in enumerate(zip(raw, files, record_keys or [None] * len(raw)))]
            for i, (code, reason) in rejects.items():
                rows[i] = {"kind": "dead_letter", "line": batch.column("value")[i].as_py(), "source_file": files[i],
                           "reason_code": code, "reason": reason, "table_id": None}
            out = rows_to_batch(rows)
        finally:
            if was_enabled:
                gc.enable()
        yield _with_origin(out, batch)


def _rejects(batch: pa.RecordBatch) -> dict[int, tuple[str, str]]:
    """Row index -> (code, reason) of the records the source could not make lines of."""
    codes = batch.column(REJECT_CODE)
    if codes.null_count == len(codes):
        return {}
    reasons = batch.column(REJECT_REASON).to_pylist() if REJECT_REASON in batch.schema.names else [None] * len(codes)
    return {i: (code, reasons[i] or code) for i, code in enumerate(codes.to_pylist()) if code is not None}


def _record_keys(column: pa.Array) -> list[str | None]:
    try:
        return column.to_pylist()
    except UnicodeDecodeError:  # a key that is not UTF-8 is no JSON object either: it names no row
        return [None if k is None else k.decode("utf-8", "replace") for k in column.cast(pa.binary()).to_pylist()]


def _with_origin(out: pa.RecordBatch, lines: pa.RecordBatch) -> pa.RecordBatch:
    """The parsed rows with the lines' Kafka origin columns (rows and lines correspond one to one)."""
    for name in KAFKA_ORIGIN_COLUMNS:
        if name in lines.schema.names:
            i = PARSED.get_field_index(name)
            out = out.set_column(i, PARSED.field(i), lines.column(name).cast(PARSED.field(i).type))
    return out


def _tombstone_or_bytes(raw: bytes | None, source_file: str | None, keys: KeySpec, record_key: str | None = None) -> dict[str, Any]:
    return parse_line(None, source_file, keys) if raw is None else parse_bytes(raw, source_file, keys, record_key)


def split_parsed(parsed: pa.Table, batch_id: int, ingested_at: dt.datetime | None = None) -> ParsedBatch:
    """Split the parser's wide rows by kind and shape them to their tables' schemas."""
    ingested_at = ingested_at or dt.datetime.now(dt.timezone.utc)
    kinds = parsed.column("kind")
    n = parsed.num_rows
    if "arrival" not in parsed.column_names:  # the input order, as the stream's split keeps it (`parse_spark.split`)
        parsed = parsed.append_column("arrival", pa.array(range(n), pa.int64()))
    ingest_ts = pa.scalar(ingested_at, schemas.TS)
    today = pa.scalar(ingested_at.date(), pa.date32())

    def rows_of(kind: str) -> pa.Table:
        return parsed.filter(pc.equal(kinds, kind))

    changes = rows_of("change")
    changes = changes.set_column(changes.schema.get_field_index("event_date"), "event_date", pc.fill_null(changes.column("event_date"), today))
    events = _project(changes, schemas.RAW_CHANGE_EVENTS, {"ingested_at": ingest_ts})
    events, dups = _dedup_first(events, "event_id")

    marker_rows = rows_of("marker")
    marker_rows = marker_rows.set_column(marker_rows.schema.get_field_index("marker_date"), "marker_date", pc.fill_null(marker_rows.column("marker_date"), today))
    markers = _project(marker_rows, schemas.TRANSACTION_MARKERS, {"ingested_at": ingest_ts})
    markers, marker_dups = _dedup_first(markers, "marker_id")

    dead = rows_of("dead_letter")
    dead_letters = _project(
        dead,
        schemas.DEAD_LETTER,
        {"stage": pa.scalar("ingest"), "event_id": pa.scalar(None, pa.string()), "batch_id": pa.scalar(batch_id, pa.int64()), "dead_lettered_at": ingest_ts},
    )
    tombstones = int(pc.sum(pc.equal(kinds, "tombstone")).as_py() or 0) if n else 0
    return ParsedBatch(
        batch_id=batch_id,
        events=events,
        markers=markers,
        dead_letters=dead_letters,
        tombstones=tombstones,
        rows_read=n,
        in_batch_duplicates=dups + marker_dups,
        ingested_at=ingested_at,
    )


def _project(table: pa.Table, schema: pa.Schema, constants: dict[str, pa.Scalar]) -> pa.Table:
    arrays = []
    for f in schema:
        if f.name in constants:
            arrays.append(pa.array([constants[f.name].as_py()] * table.num_rows, f.type))
        else:
            arrays.append(table.column(f.name).cast(f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _dedup_first(table: pa.Table, column: str) -> tuple[pa.Table, int]:
    if table.num_rows == 0:
        return table, 0
    indexed = table.select([column]).append_column("__i", pa.array(range(table.num_rows), pa.int64()))
    first = indexed.group_by(column, use_threads=False).aggregate([("__i", "min")]).column("__i_min")
    if len(first) == table.num_rows:
        return table, 0
    first = first.combine_chunks() if isinstance(first, pa.ChunkedArray) else first
    return table.take(first.take(pc.sort_indices(first))), table.num_rows - len(first)  # first row per id, in input order
