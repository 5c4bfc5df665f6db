"""Parsing and normalisation of Debezium output, one line at a time.

This is pure Python with no Spark and no Arrow in it: the executors run it on each partition's lines
(`parse_spark`, in `mapInArrow`, through `parsed_batches`, which makes Arrow batches of its rows), and
the tests run it directly on real connector output. Every line ends as exactly one of: a change
event, a transaction marker, a tombstone, or a dead letter whose reason says what to do. Reading and
writing the JSON text itself is `json_codec`'s.

Normalisation choices worth knowing:

* `before` / `after` stay JSON text so the raw log never breaks on schema drift.
* `position` is a fixed-width string whose lexical order is the source's log order, per connector
  (PostgreSQL `lsn`; MySQL binlog file index, `pos`, `row`; SQL Server commit/change LSN and serial;
  Oracle SCN; MongoDB oplog time and ordinal). Other connectors fall back to `source.ts_ms`, which is
  *not* a log position: two changes to one row in the same millisecond are then ordered by
  `tx_total_order` only. `position_kind` records which rule applied.
* PostgreSQL transaction ids `<txId>:<lsn>` normalise to `<txId>`: the LSN part differs between the
  events and markers of one transaction. MySQL GTIDs (`<uuid>:<n>`) are left whole.
* The event identity hashes the whole envelope except the times the connector processed it (`ts_ms`,
  and Debezium 2.x+'s `ts_us` and `ts_ns`), because a connector restart re-emits the same change with
  new ones; everything else about it is unchanged (the source's own times, `source.ts_*`, stay in).
* Numbers keep every digit. A JSON number that a 64-bit float holds exactly (its shortest float text
  has the same value) is read as a float; any other (a `DECIMAL(40,3)` written as a JSON number by
  `decimal.format=NUMERIC`, say) is read as `decimal.Decimal` and written back as its own digits, so
  the row images in the raw log, and every stage after it, see the value the source committed.
"""

from __future__ import annotations

import decimal
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdc_platform.parse import control_records
from cdc_platform.parse.json_codec import (  # the JSON text the identities and row images are made of
    _ORJSON_SORTED,
    _Dead,
    _fast_dumps_utf8,
    _loads,
    _orjson,
    _stdlib_dumps,
    _text,
    canonical_json,
    quote_value,
)

MS_PER_DAY = 86_400_000

KNOWN_OPS = frozenset({"c", "u", "d", "r", "t"})
SAFE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_$\-]{0,127}$")
PG_TX_ID_RE = re.compile(r"^(\d+):(\d+)$")
_TRAILING_DIGITS_RE = re.compile(r"(\d+)$")
_SNAPSHOT_FALSE = {None, False, "false", "False", ""}
_INT_TEXT_RE = re.compile(r"-?[0-9]{1,39}")  # an integer some converter wrote as a string
_MAX_INT_DIGITS = 4300  # Python's int() refuses longer digit strings (sys.int_info.default_max_str_digits)
#: Debezium PostgreSQL's `source.sequence`: JSON text of [last commit LSN, LSN], each a decimal string or null.
_PG_SEQUENCE_RE = re.compile(r'\[\s*(?:null|"([0-9]{1,20})")\s*,\s*(?:null|"([0-9]{1,20})")\s*\]')

#: Dead-letter reason codes with the sentence an operator reads. `{}` fields are filled per line.
REASONS: dict[str, str] = {
    "not_json": "line is not valid JSON ({detail}); fix the producer, the line is kept here verbatim",
    "not_object": "line is JSON {detail}, not an object; expected a Debezium change event, a transaction marker, or null",
    "missing_op": "change event has no `op`; expected one of c, u, d, r, t",
    "unknown_op": "change event has unknown op {detail}; expected one of c, u, d, r, t (Debezium `m` messages are not table changes)",
    "missing_table": "change event has no `source.table`; the connector must include source metadata (do not use ExtractNewRecordState / unwrap SMTs before this platform)",
    "unsafe_table_name": "table name {detail} is not a safe identifier (letters, digits, _, $, -); rename it with a RegexRouter SMT or fix the producer",
    "missing_after": "op {detail} without an `after` row image; inserts, updates and snapshot reads must carry the new row",
    "delete_without_row": "delete names no row (no `before` and no message key); set REPLICA IDENTITY FULL on the source table or carry the message key",
    "missing_key": "row image lacks key column(s) {detail} configured for this table; check `key:` in the config or the connector's column filters",
    "invalid_field": "field {detail}; Debezium emits these as the documented types",
    "invalid_marker": "transaction marker {detail}",
    "unrecognised_shape": "JSON object is neither a change event nor a transaction marker (keys: {detail})",
    "line_too_long": "line is {detail} bytes, over the parser's 64 MiB maximum; split the record or fix the producer",
    "not_utf8": "line is not valid UTF-8 ({detail}); the producer must write UTF-8 (the line is kept with the bad bytes as \\x escapes)",
    "lone_surrogate": "line holds a lone UTF-16 surrogate escape ({detail}), which no UTF-8 text can carry; fix the producer's JSON encoder",
    "out_of_range": "{detail}; the platform stores integers as signed 64-bit, floats as 64-bit and times between years 1 and 9999",
    "too_deep": "JSON nests deeper than the parser follows ({detail}); flatten the record or fix the producer",
}

