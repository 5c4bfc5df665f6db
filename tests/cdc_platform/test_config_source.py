"""`source:` in cdc.yaml: files by default, or Kafka with Spark's connector options; bad entries fail at load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cdc_platform.config import load_config
from cdc_platform.config_source import DEFAULT_MAX_OFFSETS_PER_TRIGGER, parse_source
from cdc_platform.errors import ConfigError
from tests.cdc_platform.test_config import write


def test_files_is_the_default_and_unchanged(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "landing: landing\nlake: lake\n"))
    assert cfg.source.kind == "files" and cfg.source.kafka is None
    assert cfg.checkpoint_dir == (tmp_path / "conf" / "lake" / "_checkpoints" / "ingest").resolve()
    assert load_config(write(tmp_path, "landing: l\nlake: k\nsource: files\n")).source.kind == "files"
    assert load_config(write(tmp_path, "landing: l\nlake: k\nsource: {kind: files}\n")).source.kind == "files"


def test_kafka_source_with_a_pattern_and_pass_through_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_SECRET", "s3cret")
    cfg = load_config(write(tmp_path, r"""
lake: lake
source:
  kind: kafka
  bootstrap_servers: [127.0.0.1:9092, 127.0.0.1:9093]
  subscribe_pattern: 'pg\..*'
  starting_offsets: latest
  max_offsets_per_trigger: 500
  fail_on_data_loss: false
  options:
    kafka.security.protocol: SASL_PLAINTEXT
    kafka.sasl.mechanism: PLAIN
    kafka.sasl.jaas.config: 'org.apache.kafka.common.security.plain.PlainLoginModule required password="${KAFKA_SECRET}";'
    kafka.request.timeout.ms: 30000
