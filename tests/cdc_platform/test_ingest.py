"""The streaming ingest end to end: peer data, exactly once, replays, crashes and path safety."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform import lake
from cdc_platform.config import PlatformConfig
from cdc_platform.parse.envelope import KeySpec, parse_line
from cdc_platform.run.ingest import IngestJob
from cdc_platform.parse.parsed_batches import rows_to_batch
from cdc_platform.stages.stage import BatchContext, ParsedBatch, StageResult
from tests.cdc_platform.test_spark_jobs import tagged_jobs

PRODUCTS = {"inventory.products": {"key": ["id"]}}


def event(table: str = "customers", db: str = "payments", pos: int = 100, op: str = "c", row_id: int = 1, **extra: Any) -> str:
    image = {"id": row_id, "email": f"u{row_id}@example.com"}
    return json.dumps({
        "before": image if op == "d" else None,
        "after": None if op == "d" else image,
        "source": {"connector": "mysql", "name": "payments", "db": db, "table": table, "ts_ms": 1767225600000 + pos,
                   "file": "mysql-bin.000003", "pos": pos, "row": 0},
        "op": op, "ts_ms": 1767225600500 + pos, "transaction": None, **extra,
    })


def count(query: Callable[..., list[dict[str, Any]]], cfg: PlatformConfig, table: str) -> int:
    return query(cfg, f"SELECT count(*) AS n FROM {table}")[0]["n"]


def versions(cfg: PlatformConfig) -> dict[str, int]:
    return {name: lake.open_table(path).version() for name, path in lake.lake_tables(cfg.lake).items()}


def test_peer_data_lands_in_the_raw_log(make_config, land, run_pipeline, query, peer_files) -> None:
    cfg = make_config(PRODUCTS)
    land("flink/schema-exclude.jsonl", peer_files["schema_exclude"])
    report = run_pipeline(cfg)
    assert report.total("rows_read") == 16
    raw = query(cfg, "SELECT op, key, position, snapshot, source_file FROM raw_change_events ORDER BY position, key")
    assert len(raw) == 16
    assert sum(r["op"] == "r" for r in raw) == 9 and all(r["snapshot"] for r in raw if r["op"] == "r")
    assert raw[-1]["op"] == "d" and raw[-1]["key"] == '{"id":111}'
    assert raw[0]["source_file"].endswith("flink/schema-exclude.jsonl")
    metrics = query(cfg, "SELECT batch_id, rows_read, change_events, rows_landed['raw_change_events'] AS landed, lag_seconds FROM pipeline_metrics")
    assert metrics == [{"batch_id": 0, "rows_read": 16, "change_events": 16, "landed": 16, "lag_seconds": metrics[0]["lag_seconds"]}]
    assert metrics[0]["lag_seconds"] > 0


def test_replica_identity_file_dead_letters_the_keyless_delete(spark, make_config, land, run_pipeline, query, peer_files) -> None:
    cfg = make_config(PRODUCTS)
    land(None, peer_files["replica_identity"])
    labels = ("batch", "split", "raw_change_events", "latest_state", "transactions", "dead_letter", "metrics")
    before = {label: tagged_jobs(spark, label) for label in labels}
    run_pipeline(cfg)
    assert count(query, cfg, "raw_change_events") == 15
    (dead,) = query(cfg, "SELECT reason_code, reason, stage, table_id, batch_id FROM dead_letter")
    assert dead["reason_code"] == "delete_without_row" and dead["stage"] == "ingest"
    assert "REPLICA IDENTITY FULL" in dead["reason"] and dead["table_id"] == "inventory.products"

    # The Spark UI and event log name each job's part of the batch (`spark_jobs.labelled`), Delta's own jobs
    # included; the stage queries run side by side, so a tag leaking between their threads would mislabel them.
    # The ingest batch's parts are in its batch; the stage queries' jobs never are (they are queries of their own).
    ran = {label: tagged_jobs(spark, label) - before[label] for label in labels}
    parts = [label for label in labels if label != "batch"]
    assert all(ran[label] for label in parts), {label: len(ran[label]) for label in labels}
    ingest_parts = [label for label in parts if label not in ("latest_state", "transactions")]
    assert set().union(*(ran[label] for label in ingest_parts)) <= ran["batch"]
    assert not (ran["latest_state"] | ran["transactions"]) & ran["batch"]
    for i, a in enumerate(parts):
        for b in parts[i + 1:]:
            assert not ran[a] & ran[b], f"jobs tagged both {a} and {b}"


def test_running_twice_adds_nothing_even_without_the_checkpoint(make_config, land, run_pipeline, query, peer_files) -> None:
    cfg = make_config(PRODUCTS)
    land(None, peer_files["schema_exclude"])
    land(None, ['{"status":"BEGIN","id":"601:34078720","ts_ms":1596001099434,"event_count":null,"data_collections":null}'])
    run_pipeline(cfg)
    before = versions(cfg)
    second = run_pipeline(cfg)
    assert second.batches == [] and versions(cfg) == before, "the checkpoint knows every file: nothing to do"

    shutil.rmtree(cfg.checkpoint_dir)  # lost progress: every file is read again
    third = run_pipeline(cfg)
    assert third.total("rows_read") == 17
    assert count(query, cfg, "raw_change_events") == 16, "event identity dedups redelivered input"
    assert count(query, cfg, "transaction_markers") == 1
    assert third.batches[0].duplicates_skipped == 17


def test_redelivered_event_with_new_ts_ms_is_a_duplicate(make_config, land, run_pipeline, query) -> None:
    cfg = make_config({"payments.customers": {"key": ["id"]}})
    original = json.loads(event(pos=7))
    land(None, [json.dumps(original)])
    run_pipeline(cfg)
    original["ts_ms"] += 60_000  # a connector restart re-emits with a new processing time
    land(None, [json.dumps(original), json.dumps(original)])
    report = run_pipeline(cfg)
    assert count(query, cfg, "raw_change_events") == 1
    assert report.batches[0].duplicates_skipped == 2


def parsed_batch(lines: list[str], keys: dict[str, list[str]]) -> pa.Table:
    return pa.Table.from_batches([rows_to_batch([parse_line(line, "f.jsonl", KeySpec(keys)) for line in lines])])


def test_a_replayed_micro_batch_commits_nothing(make_config) -> None:
    cfg = make_config({"payments.customers": {"key": ["id"]}})
    job = IngestJob(cfg, stages=[])
    job.setup()
    batch = parsed_batch([event(pos=1), event(pos=2, row_id=2), "not json", "null"], {"payments.customers": ["id"]})
    first = job.process_parsed(batch, 0, "query-a")
    assert first.rows_landed["raw_change_events"] == 2 and first.dead_letters == 1
    before = versions(cfg)
    replay = job.process_parsed(batch, 0, "query-a")
    assert versions(cfg) == before, "every table refused the same (query id, batch id)"
    assert replay.rows_landed["raw_change_events"] == 0
    assert lake.open_table(job.path("dead_letter")).to_pyarrow_table().num_rows == 1
    assert lake.open_table(job.path("pipeline_metrics")).to_pyarrow_table().num_rows == 1


class FailsOnce:
    """A stage that crashes the first time, like a process killed after the raw log committed."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    def setup(self, config: PlatformConfig) -> None:
        pass

    def prepare(self, batch: ParsedBatch, ctx: BatchContext) -> int:
        return batch.events.num_rows

    def commit(self, seen: int, ctx: BatchContext) -> StageResult:
        self.calls += 1
        if self.calls == 1:
            raise KeyboardInterrupt("killed mid-batch")  # a kill, not an error: nothing may catch it
        return StageResult(figures={"seen": seen})


