"""Apache Kafka broker (KRaft, one node acting as broker and controller) and Kafka Connect (distributed
mode, JSON converter with schemas by default, Debezium's connectors and Apicurio's Avro converter on its
plugin path), both from the jars that
`install.ensure_jars` resolved; plus a Connect REST client and a small consumer for tests."""

from __future__ import annotations

import base64
import json
import os
import shlex
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_platform.testbed import install
from cdc_platform.testbed.errors import TestbedError
from cdc_platform.testbed.process import HOST, Service, port_open, run

JVM_FLAGS = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
#: Extra JVM options for the broker and Connect. The default, C1 only, halves their start (measured: bed
#: up in ~10 s instead of ~18 s on 2 cores); a benchmark of steady throughput sets it to "" (full JIT).
JVM_OPTS_ENV = "CDC_TESTBED_JVM_OPTS"
DEFAULT_JVM_OPTS = "-XX:TieredStopAtLevel=1"

LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.console.ref = STDOUT
logger.kafka.name = org.apache.kafka
logger.kafka.level = WARN
logger.kafkaroot.name = kafka
logger.kafkaroot.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.connect.name = org.apache.kafka.connect
logger.connect.level = INFO
logger.reflections.name = org.reflections
logger.reflections.level = ERROR
logger.debezium.name = io.debezium
logger.debezium.level = INFO
"""


def _classpath() -> str:
    return f"{install.KAFKA_LIBS}/*"


def _java(java: str, log4j: Path, main: str, *args: str) -> list[str]:
    extra = shlex.split(os.environ.get(JVM_OPTS_ENV, DEFAULT_JVM_OPTS))
    return [java, *JVM_FLAGS, *extra, f"-Dlog4j2.configurationFile={log4j}", "-cp", _classpath(), main, *args]


def _properties(path: Path, values: dict[str, Any]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()), encoding="utf-8")


def new_cluster_id() -> str:
    """A KRaft cluster id (url-safe base64 of a random UUID) that never starts with "-": the storage tool's
    argument parser takes `-t -T05A...` for two options and the format fails (1 start in 64 did, in CI's
    replica). Kafka's own `Uuid.randomUuid()` draws again for the same reason."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


