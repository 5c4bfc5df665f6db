"""How the platform asks the source's Debezium connector to re-read rows: the `repair:` settings of cdc.yaml, and
the two channels Debezium listens on for signals.

* The signalling table (`signal.data.collection`, Debezium's *source* channel): a row inserted into it in the
  source database, through `source_connection` (its user needs INSERT on that table). The connector reads it
  from the database's log like any change, so the table must be captured (in `table.include.list`, and for
  PostgreSQL in the publication).
* A Kafka signal topic (`signal.kafka.topic`, the *kafka* channel): a record keyed by the connector's
  `topic.prefix`, its value `{"id", "type", "data"}`, produced with confluent-kafka (librdkafka).

Either way an incremental snapshot writes its watermarks into the signalling table, so the connector needs
`signal.data.collection` set whichever channel carries the request (Debezium's documentation, "Incremental
snapshots"). A channel that cannot be used (no such table, no privilege, a broker that does not answer) is a
`SignalChannelError` saying which and what to check; nothing is half-sent from one repair's signals to a table
(one transaction), while a Kafka producer may have delivered the first signals of a repair that then failed
(the error says how many).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdc_platform.errors import CdcError, ConfigError
from cdc_platform.sources.source_connection import SourceConnection, SourceConnectionError, column_types, connect, quote, split_name

CHANNELS = ("source", "kafka")
SIGNAL_TYPE = "execute-snapshot"
_KEYS = {"channel", "signal_table", "signal_topic", "topic_prefix", "bootstrap_servers", "kafka_options", "max_keys",
         "max_repairs_per_hour", "keys_per_signal", "max_signal_chars", "wait", "poll", "auto", "remove_absent"}
_TABLE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_$\-]{0,127}(\.[A-Za-z0-9_][A-Za-z0-9_$\-]{0,127})?$")
_ENV_REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Columns Debezium's signalling table has (`id`, `type`, `data`), in this order.
SIGNAL_COLUMNS = ("id", "type", "data")


class SignalChannelError(CdcError):
    """The signal channel the config names cannot be used; the message says which and what to check."""


@dataclass(frozen=True)
class RepairConfig:
    """`repair:` of cdc.yaml: where signals go, and the bounds of one repair."""

    channel: str | None = None  # "source" | "kafka"; None: no channel, a repair only says what to do
    signal_table: str | None = None  # the connector's signal.data.collection, as `schema.table` / `db.table`
    signal_topic: str | None = None  # the connector's signal.kafka.topic
    topic_prefix: str | None = None  # the connector's topic.prefix: the Kafka signal's key
    bootstrap_servers: str | None = None  # for signal_topic; default: the Kafka source's
    kafka_options: tuple[tuple[str, str], ...] = ()  # librdkafka settings for the producer (security), `${VAR}`s expanded
    max_keys: int = 1_000  # keys one repair asks for at most
    max_repairs_per_hour: int = 4  # per table, counted in the lake's `source_repairs`
    keys_per_signal: int = 1_000
    max_signal_chars: int = 60_000  # and the signalling table's `data` column, when that is shorter
    wait: float = 600.0  # seconds a repair waits for its rows to land
    poll: float = 5.0  # seconds between looks at the lake while it waits
    auto: bool = False  # the scheduled coverage check repairs what it finds, within the bounds
    remove_absent: bool = False  # also tombstone lake rows the source no longer has (the backfill path)

    def describe(self) -> str:
        if self.channel == "source":
            return f"signalling table {self.signal_table}"
        if self.channel == "kafka":
            return f"Kafka topic {self.signal_topic} at {self.bootstrap_servers} (key {self.topic_prefix})"
        return "no signal channel"


def _positive(raw: Mapping[str, Any], name: str, default: float, entry: str, *, integer: bool) -> Any:
    value = raw.get(name, default)
    kinds = (int,) if integer else (int, float)
    if not isinstance(value, kinds) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{entry}.{name} must be a positive {'integer' if integer else 'number'}, got {value!r}")
    return int(value) if integer else float(value)


def parse_repair(value: Any, where: str, kafka_bootstrap: str | None = None, environ: Mapping[str, str] | None = None) -> RepairConfig:
    """`repair:` of cdc.yaml (absent: no channel, default bounds). `kafka_bootstrap` is the Kafka source's servers."""
    env = os.environ if environ is None else environ
    entry = f"{where}: repair"
    if value is None:
        return RepairConfig()
    if not isinstance(value, dict):
        raise ConfigError(f"{entry} must be a mapping such as {{signal_table: public.debezium_signal}}")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise ConfigError(f"{entry}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(_KEYS))}")
    table, topic = value.get("signal_table"), value.get("signal_topic")
    if table is not None and (not isinstance(table, str) or not _TABLE_RE.match(table)):
        raise ConfigError(f"{entry}.signal_table must name the connector's signal.data.collection as 'schema.table' "
                          f"(PostgreSQL) or 'database.table' (MariaDB/MySQL), got {table!r}")
    if topic is not None and (not isinstance(topic, str) or not re.match(r"^[A-Za-z0-9._\-]{1,249}$", topic)):
        raise ConfigError(f"{entry}.signal_topic must be a Kafka topic name, got {topic!r}")
    channel = value.get("channel")
    if channel is None:
        if table is not None and topic is not None:
            raise ConfigError(f"{entry} names both a signal_table and a signal_topic: set `channel: source` or `channel: kafka`")
        channel = "source" if table is not None else "kafka" if topic is not None else None
    elif channel not in CHANNELS:
        raise ConfigError(f"{entry}.channel must be one of {', '.join(CHANNELS)}, got {channel!r}")
    if channel == "source" and table is None:
        raise ConfigError(f"{entry}.channel is source, which needs signal_table (the connector's signal.data.collection)")
    prefix, servers, options = value.get("topic_prefix"), value.get("bootstrap_servers", kafka_bootstrap), {}
    if channel == "kafka":
        if topic is None:
            raise ConfigError(f"{entry}.channel is kafka, which needs signal_topic (the connector's signal.kafka.topic)")
        if not isinstance(prefix, str) or not prefix:
            raise ConfigError(f"{entry}.topic_prefix is required with signal_topic: the connector's topic.prefix, the key "
                              "Debezium expects on its signals")
        if isinstance(servers, (list, tuple)):
            servers = ",".join(str(s) for s in servers)
        if not isinstance(servers, str) or not servers:
            raise ConfigError(f"{entry}.bootstrap_servers is required with signal_topic when the source is not Kafka")
        raw_options = value.get("kafka_options") or {}
        if not isinstance(raw_options, dict):
            raise ConfigError(f"{entry}.kafka_options must be a mapping of librdkafka settings")
        for k, v in raw_options.items():
            def sub(m: re.Match[str], k: Any = k) -> str:
                if m.group(1) not in env:
                    raise ConfigError(f"{entry}.kafka_options.{k} refers to ${{{m.group(1)}}}, which is not set in the environment")
                return env[m.group(1)]

            options[str(k)] = _ENV_REF_RE.sub(sub, str(v))
    flags = {}
    for name in ("auto", "remove_absent"):
        flags[name] = value.get(name, False)
        if not isinstance(flags[name], bool):
            raise ConfigError(f"{entry}.{name} must be true or false, got {flags[name]!r}")
    return RepairConfig(
        channel=channel, signal_table=table, signal_topic=topic, topic_prefix=prefix if channel == "kafka" else None,
        bootstrap_servers=servers if channel == "kafka" else None, kafka_options=tuple(sorted(options.items())),
        max_keys=_positive(value, "max_keys", 1_000, entry, integer=True),
        max_repairs_per_hour=_positive(value, "max_repairs_per_hour", 4, entry, integer=True),
        keys_per_signal=_positive(value, "keys_per_signal", 1_000, entry, integer=True),
        max_signal_chars=_positive(value, "max_signal_chars", 60_000, entry, integer=True),
        wait=_positive(value, "wait", 600.0, entry, integer=False), poll=_positive(value, "poll", 5.0, entry, integer=False),
        **flags,
    )