def progress_rows(job: IngestJob) -> list[dict[str, Any]]:
    return lake.open_table(job.path("stage_progress")).to_pyarrow_table().to_pylist()


def test_a_stage_that_crashed_midway_completes_once_on_replay(make_config) -> None:
    """The ingest commits whole; a stage query killed mid-batch replays that batch from its own checkpoint."""
    cfg = make_config({"payments.customers": {"key": ["id"]}})
    stage = FailsOnce()
    job = IngestJob(cfg, stages=[stage])
    job.setup()
    batch = parsed_batch([event(pos=1), "[]"], {"payments.customers": ["id"]})
    with pytest.raises(KeyboardInterrupt):
        job.process_parsed(batch, 3, "q")
    assert lake.open_table(job.path("raw_change_events")).to_pyarrow_table().num_rows == 1
    assert lake.open_table(job.path("dead_letter")).to_pyarrow_table().num_rows == 1, "the ingest's own dead letter landed"
    assert progress_rows(job) == []
    job.process_parsed(batch, 3, "q")  # the ingest refuses the replay; the stage query replays its batch
    assert lake.open_table(job.path("raw_change_events")).to_pyarrow_table().num_rows == 1
    assert lake.open_table(job.path("dead_letter")).to_pyarrow_table().num_rows == 1
    (progress,) = progress_rows(job)
    assert progress["query"] == "flaky" and progress["events"] == 1 and dict(progress["stage_figures"]) == {"flaky.seen": 1.0}
    assert stage.calls == 2
    metrics = lake.open_table(job.path("pipeline_metrics")).to_pyarrow_table().to_pylist()
    assert len(metrics) == 1 and dict(metrics[0]["stage_figures"]) == {}