MAX_LINE_CHARS = 64 * 1024 * 1024
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MIN_TS_MS, MAX_TS_MS = -62_135_596_800_000, 253_402_300_799_999  # 0001-01-01 .. 9999-12-31T23:59:59.999
_BOM = "\ufeff"


@dataclass(frozen=True)
class KeySpec:
    """Key columns of configured tables, by `<db-or-schema>.<table>`; the parser fills `key` for them."""

    keys_by_source: Mapping[str, Sequence[str]]

    def for_table(self, table_id: str) -> Sequence[str] | None:
        return self.keys_by_source.get(table_id)


class RecordKey:
    """A Kafka record's key, as JSON text, read only when an event needs it.

    Its one use is the file dump's `{"key": ...}`: naming the row of a delete without a `before` image.
    Nearly no event needs it, so its JSON is parsed on demand; a key that is not a JSON object (after
    the converter's schema wrapper is stripped) names no row.
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def value(self) -> Any:
        try:
            key, _ = _unwrap(_loads(self.text))
        except (ValueError, _Dead, RecursionError):
            return None
        return key


def reason_text(code: str, detail: str = "") -> str:
    return REASONS[code].format(detail=detail)


def loads_json(text: str) -> Any:
    """JSON text as Python objects with every number exact (see `_exact_float`); for row images.

    Raises `ValueError` on text that is not JSON; the raw log holds only text this module wrote.
    """
    try:
        return _loads(text)
    except _Dead as dead:
        raise ValueError(reason_text(dead.code, dead.detail)) from None


def _as_int(value: Any, field: str) -> int | None:
    """Accept ints and integral numeric strings (some converters stringify int64); reject the rest."""
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:  # nearly every call: skip the checks below
        return value
    if value is None:
        return None
    if isinstance(value, bool):
        raise _Dead("invalid_field", f"`{field}` is a boolean, expected a number")
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str) and _INT_TEXT_RE.fullmatch(value.strip()):
        number = int(value.strip())  # ASCII digits only: "²" or "١٢" pass str.isdigit(), and no JSON reader takes them
    else:
        raise _Dead("invalid_field", f"`{field}` is {quote_value(value)[:60]}, expected an integer")
    if not INT64_MIN <= number <= INT64_MAX:  # would fail the whole Arrow batch, not just this line
        raise _Dead("out_of_range", f"`{field}` is {str(number)[:40]}, outside the signed 64-bit range")
    return number


#: Envelope fields a redelivery changes: when the connector processed the event, not what happened.
#: `ts_us`/`ts_ns` came with Debezium 2.x; left in the identity, a connector's replay after a crash
#: landed every replayed change twice (found by the test bed's fault test, Debezium 3.5).
_PROCESSING_TIMES = ("ts_ms", "ts_us", "ts_ns")


def _as_ts_ms(value: Any, field: str) -> int | None:
    """Epoch milliseconds that a date and a microsecond timestamp can hold (Python, Arrow, Delta)."""
    if type(value) is int and MIN_TS_MS <= value <= MAX_TS_MS:  # nearly every call (the range is within int64)
        return value
    ms = _as_int(value, field)
    if ms is not None and not MIN_TS_MS <= ms <= MAX_TS_MS:
        raise _Dead("out_of_range", f"`{field}` is {ms}, not epoch milliseconds between the years 1 and 9999")
    return ms


def normalise_transaction_id(raw_id: Any) -> str | None:
    """PostgreSQL `<txId>:<lsn>` -> `<txId>`; every other id (MySQL GTID, binlog coordinates) as is."""
    if raw_id is None:
        return None
    text = str(raw_id)
    m = PG_TX_ID_RE.match(text)
    return m.group(1) if m else text


#: Per-process memo of values that repeat on nearly every line: `table_id` by (namespace, table) for
#: names that passed the safe-name check, and the binlog index by `source.file`. Bounded so a stream
#: of garbage names cannot grow them without end; clearing only costs a recomputation.
_MEMO_LIMIT = 4096
_TABLE_IDS: dict[tuple[str | None, str], str] = {}
_BINLOG_INDEX: dict[str, int] = {}


def _table_id(src: Mapping[str, Any]) -> str:
    """`<db-or-schema>.<table>` from `source`, or the dead letter that says why there is none."""
    table = src.get("table")
    namespace = src.get("schema") or src.get("db")
    if type(table) is str and (namespace is None or type(namespace) is str):
        known = _TABLE_IDS.get((namespace, table))
        if known is not None:
            return known
    if table is None or table == "":
        raise _Dead("missing_table")
    if not isinstance(table, str):
        raise _Dead("invalid_field", f"`source.table` is a {_json_type(table)}, expected a string")
    for part in (table, namespace):
        if part is not None and (not isinstance(part, str) or not SAFE_NAME_RE.match(part)):
            raise _Dead("unsafe_table_name", quote_value(part)[:80])
    table_id = f"{namespace}.{table}" if namespace else table
    if len(_TABLE_IDS) >= _MEMO_LIMIT:
        _TABLE_IDS.clear()
    _TABLE_IDS[(namespace, table)] = table_id
    return table_id


def _binlog_index(file: str) -> int:
    """The trailing number of a binlog file name (`mysql-bin.000018` -> 18), 0 without one."""
    index = _BINLOG_INDEX.get(file)
    if index is None:
        m = _TRAILING_DIGITS_RE.search(file)
        digits = m.group(1) if m else "0"
        if len(digits) > _MAX_INT_DIGITS:  # int() would refuse it with a ValueError that fails the whole batch
            raise _Dead("out_of_range", f"`source.file` ends in a number of {len(digits)} digits")
        index = int(digits)
        if len(_BINLOG_INDEX) >= _MEMO_LIMIT:
            _BINLOG_INDEX.clear()
        _BINLOG_INDEX[file] = index
    return index


def _pg_position(src: Mapping[str, Any]) -> int | None:
    """A PostgreSQL event's place in Debezium's stream: the higher of its `lsn` and the last commit LSN before
    its transaction (`sequence[0]`); None when the event carries neither.

    The stream is in commit order; an LSN alone is not. A transaction that wrote a row before an earlier-committed
    one's commit carries LSNs below that commit: against streamed changes of one key that is harmless (row locks
    order them), but an incremental-snapshot read carries no `lsn` at all (Debezium leaves it out), only
    `sequence`, at its window's close, and must sort below every change of a transaction that commits after that
    close, however early it wrote. The last commit LSN of such a transaction is past the close, so the higher of
    the two does; within a transaction it only ties events, which arrival order keeps in order (README,
    "Repairing coverage from the source").
    """
    lsn = _as_int(src.get("lsn"), "source.lsn")
    sequence = src.get("sequence")
    if sequence is None:
        return lsn
    m = _PG_SEQUENCE_RE.fullmatch(sequence.strip()) if isinstance(sequence, str) else None
    if m is None:
        if lsn is not None:  # an unreadable sequence beside an LSN: the LSN alone, as before sequences were read
            return lsn
        raise _Dead("invalid_field", f"`source.sequence` is {quote_value(sequence)[:60]}, expected Debezium's "
                    '\'["<last commit LSN>","<LSN>"]\' (an event without `source.lsn` is placed by it)')
    known = [int(v) for v in m.groups() if v is not None] + ([] if lsn is None else [lsn])
    if not known:
        return None
    highest = max(known)
    if highest > INT64_MAX:
        raise _Dead("out_of_range", f"`source.sequence` holds {highest}, outside the signed 64-bit range")
    return highest


def _position(connector: str, src: Mapping[str, Any], source_ms: int | None, tx_order: int | None) -> tuple[str, str]:
    if connector == "postgresql" and (pg := _pg_position(src)) is not None:
        return f"{pg:020d}", "pg_lsn"
    if connector in ("mysql", "mariadb") and (pos := src.get("pos")) is not None:  # Debezium's MariaDB connector: same binlog fields
        file_index = _binlog_index(str(src.get("file") or ""))
        pos = _as_int(pos, "source.pos") or 0
        row = _as_int(src.get("row"), "source.row") or 0
        return f"{file_index:010d}{pos:020d}{row:010d}", "mysql_binlog"
    if connector == "sqlserver" and src.get("commit_lsn") is not None:
        serial = _as_int(src.get("event_serial_no"), "source.event_serial_no") or 0
        return f"{src.get('commit_lsn')}|{src.get('change_lsn') or ''}|{serial:010d}", "sqlserver_lsn"
    if connector == "oracle" and src.get("scn") is not None:
        return f"{_as_int(src.get('scn'), 'source.scn'):030d}", "oracle_scn"
    if connector == "mongodb" and src.get("ord") is not None:
        return f"{(source_ms or 0):020d}{_as_int(src.get('ord'), 'source.ord'):010d}", "mongodb_oplog"
    return f"{(source_ms or 0):020d}{(tx_order or 0):010d}", "source_ts_fallback"


def _unwrap(obj: Any) -> tuple[Any, Any]:
    """Strip the JSON converter's `{"schema", "payload"}` wrapper; return (payload, schema or None)."""
    if isinstance(obj, dict) and "payload" in obj and "schema" in obj and len(obj) == 2:
        return obj["payload"], obj["schema"]
    return obj, None