def signal_table_limit(connection: SourceConnection, repair: RepairConfig) -> int | None:
    """How many characters the signalling table's `data` column holds (None: unbounded, as `text` is); raises
    `SignalChannelError` when the table is not there with Debezium's columns."""
    assert repair.signal_table is not None
    try:
        columns = column_types(connection, repair.signal_table)
    except SourceConnectionError as e:
        raise SignalChannelError(f"the signalling table {repair.signal_table} cannot be read: {e}") from e
    missing = [c for c in SIGNAL_COLUMNS if c not in columns]
    if missing:
        what = "does not exist (or is not visible to the source_connection user)" if not columns else f"has no column(s) {', '.join(missing)}"
        raise SignalChannelError(f"the signalling table {repair.signal_table} on {connection.describe()} {what}; create it as "
                                 "Debezium documents (id varchar(42) primary key, type varchar(32) not null, data text) and set the "
                                 "connector's signal.data.collection to it")
    schema, table = split_name(repair.signal_table, connection.kind, connection.database)
    with connect(connection) as c, c.cursor() as cur:
        cur.execute("SELECT character_maximum_length FROM information_schema.columns WHERE table_schema = %s AND table_name = %s "
                    "AND column_name = 'data'", (schema, table))
        row = cur.fetchone()
        c.rollback()
    limit = None if row is None or row[0] is None else int(row[0])
    return limit if limit is None or limit < 2**31 - 1 else None


