"""An Avro schema from a schema registry, read back as the Kafka Connect schema it was written from.

A Debezium connector with an Avro converter (Confluent's, Apicurio's) turns each record's Connect schema
into an Avro schema and keeps what Avro has no words for in properties: `connect.name`, `connect.version`,
`connect.parameters`, `connect.default`, `connect.type` (int8, int16). The platform parses what Debezium's
JSON converter with `schemas.enable=true` writes, `{"schema": <Connect schema>, "payload": <value>}`, so an
Avro record is brought to that shape: this module gives its `schema` half, the way Confluent's
`AvroData.toConnectSchema` reads those properties back, laid out key for key as `JsonConverter` writes a
Connect schema (`type`, `fields`/`items`/`keys`+`values`, `optional`, `name`, `version`, `doc`,
`parameters`, `default`, then `field` in a struct's field). The `payload` half is Spark's (`avro_decode`).

It also gives the *reader* schema `from_avro` decodes with: the same schema without Avro's logical types,
so a Connect `Decimal` comes out as its unscaled bytes, a `Date` as days and a `Timestamp` as epoch
milliseconds, which is exactly what the JSON converter writes for them (its default `decimal.format` is
BASE64). Avro's binary encoding of a logical type is that of its underlying type, so the bytes read the
same either way.

An Avro schema with no `connect.*` properties (a producer other than Kafka Connect) is read as Confluent's
converter reads one: a record is a struct named by its full name, `decimal`, `date`, `time-millis` and
`timestamp-millis` become Connect's `Decimal`, `Date`, `Time` and `Timestamp`, other logical types their
underlying type. A union of several non-null types (which Connect never writes) becomes a struct of
optional fields `member0`, `member1`, ..., the names Spark's Avro reader gives them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from cdc_platform.errors import CdcError

_PRIMITIVES = {"boolean": "boolean", "int": "int32", "long": "int64", "float": "float", "double": "double",
               "bytes": "bytes", "string": "string"}
_INT_CONNECT_TYPES = {"int8", "int16", "int32"}
#: Avro logical types Connect has a logical type for, when no `connect.name` says otherwise.
_LOGICAL = {"decimal": "org.apache.kafka.connect.data.Decimal", "date": "org.apache.kafka.connect.data.Date",
            "time-millis": "org.apache.kafka.connect.data.Time", "timestamp-millis": "org.apache.kafka.connect.data.Timestamp"}
#: The record names the converters give a struct that had none; Connect's schema then has no name.
_DEFAULT_NAMES = {"io.confluent.connect.avro.ConnectDefault", "io.apicurio.registry.utils.converter.avro.ConnectDefault"}
UNION_NAME = "io.confluent.connect.avro.Union"


class SchemaTranslationError(CdcError):
    """A schema from the registry is not a valid Avro schema (or uses what Avro does not allow)."""


def parse(text: str) -> Any:
    """The registry's schema text as JSON; a text that is none raises `SchemaTranslationError`."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise SchemaTranslationError(f"the schema is not JSON ({exc})") from None


