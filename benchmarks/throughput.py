"""Throughput of `cdc run` against the physical limit of this machine, on one workload, in one process.

(a) the limit: Spark reads the landing files and writes them as plain Parquet (no parsing, no dedup,
    no merge); (b) the pipeline: `IngestJob(config).run_available_now(spark)`, exactly what `cdc run`
    does (raw log + every stage `ingest.default_stages()` finds at the time), over the same files.
Both use the same session (`get_spark()`), after one warm-up scan that fills the page cache and the
JIT, so the ratio (b)/(a) compares work, not start-up. A per-batch chart shows where (b) spends time.
Reference points put the ratio in perspective: Spark's own JSON parse plus one Parquet write (the
least any pipeline does per line), the unparsed lines collected to the driver (the least a pipeline
that commits from the driver, as delta-rs does, pays before parsing), the outputs' floor (the tables
`cdc run` writes, each written once by Spark's own functions from one parse: what this engine needs for
this product's outputs, before any guarantee), and the naive peer: foreachBatch with a delta-spark MERGE
of each batch into each latest-state table, as Delta's docs show it. The issue's target is `cdc run` at
half the parse-and-write reference's speed, and ahead of the naive peer.

    .venv/bin/python benchmarks/throughput.py                  # >= 1M change events (~2.5M lines)
    .venv/bin/python benchmarks/throughput.py --events 100000  # quick look
    .venv/bin/python benchmarks/throughput.py --parse-only     # the parsers alone: Python (one core, profiled), then JVM and Python in Spark
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import (
    OUT,
    CpuByRole,
    MemorySampler,
    TaskSampler,
    banner,
    exit_now,
    fresh_dir,
    load_average,
    cpu_line,
    memory_line,
    say,
    stage_names,
    transactions_for,
    workload,
)

from cdc_platform.config import DEFAULT_MAX_FILES_PER_TRIGGER  # the naive peer's batch too (benchmarks/README.md has the sweep)


def run_limit(spark: Any, landing: Path, target: Path) -> float:
    t0 = time.perf_counter()
    spark.read.option("recursiveFileLookup", "true").text(str(landing)).write.mode("overwrite").parquet(str(target))
    return time.perf_counter() - t0


def run_to_driver(spark: Any, landing: Path, files_per_batch: int) -> float:
    """Reference point: the same lines with their file names brought to the driver as Arrow, no parsing.

    In batches of the pipeline's size (one collect of everything would pass spark.driver.maxResultSize).
    Every driver-side writer (delta-rs here) pays at least this, so (a)/this bounds what the ratio can
    reach in this architecture before a single field is parsed or a single Delta commit is made.
    """
    from pyspark.sql import functions as F

    files = sorted(str(p) for p in landing.rglob("*") if p.is_file())
    t0 = time.perf_counter()
    for i in range(0, len(files), files_per_batch):
        lines = spark.read.text(files[i : i + files_per_batch])
        lines.select(F.col("value"), F.col("_metadata.file_path").alias("source_file")).toArrow()
    return time.perf_counter() - t0


#: The envelope's top-level fields; nested ones stay JSON text, as the raw log keeps before/after.
ENVELOPE_DDL = (
    "before STRING, after STRING, source STRING, op STRING, ts_ms LONG, transaction STRING, "
    "status STRING, id STRING, event_count LONG, data_collections STRING"
)


def run_parse_and_write(spark: Any, landing: Path, target: Path) -> float:
    """Reference point: Spark's own JSON parser (Jackson, in the JVM) plus one Parquet write of line + fields.

    The least any CDC pipeline does per line: parse it and write it once, here with no dedup, no identity,
    no latest state, no transactions and no driver at all. If this alone is near half the limit's speed,
    a ratio of 0.5 is out of reach for any implementation on this machine.
    """
    from pyspark.sql import functions as F

    t0 = time.perf_counter()
    lines = spark.read.option("recursiveFileLookup", "true").text(str(landing))
    parsed = lines.select("value", F.from_json("value", ENVELOPE_DDL).alias("e")).select("value", "e.*")
    parsed.write.mode("overwrite").parquet(str(target))
    return time.perf_counter() - t0


#: The source block of a MySQL envelope as far as the naive peer reads it (table and binlog position), and as
#: the floor below reads it (with the source time); and the transaction block.
BINLOG_DDL = "db STRING, `table` STRING, file STRING, pos LONG, `row` LONG"
SOURCE_DDL = BINLOG_DDL + ", ts_ms LONG"
TRANSACTION_DDL = "id STRING, total_order LONG, data_collection_order LONG"


def _table_id(src: str) -> Any:
    """`<db>.<table>` of a parsed source block (the config's `source` of a table)."""
    from pyspark.sql import functions as F

    return F.concat_ws(".", f"{src}.db", f"{src}.table")


def _binlog_position(src: str) -> Any:
    """The binlog position of a parsed source block, as a struct that orders as the binlog does."""
    from pyspark.sql import functions as F

    return F.struct(F.col(f"{src}.file").alias("file"), F.col(f"{src}.pos").alias("pos"), F.col(f"{src}.row").alias("row"))


def _last_per_key(rows: Any, image: Any, key_columns: Sequence[str], key: str, order: str) -> Any:
    """Each key's last row by `order`, the key (named `key`) being the key columns read from the row image as JSON text."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keyed = rows.withColumn(key, F.to_json(F.struct(*[F.get_json_object(image, f"$.{c}").alias(c) for c in key_columns])))
    return keyed.withColumn("_n", F.row_number().over(Window.partitionBy(key).orderBy(F.col(order).desc()))).where("_n = 1").drop("_n")


def run_outputs_floor(spark: Any, config: Any, landing: Path, target: Path) -> tuple[float, dict[str, float]]:
    """Reference point: what `cdc run` writes, each table written once by Spark's own functions, nothing else.

    From one parse (Spark's JSON functions), held in memory with the change events shaped as the raw log's rows:
    the raw log (every change event with its line, an id hashed from the line, its table, position and
    transaction), the markers, each source table's latest state (the last change per key by position,
    a window per table) and the transactions (each transaction's events as one row, with its END
    marker's count). Delta writes; no application-transaction guard, no dedup against the lake (it is
    empty), no dead letters, metrics, watermark or held state, no exact numbers or canonical identity,
    and no driver work between the steps. It is the least this engine does to write this product's
    tables: `cdc run` / this is how far the pipeline is from its own floor, and this / the
    parse-and-write reference is the most that ratio can be for these outputs on this machine.
    Returns (seconds, seconds by step).
    """
    from pyspark.sql import functions as F

    steps: dict[str, float] = {}
    t0 = time.perf_counter()
    lines = spark.read.option("recursiveFileLookup", "true").text(str(landing))
    parsed = (lines.select("value", F.col("_metadata.file_path").alias("source_file"), F.from_json("value", ENVELOPE_DDL).alias("e"))
              .select("value", "source_file", "e.*").persist())
    src = F.from_json("source", SOURCE_DDL)
    events = (parsed.where(F.col("op").isin("c", "u", "d", "r", "t"))
              .select(F.sha2("value", 256).alias("event_id"), F.col("value").alias("line"), "source_file", "op", "before", "after",
                      src.alias("src"), F.from_json("transaction", TRANSACTION_DDL).alias("tx"))
              .select("event_id", "line", "source_file", "op", "before", "after",
                      _table_id("src").alias("table_id"), _binlog_position("src").alias("position"),
                      F.col("tx.id").alias("transaction_id"), F.col("tx.total_order").alias("tx_total_order"),
                      F.timestamp_millis(F.col("src.ts_ms")).alias("source_ts"))
              .withColumn("event_date", F.to_date("source_ts"))
              .persist())

    def step(name: str, action: Any) -> None:
        t = time.perf_counter()
        action()
        steps[name] = time.perf_counter() - t

    step("raw log", lambda: events.write.format("delta").mode("overwrite").partitionBy("event_date").save(str(target / "raw_change_events")))
    markers = (parsed.where(F.col("status").isin("BEGIN", "END"))
               .select(F.concat_ws("|", "id", "status").alias("marker_id"), F.col("value").alias("line"), "source_file",
                       F.col("id").alias("transaction_id"), "status", "event_count", "data_collections",
                       F.timestamp_millis("ts_ms").alias("marker_ts")))
    step("markers", lambda: markers.write.format("delta").mode("overwrite").save(str(target / "transaction_markers")))
    for t in config.tables:
        last = _last_per_key(events.where(F.col("table_id") == t.source), F.coalesce("after", "before"), t.key, "key", "position")
        step(f"latest {t.name}", lambda last=last, t=t: last.write.format("delta").mode("overwrite").save(str(target / t.name)))
    ends = markers.where(F.col("status") == "END").select("transaction_id", "event_count")
    grouped = (events.where(F.col("transaction_id").isNotNull()).groupBy("transaction_id")
               .agg(F.count(F.lit(1)).alias("events_seen"),
                    F.array_sort(F.collect_list(F.struct("tx_total_order", "event_id", "table_id", "op", "before", "after", "position"))).alias("events"))
               .join(ends, "transaction_id"))
    complete = grouped.where(F.col("events_seen") == F.col("event_count"))
    step("transactions", lambda: complete.write.format("delta").mode("overwrite").save(str(target / "transactions")))
    events.unpersist()
    parsed.unpersist()
    return time.perf_counter() - t0, steps


def run_naive_peer(spark: Any, config: Any, target: Path, files_per_batch: int) -> tuple[float, int]:
    """Reference point: the pattern the Delta docs show, a file stream whose `foreachBatch` MERGEs each
    batch into each latest-state table with delta-spark (last change per key by binlog position, deletes
    delete, an older change never overwrites a newer one).

    No raw log, identity, dead letters, transactions or history, and the row image stays JSON text, so
    it flatters the peer: it is the least a Spark user writes to keep a latest state. Returns (seconds,
    micro-batches).
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from pyspark.sql.types import StructType

    tables = {t.source: t for t in config.tables}
    schema = StructType.fromDDL("k STRING, seq STRUCT<file: STRING, pos: BIGINT, row: BIGINT>, op STRING, after STRING")
    for t in tables.values():
        DeltaTable.createIfNotExists(spark).location(str(target / t.name)).addColumns(schema).execute()
    batches = 0
    steps: dict[str, float] = {"events": 0.0}

    def upsert(df: Any, batch_id: int) -> None:
        nonlocal batches
        batches += 1
        events = (df.select(F.from_json("value", ENVELOPE_DDL).alias("e"))
                  .select("e.op", "e.before", "e.after", F.from_json("e.source", BINLOG_DDL).alias("src"))
                  .where(F.col("op").isin("c", "u", "d", "r"))
                  .select(_table_id("src").alias("source"), "op", "after", F.coalesce("after", "before").alias("image"),
                          _binlog_position("src").alias("seq"))
                  .persist())
        t_batch = time.perf_counter()
        events.count()  # parse the batch once; each table's MERGE reads it from memory
        steps["events"] += time.perf_counter() - t_batch
        for source, t in tables.items():
            t_merge = time.perf_counter()
            last = _last_per_key(events.where(F.col("source") == source), F.col("image"), t.key, "k", "seq").select("k", "seq", "op", "after")
            (DeltaTable.forPath(spark, str(target / t.name)).alias("t").merge(last.alias("s"), "t.k = s.k")
             .whenMatchedDelete("s.op = 'd' AND s.seq > t.seq")
             .whenMatchedUpdateAll("s.op <> 'd' AND s.seq > t.seq")
             .whenNotMatchedInsertAll("s.op <> 'd'")
             .execute())
            steps[f"merge {t.name}"] = steps.get(f"merge {t.name}", 0.0) + time.perf_counter() - t_merge
        events.unpersist()

    stream = (spark.readStream.format("text").option("recursiveFileLookup", "true")
              .option("maxFilesPerTrigger", files_per_batch).load(str(config.landing)))
    t0 = time.perf_counter()
    query = (stream.writeStream.foreachBatch(upsert).trigger(availableNow=True)
             .option("checkpointLocation", str(target / "_checkpoint")).start())
    query.awaitTermination()
    say("    naive peer, seconds inside foreachBatch: " + ", ".join(f"{k} {v:.1f}" for k, v in steps.items()))
    return time.perf_counter() - t0, batches


def batch_rows(lake_dir: Path) -> list[dict[str, Any]]:
    """pipeline_metrics rows of the run, in batch order (delta-rs, not Spark: this is bookkeeping)."""
    from cdc_platform import lake

    rows = lake.open_table(lake_dir / "pipeline_metrics").to_pyarrow_table().to_pylist()
    return sorted(rows, key=lambda r: r["batch_id"])


def chart(rows: list[dict[str, Any]], run_started: float, run_started_wall: float, path: Path, title: str) -> None:
    """Stacked bars per batch: Spark's share outside foreachBatch, then each step inside it (collect, parse, stages)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order: list[str] = []
    for r in rows:
        for k, _ in r["stage_seconds"]:
            if k not in order:
                order.append(k)
    spark_part: list[float] = []
    previous_end = run_started_wall
    for r in rows:
        spark_part.append(max(0.0, r["started_at"].timestamp() - previous_end))
        previous_end = r["finished_at"].timestamp()
    ids = [r["batch_id"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.35), 5))
    bottom = [0.0] * len(rows)
    series = [("spark: trigger, listing, planning (outside foreachBatch)", spark_part)]
    for name in order:
        series.append((f"stage {name}", [dict(r["stage_seconds"]).get(name, 0.0) for r in rows]))
    other = [
        max(0.0, (r["finished_at"] - r["started_at"]).total_seconds() - sum(v for _, v in r["stage_seconds"])) for r in rows
    ]
    series.append(("other (split, metrics)", other))
    for label, values in series:
        ax.bar(ids, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("micro-batch id")
    ax.set_ylabel("seconds")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse_only(w: Any, limit_lines: int, conf: dict[str, str]) -> None:
    """The parsers alone: the Python one on this core (profiled), then the JVM one as a Spark job over the same lines.

    The Spark jobs write the parsed rows to the `noop` sink, so they time reading the lines and parsing them,
    nothing after: first the lines read and dropped (the floor), then each parser (`spark.cdc.parser`), in one
    task (one core, beside the Python parser's figure) and in the session's tasks (both cores). Each runs once
    to warm up, then is timed.
    """
    import cProfile
    import pstats

    import pyarrow as pa

    from cdc_platform.config import load_config
    from cdc_platform.parse.envelope import KeySpec
    from cdc_platform.parse.parsed_batches import parse_arrow_batches

    keys = KeySpec(dict(load_config(w.config_path).keys_by_source))
    lines: list[str] = []
    files: list[str] = []
    for path in sorted(w.landing.rglob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            lines.append(line)
            files.append(str(path))
            if len(lines) >= limit_lines:
                break
        if len(lines) >= limit_lines:
            break
    batches = [
        pa.RecordBatch.from_pydict({"value": lines[i : i + 10_000], "source_file": files[i : i + 10_000]})
        for i in range(0, len(lines), 10_000)
    ]
    banner(f"parser alone: {len(lines):,} lines")
    t0, c0 = time.perf_counter(), time.process_time()
    out = sum(b.num_rows for b in parse_arrow_batches(iter(batches), keys))
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    python_rate, cpu_rate = out / seconds, out / cpu_seconds
    say(f"Python parser (parse_arrow_batches): {out:,} lines in {seconds:.2f} s = {python_rate:,.0f} lines/s on one core, "
        f"{cpu_rate:,.0f} lines per CPU second  [{load_average()}]")
    profile = cProfile.Profile()
    profile.enable()
    for _ in parse_arrow_batches(iter(batches[:10]), keys):
        pass
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(12)
    parse_in_spark(lines, keys, conf, python_rate, cpu_rate)


def parse_in_spark(lines: list[str], keys: Any, conf: dict[str, str], python_rate: float, cpu_rate: float) -> None:
    """`parse_spark.parse_lines` as a Spark job over `lines` (written to text files first), to the noop sink."""
    from pyspark.sql import functions as F

    from cdc_platform.parse import parse_spark
    from cdc_platform.spark.session import get_spark

    spark = get_spark(conf=conf)
    folder = OUT / "parse_only"
    fresh_dir(folder)
    per_file = 10_000
    for i in range(0, len(lines), per_file):
        (folder / f"lines-{i // per_file:05d}.jsonl").write_text("\n".join(lines[i : i + per_file]) + "\n", encoding="utf-8")
    read = spark.read.format("text").load(str(folder)).select("value", F.col("_metadata.file_path").alias("source_file"))
    tasks = read.rdd.getNumPartitions()

    def timed(frame: Any) -> tuple[float, float, str]:
        """Wall seconds, CPU seconds of Spark's tasks and Python workers (the parsing; not the JIT's or the driver's),
        and the whole CPU line, of the second of two runs."""
        frame.write.format("noop").mode("overwrite").save()  # warm-up: class loading, code generation, the JIT
        cpu = CpuByRole(jvm_threads=True).start()
        t = time.perf_counter()
        frame.write.format("noop").mode("overwrite").save()
        wall = time.perf_counter() - t
        roles = cpu.stop()
        return wall, roles.get("jvm: tasks", 0.0) + roles.get("python workers", 0.0), cpu_line(roles, wall)

    n = len(lines)
    floor = {"one task": timed(read.coalesce(1)), f"{tasks} tasks": timed(read)}
    banner(f"parsers as a Spark job: {n:,} lines, to the noop sink (the lines read and dropped: "
           + ", ".join(f"{k} {wall:.2f} s, tasks' CPU {cpu:.2f} s" for k, (wall, cpu, _) in floor.items()) + ")")
    for parser in parse_spark.PARSERS:
        for label, frame in (("one task", read.coalesce(1)), (f"{tasks} tasks", read)):
            wall, cpu, line = timed(parse_spark.parse_lines(frame, keys, parser))
            parse_cpu = max(cpu - floor[label][1], 1e-9)
            say(f"{parser:>6} parser, {label:>8}: {wall:6.2f} s = {n / wall:>9,.0f} lines/s; tasks' CPU {cpu:6.2f} s, less the read's: "
                f"{n / parse_cpu:>9,.0f} lines per CPU second  [{load_average()}]")
            say(f"    {line}")
    say(f"(the Python parser alone on one core above: {python_rate:,.0f} lines/s, {cpu_rate:,.0f} lines per CPU second)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000, help="at least this many change events (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--events-per-file", type=int, default=500, help="lines per landing file (generator default 500)")
    parser.add_argument("--max-files-per-trigger", type=int, default=DEFAULT_MAX_FILES_PER_TRIGGER,
                        help=f"files per micro-batch (default {DEFAULT_MAX_FILES_PER_TRIGGER:,}, the config's)")
    parser.add_argument("--skip-limit", action="store_true", help="measure the pipeline only")
    parser.add_argument("--naive-peer", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the naive peer: foreachBatch + a delta-spark MERGE per table (default on)")
    parser.add_argument("--parse-only", action="store_true",
                        help="time the parsers alone: the Python one (profiled, no Spark), then both as a Spark job to the noop sink")
    parser.add_argument("--parse-lines", type=int, default=200_000, help="lines for --parse-only")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="a Spark setting for the session, on top of the platform's (repeatable): a variant to compare")
    args = parser.parse_args()
    conf = dict(item.split("=", 1) for item in args.conf)

    w = workload(transactions_for(args.events), args.seed, args.events_per_file)
    f = w.facts
    banner("throughput benchmark")
    say(
        f"workload: {f['transactions']:,} transactions -> {w.change_events:,} change events, {w.lines:,} lines "
        f"({f['markers']:,} markers, {f['duplicate_events']:,} redeliveries, {f['tombstones']:,} tombstones, "
        f"{f['malformed_lines']:,} malformed) in {f['files']:,} files, {f['bytes'] / 2**20:,.0f} MiB; {w.landing}"
    )
    if args.parse_only:
        parse_only(w, args.parse_lines, conf)
        return 0

    from cdc_platform.config import load_config, with_overrides
    from cdc_platform.run.ingest import IngestJob, default_stages
    from cdc_platform.run.run_reports import RunReport
    from cdc_platform.spark.session import get_spark
    from cdc_platform.stages.stage import RAW

    run_dir = OUT / "throughput"
    fresh_dir(run_dir)
    t0 = time.perf_counter()
    spark = get_spark("cdc-benchmark-throughput", conf=conf or None)
    say(f"spark started in {time.perf_counter() - t0:.1f} s" + (f" with {conf}" if conf else ""))
    t0 = time.perf_counter()
    warm_lines = spark.read.option("recursiveFileLookup", "true").text(str(w.landing)).count()
    say(f"warm-up scan: {warm_lines:,} lines in {time.perf_counter() - t0:.1f} s (page cache, JIT)")

    results: dict[str, Any] = {"workload": f, "max_files_per_trigger": args.max_files_per_trigger}
    if not args.skip_limit:
        run_limit(spark, w.landing, run_dir / "limit-warmup")  # the first write pays the Parquet writer's JIT
        run_parse_and_write(spark, w.landing, run_dir / "parse-and-write")  # and Jackson's
        mem = MemorySampler().start()
        limit_s = run_limit(spark, w.landing, run_dir / "limit")
        limit_mem = mem.stop()
        results["limit"] = {"seconds": limit_s, "memory": limit_mem, "load": load_average()}
        say(
            f"(a) limit, text -> plain Parquet: {limit_s:.1f} s = {w.change_events / limit_s:,.0f} change events/s "
            f"({w.lines / limit_s:,.0f} lines/s)  [{load_average()}]"
        )
        say(f"    {memory_line(limit_mem)}")
        parse_write_s = run_parse_and_write(spark, w.landing, run_dir / "parse-and-write")
        results["parse_and_write"] = {"seconds": parse_write_s, "load": load_average()}
        say(
            f"    reference, Spark's JSON parse + one Parquet write: {parse_write_s:.1f} s = {w.change_events / parse_write_s:,.0f} change events/s "
            f"({w.lines / parse_write_s:,.0f} lines/s); (a)/this = {limit_s / parse_write_s:.2f}: parsing and writing once, nothing else  [{load_average()}]"
        )
        to_driver_s = run_to_driver(spark, w.landing, args.max_files_per_trigger)
        results["to_driver"] = {"seconds": to_driver_s, "load": load_average()}
        say(
            f"    reference, text -> driver as Arrow, unparsed: {to_driver_s:.1f} s = {w.change_events / to_driver_s:,.0f} change events/s "
            f"({w.lines / to_driver_s:,.0f} lines/s); (a)/this = {limit_s / to_driver_s:.2f} is the most the ratio can be with "
            f"driver-side commits, before any parsing or commit  [{load_average()}]"
        )

        floor_s, floor_steps = run_outputs_floor(spark, load_config(w.config_path), w.landing, run_dir / "outputs-floor")
        results["outputs_floor"] = {"seconds": floor_s, "steps": floor_steps, "load": load_average()}
        say("    the outputs' floor, seconds by table (the first also parses): " + ", ".join(f"{k} {v:.1f}" for k, v in floor_steps.items()))
        say(
            f"    reference, the outputs' floor (cdc run's tables, each written once by Spark's own functions, no guard or dedup): "
            f"{floor_s:.1f} s = {w.change_events / floor_s:,.0f} change events/s; (a)/this = {limit_s / floor_s:.2f}, "
            f"parse-and-write/this = {parse_write_s / floor_s:.2f}: the most `cdc run` / parse-and-write can be for these outputs  [{load_average()}]"
        )

    if args.naive_peer:
        peer_s, peer_batches = run_naive_peer(spark, load_config(w.config_path), run_dir / "naive-peer", args.max_files_per_trigger)
        results["naive_peer"] = {"seconds": peer_s, "batches": peer_batches, "load": load_average()}
        say(
            f"    reference, naive peer (foreachBatch + one delta-spark MERGE per latest-state table, Delta's docs' pattern): "
            f"{peer_s:.1f} s = {w.change_events / peer_s:,.0f} change events/s, {peer_batches} batches  [{load_average()}]"
        )

    config = with_overrides(
        load_config(w.config_path),
        lake=run_dir / "lake",
        checkpoint=None,
        max_files_per_trigger=args.max_files_per_trigger,
    )
    job = IngestJob(config)
    say(f"(b) cdc run: stages that ran: {', '.join(stage_names(job))} (default_stages found: "
        f"{', '.join(type(s).__name__ for s in default_stages(config)) or 'none'}); "
        f"max_files_per_trigger={args.max_files_per_trigger}")
    mem = MemorySampler().start()
    cpu = CpuByRole(jvm_threads=True).start()
    tasks = TaskSampler(spark).start()
    wall0 = time.time()
    t0 = time.perf_counter()
    report = job.run_available_now(spark)
    run_s = time.perf_counter() - t0
    driver_only = tasks.stop()
    run_cpu = cpu.stop()
    run_mem = mem.stop()
    landed = report.landed()
    rows = batch_rows(config.lake)
    results["pipeline"] = {
        "seconds": run_s,
        "batches": len(report.batches),
        "memory": run_mem,
        "cpu_seconds": run_cpu,
        "landed": landed,
        "rows_read": report.total("rows_read"),
        "load": load_average(),
        "stages": stage_names(job),
        "driver_only_share": driver_only,
        "stage_batches": len(report.stage_batches),
        "stage_query_seconds": sum(b.seconds for b in report.stage_batches),
    }
    say(
        f"(b) cdc run: {run_s:.1f} s = {w.change_events / run_s:,.0f} change events/s ({report.total('rows_read') / run_s:,.0f} lines/s), "
        f"{len(report.batches)} batches  [{load_average()}]"
    )
    say(f"    {memory_line(run_mem)}")
    say(f"    {cpu_line(run_cpu, run_s)}")
    say(f"    driver only (no Spark task running): {driver_only:.1%} of the run's wall time (target <= 25%: it bounds any cluster's speed-up); "
        f"ingest batches {sum(b.seconds for b in report.batches):.1f} s, then the stage queries' {len(report.stage_batches)} batches "
        f"{sum(b.seconds for b in report.stage_batches):.1f} s (side by side)")
    in_batches = sum(b.seconds for b in report.batches)
    by_stage = RunReport(batches=report.batches).stage_seconds()
    say(
        f"    where the ingest's time went: spark outside foreachBatch (trigger, listing, planning) "
        f"{run_s - in_batches - report.drain_seconds:.1f} s; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in by_stage.items())
        + f", other {in_batches - sum(by_stage.values()):.1f} s; then draining the stage queries {report.drain_seconds:.1f} s: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in RunReport(stage_batches=report.stage_batches).stage_seconds().items())
    )
    ok_lines = report.total("rows_read") == w.lines
    ok_events = landed.get(RAW, 0) == w.change_events
    say(
        f"    accounting: lines read {report.total('rows_read'):,} (expected {w.lines:,}) {'OK' if ok_lines else 'MISMATCH'}; "
        f"raw events landed {landed.get(RAW, 0):,} (expected {w.change_events:,}) {'OK' if ok_events else 'MISMATCH'}; "
        f"landed per table: {json.dumps(landed, sort_keys=True)}"
    )
    if "limit" in results:
        ratio = results["limit"]["seconds"] / run_s
        results["ratio"] = ratio
        to_reference = results["parse_and_write"]["seconds"] / run_s
        results["ratio_to_parse_and_write"] = to_reference
        results["ratio_to_floor"] = results["outputs_floor"]["seconds"] / run_s
        say(f"ratio (b)/(a) = {ratio:.3f}; (b)/parse-and-write = {to_reference:.3f} (target >= 0.3); "
            f"(b)/the outputs' floor = {results['ratio_to_floor']:.3f}  [{load_average()}]")
    if "naive_peer" in results:
        say(f"(b)/naive peer = {results['naive_peer']['seconds'] / run_s:.2f} (target > 1)")
    png = OUT / "throughput_batches.png"
    chart(rows, t0, wall0, png, f"cdc run per batch: {w.change_events:,} change events, {w.change_events / run_s:,.0f} events/s, "
          f"{args.max_files_per_trigger} files/batch; {load_average()}")
    say(f"chart: {png}")
    (OUT / "throughput.json").write_text(json.dumps(results, indent=2, default=str), encoding="utf-8")
    return 0 if ok_lines and ok_events else 1


if __name__ == "__main__":
    exit_now(main())