def _row_schema(schema: Any) -> str | None:
    """The Connect schema of the `after` (else `before`) field, kept so later stages can type exactly."""
    fields = schema.get("fields") if isinstance(schema, dict) else None
    if not isinstance(fields, list):  # a number here failed the whole batch ("not iterable")
        return None
    for wanted in ("after", "before"):
        for fld in fields:
            if isinstance(fld, dict) and fld.get("field") == wanted:
                return canonical_json(fld)
    return None


def _blank_row(kind: str, line: str, source_file: str | None) -> dict[str, Any]:
    return {"kind": kind, "line": line, "source_file": source_file}


def parse_line(line: str | None, source_file: str | None, keys: KeySpec, record_key: str | None = None) -> dict[str, Any]:
    """Normalise one input line into a row of the `PARSED` schema (missing columns are null).

    A leading byte-order mark (a file written by a Windows tool) is encoding metadata, not data: it is
    skipped for parsing and kept in `line`. `record_key` is the Kafka record's key (JSON text) when the
    line is a Kafka record's value: it plays the part of a file dump's `key` (see `RecordKey`).
    """
    if line is None or not line.strip() or line.strip() == "null":
        return _blank_row("tombstone", line or "", source_file)
    if len(line) > MAX_LINE_CHARS:
        return _dead_row(line, source_file, _Dead("line_too_long", str(len(line.encode("utf-8", "replace")))))
    text = line[1:] if line.startswith(_BOM) else line
    try:
        obj = _loads(text)
    except _Dead as dead:
        return _dead_row(line, source_file, dead)
    except RecursionError:
        return _dead_row(line, source_file, _Dead("too_deep", "while reading"))
    except ValueError as exc:
        return _dead_row(line, source_file, _Dead("not_json", str(exc)[:120]))
    try:
        return _parse_object(obj, line, source_file, keys, None if record_key is None else RecordKey(record_key))
    except _Dead as dead:
        return _dead_row(line, source_file, dead)
    except RecursionError:  # the stdlib writer recurses a little deeper than its reader did
        return _dead_row(line, source_file, _Dead("too_deep", "while writing the row image"))