@dataclass
class Broker:
    """One KRaft node (broker + controller) on loopback."""

    root: Path
    port: int
    controller_port: int
    java: str = "java"
    service: Service | None = None

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    def prepare(self) -> None:
        """Write the config and format the storage directory (a JVM run of Kafka's StorageTool)."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "log4j2.properties").write_text(LOG4J2, encoding="utf-8")
        _properties(
            self.root / "server.properties",
            {
                "process.roles": "broker,controller",
                "node.id": 1,
                "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
                "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
                "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "log.dirs": self.root / "data",
                "num.partitions": 1,
                "auto.create.topics.enable": "true",
                "offsets.topic.replication.factor": 1,
                "offsets.topic.num.partitions": 1,
                "transaction.state.log.replication.factor": 1,
                "transaction.state.log.min.isr": 1,
                "transaction.state.log.num.partitions": 1,
                "share.coordinator.state.topic.replication.factor": 1,
                "share.coordinator.state.topic.min.isr": 1,
                "group.initial.rebalance.delay.ms": 0,
                "num.network.threads": 2,
                "num.io.threads": 2,
                "log.retention.hours": -1,
            },
        )
        cluster_id = new_cluster_id()
        run(
            _java(self.java, self.root / "log4j2.properties", "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(self.root / "server.properties")),
            self.root / "format.log",
            what="formatting the Kafka broker's storage",
            timeout=120,
        )

    def launch(self, die_with_parent: bool = True) -> None:
        self.service = Service("kafka broker", self.root / "broker.log")
        self.service.launch(
            _java(self.java, self.root / "log4j2.properties", "kafka.Kafka", str(self.root / "server.properties")),
            die_with_parent=die_with_parent,
        )

    def healthy(self) -> bool:
        """Port open and a metadata request answered with this broker in it."""
        if not port_open(self.port):
            return False
        from confluent_kafka.admin import AdminClient

        meta = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 3000}).list_topics(timeout=3)
        return 1 in meta.brokers

    def wait_ready(self, timeout: float = 90.0) -> None:
        assert self.service is not None
        self.service.wait_until(self.healthy, "waiting for the broker to answer a metadata request", timeout)

    def topics(self) -> set[str]:
        from confluent_kafka.admin import AdminClient

        return set(AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=10).topics)


@dataclass
class Connect:
    """A Kafka Connect worker in distributed mode (configs, offsets and status in Kafka topics)."""

    root: Path
    port: int
    bootstrap: str
    java: str = "java"
    group: str = "cdc-testbed-connect"
    service: Service | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "log4j2.properties").write_text(LOG4J2, encoding="utf-8")
        _properties(
            self.root / "connect.properties",
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "key.converter": "org.apache.kafka.connect.json.JsonConverter",
                "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                "key.converter.schemas.enable": "true",
                "value.converter.schemas.enable": "true",
                "config.storage.topic": f"{self.group}-configs",
                "offset.storage.topic": f"{self.group}-offsets",
                "status.storage.topic": f"{self.group}-status",
                "config.storage.replication.factor": 1,
                "offset.storage.replication.factor": 1,
                "status.storage.replication.factor": 1,
                "offset.storage.partitions": 1,
                "status.storage.partitions": 1,
                "offset.flush.interval.ms": 1000,
                "listeners": f"http://{HOST}:{self.port}",
                "rest.advertised.host.name": HOST,
                "rest.advertised.port": self.port,
                "plugin.path": install.PLUGINS,
                # Debezium's jars declare their connectors for the ServiceLoader: no class-path scan.
                "plugin.discovery": "service_load",
                "scheduled.rebalance.max.delay.ms": 0,
                "topic.creation.enable": "true",
            },
        )

    def launch(self, die_with_parent: bool = True) -> None:
        self.service = Service("kafka connect", self.root / "connect.log")
        self.service.launch(
            _java(self.java, self.root / "log4j2.properties", "org.apache.kafka.connect.cli.ConnectDistributed", str(self.root / "connect.properties")),
            die_with_parent=die_with_parent,
        )

    # -- REST --------------------------------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, timeout: float = 30.0) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                return err.code, json.loads(raw) if raw else None
            except ValueError:
                return err.code, raw.decode(errors="replace")

    def plugins(self) -> set[str]:
        status, body = self.request("GET", "/connector-plugins", timeout=5)
        return {p["class"] for p in body} if status == 200 else set()

    def converters(self) -> set[str]:
        status, body = self.request("GET", "/connector-plugins?connectorsOnly=false", timeout=5)
        return {p["class"] for p in body if p.get("type") == "converter"} if status == 200 else set()

    def healthy(self) -> bool:
        """REST answers, the worker has joined its group (listing connectors works), both Debezium
        connectors are loaded and so is Apicurio's Avro converter."""
        if not port_open(self.port):
            return False
        status, _ = self.request("GET", "/connectors", timeout=5)
        return status == 200 and {POSTGRES_CONNECTOR, MARIADB_CONNECTOR} <= self.plugins() and AVRO_CONVERTER in self.converters()

    def wait_ready(self, timeout: float = 120.0) -> None:
        assert self.service is not None
        self.service.wait_until(self.healthy, "waiting for the REST API and the Debezium plugins", timeout)

    def status(self, name: str) -> dict[str, Any] | None:
        code, body = self.request("GET", f"/connectors/{name}/status", timeout=10)
        return body if code == 200 else None

    def register(self, name: str, config: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
        """Create (or reconfigure) connector `name` and wait until it and its tasks are RUNNING."""
        config = {k: str(v) for k, v in config.items()}
        deadline = time.monotonic() + timeout
        while True:
            code, body = self.request("PUT", f"/connectors/{name}/config", config)
            if code in (200, 201):
                break
            if code == 409 and time.monotonic() < deadline:  # rebalance in progress
                time.sleep(0.5)
                continue
            raise TestbedError(f"test bed: Connect refused connector {name!r}: HTTP {code}: {_message(body)}")
        return self.wait_running(name, max(1.0, deadline - time.monotonic()))

    def wait_running(self, name: str, timeout: float = 120.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        status: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            status = self.status(name)
            if status:
                states = [status["connector"]["state"], *(t["state"] for t in status.get("tasks", []))]
                failed = [t for t in [status["connector"], *status.get("tasks", [])] if t["state"] == "FAILED"]
                if failed:
                    trace = str(failed[0].get("trace", "")).strip().splitlines()
                    raise TestbedError(f"test bed: connector {name!r} FAILED: {trace[0] if trace else 'no trace'} (log: {self.root / 'connect.log'})")
                if status.get("tasks") and all(s == "RUNNING" for s in states):
                    return status
            time.sleep(0.3)
        raise TestbedError(f"test bed: connector {name!r} not RUNNING after {timeout:.0f} s: {status}")

    def delete(self, name: str) -> None:
        code, body = self.request("DELETE", f"/connectors/{name}")
        if code not in (200, 204, 404):
            raise TestbedError(f"test bed: could not delete connector {name!r}: HTTP {code}: {_message(body)}")


AVRO_CONVERTER = "io.apicurio.registry.utils.converter.AvroConverter"
POSTGRES_CONNECTOR = "io.debezium.connector.postgresql.PostgresConnector"
MARIADB_CONNECTOR = "io.debezium.connector.mariadb.MariaDbConnector"


def _message(body: Any) -> str:
    if isinstance(body, dict) and "message" in body:
        return str(body["message"]).splitlines()[0]
    return str(body)[:300]


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None

    def json_key(self) -> Any:
        return None if self.key is None else json.loads(self.key)

    def json_value(self) -> Any:
        return None if self.value is None else json.loads(self.value)

    def dump_line(self) -> str:
        """The record as the file-based pipeline reads a dumped Kafka record: {"key": …, "value": …}."""
        return json.dumps({"key": self.json_key(), "value": self.json_value()}, separators=(",", ":"))


def consume(
    bootstrap: str,
    topics: Iterable[str],
    until: Callable[[list[Record]], bool],
    timeout: float = 60.0,
) -> list[Record]:
    """Read `topics` from the beginning until `until(records)` holds; a timeout raises with what arrived.

    Topics that do not exist yet are waited for (a connector creates them on its first event). Records
    come once each, in offset order per partition: a rebalance (a subscribed topic appearing) makes the
    consumer fetch again from the start, and those repeats are dropped here."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"testbed-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 500,
            "allow.auto.create.topics": False,
        }
    )
    records: list[Record] = []
    seen: set[tuple[str, int, int]] = set()
    try:
        consumer.subscribe(list(topics))
        deadline = time.monotonic() + timeout
        while not until(records):
            if time.monotonic() > deadline:
                counts: dict[str, int] = {}
                for r in records:
                    counts[r.topic] = counts.get(r.topic, 0) + 1
                raise AssertionError(f"consume: condition not met after {timeout:.0f} s; records per topic: {counts}")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._PARTITION_EOF):
                    continue
                raise TestbedError(f"test bed: consumer error: {msg.error()}")
            where = (msg.topic(), msg.partition(), msg.offset())
            if where not in seen:
                seen.add(where)
                records.append(Record(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value()))
        return records
    finally:
        consumer.close()


def consume_all(bootstrap: str, topics: Iterable[str], timeout: float = 120.0) -> list[Record]:
    """Every record `topics` hold now: read until each partition's end offset, as it was when called."""
    from confluent_kafka import Consumer, TopicPartition

    topics = list(topics)
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}"})
    try:
        meta = probe.list_topics(timeout=10).topics
        ends_at = {(t, p): probe.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1] for t in topics for p in meta[t].partitions}
    finally:
        probe.close()

    def complete(records: list[Record]) -> bool:
        last: dict[tuple[str, int], int] = {}
        for r in records:
            last[(r.topic, r.partition)] = max(last.get((r.topic, r.partition), -1), r.offset)
        return all(last.get(tp, -1) >= end - 1 for tp, end in ends_at.items())

    return consume(bootstrap, topics, until=complete, timeout=timeout)