BEGIN = json.dumps({"status": "BEGIN", "id": "tx-1", "ts_ms": 1767225600000, "event_count": None, "data_collections": None})


def counted_job(make_config: Callable[..., PlatformConfig], lines: list[str]) -> tuple[IngestJob, CountsRaw, pa.Table]:
    """An ingest job over one keyed table with a `CountsRaw` stage, set up, and a parsed batch of `lines`."""
    job = IngestJob(make_config({"payments.customers": {"key": ["id"]}}), stages=[stage := CountsRaw()])
    job.setup()
    return job, stage, parsed_batch(lines, {"payments.customers": ["id"]})


def fails_once(real: Callable[..., Any], table: str, message: str) -> Callable[..., Any]:
    """`real` (a write taking the frame, then the table's path), except that its first call for `table` raises OSError."""
    failed: list[bool] = []

    def write(df: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).endswith(table) and not failed:
            failed.append(True)
            raise OSError(message)
        return real(df, path, *args, **kwargs)

    return write


def test_a_failed_marker_write_fails_the_batch_after_the_events_land_and_replays_once(make_config, monkeypatch) -> None:
    """The raw log commits before the markers; a markers error fails the batch with the events landed, before
    any stage query reads it, and the replay writes only what is missing."""
    from cdc_platform.lake import insert_new

    job, stage, batch = counted_job(make_config, [event(pos=1), BEGIN])
    monkeypatch.setattr(insert_new, "insert_new_once", fails_once(insert_new.insert_new_once, "transaction_markers", "disk full while writing the markers"))
    with pytest.raises(OSError, match="disk full"):
        job.process_parsed(batch, 0, "q")
    assert stage.seen == [], "no stage query ran on a batch the ingest did not finish"
    assert lake.open_table(job.path("raw_change_events")).to_pyarrow_table().num_rows == 1
    assert lake.open_table(job.path("transaction_markers")).to_pyarrow_table().num_rows == 0
    replay = job.process_parsed(batch, 0, "q")
    assert replay.rows_landed["raw_change_events"] == 0 and replay.rows_landed["transaction_markers"] == 1
    assert lake.open_table(job.path("raw_change_events")).to_pyarrow_table().num_rows == 1
    assert stage.seen == [(1, 1)], "the stage query read the batch once, events and markers committed"


def test_a_failed_dead_letter_write_leaves_the_raw_log_whole_and_the_replay_writes_it_once(make_config, monkeypatch) -> None:
    """The ingest's dead letters commit beside the raw log and markers: one failing does not stop the other
    half-way, the batch fails (no metrics row, no stage query), and the replay writes only the dead letters."""
    from cdc_platform.lake import lake_spark

    job, stage, batch = counted_job(make_config, [event(pos=1), BEGIN, "not json"])
    monkeypatch.setattr(lake_spark, "append_once", fails_once(lake_spark.append_once, "dead_letter", "disk full while writing the dead letters"))
    with pytest.raises(OSError, match="disk full"):
        job.process_parsed(batch, 0, "q")
    assert stage.seen == [], "no stage query ran on a batch the ingest did not finish"
    assert lake.open_table(job.path("pipeline_metrics")).to_pyarrow_table().num_rows == 0
    assert lake.open_table(job.path("raw_change_events")).to_pyarrow_table().num_rows == 1
    assert lake.open_table(job.path("transaction_markers")).to_pyarrow_table().num_rows == 1
    assert lake.open_table(job.path("dead_letter")).to_pyarrow_table().num_rows == 0
    replay = job.process_parsed(batch, 0, "q")
    assert replay.rows_landed["raw_change_events"] == 0 and replay.rows_landed["transaction_markers"] == 0
    assert replay.rows_landed["dead_letter"] == 1
    assert lake.open_table(job.path("dead_letter")).to_pyarrow_table().num_rows == 1
    assert lake.open_table(job.path("raw_change_events")).to_pyarrow_table().num_rows == 1
    assert stage.seen == [(1, 1)]