def parse_bytes(raw: bytes, source_file: str | None, keys: KeySpec, record_key: str | None = None) -> dict[str, Any]:
    """`parse_line` for a line Spark handed over as bytes that may not be UTF-8 (it does not check)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        detail = f"byte 0x{raw[exc.start]:02x} at offset {exc.start}"
        return _dead_row(raw.decode("utf-8", "backslashreplace"), source_file, _Dead("not_utf8", detail))
    return parse_line(line, source_file, keys, record_key)


def _dead_row(line: str, source_file: str | None, dead: _Dead) -> dict[str, Any]:
    row = _blank_row("dead_letter", line, source_file)
    row["reason_code"] = dead.code
    row["reason"] = reason_text(dead.code, dead.detail)
    row["table_id"] = dead.table_id
    return row


def _json_type(obj: Any) -> str:
    if isinstance(obj, list):
        return "array"
    if isinstance(obj, str):
        return "string"
    if isinstance(obj, bool):
        return "boolean"
    if isinstance(obj, (int, float, decimal.Decimal)):
        return "number"
    return "null"


def _heartbeat_micros(payload: Mapping[str, Any]) -> int | None:
    """A heartbeat's `ts_ms` as epoch microseconds, or None when it is not a usable time. A heartbeat
    carries no data, so a bad time is not a dead letter: the heartbeat is still counted, without a time."""
    ms = payload.get("ts_ms")
    return ms * 1000 if type(ms) is int and MIN_TS_MS <= ms <= MAX_TS_MS else None


def _parse_object(obj: Any, line: str, source_file: str | None, keys: KeySpec, record_key: RecordKey | None = None) -> dict[str, Any]:
    if obj is None:
        return _blank_row("tombstone", line, source_file)
    if not isinstance(obj, dict):
        raise _Dead("not_object", f"{_json_type(obj)}")
    message_key: Any = record_key
    if "value" in obj and "key" in obj and "op" not in obj and "payload" not in obj:
        # A Kafka record dumped with its key: the key names the row of a keyless delete.
        message_key, _ = _unwrap(obj["key"])
        obj = obj["value"]
        if obj is None:
            return _blank_row("tombstone", line, source_file)
    payload, schema = _unwrap(obj)
    if payload is None:
        return _blank_row("tombstone", line, source_file)
    if not isinstance(payload, dict):
        raise _Dead("not_object", f"payload {_json_type(payload)}")
    control = control_records.control_kind(payload, schema)
    if control is not None:  # a heartbeat or schema-change record: counted, not stored (see control_records)
        row = _blank_row("control", line, source_file)
        row["reason_code"] = control
        # A heartbeat's time says how far the source had been read when it was idle (the freshness checks)
        row["source_ts"] = _heartbeat_micros(payload) if control == control_records.HEARTBEAT else None
        return row
    if "op" in payload or "source" in payload or "after" in payload or "before" in payload:
        return _parse_change(payload, schema, message_key, line, source_file, keys)
    if "status" in payload and "id" in payload:
        return _parse_debezium_marker(payload, line, source_file)
    if "marker" in payload:
        return _parse_stripe_marker(payload, line, source_file)
    raise _Dead("unrecognised_shape", ", ".join(sorted(map(str, payload))[:12]) or "none")


def _parse_change(
    env: dict[str, Any], schema: Any, message_key: Any, line: str, source_file: str | None, keys: KeySpec
) -> dict[str, Any]:
    src = env.get("source")
    if src is None:
        raise _Dead("missing_table")
    if not isinstance(src, dict):
        raise _Dead("invalid_field", f"`source` is a {_json_type(src)}, expected an object")
    message = control_records.is_message(env)  # a logical-decoding message: raw log only, never applied
    table_id = control_records.MESSAGES if message else _table_id(src)
    table = None if message else src["table"]

    op = env.get("op")
    if op is None:
        raise _Dead("missing_op", table_id=table_id)
    if not message and (not isinstance(op, str) or op not in KNOWN_OPS):
        raise _Dead("unknown_op", quote_value(op)[:40], table_id=table_id)
    before, after = env.get("before"), env.get("after")
    if before is not None and not isinstance(before, dict):
        raise _Dead("invalid_field", f"`before` is a {_json_type(before)}, expected an object or null", table_id)
    if after is not None and not isinstance(after, dict):
        raise _Dead("invalid_field", f"`after` is a {_json_type(after)}, expected an object or null", table_id)
    if op in ("c", "u", "r") and after is None:
        raise _Dead("missing_after", repr(op), table_id)

    # The identity text comes first because it vouches for the rest: when orjson writes the whole
    # envelope as the stdlib would, it writes every part of it (key values, row images) that way too,
    # since `_fast_dumps`'s output check looks only at single number tokens. Those parts then skip it.
    identity = dict(env)
    for processed_at in _PROCESSING_TIMES:
        identity.pop(processed_at, None)
    identity_utf8 = _fast_dumps_utf8(identity, _ORJSON_SORTED)  # None: the stdlib writes it, further down
    plain = _orjson is not None and identity_utf8 is not None

    key_cols = keys.for_table(table_id)
    key_text: str | None = None
    if op == "d" and before is None:
        if isinstance(message_key, RecordKey):
            message_key = message_key.value()
        if isinstance(message_key, dict) and message_key:
            before_for_key: dict[str, Any] | None = message_key
        else:
            raise _Dead("delete_without_row", table_id=table_id)
    else:
        before_for_key = before
    if key_cols and op != "t":
        image = after if op != "d" else before_for_key
        assert image is not None
        key_values = {}
        for c in key_cols:
            value = image.get(c)
            if value is None:
                raise _Dead("missing_key", ", ".join(c for c in key_cols if image.get(c) is None), table_id)
            key_values[c] = value
        if plain and image is not message_key:
            key_text = _orjson.dumps(key_values, option=_ORJSON_SORTED).decode("utf-8")
        else:
            key_text = canonical_json(key_values)

    source_ms = _as_ts_ms(src.get("ts_ms"), "source.ts_ms")
    envelope_ms = _as_ts_ms(env.get("ts_ms"), "ts_ms")
    tx = env.get("transaction")
    tx_raw_id: str | None = None
    tx_total: int | None = None
    tx_coll: int | None = None
    if tx is not None:
        if not isinstance(tx, dict):
            raise _Dead("invalid_field", f"`transaction` is a {_json_type(tx)}, expected an object or null", table_id)
        raw_id = tx.get("id")
        tx_raw_id = None if raw_id is None else str(raw_id)
        tx_total = _as_int(tx.get("total_order"), "transaction.total_order")
        tx_coll = _as_int(tx.get("data_collection_order"), "transaction.data_collection_order")
    connector = str(src.get("connector") or "")
    position, position_kind = _position(connector, src, source_ms, tx_total)
    snapshot_flag = src.get("snapshot")
    if isinstance(snapshot_flag, (dict, list)):  # unhashable: the set lookup below would fail the whole batch
        kind = "an object" if isinstance(snapshot_flag, dict) else "an array"
        raise _Dead("invalid_field", f"`source.snapshot` is {kind}, expected a string or boolean", table_id)
    snapshot = snapshot_flag not in _SNAPSHOT_FALSE or op == "r"

    if identity_utf8 is None:
        identity_utf8 = _stdlib_dumps(identity, True).encode("utf-8")
    event_id = hashlib.blake2b(identity_utf8, digest_size=16).hexdigest()  # of canonical_json(identity)
    before_image = before if before is not None else (before_for_key if op == "d" else None)  # else: message key
    if plain:
        before_text = _orjson.dumps(before).decode("utf-8") if before is not None else _text(before_image)
        after_text = None if after is None else _orjson.dumps(after).decode("utf-8")
    else:
        before_text, after_text = _text(before_image), _text(after)
    day_ms = source_ms if source_ms is not None else envelope_ms
    name, db, namespace = src.get("name"), src.get("db"), src.get("schema")
    return {
        "kind": "change",
        "event_id": event_id,
        "event_date": None if day_ms is None else day_ms // MS_PER_DAY,
        "table_id": table_id,
        "source_connector": connector or None,
        "source_name": None if name is None else str(name),
        "source_db": None if db is None else str(db),
        "source_schema": None if namespace is None else str(namespace),
        "source_table": table,
        "op": op,
        "key": key_text,
        "before": before_text,
        "after": after_text,
        "row_schema": None if schema is None else _row_schema(schema),
        "position": position,
        "position_kind": position_kind,
        "source_ts": None if source_ms is None else source_ms * 1000,
        "envelope_ts": None if envelope_ms is None else envelope_ms * 1000,
        "snapshot": snapshot,
        "transaction_id": normalise_transaction_id(tx_raw_id),
        "transaction_raw_id": tx_raw_id,
        "tx_total_order": tx_total,
        "tx_collection_order": tx_coll,
        "source_file": source_file,
        "line": line,
    }


def _marker_row(
    tx_raw_id: Any, status: str, count: int | None, collections: list[tuple[str, int]] | None,
    shape: str, ts_ms: int | None, line: str, source_file: str | None,
) -> dict[str, Any]:
    if tx_raw_id is None or (isinstance(tx_raw_id, str) and not tx_raw_id.strip()):
        raise _Dead("invalid_marker", "has no transaction id (`id`); it cannot be matched to its events")
    if isinstance(tx_raw_id, (dict, list)):
        raise _Dead("invalid_marker", "id is not a string or number")
    tx_id = normalise_transaction_id(tx_raw_id)
    return {
        "kind": "marker",
        "marker_id": f"{tx_id}|{status}",
        "marker_date": None if ts_ms is None else ts_ms // MS_PER_DAY,
        "transaction_id": tx_id,
        "transaction_raw_id": str(tx_raw_id),
        "status": status,
        "event_count": count,
        "data_collections": collections,
        "marker_shape": shape,
        "marker_ts": None if ts_ms is None else ts_ms * 1000,
        "source_file": source_file,
        "line": line,
    }


def _parse_debezium_marker(env: dict[str, Any], line: str, source_file: str | None) -> dict[str, Any]:
    status = env.get("status")
    if status not in ("BEGIN", "END"):
        raise _Dead("invalid_marker", f"status {quote_value(status)[:40]} is not BEGIN or END")
    count = _as_int(env.get("event_count"), "event_count")
    collections: list[tuple[str, int]] | None = None
    raw = env.get("data_collections")
    if raw is not None:
        if not isinstance(raw, list):
            raise _Dead("invalid_marker", "data_collections is not a list")
        collections = []
        for item in raw:
            if not isinstance(item, dict) or not isinstance(item.get("data_collection"), str):
                raise _Dead("invalid_marker", "data_collections entry lacks `data_collection`")
            n = _as_int(item.get("event_count"), "data_collections[].event_count")
            collections.append((item["data_collection"], n if n is not None else 0))
        collections = control_records.merge_collections(collections)
        for name, total in collections:  # each count fits; their sum may not, and Arrow would fail the batch on it
            if not INT64_MIN <= total <= INT64_MAX:
                raise _Dead("out_of_range", f"`data_collections[].event_count` of {quote_value(name)[:60]} sums to {total}, outside the signed 64-bit range")
    if status == "END" and count is None:
        raise _Dead("invalid_marker", "END has no event_count; completeness cannot be judged")
    return _marker_row(env.get("id"), status, count, collections, "debezium", _as_ts_ms(env.get("ts_ms"), "ts_ms"), line, source_file)


def _parse_stripe_marker(env: dict[str, Any], line: str, source_file: str | None) -> dict[str, Any]:
    marker = env.get("marker")
    if marker not in ("BEGIN", "COMMIT", "END"):
        raise _Dead("invalid_marker", f"marker {quote_value(marker)[:40]} is not BEGIN or COMMIT")
    status = "BEGIN" if marker == "BEGIN" else "END"
    count = _as_int(env.get("total_events"), "total_events")
    raw = env.get("per_source_event_counts")
    collections: list[tuple[str, int]] | None = None
    if raw is not None:
        if isinstance(raw, dict):
            items = list(raw.items())
        elif isinstance(raw, list):
            items = [(i.get("source") or i.get("data_collection"), i.get("event_count", i.get("count"))) for i in raw if isinstance(i, dict)]
        else:
            raise _Dead("invalid_marker", "per_source_event_counts is not an object")
        collections = []
        for name, n in items:
            if not isinstance(name, str):
                raise _Dead("invalid_marker", "per_source_event_counts has an entry without a source name")
            collections.append((name, _as_int(n, "per_source_event_counts") or 0))
    if status == "END" and count is None:
        raise _Dead("invalid_marker", "COMMIT has no total_events; completeness cannot be judged")
    raw_id = env.get("transaction_id", env.get("id", env.get("txn_id")))
    ts = _as_ts_ms(env.get("ts_ms", env.get("timestamp_ms")), "ts_ms")
    return _marker_row(raw_id, status, count, collections, "stripe", ts, line, source_file)


def parse_lines(
    lines: Iterable[str | None], files: Iterable[str | None], keys: KeySpec, record_keys: Iterable[str | None] | None = None
) -> list[dict[str, Any]]:
    """`parse_line` over parallel columns; `record_keys` only for Kafka records (their keys)."""
    if record_keys is None:
        return [parse_line(line, f, keys) for line, f in zip(lines, files)]
    return [parse_line(line, f, keys, k) for line, f, k in zip(lines, files, record_keys)]