def to_json(value: Any) -> str:
    """Compact JSON text, as Kafka Connect's JsonConverter writes it (no spaces, UTF-8 kept)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def connect_schema(avro: Any) -> dict[str, Any]:
    """The Connect schema (JsonConverter's JSON layout) of an Avro schema (parsed JSON)."""
    return _Reader().schema(avro, namespace=None)


def reader_schema(avro: Any) -> Any:
    """The Avro schema without `logicalType` annotations: what `from_avro` decodes with (see the module doc)."""
    if isinstance(avro, list):
        return [reader_schema(t) for t in avro]
    if not isinstance(avro, dict):
        return avro
    out: dict[str, Any] = {}
    for key, value in avro.items():
        if key == "logicalType":
            continue
        if key in ("type", "items", "values"):
            out[key] = reader_schema(value)
        elif key == "fields" and isinstance(value, list):
            out[key] = [{**f, "type": reader_schema(f.get("type"))} if isinstance(f, dict) else f for f in value]
        else:
            out[key] = value
    return out


class _Reader:
    """One schema's walk: named types (records, enums, fixed) are defined once and referred to by name."""

    def __init__(self) -> None:
        self.named: dict[str, dict[str, Any]] = {}

    def schema(self, avro: Any, namespace: str | None, *, optional: bool = False, default: Any = None,
               doc: str | None = None) -> dict[str, Any]:
        if isinstance(avro, list):
            return self._union(avro, namespace, default, doc)
        if isinstance(avro, str):
            if avro in _PRIMITIVES:
                value = None if default is None else _default_value(avro, default, self, namespace)
                return _layout(_PRIMITIVES[avro], optional=optional, doc=doc, default=value)
            return self.schema(self._lookup(avro, namespace), namespace, optional=optional, default=default, doc=doc)
        if not isinstance(avro, dict) or "type" not in avro:
            raise SchemaTranslationError(f"not an Avro schema: {to_json(avro)[:200]}")
        kind = avro["type"]
        if isinstance(kind, (dict, list)):  # {"type": {...}} wraps a schema
            return self.schema(kind, namespace, optional=optional, default=default, doc=doc)
        props: dict[str, Any] = {"name": avro.get("connect.name"), "version": avro.get("connect.version"),
                                 "doc": doc if doc is not None else avro.get("connect.doc"),
                                 "parameters": avro.get("connect.parameters")}
        if default is None:
            default = avro.get("connect.default")
        extra: dict[str, Any] = {}
        if kind == "record":
            full = self._define(avro, namespace)
            inner = full.rpartition(".")[0] or None
            if props["name"] is None and full not in _DEFAULT_NAMES:
                props["name"] = full
            if props["doc"] is None and isinstance(avro.get("doc"), str):
                props["doc"] = avro["doc"]
            fields = []
            for f in avro.get("fields") or []:
                if not isinstance(f, dict) or not isinstance(f.get("name"), str) or "type" not in f:
                    raise SchemaTranslationError(f"record {full} has a field without a name or a type: {to_json(f)[:200]}")
                field_default = f.get("default")
                field_doc = f.get("doc") if isinstance(f.get("doc"), str) else None
                fields.append({**self.schema(f["type"], inner, default=field_default, doc=field_doc), "field": f["name"]})
            connect_type = "struct"
            extra["fields"] = fields
        elif kind == "array":
            connect_type = "array"
            extra["items"] = self.schema(avro.get("items"), namespace)
        elif kind == "map":
            connect_type = "map"
            extra["keys"] = _layout("string")
            extra["values"] = self.schema(avro.get("values"), namespace)
        elif kind in ("enum", "fixed"):
            self._define(avro, namespace)
            connect_type = "string" if kind == "enum" else "bytes"
        elif kind in _PRIMITIVES:
            connect_type = _PRIMITIVES[kind]
            declared = avro.get("connect.type")
            if kind == "int" and declared in _INT_CONNECT_TYPES:
                connect_type = declared
        else:
            return self.schema(self._lookup(kind, namespace), namespace, optional=optional, default=default, doc=doc)
        logical = avro.get("logicalType")
        if props["name"] is None and logical in _LOGICAL and (logical != "decimal" or kind in ("bytes", "fixed")):
            props["name"] = _LOGICAL[logical]
            props["version"] = 1
            if logical == "decimal":
                props["parameters"] = {"scale": str(avro.get("scale", 0)), "connect.decimal.precision": str(avro.get("precision"))}
        connect_default = None if default is None else _default_value(avro, default, self, namespace)
        return _layout(connect_type, extra, optional=optional, default=connect_default, **props)

    def _union(self, members: list[Any], namespace: str | None, default: Any, doc: str | None) -> dict[str, Any]:
        branches = [m for m in members if m != "null" and not (isinstance(m, dict) and m.get("type") == "null")]
        optional = len(branches) < len(members)
        if len(branches) == 1:
            return self.schema(branches[0], namespace, optional=optional, default=default, doc=doc)
        fields = [{**self.schema(m, namespace, optional=True), "field": f"member{i}"} for i, m in enumerate(branches)]
        return _layout("struct", {"fields": fields}, optional=optional, name=UNION_NAME, doc=doc)

    def _define(self, avro: dict[str, Any], namespace: str | None) -> str:
        name = avro.get("name")
        if not isinstance(name, str) or not name:
            raise SchemaTranslationError(f"a named Avro type has no name: {to_json(avro)[:200]}")
        ns = avro.get("namespace") if "namespace" in avro else namespace
        full = name if "." in name or not ns else f"{ns}.{name}"
        self.named[full] = avro
        return full

    def _lookup(self, name: str, namespace: str | None) -> dict[str, Any]:
        for candidate in ((f"{namespace}.{name}" if namespace and "." not in name else None), name):
            if candidate is not None and candidate in self.named:
                return self.named[candidate]
        raise SchemaTranslationError(f"the schema refers to type {name!r}, which it does not define before that point")


def _layout(connect_type: str, extra: Mapping[str, Any] | None = None, *, optional: bool = False, name: Any = None,
            version: Any = None, doc: Any = None, parameters: Any = None, default: Any = None) -> dict[str, Any]:
    """A Connect schema's keys in JsonConverter's order, absent ones left out as it leaves them out."""
    out: dict[str, Any] = {"type": connect_type, **(extra or {}), "optional": optional}
    if name is not None:
        out["name"] = name
    if version is not None:
        out["version"] = version
    if doc is not None:
        out["doc"] = doc
    if parameters is not None:
        out["parameters"] = {str(k): str(v) for k, v in parameters.items()} if isinstance(parameters, dict) else parameters
    if default is not None:
        out["default"] = default
    return out


def _default_value(avro: Any, default: Any, reader: _Reader, namespace: str | None) -> Any:
    """An Avro JSON default as the JSON converter writes the same Connect default: bytes as base64 (Avro
    writes them as a string of code points 0-255), records and collections member by member."""
    if isinstance(avro, list):  # a union's default belongs to its first branch
        return _default_value(avro[0], default, reader, namespace) if avro else default
    if isinstance(avro, str):
        if avro in ("bytes",) and isinstance(default, str):
            return _latin1_base64(default)
        if avro in _PRIMITIVES or avro == "null":
            return default
        return _default_value(reader._lookup(avro, namespace), default, reader, namespace)
    if not isinstance(avro, dict):
        return default
    kind = avro.get("type")
    if isinstance(kind, (dict, list)):
        return _default_value(kind, default, reader, namespace)
    if kind in ("bytes", "fixed") and isinstance(default, str):
        return _latin1_base64(default)
    if kind == "record" and isinstance(default, dict):
        inner = (avro.get("namespace") or namespace) if "." not in str(avro.get("name")) else str(avro.get("name")).rpartition(".")[0]
        return {f["name"]: _default_value(f.get("type"), default.get(f["name"]), reader, inner)
                for f in avro.get("fields") or [] if isinstance(f, dict) and f.get("name") in default}
    if kind == "array" and isinstance(default, list):
        return [_default_value(avro.get("items"), d, reader, namespace) for d in default]
    if kind == "map" and isinstance(default, dict):
        return {k: _default_value(avro.get("values"), v, reader, namespace) for k, v in default.items()}
    return default


def _latin1_base64(text: str) -> str:
    try:
        return base64.b64encode(text.encode("latin-1")).decode("ascii")
    except UnicodeEncodeError:
        return text  # not Avro's encoding of bytes: kept as written