def test_the_dead_letters_commit_beside_a_failing_raw_log_and_are_not_written_again(make_config, monkeypatch) -> None:
    """Side by side, the dead letters' append runs to its end while the raw log fails; the replay skips it."""
    from cdc_platform.lake import insert_new

    job, _, batch = counted_job(make_config, [event(pos=1), "not json"])
    monkeypatch.setattr(insert_new, "insert_new_once", fails_once(insert_new.insert_new_once, "raw_change_events", "disk full while writing the raw log"))
    with pytest.raises(OSError, match="disk full"):
        job.process_parsed(batch, 0, "q")
    assert lake.open_table(job.path("dead_letter")).to_pyarrow_table().num_rows == 1
    assert lake.open_table(job.path("raw_change_events")).to_pyarrow_table().num_rows == 0
    replay = job.process_parsed(batch, 0, "q")
    assert replay.rows_landed["raw_change_events"] == 1 and "dead_letter" not in replay.rows_landed
    assert lake.open_table(job.path("dead_letter")).to_pyarrow_table().num_rows == 1


class CountsRaw:
    """A Spark stage that notes its batch's events and markers (it reads the markers beside the raw log)."""

    name = "counts_raw"
    reads_markers = True

    def __init__(self) -> None:
        self.seen: list[tuple[int, int]] = []

    def setup(self, config: PlatformConfig) -> None:
        pass

    def run(self, batch: Any, ctx: BatchContext) -> StageResult:
        self.seen.append((batch.events.count(), batch.markers.count()))
        return StageResult()


class SideStage:
    """A stage that runs beside another: `folding` is set once the driver-side one is folding."""

    def __init__(self, folding: threading.Event, *, fail: bool = False) -> None:
        self.folding, self.fail, self.released, self.committed = folding, fail, False, False

    def setup(self, config: PlatformConfig) -> None:
        pass


class SparkSide(SideStage):
    """A Spark stage that waits until the driver-side stage is folding (so it only passes if the two run
    side by side), then returns or fails; records whether the job released its cached work."""

    name = "spark_side"

    def run(self, batch: Any, ctx: BatchContext) -> StageResult:
        assert self.folding.wait(60), "the driver-side stage never started while this one ran"
        if self.fail:
            raise RuntimeError("the spark side broke")
        return StageResult(figures={"ran": 1.0}, release=lambda: setattr(self, "released", True))


class ArrowSide(SideStage):
    """A driver-side stage (prepare/commit on the collected batch)."""

    name = "arrow_side"

    def prepare(self, batch: ParsedBatch, ctx: BatchContext) -> int:
        self.folding.set()
        return batch.events.num_rows

    def commit(self, seen: int, ctx: BatchContext) -> StageResult:
        if self.fail:
            raise OSError("disk full")
        time.sleep(0.5)  # still committing when a failing Spark stage returns
        self.committed = True
        return StageResult(figures={"seen": float(seen)})


def test_stage_queries_run_side_by_side_and_one_failing_leaves_the_other_to_finish(make_config) -> None:
    from cdc_platform.stages.stage import StageFailure

    cfg = make_config({"payments.customers": {"key": ["id"]}})
    keys = {"payments.customers": ["id"]}

    folding = threading.Event()
    spark_side, arrow_side = SparkSide(folding), ArrowSide(folding)
    job = IngestJob(cfg, stages=[spark_side, arrow_side])
    job.setup()
    report = job.process_parsed(parsed_batch([event(pos=1), event(pos=2, row_id=2)], keys), 0, "q")
    assert report.stage_seconds.keys() >= {"spark_side", "arrow_side"} and arrow_side.committed and spark_side.released
    figures = {r["query"]: dict(r["stage_figures"]) for r in progress_rows(job)}
    assert figures["spark_side"]["spark_side.ran"] == 1.0 and figures["arrow_side"]["arrow_side.seen"] == 2.0

    # A failing Spark stage's query fails after the driver-side one has finished committing.
    folding = threading.Event()
    arrow_side = ArrowSide(folding)
    job = IngestJob(cfg, stages=[SparkSide(folding, fail=True), arrow_side])
    with pytest.raises(StageFailure, match="the spark side broke"):
        job.process_parsed(parsed_batch([event(pos=3, row_id=3)], keys), 1, "q")
    assert arrow_side.committed, "the driver-side stage was not cut off mid-commit"

    # A failing driver-side stage fails its query; the Spark stage (replaying its failed batch) finishes and is released.
    folding = threading.Event()
    spark_side = SparkSide(folding)
    job = IngestJob(cfg, stages=[spark_side, ArrowSide(folding, fail=True)])
    with pytest.raises(StageFailure, match="disk full"):
        job.process_parsed(parsed_batch([event(pos=4, row_id=4)], keys), 2, "q")
    assert spark_side.released
    taken = sum(r["events"] for r in progress_rows(job) if r["query"] == "spark_side")
    assert taken == 4, "the Spark stage's failed batch replayed (pos 3) and the new one followed (pos 4), each once"


