"""Avro from Kafka against JSON from Kafka: the same change events, `cdc run` over each, in one process.

The test bed (`cdc_platform.testbed`) runs two Debezium PostgreSQL connectors over one table with the
same topic prefix: one with Kafka Connect's JSON converter (`schemas.enable=true`), one with Apicurio's
Avro converter writing to the bed's schema registry, its records routed to `avro.<topic>`. A writer
commits `--events` row changes (inserts, then an update of each row, in transactions of `--tx-rows`);
once both topics hold every record, `IngestJob(config).run_available_now(spark)` (what `cdc run` does)
reads each into a fresh lake, the two alternating (`--repeat`: json avro, avro json, json avro ..., so
neither format always runs warmer), and the rates are printed side by side with the load average. The first
`--warmup` runs of each format are printed but left out of the medians compared at the end: the first run of
a session pays the JVM's warm-up (its JIT, Janino's classes), which fell on JSON alone before. Before
the runs, the Avro topic's records are decoded alone (the registry
lookups, `from_avro` and the JSON text the parser reads; no parse, no writes) to show what decoding
costs apart from the rest, once learning the batch's ids first and once with the topic's subjects read
up front (what a stream does); each run prints how many of its batches were decoded twice.

    .venv/bin/python benchmarks/avro_vs_json.py                     # 100,000 change events, once each
    .venv/bin/python benchmarks/avro_vs_json.py --events 20000      # quick look
    .venv/bin/python benchmarks/avro_vs_json.py --events 200000 --repeat 4   # four of each after the warm-up
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import yaml
from _common import OUT, alternating, banner, exit_now, fresh_dir, load_average, say

PREFIX = "bench"
TABLE = "bench_rows"
DDL = f"""create table {TABLE} (id bigint primary key, name text not null, amount numeric(12,2), at timestamptz,
          doc jsonb, ref uuid, flag boolean)"""


def write_changes(bed: Any, events: int, tx_rows: int) -> int:
    """`events` row changes: half inserts, then an update of each inserted row; returns the change count."""
    rows = max(1, events // 2)
    with bed.postgres.connect(autocommit=False) as conn:
        for start in range(1, rows + 1, tx_rows):
            end = min(rows, start + tx_rows - 1)
            conn.execute(f"insert into {TABLE} select g, 'name ' || g, g * 1.01, now(), jsonb_build_object('g', g, 'tags', "
                         f"jsonb_build_array('a', 'b')), md5(g::text)::uuid, g % 2 = 0 from generate_series({start}, {end}) g")
            conn.commit()
        for start in range(1, rows + 1, tx_rows):
            conn.execute(f"update {TABLE} set amount = amount + 1, flag = not flag where id between {start} and {start + tx_rows - 1}")
            conn.commit()
    return rows * 2


def high_watermark(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-watermarks"})
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in meta.partitions)
    finally:
        consumer.close()


def wait_for(bootstrap: str, topics: list[str], count: int, timeout: float) -> float:
    t0 = time.monotonic()
    while any(high_watermark(bootstrap, t) < count for t in topics):
        if time.monotonic() - t0 > timeout:
            have = {t: high_watermark(bootstrap, t) for t in topics}
            raise SystemExit(f"the connectors wrote {have} records after {timeout:.0f} s, expected {count} each")
        time.sleep(1.0)
    return time.monotonic() - t0


def lake_config(root: Path, bed: Any, topics: list[str], avro: bool) -> Any:
    from cdc_platform.config import load_config

    source: dict[str, Any] = {"kind": "kafka", "bootstrap_servers": bed.broker.bootstrap, "topics": topics}
    if avro:
        source |= {"format": "avro", "schema_registry_url": bed.registry.url}
    fresh_dir(root)
    (root / "cdc.yaml").write_text(yaml.safe_dump({"lake": "lake", "source": source, "tables": {f"public.{TABLE}": {"key": ["id"]}}}),
                                   encoding="utf-8")
    return load_config(root / "cdc.yaml")


def decode_only(spark: Any, bed: Any, topic: str, *, known: bool = False) -> tuple[float, float, int]:
    """Seconds to learn the batch's schema ids (the records read and held, their ids collected, the registry asked)
    and then to turn the records into lines (`from_avro`, the text), and the characters made; read as the stream
    reads (as many tasks as cores). `known`: the topic's subjects are read first (as a stream does), so there
    are no ids to learn and the first figure is the subjects' requests and the planning."""
    from cdc_platform.sources.avro_decode import AvroLines, subjects_of
    from cdc_platform.sources.schema_registry import SchemaRegistry
    from cdc_platform.sources.streams import default_parallelism
    from pyspark.sql import functions as F

    records = (spark.read.format("kafka").option("kafka.bootstrap.servers", bed.broker.bootstrap).option("subscribe", topic)
               .option("startingOffsets", "earliest").option("minPartitions", str(default_parallelism(spark))).load()
               .select("value", F.lit("x").alias("source_file"), F.col("key").alias("kafka_key")))
    t0 = time.perf_counter()
    decode = AvroLines(SchemaRegistry(bed.registry.url), subjects_of([topic]) if known else ())
    lines = decode(records)
    t1 = time.perf_counter()
    n = lines.where(F.col("reject_code").isNull() & F.col("value").isNotNull()).agg(F.sum(F.length("value"))).collect()[0][0] or 0
    decode.release()
    return t1 - t0, time.perf_counter() - t1, int(n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=100_000, help="row changes written (half inserts, half updates)")
    parser.add_argument("--tx-rows", type=int, default=500, help="rows per source transaction")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each format, alternating, after the warm-up")
    parser.add_argument("--warmup", type=int, default=1, help="runs of each format before, left out of the medians")
    parser.add_argument("--jfr", type=Path, help="record the Spark JVM with Java Flight Recorder into this folder "
                                                 "(benchmarks/jfr_summary.py reads it; the test bed's JVMs are not recorded)")
    parser.add_argument("--save-records", type=Path, help="also write both topics' records (key, value, topic, partition, offset) "
                                                          "as Parquet into this folder, to measure the decode and parse without the bed")
    args = parser.parse_args()

    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.spark.session import get_spark
    from cdc_platform.testbed import Stack

    banner(f"Avro vs JSON from Kafka: {args.events:,} change events")
    root = OUT / "avro_vs_json"
    fresh_dir(root)
    bed = Stack.start(root / "bed")
    try:
        with bed.postgres.connect() as conn:
            conn.execute(DDL)
        json_connector = bed.postgres_connector(PREFIX, [f"public.{TABLE}"], snapshot_mode="no_data")
        avro_connector = {
            **json_connector, **bed.registry.avro_converter_config(), "slot.name": f"{PREFIX}_avro_slot",
            "publication.name": f"{PREFIX}_avro_pub", "custom.metric.tags": "converter=avro",
            "transforms": "route", "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
            "transforms.route.regex": "(.*)", "transforms.route.replacement": "avro.$1",
        }
        for name, connector in (("bench-json", json_connector), ("bench-avro", avro_connector)):
            bed.connect.register(name, connector)
            bed.wait_streaming(connector)
        t0 = time.monotonic()
        changes = write_changes(bed, args.events, args.tx_rows)
        json_topic, avro_topic = f"{PREFIX}.public.{TABLE}", f"avro.{PREFIX}.public.{TABLE}"
        waited = wait_for(bed.broker.bootstrap, [json_topic, avro_topic], changes, timeout=1800)
        say(f"written: {changes:,} change events in {time.monotonic() - t0:.0f} s (connectors caught up {waited:.0f} s after the writer)")
        sizes = {t: high_watermark(bed.broker.bootstrap, t) for t in (json_topic, avro_topic)}

        if args.jfr:  # only the JVM PySpark starts from here on (the bed's JVMs are running already)
            args.jfr.mkdir(parents=True, exist_ok=True)
            os.environ["JDK_JAVA_OPTIONS"] = (f"-XX:StartFlightRecording:settings=profile,filename={args.jfr.resolve()}/ "
                                              "-XX:FlightRecorderOptions:stackdepth=256")
        spark = get_spark()
        if args.save_records:
            for topic in (json_topic, avro_topic):
                (spark.read.format("kafka").option("kafka.bootstrap.servers", bed.broker.bootstrap).option("subscribe", topic)
                 .option("startingOffsets", "earliest").load().select("key", "value", "topic", "partition", "offset", "timestamp")
                 .write.mode("overwrite").parquet(str(args.save_records.resolve() / topic)))
        decode_only(spark, bed, avro_topic)  # warm-up: the first jobs of a session compile and load classes
        ids, made, chars = decode_only(spark, bed, avro_topic)
        say(f"decode only, after a warm-up (Avro -> the JSON converter's text, {chars / 1e6:,.0f} M chars): {ids + made:.1f} s "
            f"(the ids {ids:.1f} s, the text {made:.1f} s), {changes / (ids + made):,.0f} records/s   [{load_average()}]")
        ids, made, chars = decode_only(spark, bed, avro_topic, known=True)
        say(f"decode only, the topic's subjects read first (no ids to learn): {ids + made:.1f} s "
            f"(subjects and planning {ids:.1f} s, the text {made:.1f} s), {changes / (ids + made):,.0f} records/s   [{load_average()}]")

        rates: dict[str, list[float]] = {"json": [], "avro": []}
        order = alternating(["json", "avro"], args.warmup + args.repeat)
        for i, fmt in enumerate(order):
            counted = i >= 2 * args.warmup
            topics = [avro_topic, f"avro.{PREFIX}.transaction"] if fmt == "avro" else [json_topic, f"{PREFIX}.transaction"]
            cfg = lake_config(root / f"{fmt}-{i}", bed, topics, avro=fmt == "avro")
            say(f"cdc run, {fmt}: starting at {time.strftime('%H:%M:%S')}")  # jfr_summary.py --after
            t = time.perf_counter()
            messages: list[str] = []
            report = IngestJob(cfg, progress=messages.append).run_available_now(spark)
            took = time.perf_counter() - t
            if counted:
                rates[fmt].append(changes / took)
            steps = ", ".join(f"{k} {v:.1f}" for k, v in sorted(report.stage_seconds().items(), key=lambda kv: -kv[1]) if v >= 0.05)
            again = sum("decoding the batch again" in m for m in messages)
            say(f"cdc run, {fmt}{'' if counted else ' (warm-up, not counted)'}: {took:.1f} s, {changes / took:,.0f} change events/s, {len(report.batches)} batches "
                f"({again} decoded twice), {report.total('rows_read'):,} records (steps, s: {steps})   [{load_average()}]")
        mid = {fmt: statistics.median(r) for fmt, r in rates.items()}
        best = {fmt: max(r) for fmt, r in rates.items()}
        say(f"median rates over {args.repeat} runs each: json {mid['json']:,.0f}/s, avro {mid['avro']:,.0f}/s "
            f"(avro/json {mid['avro'] / mid['json']:.2f}); best: json {best['json']:,.0f}/s, avro {best['avro']:,.0f}/s "
            f"(avro/json {best['avro'] / best['json']:.2f}); records on the topics: {sizes}")
    finally:
        bed.stop()
    return 0


if __name__ == "__main__":
    exit_now(main())
