"""`source:` in cdc.yaml: what the stream reads, landing files (the default) or Kafka topics.

Kafka's settings are checked when the config loads, so a typo or a setting Spark's Kafka source owns
fails with the entry's name before any Spark starts; consumer settings pass through as `kafka.*` options,
with `${VAR}`s taken from the environment (secrets stay out of the file). `config.PlatformConfig` holds
the result as its `source`.

A Kafka source reads Debezium's JSON converter output (`format: json`, the default) or Avro in a schema
registry's wire format (`format: avro` with `schema_registry_url`, the registry's Confluent-compatible
API); the registry's basic-auth user and password can only be `${VAR}` references to the environment.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdc_platform.errors import ConfigError

SOURCE_KINDS = ("files", "kafka")
_KAFKA_KEYS = {
    "kind", "bootstrap_servers", "topics", "subscribe_pattern", "starting_offsets", "max_offsets_per_trigger",
    "fail_on_data_loss", "options", "format", "schema_registry_url", "schema_registry_user", "schema_registry_password",
    "min_partitions",
}
FORMATS = ("json", "avro")
#: Kafka records per micro-batch, the counterpart of `config.DEFAULT_MAX_FILES_PER_TRIGGER` (same reasoning).
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 500_000
#: Consumer settings Spark's Kafka source owns (it refuses them, or they would break its offset tracking).
_KAFKA_OWNED_OPTIONS = {
    "kafka.bootstrap.servers": "set `bootstrap_servers:` instead",
    "kafka.auto.offset.reset": "set `starting_offsets:` instead",
    "kafka.enable.auto.commit": "the stream's checkpoint keeps the offsets, never the consumer group",
    "kafka.key.deserializer": "keys are always read as bytes",
    "kafka.value.deserializer": "values are always read as bytes",
    "kafka.interceptor.classes": "Spark's Kafka source does not allow consumer interceptors",
}
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._\-]{1,249}$")
_ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_WHOLE_ENV_REF_RE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_URL_RE = re.compile(r"^https?://[^\s/?#]+(/[^\s?#]*)?$")


@dataclass(frozen=True)
class SchemaRegistryConfig:
    """Where `format: avro` looks schema ids up: a Confluent-compatible API's base URL (before `/schemas`)."""

    url: str
    user: str | None = None  # basic auth, from the environment only
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class KafkaSourceConfig:
    """Where `source: kafka` reads: Spark's Kafka connector options, checked when the config loads."""

    bootstrap_servers: str
    topics: tuple[str, ...] = ()  # exactly one of topics / subscribe_pattern
    subscribe_pattern: str | None = None
    #: "earliest", "latest", or Spark's JSON per topic and partition; only for a new checkpoint.
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS_PER_TRIGGER
    #: Stop when offsets the checkpoint expects are gone (retention deleted unread records); false reads on.
    fail_on_data_loss: bool = True
    #: Spark tasks a micro-batch's records are read, decoded and parsed in, at least (Spark's `minPartitions`: a
    #: topic partition's offsets are split into consecutive ranges, so their order holds); None: the session's
    #: default parallelism (its cores), since a Debezium topic often has one partition, which alone is one task.
    min_partitions: int | None = None
    #: Pass-through `kafka.*` consumer options (security settings and the like), `${VAR}`s already expanded.
    options: tuple[tuple[str, str], ...] = ()
    #: How record values and keys are written: Debezium's JSON converter, or Avro with a schema registry.
    format: str = "json"  # one of FORMATS
    schema_registry: SchemaRegistryConfig | None = None  # set exactly when format is "avro"

    def spark_options(self) -> dict[str, str]:
        """The options of `spark.readStream.format("kafka")`, by Spark's names."""
        opts = {"kafka.bootstrap.servers": self.bootstrap_servers, "startingOffsets": self.starting_offsets,
                "failOnDataLoss": str(self.fail_on_data_loss).lower(), "includeHeaders": "false"}
        if self.subscribe_pattern is not None:
            opts["subscribePattern"] = self.subscribe_pattern
        else:
            opts["subscribe"] = ",".join(self.topics)
        if self.max_offsets_per_trigger is not None:
            opts["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        if self.min_partitions is not None:
            opts["minPartitions"] = str(self.min_partitions)
        opts.update(self.options)
        return opts

    def describe(self) -> str:
        what = f"pattern {self.subscribe_pattern}" if self.subscribe_pattern is not None else "topics " + ", ".join(self.topics)
        avro = f", avro with {self.schema_registry.url}" if self.schema_registry is not None else ""
        return f"kafka {self.bootstrap_servers} ({what}{avro})"


@dataclass(frozen=True)
class SourceConfig:
    """What the stream reads: landing files (the default) or Kafka topics."""

    kind: str = "files"  # one of SOURCE_KINDS
    kafka: KafkaSourceConfig | None = None  # set exactly when kind is "kafka"


def parse_source(value: Any, where: str, environ: Mapping[str, str] | None = None) -> SourceConfig:
    """`source:` as `files`, `kafka` (which then lacks its settings), or a mapping with `kind:`."""
    if value is None or value == "files":
        return SourceConfig()
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: `source` must be `files` or a mapping such as {{kind: kafka, bootstrap_servers: ..., topics: [...]}}")
    kind = value.get("kind", "files")
    if kind not in SOURCE_KINDS:
        raise ConfigError(f"{where}: source.kind must be one of {', '.join(SOURCE_KINDS)}, got {kind!r}")
    if kind == "files":
        extra = sorted(set(value) - {"kind"})
        if extra:
            raise ConfigError(f"{where}: source.{extra[0]} applies to `kind: kafka` only; the files source reads `landing:`")
        return SourceConfig()
    return SourceConfig(kind="kafka", kafka=_parse_kafka(value, where, os.environ if environ is None else environ))


def _parse_kafka(raw: Mapping[str, Any], where: str, environ: Mapping[str, str]) -> KafkaSourceConfig:
    entry = f"{where}: source"
    unknown = sorted(set(raw) - _KAFKA_KEYS)
    if unknown:
        hint = " (pass Kafka consumer settings under `options:` as `kafka.<name>`)" if any("." in str(k) for k in unknown) else ""
        raise ConfigError(f"{entry}: unknown key(s) {', '.join(map(str, unknown))}{hint}; allowed: {', '.join(sorted(_KAFKA_KEYS))}")
    servers = raw.get("bootstrap_servers")
    if isinstance(servers, list) and servers and all(isinstance(s, str) for s in servers):
        servers = ",".join(servers)
    if not isinstance(servers, str) or not re.match(r"^[^\s,]+:\d+(,[^\s,]+:\d+)*$", servers.strip()):
        raise ConfigError(f"{entry}.bootstrap_servers must be host:port[,host:port...] (or a list of them), got {servers!r}")

    topics, pattern = raw.get("topics"), raw.get("subscribe_pattern")
    if (topics is None) == (pattern is None):
        raise ConfigError(f"{entry}: set exactly one of `topics: [names]` or `subscribe_pattern: REGEX` (a pattern also picks up topics created later)")
    topic_tuple: tuple[str, ...] = ()
    if topics is not None:
        if isinstance(topics, str):
            topics = [topics]
        if not isinstance(topics, list) or not topics or not all(isinstance(t, str) and _TOPIC_RE.match(t) for t in topics):
            raise ConfigError(f"{entry}.topics must be a non-empty list of Kafka topic names (letters, digits, . _ -), got {topics!r}")
        topic_tuple = tuple(topics)
    if pattern is not None:
        if not isinstance(pattern, str) or not pattern:
            raise ConfigError(f"{entry}.subscribe_pattern must be a regular expression string, got {pattern!r}")
        try:
            re.compile(pattern)  # Java's regex syntax is close enough to catch the usual typos here
        except re.error as exc:
            raise ConfigError(f"{entry}.subscribe_pattern {pattern!r} is not a valid regular expression ({exc})") from None

    starting = _starting_offsets(raw.get("starting_offsets", "earliest"), entry)

    max_offsets = raw.get("max_offsets_per_trigger", DEFAULT_MAX_OFFSETS_PER_TRIGGER)
    if max_offsets is not None and (not isinstance(max_offsets, int) or isinstance(max_offsets, bool) or max_offsets < 1):
        raise ConfigError(f"{entry}.max_offsets_per_trigger must be a positive integer (records per micro-batch) or null, got {max_offsets!r}")
    min_partitions = raw.get("min_partitions")
    if min_partitions is not None and (not isinstance(min_partitions, int) or isinstance(min_partitions, bool) or min_partitions < 1):
        raise ConfigError(f"{entry}.min_partitions must be a positive integer (Spark tasks a micro-batch is read in, at least) "
                          f"or null for the session's cores, got {min_partitions!r}")
    fail = raw.get("fail_on_data_loss", True)
    if not isinstance(fail, bool):
        raise ConfigError(f"{entry}.fail_on_data_loss must be true or false, got {fail!r}")

    options = raw.get("options") or {}
    if not isinstance(options, dict):
        raise ConfigError(f"{entry}.options must be a mapping of `kafka.<consumer setting>: value`")
    resolved: list[tuple[str, str]] = []
    for name, val in options.items():
        name = str(name)
        if not name.startswith("kafka.") or len(name) <= len("kafka."):
            raise ConfigError(f"{entry}.options.{name}: only Kafka consumer settings pass through, named `kafka.<setting>` (e.g. kafka.security.protocol)")
        if name in _KAFKA_OWNED_OPTIONS:
            raise ConfigError(f"{entry}.options.{name} cannot be set: {_KAFKA_OWNED_OPTIONS[name]}")
        if isinstance(val, bool):
            val = str(val).lower()
        if not isinstance(val, (str, int, float)):
            raise ConfigError(f"{entry}.options.{name} must be a string or number, got {type(val).__name__}")
        resolved.append((name, _expand_env(str(val), f"{entry}.options.{name}", environ)))
    fmt = raw.get("format", "json")
    if fmt not in FORMATS:
        raise ConfigError(f"{entry}.format must be one of {', '.join(FORMATS)} (how the connector's converter writes records), got {fmt!r}")
    return KafkaSourceConfig(
        bootstrap_servers=servers.strip(), topics=topic_tuple, subscribe_pattern=pattern, starting_offsets=starting,
        max_offsets_per_trigger=max_offsets, fail_on_data_loss=fail, min_partitions=min_partitions, options=tuple(resolved),
        format=fmt, schema_registry=_schema_registry(raw, fmt, entry, environ),
    )


def _schema_registry(raw: Mapping[str, Any], fmt: str, entry: str, environ: Mapping[str, str]) -> SchemaRegistryConfig | None:
    """`schema_registry_url` (and its optional basic auth) for `format: avro`; refused with `format: json`."""
    url = raw.get("schema_registry_url")
    given = [k for k in ("schema_registry_url", "schema_registry_user", "schema_registry_password") if k in raw]
    if fmt != "avro":
        if given:
            raise ConfigError(f"{entry}.{given[0]} applies to `format: avro` only (records in a schema registry's wire format)")
        return None
    if not isinstance(url, str) or not _URL_RE.match(url.strip()):
        raise ConfigError(f"{entry}.schema_registry_url is required with `format: avro`: the registry's Confluent-compatible "
                          f"API, such as http://registry:8081 (Apicurio: http://host:8080/apis/ccompat/v7), got {url!r}")
    user, password = raw.get("schema_registry_user"), raw.get("schema_registry_password")
    if (user is None) != (password is None):
        raise ConfigError(f"{entry}: set both schema_registry_user and schema_registry_password (basic auth), or neither")

    def secret(name: str, value: Any) -> str:
        m = _WHOLE_ENV_REF_RE.match(value) if isinstance(value, str) else None
        if m is None:
            raise ConfigError(f"{entry}.{name} must come from the environment, written as '${{VAR}}' (e.g. '${{CDC_{name.upper()}}}'); "
                              "credentials are never kept in the config file")
        if m.group(1) not in environ:
            raise ConfigError(f"{entry}.{name} refers to ${{{m.group(1)}}}, which is not set in the environment; export it before starting")
        return environ[m.group(1)]

    if user is None:
        return SchemaRegistryConfig(url=url.strip().rstrip("/"))
    return SchemaRegistryConfig(url=url.strip().rstrip("/"), user=secret("schema_registry_user", user),
                                password=secret("schema_registry_password", password))


def _starting_offsets(value: Any, entry: str) -> str:
    """"earliest", "latest", or per-partition offsets (a mapping, or its JSON) as Spark's JSON text."""
    if value in ("earliest", "latest"):
        return str(value)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = None
    ok = isinstance(value, dict) and value and all(
        isinstance(t, str) and isinstance(parts, dict) and parts
        and all(str(p).isdigit() and isinstance(o, int) and not isinstance(o, bool) and o >= -2 for p, o in parts.items())
        for t, parts in value.items()
    )
    if not ok:
        raise ConfigError(
            f"{entry}.starting_offsets must be earliest, latest, or offsets per topic and partition such as "
            "{orders: {'0': 42}} (-2 earliest, -1 latest); it applies only when the stream starts without a checkpoint"
        )
    return json.dumps({t: {str(p): o for p, o in parts.items()} for t, parts in value.items()}, sort_keys=True)


def _expand_env(value: str, entry: str, environ: Mapping[str, str]) -> str:
    """`${NAME}` from the environment, so secrets (passwords, JAAS configs) stay out of the config file."""

    def sub(m: re.Match[str]) -> str:
        if m.group(1) not in environ:
            raise ConfigError(f"{entry} refers to ${{{m.group(1)}}}, which is not set in the environment; export it before starting")
        return environ[m.group(1)]

    return _ENV_REF_RE.sub(sub, value)
