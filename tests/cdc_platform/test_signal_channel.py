"""`repair:` in cdc.yaml, and a signal channel that cannot be used: each a clear error naming what to check."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform.config import load_config
from cdc_platform.errors import ConfigError
from cdc_platform.sources.signal_channel import RepairConfig, SignalChannelError, parse_repair, send, signal_table_limit
from cdc_platform.sources.source_connection import SourceConnection


def _config(tmp_path: Path, repair: Any, **extra: Any) -> Any:
    (tmp_path / "cdc.yaml").write_text(yaml.safe_dump({"landing": "landing", "lake": "lake", "repair": repair, **extra}), encoding="utf-8")
    return load_config(tmp_path / "cdc.yaml")


def test_repair_settings_load_with_their_defaults(tmp_path: Path) -> None:
    plain = _config(tmp_path, None)
    assert plain.repair == RepairConfig() and plain.repair.channel is None and plain.repair.describe() == "no signal channel"
    table = _config(tmp_path, {"signal_table": "public.debezium_signal", "max_keys": 50, "auto": True, "wait": 30}).repair
    assert (table.channel, table.signal_table, table.max_keys, table.auto, table.wait) == ("source", "public.debezium_signal", 50, True, 30.0)
    assert (table.max_repairs_per_hour, table.keys_per_signal, table.max_signal_chars, table.remove_absent) == (4, 1_000, 60_000, False)
    kafka = _config(tmp_path, {"signal_topic": "pg-signals", "topic_prefix": "pg"},
                    source={"kind": "kafka", "bootstrap_servers": "b1:9092,b2:9092", "topics": ["pg.public.t"]}).repair
    assert (kafka.channel, kafka.bootstrap_servers, kafka.topic_prefix) == ("kafka", "b1:9092,b2:9092", "pg")
    assert kafka.describe() == "Kafka topic pg-signals at b1:9092,b2:9092 (key pg)"


def test_the_environment_fills_kafka_options() -> None:
    repair = parse_repair({"signal_topic": "s", "topic_prefix": "pg", "bootstrap_servers": "b:1", "kafka_options": {"sasl.password": "${PW}"}},
                          "cdc.yaml", environ={"PW": "secret"})
    assert repair.kafka_options == (("sasl.password", "secret"),)
    with pytest.raises(ConfigError, match=r"kafka_options.sasl.password refers to \$\{PW\}"):
        parse_repair({"signal_topic": "s", "topic_prefix": "pg", "bootstrap_servers": "b:1", "kafka_options": {"sasl.password": "${PW}"}},
                     "cdc.yaml", environ={})


@pytest.mark.parametrize(("repair", "message"), [
    ({"signal_tabel": "x.y"}, "unknown key.*signal_tabel"),
    ({"signal_table": "a.b.c"}, "signal_table must name"),
    ({"signal_table": "x'; drop"}, "signal_table must name"),
    ({"signal_table": "a.b", "signal_topic": "t"}, "set `channel: source` or `channel: kafka`"),
    ({"channel": "jmx"}, "channel must be one of source, kafka"),
    ({"channel": "source"}, "needs signal_table"),
    ({"signal_topic": "t"}, "topic_prefix is required"),
    ({"signal_topic": "t", "topic_prefix": "pg"}, "bootstrap_servers is required"),
    ({"signal_table": "a.b", "max_keys": 0}, "max_keys must be a positive integer"),
    ({"signal_table": "a.b", "wait": "soon"}, "wait must be a positive number"),
    ({"signal_table": "a.b", "auto": "yes"}, "auto must be true or false"),
    ("yes", "must be a mapping"),
])
def test_a_wrong_repair_setting_is_refused_naming_it(repair: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_repair(repair, "cdc.yaml")


def test_no_configured_table_may_be_named_like_the_repair_log(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="reserved for a platform table"):
        _config(tmp_path, None, tables={"public.x": {"key": ["id"], "name": "source_repairs"}})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_kafka_signal_topic_nobody_serves_is_a_clear_error_in_bounded_time() -> None:
    repair = RepairConfig(channel="kafka", signal_topic="pg-signals", topic_prefix="pg", bootstrap_servers=f"127.0.0.1:{_closed_port()}")
    started = time.monotonic()
    with pytest.raises(SignalChannelError, match=r"the Kafka signal topic pg-signals at 127\.0\.0\.1:\d+ cannot be written: .*0 of 1 signal"):
        from cdc_platform.sources.signal_channel import send_to_kafka

        send_to_kafka(repair, [("id-1", '{"type":"incremental"}')], timeout=3)
    assert time.monotonic() - started < 30


def test_a_signalling_table_on_a_database_that_does_not_answer_is_a_clear_error() -> None:
    connection = SourceConnection("postgresql", "127.0.0.1", _closed_port(), "app", "u", "p", connect_timeout=2)
    repair = RepairConfig(channel="source", signal_table="public.debezium_signal")
    with pytest.raises(SignalChannelError, match=r"the signalling table public\.debezium_signal cannot be read: cannot read"):
        signal_table_limit(connection, repair)
    with pytest.raises(SignalChannelError, match=r"cannot be written: .*nothing of this repair was sent|cannot be written: cannot"):
        send(connection, repair, [("id-1", "{}")])
    with pytest.raises(SignalChannelError, match="no signal channel is configured"):
        send(connection, RepairConfig(), [("id-1", "{}")])
