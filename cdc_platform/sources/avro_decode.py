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
from typing import TYPE_CHECKING

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


def _head(c: Column) -> Column:
    """The first five bytes as hex: the magic byte and the schema id."""
    from pyspark.sql import functions as F

    return F.hex(F.substring(c, 1, 5))


def _framed(c: Column) -> Column:
    """A value in the wire format: at least the magic byte 0 and a 4-byte id."""
    from pyspark.sql import functions as F

    head = _head(c)
    return c.isNotNull() & (F.length(head) == 10) & head.startswith("00")


def _schema_id(c: Column) -> Column:
    from pyspark.sql import functions as F

    return F.when(_framed(c), F.conv(F.substring(_head(c), 3, 8), 16, 10).cast("long"))


def _decoded(name: str, decoders: dict[int, Decoder]) -> Column:
    """The record's key or value as the JSON converter's text (one branch per schema id of the batch), null
    without a usable id; what `from_avro` answered bytes that do not decode with is told apart by `_failed`."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    schema_id = _schema_id(F.col(name))
    out: Column | None = None
    for i, d in sorted(decoders.items()):
        if d.prefix is None or d.reader is None:
            continue
        decoded = from_avro(_body(name), d.reader, {"mode": "PERMISSIVE"})
        if d.wrapped:  # {"v":<value>} -> <value>; one reference, so the decode runs once
            payload = F.regexp_extract(F.to_json(F.struct(decoded.alias("v")), {"ignoreNullFields": "false"}), r'(?s)^\{"v":(.*)\}$', 1)
        else:
            payload = F.to_json(decoded, {"ignoreNullFields": "false"})
        text = F.concat(F.lit(d.prefix), payload, F.lit("}"))
        out = F.when(schema_id == i, text) if out is None else out.when(schema_id == i, text)
    return out if out is not None else F.lit(None).cast("string")


def _body(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.expr(f"substring(`{name}`, 6)")


def _failed(name: str, text: Column, decoders: dict[int, Decoder]) -> Column:
    """Whether `text` (a column `_decoded` made, so each record is decoded once) is `from_avro`'s answer to
    bytes that do not decode: its failure payload, unless the bytes are the one encoding of that value."""
    from pyspark.sql import functions as F

    schema_id = _schema_id(F.col(name))
    out: Column = F.lit(False)
    for i, d in sorted(decoders.items()):
        if d.prefix is None:
            continue
        failed = F.coalesce(text, F.lit("")) == F.lit(d.prefix + d.failed_payload + "}")
        if d.null_encoding is not None:
            failed = failed & (_body(name) != F.lit(bytearray(d.null_encoding)))
        out = F.when(schema_id == i, failed).otherwise(out)
    return out


def lines(records: DataFrame, decoders: dict[int, Decoder], registry_url: str, *, unknown: str = UNKNOWN_SCHEMA_ID) -> DataFrame:
    """The micro-batch's records (binary `value` and key) as lines in `streams.py`'s column contract.

    A record naming a schema id not among `decoders` gets the code `unknown`: `UNKNOWN_SCHEMA_ID` when they are
    every id of the batch the registry knows, `LINES_INCOMPLETE` when they are only the ids known so far."""
    from pyspark.sql import functions as F

    key, value = F.col(RECORD_KEY_COLUMN), F.col("value")
    # Two projections: the texts are made once each, and only read by what follows (Spark does not merge
    # a projection into the next when that would run a costly expression twice).
    decoded = records.select(
        "*", _decoded("value", decoders).alias("_value_made"), _decoded(RECORD_KEY_COLUMN, decoders).alias("_key_made"))
    decoded = decoded.select(
        "*", *(F.when(~_failed(c, F.col(f"_{side}_made"), decoders), F.col(f"_{side}_made")).alias(f"_{side}_text")
               for side, c in (("value", "value"), ("key", RECORD_KEY_COLUMN))))
    usable = [i for i, d in decoders.items() if d.problem is None]
    problems = {i: d.problem for i, d in decoders.items() if d.problem is not None}

    def why(side: str, c: Column, text: Column, *, required: bool) -> tuple[Column, Column]:
        """(code, reason) of one side of the record, null when it reads."""
        schema_id = _schema_id(c)
        id_text = schema_id.cast("string")
        at = f" (the record's {side})"
        extra = F.lit("") if side == "value" else F.concat(F.lit("; the key's bytes in base64: "), F.base64(c))
        unsupported = F.lit(None).cast("string")
        for i, text_of in problems.items():
            unsupported = F.when(schema_id == i, F.lit(text_of)).otherwise(unsupported)
        cases = [
            (c.isNotNull() & ~_framed(c) & F.lit(required),
             NOT_WIRE_FORMAT,
             F.concat(F.lit(f"the record's {side} is not in the schema registry's wire format (magic byte 0, a 4-byte schema id, "
                            "then Avro); it starts with 0x"), F.lower(F.hex(F.substring(c, 1, 4))),
                      F.lit(f": is the topic written by another converter? (`format: json` reads the JSON converter's); {_BASE64_NOTE}"))),
            (schema_id.isNotNull() & ~schema_id.isin(usable) & unsupported.isNull(),
             unknown,
             F.concat(F.lit("schema id "), id_text, F.lit(f"{at} is unknown to the schema registry at {registry_url} (HTTP 404): "
                                                         f"written against another registry, or the schema was deleted; {_BASE64_NOTE}"), extra)
             if unknown == UNKNOWN_SCHEMA_ID else
             F.concat(F.lit("schema id "), id_text, F.lit(f"{at} was not read from the registry yet: the batch is decoded again with it"))),
            (unsupported.isNotNull(),
             UNSUPPORTED_SCHEMA,
             F.concat(F.lit("schema id "), id_text, F.lit(f"{at} "), unsupported, F.lit(f"; {_BASE64_NOTE}"), extra)),
            (schema_id.isNotNull() & text.isNull(),
             NOT_DECODABLE,
             F.concat(F.lit(f"the record's {side} does not decode as Avro with schema id "), id_text,
                      F.lit(f" (truncated or corrupt bytes, or written with another schema); {_BASE64_NOTE}"), extra)),
        ]
        code: Column = F.lit(None).cast("string")
        reason: Column = F.lit(None).cast("string")
        for condition, name, sentence in reversed(cases):
            code = F.when(condition, F.lit(name)).otherwise(code)
            reason = F.when(condition, sentence).otherwise(reason)
        return code, reason

    v_code, v_reason = why("value", value, F.col("_value_text"), required=True)
    k_code, k_reason = why("key", key, F.col("_key_text"), required=False)
    code = F.when(value.isNull(), F.lit(None)).otherwise(F.coalesce(v_code, k_code))
    reason = F.when(value.isNull(), F.lit(None)).otherwise(F.coalesce(v_reason, k_reason))
    origin = [c for c in KAFKA_ORIGIN_COLUMNS if c in records.columns]
    return decoded.select(
        F.when(code.isNotNull(), F.base64(value)).otherwise(F.col("_value_text")).alias("value"),
        "source_file",
        F.when(_framed(key), F.col("_key_text")).otherwise(key.cast("string")).alias(RECORD_KEY_COLUMN),
        *origin,
        code.alias(REJECT_CODE),
        reason.alias(REJECT_REASON),
    )
