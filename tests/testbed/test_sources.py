"""`sources.kafka_stream` against the test bed's real broker: the column contract the parser consumes,
tombstones, keys, origins, several partitions, and a topic matching the pattern created mid-stream."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from cdc_platform.config_source import KafkaSourceConfig
from cdc_platform.parse.envelope import KeySpec
from cdc_platform.parse.parsed_batches import parse_arrow_batches
from cdc_platform.lake.schemas import PARSED
from cdc_platform.sources.streams import KAFKA_COLUMNS, kafka_stream
from cdc_platform.testbed import Stack


def produce(bootstrap: str, topic: str, records: list[tuple[str | None, str | None, int]], partitions: int = 1) -> None:
    """(key, value, partition) records, flushed; the topic is created with `partitions` first."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic not in admin.list_topics(timeout=10).topics:
        for future in admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)]).values():
            future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value, partition in records:
        producer.produce(topic, key=None if key is None else key.encode(), value=None if value is None else value.encode(), partition=partition)
    assert producer.flush(30) == 0


def change(row_id: int, op: str = "c", lsn: int = 100) -> str:
    image = {"id": row_id, "v": f"v{row_id}"}
    return json.dumps({"before": image if op == "d" else None, "after": None if op == "d" else image, "op": op, "ts_ms": 1,
                       "source": {"connector": "postgresql", "schema": "public", "table": "t", "lsn": lsn, "ts_ms": 1_700_000_000_000}})


class Collect:
    """A foreachBatch sink that keeps each micro-batch as Arrow (what IngestJob.foreach_batch sees)."""

    def __init__(self) -> None:
        self.batches: list[pa.Table] = []

    def __call__(self, df: Any, batch_id: int) -> None:
        self.batches.append(df.toArrow())

    def rows(self) -> list[dict[str, Any]]:
        return [r for t in self.batches for r in t.to_pylist()]


def start(spark: Any, kafka: KafkaSourceConfig, checkpoint: Path, sink: Collect, available_now: bool) -> Any:
    writer = kafka_stream(spark, kafka).writeStream.foreachBatch(sink).option("checkpointLocation", str(checkpoint))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime="500 milliseconds")
    return writer.start()