def tree(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def test_unsafe_table_names_write_nothing_outside_the_lake(tmp_path, make_config, land, run_pipeline, query) -> None:
    cfg = make_config({"payments.customers": {"key": ["id"]}})
    outside_before = tree(tmp_path.parent) - tree(tmp_path)
    land(None, [event(table="../x"), event(db="../../escape", table="t"), event(table="..", db="payments"), event(table="x/../../y")])
    run_pipeline(cfg)
    outside_after = tree(tmp_path.parent) - tree(tmp_path)
    assert outside_after == outside_before
    assert set(lake.lake_tables(cfg.lake)) <= {"raw_change_events", "transaction_markers", "dead_letter", "pipeline_metrics", "stage_progress",
                                               "customers", "customers_history", "transactions", "incomplete_transactions",
                                               "late_transaction_events", "open_transactions", "consistency_watermark"}
    dead = query(cfg, "SELECT reason_code FROM dead_letter")
    assert [d["reason_code"] for d in dead] == ["unsafe_table_name"] * 4
    assert count(query, cfg, "raw_change_events") == 0


def test_new_files_at_any_depth_and_new_tables_need_no_restart_or_config(make_config, land, run_pipeline, query) -> None:
    cfg = make_config({"payments.customers": {"key": ["id"]}})
    land("a/part-1.jsonl", [event(pos=1)])
    run_pipeline(cfg)
    land("a/b/c/part-2.jsonl", [event(table="audits", pos=2)])
    land("d/part-3.jsonl", [event(db="billing", table="invoices", pos=3)])
    run_pipeline(cfg)
    tables = query(cfg, "SELECT table_id, key FROM raw_change_events ORDER BY table_id")
    assert tables == [
        {"table_id": "billing.invoices", "key": None},
        {"table_id": "payments.audits", "key": None},
        {"table_id": "payments.customers", "key": '{"id":1}'},
    ]


def test_stream_picks_up_files_as_they_arrive(spark, make_config, land, query) -> None:
    cfg = make_config({"payments.customers": {"key": ["id"]}})
    land("first.jsonl", [event(pos=1)])
    job = IngestJob(cfg)

    def later() -> None:
        time.sleep(3)
        land("second.jsonl", [event(pos=2, row_id=2)])

    stop = threading.Event()

    def until_both_landed() -> None:
        while not stop.is_set():
            if sum(b.rows_read for b in list(job.reports)) >= 2:
                stop.set()
            time.sleep(0.2)

    threading.Thread(target=later, daemon=True).start()
    threading.Thread(target=until_both_landed, daemon=True).start()
    report = job.run_continuously(spark, interval="500 milliseconds", timeout=240, stop=stop)
    stop.set()
    assert sum(b.rows_read for b in report.batches) == 2
    assert count(query, cfg, "raw_change_events") == 2


def test_a_run_asked_to_stop_ends_after_its_batch_and_the_next_run_reads_the_rest(spark, make_config, land, query) -> None:
    """`cdc run`'s Ctrl-C (the stop event): the batch running commits whole, later files wait for the next run."""
    cfg = make_config({"payments.customers": {"key": ["id"]}}, max_files_per_trigger=1)
    for n in range(3):
        land(f"{n}.jsonl", [event(pos=n + 1, row_id=n + 1)])
    stop = threading.Event()
    job = IngestJob(cfg, progress=lambda message: stop.set() if message.startswith("batch 0:") else None)
    first = job.run_available_now(spark, stop)
    # Spark starts batch 1 as batch 0 ends; the stop may see either in flight, and lets it commit.
    assert first.stopped and [b.rows_read for b in first.batches] in ([1], [1, 1])
    assert count(query, cfg, "raw_change_events") == len(first.batches)
    rest = IngestJob(cfg).run_available_now(spark, threading.Event())
    assert not rest.stopped and sum(b.rows_read for b in rest.batches) == 3 - len(first.batches)
    assert count(query, cfg, "raw_change_events") == 3


def test_missing_landing_directory_is_a_clear_error(spark, make_config) -> None:
    from cdc_platform.errors import ConfigError

    cfg = make_config()
    shutil.rmtree(cfg.landing)
    with pytest.raises(ConfigError, match="landing directory .* does not exist"):
        IngestJob(cfg).run_available_now(spark)


def test_a_stream_killed_while_writing_its_first_offsets_restarts(make_config, land, run_pipeline, query) -> None:
    """SIGKILL between Spark's temp write and rename leaves `.0.<uuid>.tmp`; it must not block restarts."""
    import uuid

    cfg = make_config()
    land(None, [event(pos=1)])
    offsets = cfg.checkpoint_dir / "offsets"
    offsets.mkdir(parents=True)
    (cfg.checkpoint_dir / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    (offsets / f".0.{uuid.uuid4()}.tmp").write_text("")
    report = run_pipeline(cfg)
    assert report.total("rows_read") == 1 and count(query, cfg, "raw_change_events") == 1
    assert not list(offsets.glob(".*.tmp*"))


def test_executors_parse_exactly_as_the_parser_in_the_driver(spark: Any, peer_files: dict[str, Path]) -> None:
    """Parsing moved onto the executors (mapInArrow) must give the driver-side parser's rows, byte for byte, in order.

    The reference is the path before the move: the stream's lines collected with `toArrow()` (invalid
    UTF-8 and all) and parsed in the driver.
    """
    from pyspark.sql import functions as F

    from cdc_platform.parse import parse_spark
    from cdc_platform.lake import schemas
    from cdc_platform.parse.parsed_batches import parse_arrow_batches
    from tests.cdc_platform.test_bad_input import CORPUS

    paths = [str(p) for p in sorted(CORPUS.glob("*.jsonl")) + sorted(peer_files.values())]
    frame = (spark.read.format("text").load(paths).select(F.col("value"), F.col("_metadata.file_path").alias("source_file"))
             .repartition(3))  # several partitions, so the order is (partition, row)
    frame = frame.localCheckpoint()  # one fixed partitioning for both readings
    keys = KeySpec({"payments.customers": ("id",), "payments.charges": ("id",), "shop.order_items": ("order_id", "line_no")})
    lines = frame.toArrow()
    assert lines.num_rows > 150, "corpus and peer data"
    in_driver = pa.Table.from_batches(list(parse_arrow_batches(iter(lines.to_batches()), keys)), schemas.PARSED)
    on_executors = parse_spark.parse_lines(frame, keys)
    out = on_executors.orderBy(parse_spark.SEQ).drop(parse_spark.SEQ).toArrow()
    assert sorted(out.column_names) == sorted(schemas.PARSED.names)
    got = schemas.conform(out, schemas.PARSED)  # Spark's Arrow output in the exact types (and nullability)
    assert got.num_rows == lines.num_rows
    assert got.equals(in_driver)
    assert set(got.column("kind").to_pylist()) == {"change", "marker", "dead_letter", "tombstone"}
    assert on_executors.rdd.getNumPartitions() == 3, "parsed where the lines are, no shuffle to one place"


def test_a_run_ending_on_heartbeat_only_batches_still_accounts_for_every_line(make_config, land, run_pipeline, query) -> None:
    """Heartbeat-only batches fold their metrics rows (`IDLE_METRICS_INTERVAL`); the end of the run writes the last."""
    cfg = make_config({"payments.customers": {"key": ["id"]}}, max_files_per_trigger=1)
    files = [land("a.jsonl", [event(pos=100)]), land("b.jsonl", ['{"ts_ms": 1}']), land("c.jsonl", ['{"ts_ms": 2}', '{"ts_ms": 3}'])]
    for age, path in zip((30, 20, 10), files):  # the file source takes the oldest first
        os.utime(path, (time.time() - age, time.time() - age))
    report = run_pipeline(cfg)
    assert len(report.batches) == 3 and report.total("rows_read") == 4
    metrics = query(cfg, "SELECT batch_id, rows_read, stage_figures['ingest.heartbeats'] AS heartbeats, "
                         "stage_figures['ingest.idle_batches_folded'] AS folded FROM pipeline_metrics ORDER BY batch_id")
    assert metrics == [{"batch_id": 0, "rows_read": 1, "heartbeats": None, "folded": None},
                       {"batch_id": 2, "rows_read": 3, "heartbeats": 3.0, "folded": 1.0}]