"""))
    kafka = cfg.source.kafka
    assert cfg.source.kind == "kafka" and kafka is not None
    # No landing needed; the checkpoint is the Kafka stream's own.
    assert cfg.checkpoint_dir == (tmp_path / "conf" / "lake" / "_checkpoints" / "ingest_kafka").resolve()
    opts = kafka.spark_options()
    assert opts["kafka.bootstrap.servers"] == "127.0.0.1:9092,127.0.0.1:9093"
    assert opts["subscribePattern"] == r"pg\..*" and "subscribe" not in opts
    assert opts["startingOffsets"] == "latest" and opts["maxOffsetsPerTrigger"] == "500" and opts["failOnDataLoss"] == "false"
    assert opts["kafka.security.protocol"] == "SASL_PLAINTEXT" and opts["kafka.request.timeout.ms"] == "30000"
    assert 'password="s3cret"' in opts["kafka.sasl.jaas.config"], "${VAR} comes from the environment"
    assert "kafka" in cfg.describe_source() and "pg" in cfg.describe_source()


def test_kafka_topics_defaults_and_offsets_per_partition(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, """
lake: lake
source: {kind: kafka, bootstrap_servers: 'h:1', topics: [a.b, c], starting_offsets: {a.b: {0: 5, 1: -2}}}
"""))
    opts = cfg.source.kafka.spark_options()
    assert opts["subscribe"] == "a.b,c" and opts["failOnDataLoss"] == "true"
    assert opts["maxOffsetsPerTrigger"] == str(DEFAULT_MAX_OFFSETS_PER_TRIGGER)
    assert json.loads(opts["startingOffsets"]) == {"a.b": {"0": 5, "1": -2}}
    unlimited = parse_source({"kind": "kafka", "bootstrap_servers": "h:1", "topics": "t", "max_offsets_per_trigger": None}, "x")
    assert unlimited.kafka.topics == ("t",) and "maxOffsetsPerTrigger" not in unlimited.kafka.spark_options()
    assert "minPartitions" not in opts, "left to the stream, which asks for the session's cores"
    one_task = parse_source({"kind": "kafka", "bootstrap_servers": "h:1", "topics": "t", "min_partitions": 1}, "x")
    assert one_task.kafka.spark_options()["minPartitions"] == "1"


KAFKA = "lake: k\nsource:\n  kind: kafka\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lake: k\nsource: [kafka]\n", "`source` must be `files` or a mapping"),
        ("lake: k\nsource: {kind: pulsar}\n", "source.kind must be one of files, kafka"),
        ("landing: l\nlake: k\nsource: {kind: files, topics: [a]}\n", "source.topics applies to `kind: kafka` only"),
        ("lake: k\nsource: kafka\n", "bootstrap_servers must be host:port"),
        (KAFKA + "  bootstrap_servers: localhost\n  topics: [a]\n", "bootstrap_servers must be host:port"),
        (KAFKA + "  bootstrap_servers: h:1\n", "set exactly one of `topics: [names]` or `subscribe_pattern: REGEX`"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  subscribe_pattern: a.*\n", "set exactly one of"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: ['bad topic']\n", "source.topics must be a non-empty list of Kafka topic names"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: []\n", "source.topics must be a non-empty list"),
        (KAFKA + "  bootstrap_servers: h:1\n  subscribe_pattern: 'a(('\n", "is not a valid regular expression"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  starting_offsets: beginning\n", "starting_offsets must be earliest, latest"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  starting_offsets: {a: {x: 1}}\n", "starting_offsets must be earliest, latest"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  max_offsets_per_trigger: 0\n", "max_offsets_per_trigger must be a positive integer"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  fail_on_data_loss: maybe\n", "fail_on_data_loss must be true or false"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  min_partitions: 0\n", "min_partitions must be a positive integer"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  min_partitions: two\n", "min_partitions must be a positive integer"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  kafka.security.protocol: SSL\n",
         "unknown key(s) kafka.security.protocol (pass Kafka consumer settings under `options:`"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  options: {security.protocol: SSL}\n", "named `kafka.<setting>`"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  options: {kafka.auto.offset.reset: earliest}\n", "set `starting_offsets:` instead"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  options: {kafka.bootstrap.servers: 'h:2'}\n", "set `bootstrap_servers:` instead"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  options: {kafka.sasl.jaas.config: '${CDC_TEST_UNSET_VAR}'}\n",
         "refers to ${CDC_TEST_UNSET_VAR}, which is not set in the environment"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  options: {kafka.x: [1]}\n", "must be a string or number"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  format: protobuf\n", "source.format must be one of json, avro"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  format: avro\n", "schema_registry_url is required with `format: avro`"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  format: avro\n  schema_registry_url: registry:8081\n",
         "schema_registry_url is required with `format: avro`"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  schema_registry_url: http://r:1\n",
         "source.schema_registry_url applies to `format: avro` only"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  format: avro\n  schema_registry_url: http://r:1\n  schema_registry_user: u\n",
         "set both schema_registry_user and schema_registry_password"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  format: avro\n  schema_registry_url: http://r:1\n"
                 "  schema_registry_user: cdc\n  schema_registry_password: hunter2\n",
         "schema_registry_user must come from the environment, written as '${VAR}'"),
        (KAFKA + "  bootstrap_servers: h:1\n  topics: [a]\n  format: avro\n  schema_registry_url: http://r:1\n"
                 "  schema_registry_user: '${CDC_TEST_UNSET_VAR}'\n  schema_registry_password: '${CDC_TEST_UNSET_VAR}'\n",
         "schema_registry_user refers to ${CDC_TEST_UNSET_VAR}, which is not set"),
    ],
)
def test_bad_source_config_names_the_entry_and_the_fix(tmp_path: Path, text: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CDC_TEST_UNSET_VAR", raising=False)
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert message in str(err.value)
    assert str(tmp_path / "conf" / "cdc.yaml") in str(err.value), "the message names the file"


def test_avro_with_a_schema_registry_and_credentials_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REG_USER", "cdc")
    monkeypatch.setenv("REG_PASSWORD", "s3cret")
    cfg = load_config(write(tmp_path, """
lake: lake
source:
  kind: kafka
  bootstrap_servers: h:1
  topics: [pg.public.accounts]
  format: avro
  schema_registry_url: http://127.0.0.1:8080/apis/ccompat/v7/
  schema_registry_user: ${REG_USER}
  schema_registry_password: ${REG_PASSWORD}
"""))
    kafka = cfg.source.kafka
    assert kafka.format == "avro"
    assert (kafka.schema_registry.url, kafka.schema_registry.user, kafka.schema_registry.password) == (
        "http://127.0.0.1:8080/apis/ccompat/v7", "cdc", "s3cret")
    assert "s3cret" not in repr(cfg) and "avro with http://127.0.0.1:8080/apis/ccompat/v7" in cfg.describe_source()
    assert not any("registry" in name for name in kafka.spark_options()), "nothing of it reaches Spark's Kafka options"
    plain = parse_source({"kind": "kafka", "bootstrap_servers": "h:1", "topics": ["t"]}, "x")
    assert plain.kafka.format == "json" and plain.kafka.schema_registry is None


def test_a_files_source_still_needs_its_landing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no landing directory"):
        load_config(write(tmp_path, "lake: k\n"))