def send_to_table(connection: SourceConnection, repair: RepairConfig, signals: Sequence[tuple[str, str]]) -> None:
    """Insert each (id, data text) as an `execute-snapshot` row of the signalling table, all in one transaction."""
    assert repair.signal_table is not None
    schema, table = split_name(repair.signal_table, connection.kind, connection.database)
    name = f"{quote(schema, connection.kind)}.{quote(table, connection.kind)}"
    columns = ", ".join(quote(c, connection.kind) for c in SIGNAL_COLUMNS)
    try:
        with connect(connection, read_only=False) as c:
            with c.cursor() as cur:
                for signal_id, data in signals:
                    cur.execute(f"INSERT INTO {name} ({columns}) VALUES (%s, %s, %s)", (signal_id, SIGNAL_TYPE, data))
            c.commit()
    except SourceConnectionError as e:
        raise SignalChannelError(f"the signalling table {repair.signal_table} cannot be written: {e}") from e
    except Exception as e:  # the driver's own errors: no privilege, no table, a value too long
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SignalChannelError(f"the signalling table {repair.signal_table} on {connection.describe()} cannot be written: {first}; "
                                 "the source_connection user needs INSERT on it (nothing of this repair was sent)") from e


def send_to_kafka(repair: RepairConfig, signals: Sequence[tuple[str, str]], timeout: float = 30.0) -> None:
    """Produce each (id, data text) to the signal topic, keyed by the connector's topic prefix, and wait for delivery."""
    try:
        from confluent_kafka import KafkaException, Producer
    except ImportError as e:
        raise SignalChannelError("the Kafka signal channel needs confluent-kafka: pip install 'cdc-platform[sources]'") from e
    assert repair.signal_topic is not None and repair.bootstrap_servers is not None
    failures: list[str] = []

    def delivered(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    where = f"the Kafka signal topic {repair.signal_topic} at {repair.bootstrap_servers}"
    settings = {"bootstrap.servers": repair.bootstrap_servers, "message.timeout.ms": int(timeout * 1000),
                "socket.connection.setup.timeout.ms": int(min(timeout, 10) * 1000), "log_level": 3, "enable.idempotence": True,
                **dict(repair.kafka_options)}
    try:
        producer = Producer(settings)
        for signal_id, data in signals:
            value = json.dumps({"id": signal_id, "type": SIGNAL_TYPE, "data": json.loads(data)}, ensure_ascii=False)
            producer.produce(repair.signal_topic, key=repair.topic_prefix, value=value.encode("utf-8"), on_delivery=delivered)
        left = producer.flush(timeout + 5)
    except (KafkaException, BufferError, ValueError) as e:
        raise SignalChannelError(f"{where} cannot be written: {e}; check repair.bootstrap_servers and repair.kafka_options") from e
    if failures or left:
        sent = len(signals) - len(failures) - left
        cause = failures[0] if failures else f"{left} signal(s) still undelivered after {timeout:g} s"
        raise SignalChannelError(f"{where} cannot be written: {cause}; {max(sent, 0)} of {len(signals)} signal(s) were delivered; "
                                 "check that the broker answers and the topic exists (or may be created)")


def send(connection: SourceConnection | None, repair: RepairConfig, signals: Sequence[tuple[str, str]]) -> None:
    """Send `signals` (id, data text) on the configured channel."""
    if repair.channel == "source":
        if connection is None:
            raise SignalChannelError("repair.signal_table is written through source_connection, which the config does not set")
        send_to_table(connection, repair, signals)
    elif repair.channel == "kafka":
        send_to_kafka(repair, signals)
    else:
        raise SignalChannelError("no signal channel is configured (repair.signal_table or repair.signal_topic)")