def test_records_arrive_in_the_parsers_column_contract(testbed: Stack, spark: Any, tmp_path: Path) -> None:
    topic = f"src_{uuid.uuid4().hex[:8]}.public.t"
    key = lambda i: json.dumps({"schema": {"type": "struct"}, "payload": {"id": i}})  # noqa: E731
    produce(testbed.broker.bootstrap, topic, [
        (key(1), change(1), 0), (key(2), change(2), 1), (key(1), change(1, "d", 200), 0), (key(1), None, 0),
        (key(3), json.dumps({"before": None, "after": None, "op": "d", "ts_ms": 1,
                             "source": {"connector": "postgresql", "schema": "public", "table": "t", "lsn": 300, "ts_ms": 1}}), 1),
    ], partitions=2)
    sink = Collect()
    kafka = KafkaSourceConfig(bootstrap_servers=testbed.broker.bootstrap, topics=(topic,), max_offsets_per_trigger=2)
    query = start(spark, kafka, tmp_path / "ckpt", sink, available_now=True)
    query.awaitTermination(120)
    assert query.exception() is None
    assert len(sink.batches) >= 2, "max_offsets_per_trigger splits the topic into micro-batches"
    assert all(t.column_names == list(KAFKA_COLUMNS) for t in sink.batches)
    rows = sorted(sink.rows(), key=lambda r: (r["kafka_partition"], r["kafka_offset"]))
    assert [(r["kafka_partition"], r["kafka_offset"]) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    assert all(r["kafka_topic"] == topic and r["source_file"] == f"kafka:{topic}/{r['kafka_partition']}@{r['kafka_offset']}" for r in rows)
    assert rows[2]["value"] is None and rows[2]["kafka_key"] == key(1), "a tombstone: null value, its key kept"

    parsed = pa.Table.from_batches([b for t in sink.batches for b in parse_arrow_batches(iter(t.to_batches()), KeySpec({"public.t": ("id",)}))], PARSED)
    by_offset = {(r["kafka_partition"], r["kafka_offset"]): r for r in parsed.to_pylist()}
    assert by_offset[(0, 2)]["kind"] == "tombstone"
    assert by_offset[(1, 1)]["kind"] == "change" and by_offset[(1, 1)]["key"] == '{"id":3}', "the record key names a keyless delete's row"
    assert [by_offset[(p, o)]["key"] for p, o in [(0, 0), (0, 1), (1, 0)]] == ['{"id":1}', '{"id":1}', '{"id":2}']

    again = Collect()  # a restart on the same checkpoint reads nothing that was read
    query = start(spark, kafka, tmp_path / "ckpt", again, available_now=True)
    query.awaitTermination(120)
    assert again.rows() == []


def test_a_one_partition_topic_is_read_in_a_task_per_core_in_offset_order(testbed: Stack, spark: Any, tmp_path: Path) -> None:
    """A Debezium topic of one partition is still read (decoded, parsed) on every core: `minPartitions` cuts its
    offsets into consecutive ranges, so (Spark partition, row), the order the parser numbers lines in, is offset
    order; `min_partitions: 1` keeps one task."""
    from pyspark.sql import functions as F

    topic = f"one_{uuid.uuid4().hex[:8]}.public.t"
    produce(testbed.broker.bootstrap, topic, [(None, change(i, lsn=100 + i), 0) for i in range(40)])
    cores = spark.sparkContext.defaultParallelism
    assert cores >= 2, "the tests' session has two cores"
    seen: dict[int | None, list[tuple[int, list[int]]]] = {}

    def sink_for(setting: int | None) -> Callable[[Any, int], None]:
        def sink(df: Any, batch_id: int) -> None:
            rows = df.select(F.spark_partition_id().alias("task"), "kafka_offset", F.monotonically_increasing_id().alias("seq")).collect()
            order = [r["kafka_offset"] for r in sorted(rows, key=lambda r: r["seq"])]
            seen.setdefault(setting, []).append((len({r["task"] for r in rows}), order))
        return sink

    for setting in (None, 1):
        kafka = KafkaSourceConfig(bootstrap_servers=testbed.broker.bootstrap, topics=(topic,), min_partitions=setting)
        writer = kafka_stream(spark, kafka).writeStream.foreachBatch(sink_for(setting)).trigger(availableNow=True)
        query = writer.option("checkpointLocation", str(tmp_path / f"ckpt{setting}")).start()
        query.awaitTermination(120)
        assert query.exception() is None
    assert seen[None] == [(cores, list(range(40)))], "one task per core, the lines numbered in offset order"
    assert seen[1] == [(1, list(range(40)))]


def test_a_topic_created_after_the_start_is_read_without_a_restart(testbed: Stack, spark: Any, tmp_path: Path) -> None:
    prefix = f"pat_{uuid.uuid4().hex[:8]}"
    produce(testbed.broker.bootstrap, f"{prefix}.first", [(None, change(1), 0)])
    sink = Collect()
    kafka = KafkaSourceConfig(bootstrap_servers=testbed.broker.bootstrap, subscribe_pattern=rf"{prefix}\..*", starting_offsets="earliest")
    query = start(spark, kafka, tmp_path / "ckpt", sink, available_now=False)
    try:
        deadline = time.monotonic() + 90
        while not sink.rows() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert {r["kafka_topic"] for r in sink.rows()} == {f"{prefix}.first"}
        produce(testbed.broker.bootstrap, f"{prefix}.second", [(None, change(2), 0), (None, change(3), 0)])
        while len(sink.rows()) < 3 and time.monotonic() < deadline + 60:
            assert query.isActive, query.exception()
            time.sleep(0.5)
        topics = [r["kafka_topic"] for r in sink.rows()]
        assert sorted(topics) == [f"{prefix}.first", f"{prefix}.second", f"{prefix}.second"], "the new topic, from its first offset"
    finally:
        query.stop()


def test_a_restart_that_replays_an_uncommitted_batch_keeps_streaming(testbed: Stack, spark: Any, tmp_path: Path) -> None:
    """A batch planned but not committed (a crash, or a stop that refused it) is replayed from the offset log
    on restart, without the source's `latestOffset`. Spark's Kafka connector 4.1.1 and 4.1.2 then fail the
    stream in progress reporting (SPARK-55271), so every restart after a crash stopped again; jvm/pom.xml
    takes 4.1.3 for its fix."""
    topic = f"replay_{uuid.uuid4().hex[:8]}"
    produce(testbed.broker.bootstrap, topic, [(None, change(i), 0) for i in (1, 2, 3)])
    kafka = KafkaSourceConfig(bootstrap_servers=testbed.broker.bootstrap, topics=(topic,), starting_offsets="earliest")

    def crash(df: Any, batch_id: int) -> None:
        raise RuntimeError("the process dies inside the batch")

    query = start(spark, kafka, tmp_path / "ckpt", crash, available_now=False)  # type: ignore[arg-type]
    try:
        query.awaitTermination(120)
    except Exception:  # noqa: BLE001 - the crash is the point; the checkpoint now holds an uncommitted batch
        pass
    assert (tmp_path / "ckpt" / "offsets" / "0").exists() and not (tmp_path / "ckpt" / "commits" / "0").exists()

    sink = Collect()
    query = start(spark, kafka, tmp_path / "ckpt", sink, available_now=False)
    try:
        deadline = time.monotonic() + 90
        while len(sink.rows()) < 3:
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, "the replayed batch never arrived"
            time.sleep(0.5)
        produce(testbed.broker.bootstrap, topic, [(None, change(4), 0)])
        while len(sink.rows()) < 4:
            assert query.isActive, f"the stream stopped after the replay: {query.exception()}"
            assert time.monotonic() < deadline + 60, "the record after the replay never arrived"
            time.sleep(0.5)
        assert sorted(r["kafka_offset"] for r in sink.rows()) == [0, 1, 2, 3], "the replay read the batch once"
    finally:
        query.stop()
