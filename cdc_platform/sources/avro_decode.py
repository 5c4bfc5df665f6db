"""Avro records in a schema registry's wire format, made into the lines the parser reads, on the executors.

A Debezium connector with an Avro converter writes each record's key and value as a magic byte 0, a
4-byte schema id and the Avro binary (Confluent's wire format, also Apicurio's with `as-confluent`).
The parser reads what the JSON converter with `schemas.enable=true` writes, so each micro-batch of such
records becomes that text first, and from there on everything is the JSON path's: the same raw-log rows,
identities, positions, transactions and view values (`tests/testbed/test_kafka_avro.py` holds the two
side by side on real connectors). Per micro-batch:

1. the schema ids the batch's keys and values name are collected (one small aggregate, a few ids), unless
   the schemas already read are likely to be all it names (`AvroLines`: then a record naming another id
   makes the ingest ask for the batch again, with this step);
2. each id the process has not seen is read from the registry's Confluent-compatible API, once
   (`schema_registry.SchemaRegistry`, which keeps them: an id's schema never changes);
3. each id's Avro schema gives two things on the driver (`connect_schema`): the Connect schema the
   converter was handed, as the JSON converter lays it out, and the reader schema without logical
   types, so values come out as the JSON converter writes them (a `Decimal` as its bytes in base64, a
   `Date` as days, `Timestamp` as epoch milliseconds);
4. the executors decode with Spark's Avro support (`from_avro`, one branch per id of the batch) and
   write the payload with Spark's `to_json` (nulls kept, as the JSON converter keeps them), between the
   schema's text and the closing brace: `{"schema":<Connect schema>,"payload":<value>}`.

A null value stays null (a tombstone). A key that is not in the wire format (a `StringConverter` key,
say) passes as its text, as with `format: json`. A record the platform cannot read gets a reject code
and reason in the column contract (`schemas.REJECT_CODE`, `REJECT_REASON`), which the parser turns into
a dead letter holding the record's value bytes in base64 as its `line`: nothing is lost, and nothing
stops. The registry not answering is no reject: it raises (`SchemaRegistryUnavailable`) before the
batch commits anything, so the batch replays once the registry is back.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cdc_platform.errors import CdcError
from cdc_platform.lake.schemas import KAFKA_ORIGIN_COLUMNS, LINES_INCOMPLETE, RECORD_KEY_COLUMN, REJECT_CODE, REJECT_REASON
from cdc_platform.sources import connect_schema
from cdc_platform.sources.schema_registry import RegistrySchema, SchemaRegistry

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: Dead-letter reason codes of Avro records (the README's dead-letter table lists them).
NOT_WIRE_FORMAT = "not_avro_wire_format"
UNKNOWN_SCHEMA_ID = "unknown_schema_id"
UNSUPPORTED_SCHEMA = "unsupported_schema"
NOT_DECODABLE = "avro_decode_error"
_BASE64_NOTE = "the line holds the record's value bytes in base64"


class Decoder:
    """One schema id, ready for the executors: its JSON prefix and reader schema, or why it cannot be read.

    `from_avro`'s PERMISSIVE mode (one bad record must not fail the batch) answers bytes that do not
    decode with a record whose fields are all null, or null for other types, not with an error. So the
    failure is told by its payload (`failed_payload`), except for the one record that is legitimately
    all null: its bytes are known in advance (`null_encoding`, each field's union index of null), and
    Avro's encoding of a value is unique.
    """

    def __init__(self, schema: RegistrySchema) -> None:
        self.schema_id = schema.schema_id
        self.prefix: str | None = None
        self.reader: str | None = None
        self.problem: str | None = None
        self.wrapped = False  # not a record, map or array at the top: `to_json` needs it inside a struct
        self.failed_payload = "null"
        self.null_encoding: bytes | None = None
        if schema.schema_type != "AVRO":
            self.problem = f"is a {schema.schema_type} schema; `format: avro` reads Avro only"
        elif schema.references:
            self.problem = f"refers to other schemas ({', '.join(schema.references)}), which the platform does not resolve"
        else:
            try:
                avro = connect_schema.parse(schema.text)
                self.prefix = '{"schema":' + connect_schema.to_json(connect_schema.connect_schema(avro)) + ',"payload":'
                reader = connect_schema.reader_schema(avro)
                self.reader = json.dumps(reader, separators=(",", ":"))
                top = reader.get("type") if isinstance(reader, dict) else reader
                self.wrapped = top not in ("record", "map", "array")
                if top == "record":
                    names = [f["name"] for f in reader.get("fields") or []]
                    self.failed_payload = "{" + ",".join(f'"{n}":null' for n in names) + "}"
                    nulls = [_null_encoding(f.get("type")) for f in reader.get("fields") or []]
                    self.null_encoding = b"".join(nulls) if all(n is not None for n in nulls) else None  # type: ignore[misc]
                else:
                    self.null_encoding = _null_encoding(reader)
            except (CdcError, RecursionError, TypeError, AttributeError) as exc:
                self.problem = f"is not an Avro schema the platform can read ({exc})"


class AvroLines:
    """What the ingest job calls on each micro-batch of a `format: avro` Kafka source: records in, lines out.

    A batch is decoded with the schemas already known (module doc, steps 3-4) when they are likely to be all
    it names: those of the topics' subjects, read before the first batch, and those learned since. A record
    naming another id is not decoded but marked `LINES_INCOMPLETE` (no dead letter: the ingest sees the count
    in the batch's one aggregate, before it commits anything, and asks again with `learn=True`, which collects
    the batch's ids first, steps 1-2, as every batch did before). So a stream in its steady state reads each
    batch once, in one job less; a new schema id costs its batch a second read.
    """

    #: At most this many schemas take part in a batch decoded without learning (the newest ids: registries hand
    #: them out in increasing order, and a table's current schema is its newest); the plan has a branch per id.
    KNOWN_LIMIT = 32

    def __init__(self, registry: SchemaRegistry, subjects: Sequence[str] = ()) -> None:
        self.registry = registry
        self.subjects = tuple(subjects)
        self._listed = False
        self._decoders: dict[int, Decoder] = {}
        self._held: DataFrame | None = None

    def __call__(self, records: DataFrame, *, learn: bool = False) -> DataFrame:
        """The batch's lines. Learning, the records are held (persisted) for the batch: the ids' job and the decode
        then read the topic once, not twice (Kafka's records are small beside the text made from them); the ingest
        lets them go with `release` once the batch is committed."""
        from pyspark.sql import functions as F

        self.release()
        if not self._listed:  # once read whole (a registry away raises here, and the replayed batch reads them again)
            for subject in self.subjects:
                for schema in self.registry.subject_schemas(subject):
                    self._decoder(schema)
            self._listed = True
        if not learn and self._decoders:
            known = dict(sorted(self._decoders.items())[-self.KNOWN_LIMIT:])
            return lines(records, known, self.registry.url, unknown=LINES_INCOMPLETE)
        records = self._held = records.persist()
        ids = [r["id"] for r in records.select(F.explode(F.array(_schema_id(F.col("value")), _schema_id(F.col(RECORD_KEY_COLUMN)))).alias("id"))
               .where(F.col("id").isNotNull()).distinct().collect()]
        found = self.registry.schemas(ids)
        decoders = {schema_id: self._decoder(schema) for schema_id, schema in found.items() if schema is not None}
        return lines(records, decoders, self.registry.url)

    def _decoder(self, schema: RegistrySchema) -> Decoder:
        if schema.schema_id not in self._decoders:
            self._decoders[schema.schema_id] = Decoder(schema)
        return self._decoders[schema.schema_id]

    def release(self) -> None:
        """Let the last batch's held records go (idempotent)."""
        held, self._held = self._held, None
        if held is not None:
            held.unpersist()


def subjects_of(topics: Sequence[str]) -> list[str]:
    """The subjects an Avro converter registers a topic's schemas under by default (`TopicNameStrategy`, also
    Apicurio's `TopicIdStrategy` through its Confluent-compatible API): `<topic>-value` and `<topic>-key`."""
    return [f"{topic}-{side}" for topic in topics for side in ("value", "key")]


def _null_encoding(avro: object) -> bytes | None:
    """Avro's binary encoding of null for a union that allows it (its branch index, zigzag varint), else None."""
    if isinstance(avro, dict) and isinstance(avro.get("type"), list):
        avro = avro["type"]
    if not isinstance(avro, list) or "null" not in avro:
        return None
    index = avro.index("null") * 2  # zigzag of a non-negative int
    out = bytearray()
    while True:
        if index < 0x80:
            out.append(index)
            return bytes(out)
        out.append((index & 0x7F) | 0x80)
        index >>= 7


def _schema_id(c: Column) -> Column:
    """The schema id of a key or value in the wire format (at least the magic byte 0 and a 4-byte id), else null."""
    from pyspark.sql import functions as F

    framed = (F.length(c) >= 5) & (F.substring(c, 1, 1) == F.lit(bytearray(b"\x00")))
    return F.when(framed, F.conv(F.hex(F.substring(c, 2, 4)), 16, 10).cast("long"))


def _by_id(values: dict[int, Any], schema_id: Column, kind: str) -> Column:
    """`values[schema_id]`, null for an id not among them: one lookup in a map literal, however many ids."""
    from pyspark.sql import functions as F

    if not values:
        return F.lit(None).cast(kind)
    return F.try_element_at(F.create_map(*(x for k, v in sorted(values.items()) for x in (F.lit(k).cast("long"), F.lit(v)))), schema_id)


def _decoded(name: str, schema_id: Column, decoders: dict[int, Decoder]) -> Column:
    """The record's key or value as the JSON converter's text (one branch per schema id of the batch, the payload's
    alone: the schema's text comes from a map literal), null without a usable id; what `from_avro` answered bytes
    that do not decode with is told apart by `_readable`."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    payload: Column | None = None
    prefixes: dict[int, Any] = {}
    for i, d in sorted(decoders.items()):
        if d.prefix is None or d.reader is None:
            continue
        decoded = from_avro(_body(name), d.reader, {"mode": "PERMISSIVE"})
        if d.wrapped:  # {"v":<value>} -> <value>; one reference, so the decode runs once
            text = F.regexp_extract(F.to_json(F.struct(decoded.alias("v")), {"ignoreNullFields": "false"}), r'(?s)^\{"v":(.*)\}$', 1)
        else:
            text = F.to_json(decoded, {"ignoreNullFields": "false"})
        payload = F.when(schema_id == i, text) if payload is None else payload.when(schema_id == i, text)
        prefixes[i] = d.prefix
    if payload is None:
        return F.lit(None).cast("string")
    return F.concat(_by_id(prefixes, schema_id, "string"), payload, F.lit("}"))


def _body(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.expr(f"substring(`{name}`, 6)")


def _readable(name: str, made: Column, schema_id: Column, decoders: dict[int, Decoder]) -> Column:
    """`made` (a column `_decoded` made, so each record is decoded once), null when it is `from_avro`'s answer to
    bytes that do not decode: its failure payload, unless the bytes are the one encoding of that value."""
    from pyspark.sql import functions as F

    usable = {i: d for i, d in decoders.items() if d.prefix is not None}
    failed = _by_id({i: f"{d.prefix}{d.failed_payload}}}" for i, d in usable.items()}, schema_id, "string")
    null_body = _by_id({i: bytearray(d.null_encoding) for i, d in usable.items() if d.null_encoding is not None}, schema_id, "binary")
    return F.when((made != failed) | F.coalesce(_body(name) == null_body, F.lit(False)), made)


def _code(c: Column, schema_id: Column, text: Column, decoders: dict[int, Decoder], *, required: bool, unknown: str) -> Column:
    """Why one side of the record (its key or value) is no line, as a reject code; null when it reads (a key not in the
    wire format reads: it passes as its text)."""
    from pyspark.sql import functions as F

    usable = [i for i, d in decoders.items() if d.problem is None]
    problems = [i for i, d in decoders.items() if d.problem is not None]
    code = F.when(schema_id.isNull(), F.lit(NOT_WIRE_FORMAT) if required else F.lit(None).cast("string"))
    if problems:
        code = code.when(schema_id.isin(problems), F.lit(UNSUPPORTED_SCHEMA))
    code = code.when(~schema_id.isin(usable) if usable else F.lit(True), F.lit(unknown))
    return code.when(text.isNull(), F.lit(NOT_DECODABLE))


def _reason(side: str, code: Column, c: Column, schema_id: Column, decoders: dict[int, Decoder], registry_url: str, unknown: str) -> Column:
    """The sentence of `code` (from `_code`) for one side of the record: a template per code, filled by `printf`."""
    from pyspark.sql import functions as F

    def text(s: str) -> str:
        return s.replace("%", "%%")

    at = f" (the record's {side})"
    extra = "" if side == "value" else "; the key's bytes in base64: %4$s"  # the value's bytes are the line
    if unknown == UNKNOWN_SCHEMA_ID:
        unknown_text = "schema id %1$s" + text(f"{at} is unknown to the schema registry at {registry_url} (HTTP 404): written against another "
                                              f"registry, or the schema was deleted; {_BASE64_NOTE}") + extra
    else:
        unknown_text = "schema id %1$s" + text(f"{at} was not read from the registry yet: the batch is decoded again with it")
    templates = {
        NOT_WIRE_FORMAT: text(f"the record's {side} is not in the schema registry's wire format (magic byte 0, a 4-byte schema id, then Avro); "
                              "it starts with 0x") + "%2$s" + text(": is the topic written by another converter? (`format: json` reads the "
                                                                   f"JSON converter's); {_BASE64_NOTE}"),
        unknown: unknown_text,
        UNSUPPORTED_SCHEMA: "schema id %1$s" + text(at) + " %3$s" + text(f"; {_BASE64_NOTE}") + extra,
        NOT_DECODABLE: text(f"the record's {side} does not decode as Avro with schema id ") + "%1$s"
        + text(f" (truncated or corrupt bytes, or written with another schema); {_BASE64_NOTE}") + extra,
    }
    template = F.try_element_at(F.create_map(*(F.lit(x) for kv in sorted(templates.items()) for x in kv)), code)
    problems = _by_id({i: d.problem for i, d in decoders.items() if d.problem is not None}, schema_id, "string")
    return F.when(code.isNotNull(), F.printf(template, schema_id.cast("string"), F.lower(F.hex(F.substring(c, 1, 4))), problems, F.base64(c)))


def lines(records: DataFrame, decoders: dict[int, Decoder], registry_url: str, *, unknown: str = UNKNOWN_SCHEMA_ID) -> DataFrame:
    """The micro-batch's records (binary `value` and key) as lines in `streams.py`'s column contract.

    A record naming a schema id not among `decoders` gets the code `unknown`: `UNKNOWN_SCHEMA_ID` when they are
    every id of the batch the registry knows, `LINES_INCOMPLETE` when they are only the ids known so far.

    Each step is a projection of its own over the last one's columns (the ids read once, each text made once), and
    each expression's size does not grow with the reject cases or the ids but for the decode's one branch per id
    (map literals, one `printf` template per code): Spark compiles the projections, and the parse after them, into
    one generated method, and HotSpot never compiles a method of over 8,000 bytes of bytecode (`HugeMethodLimit`).
    Written as a `when` per case and id, with the id read again in each, that method was 20,669 bytes: it ran
    interpreted, and a batch's decode and parse took twice the CPU of the JSON converter's parse
    (benchmarks/README.md, "A seventh session").
    """
    from pyspark.sql import functions as F

    key, value = F.col(RECORD_KEY_COLUMN), F.col("value")
    ids = {side: F.col(f"_{side}_id") for side in ("value", "key")}
    made = records.select("*", _schema_id(value).alias("_value_id"), _schema_id(key).alias("_key_id"))
    made = made.select("*", *(_decoded(c, ids[side], decoders).alias(f"_{side}_made") for side, c in (("value", "value"), ("key", RECORD_KEY_COLUMN))))
    made = made.select("*", *(_readable(c, F.col(f"_{side}_made"), ids[side], decoders).alias(f"_{side}_text")
                              for side, c in (("value", "value"), ("key", RECORD_KEY_COLUMN))))
    made = made.select("*", *(_code(c, ids[side], F.col(f"_{side}_text"), decoders, required=side == "value", unknown=unknown).alias(f"_{side}_code")
                              for side, c in (("value", value), ("key", key))))
    v_code, k_code = F.col("_value_code"), F.col("_key_code")
    v_reason = _reason("value", v_code, value, ids["value"], decoders, registry_url, unknown)
    k_reason = _reason("key", k_code, key, ids["key"], decoders, registry_url, unknown)
    code = F.when(value.isNotNull(), F.coalesce(v_code, k_code))
    reason = F.when(value.isNotNull(), F.coalesce(v_reason, k_reason))
    origin = [c for c in KAFKA_ORIGIN_COLUMNS if c in records.columns]
    return made.select(
        F.when(code.isNotNull(), F.base64(value)).otherwise(F.col("_value_text")).alias("value"),
        "source_file",
        F.when(ids["key"].isNotNull(), F.col("_key_text")).otherwise(key.cast("string")).alias(RECORD_KEY_COLUMN),
        *origin,
        code.alias(REJECT_CODE),
        reason.alias(REJECT_REASON),
    )
