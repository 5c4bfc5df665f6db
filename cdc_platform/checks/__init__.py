"""Checks: the platform's SLOs (completeness, coverage, freshness, dead letters) as plain functions.

Each returns a `CheckOutcome`: pass/fail, a severity, a sentence, and numeric metadata a person can
read and plot. Dagster wraps them in asset checks (`dagster_project/checks.py`) through one adapter;
here they are tested without Dagster. A failed check is a data problem, never an exception.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Hashable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from cdc_platform import lake
from cdc_platform.spark import spark_jobs
from cdc_platform.errors import CheckCrashed
from cdc_platform.storage import LakePath

CHECK_STATE_DIR = "_cdc_checks"


class Severity(str, Enum):
    WARN = "WARN"
    ERROR = "ERROR"


@dataclass(frozen=True)
class CheckOutcome:
    passed: bool
    severity: Severity
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


K = TypeVar("K", bound=Hashable)

#: Checks evaluated at once (`side_by_side`). Measured on the sample lake (10 Spark checks, warm, 2 cores):
#: 8.1 s one after another, 5.1-5.3 s with 2-4 at once; a check is a few small Spark jobs, mostly the
#: driver planning and reading Delta logs, which overlaps with another check's tasks.
CHECK_THREADS = 3


def side_by_side(evaluations: Mapping[K, Callable[[], CheckOutcome]], threads: int = CHECK_THREADS) -> Iterator[tuple[K, CheckOutcome]]:
    """Evaluate independent checks at once on one Spark session; yield each outcome as it is ready.

    A check that raises does not cost the others their outcomes: every check runs to its end and is
    yielded, and the first failure is raised after the last one (`CheckCrashed`, naming the check).
    """
    failures: list[tuple[K, Exception]] = []
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(evaluations))), thread_name_prefix="cdc-check") as pool:
        pending = {pool.submit(_labelled, key, evaluate): key for key, evaluate in evaluations.items()}
        for future in as_completed(pending):
            key = pending[future]
            try:
                outcome = future.result()
            except Exception as exc:  # noqa: BLE001 - raised below, after the other checks' outcomes
                failures.append((key, exc))
                continue
            yield key, outcome
    if failures:
        key, exc = failures[0]
        others = f" ({len(failures) - 1} other check(s) failed too: {', '.join(str(k) for k, _ in failures[1:])})" if len(failures) > 1 else ""
        raise CheckCrashed(f"the check {key} could not run: {type(exc).__name__}: {exc}{others}") from exc


def _labelled(key: Hashable, evaluate: Callable[[], CheckOutcome]) -> CheckOutcome:
    """A check's Spark jobs carry its name in the Spark UI (`cdc check: <name>`, tag `cdc-check`)."""
    with spark_jobs.labelled("check", f"cdc check: {key}"):
        return evaluate()


@dataclass(frozen=True)
class TableStats:
    rows: int
    version: int
    files: int
    size_bytes: int

    def as_metadata(self) -> dict[str, int]:
        return {"rows": self.rows, "delta_version": self.version, "files": self.files, "size_bytes": self.size_bytes}


def _add_actions(table: DeltaTable) -> pa.Table:
    return lake.add_actions(table)


def table_stats(path: Path) -> TableStats:
    """Rows, version, files and bytes from the Delta log alone (file statistics), without a scan."""
    table = lake.open_table(path)
    actions = _add_actions(table)
    rows = int(pc.sum(actions.column("num_records")).as_py() or 0) if actions.num_rows else 0
    size = int(pc.sum(actions.column("size_bytes")).as_py() or 0) if actions.num_rows else 0
    return TableStats(rows=rows, version=table.version(), files=actions.num_rows, size_bytes=size)


def column_max(path: Path, column: str) -> Any:
    """The largest value of a column from file statistics (None for an empty table or missing stats)."""
    return lake.column_max(path, column)


def _as_utc(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    return None


def newest_heartbeat(lake_dir: LakePath) -> dt.datetime | None:
    """The newest Debezium heartbeat time the stream recorded (`pipeline_metrics.newest_heartbeat_ts`),
    None without one (no heartbeats, or a lake from before the column: its files have no such statistic)."""
    path = lake.table_path(lake_dir, "pipeline_metrics")
    return _as_utc(column_max(path, "newest_heartbeat_ts")) if lake.exists(path) else None


def newest_source_time(lake_dir: LakePath) -> tuple[dt.datetime | None, dt.datetime | None]:
    """(newest source change in the raw log, newest heartbeat): how far the source has been read.

    A change's commit time says the lake holds the source up to then. So does a heartbeat's: the
    connector sends one after every change it read before it, and a batch's metrics row (where its
    time is kept) is written after the batch's changes landed. On an idle source only the heartbeats
    move (Debezium's `heartbeat.interval.ms`); without them the lake would look stale when it is not.
    Caveat: through Kafka the heartbeat topic is read beside the data topics, not after them, so a
    change sent a moment before a heartbeat may land one micro-batch after it.
    """
    raw = lake.table_path(lake_dir, "raw_change_events")
    newest_change = _as_utc(column_max(raw, "source_ts")) if lake.exists(raw) else None
    return newest_change, newest_heartbeat(lake_dir)


def applied_source_time(lake_dir: LakePath) -> dt.datetime | None:
    """How far in source time every stage has applied the raw log: the newest change or heartbeat time of
    a batch whose `pipeline_metrics` row is written. That row is a batch's last commit, after every stage
    took the batch (or dead-lettered what it could not take), so each latest-state table then holds the
    source up to that time, whether or not the batch changed it. None before the first batch finished."""
    path = lake.table_path(lake_dir, "pipeline_metrics")
    if not lake.exists(path):
        return None
    return lake.newest(_as_utc(column_max(path, "newest_source_ts")), _as_utc(column_max(path, "newest_heartbeat_ts")))


def table_source_time(lake_dir: LakePath, name: str, column: str) -> dt.datetime | None:
    """How far in source time a table is current (Dagster's `dagster/last_updated_timestamp`), as
    `freshness` judges it: for the raw log its newest change or a newer heartbeat; for a latest-state
    table its newest `column`, or the time every stage has applied the raw log to (`applied_source_time`)
    when that is newer. So a table its database has not changed for an hour is as current as the
    stream, not an hour stale, while a table whose stage stopped taking batches falls behind."""
    if name == "raw_change_events":
        return lake.newest(*newest_source_time(lake_dir))
    return _state_current_to(lake_dir, lake.table_path(lake_dir, name), column)


def _state_current_to(lake_dir: LakePath, path: Path, column: str = "_source_ts") -> dt.datetime | None:
    if not lake.exists(path):
        return None
    return lake.newest(_as_utc(column_max(path, column)), applied_source_time(lake_dir))


def freshness(lake_dir: LakePath, slo_seconds: float, now: dt.datetime | None = None, latest_state: Path | None = None) -> CheckOutcome:
    """Lag from how far the source has been read (its newest change in the raw log, or a newer heartbeat)
    to now, and from the raw log to a latest-state table.

    The first is Stripe's freshness SLO (how stale is the lake compared to the database); the second
    says whether a stage downstream of the raw log is falling behind it, judged by how far the table is
    current (`table_source_time`: its own newest change, or the batches every stage finished), not by
    its own newest change alone, which would call a table its database rarely writes to stale.
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    newest_raw, beat = newest_source_time(lake_dir)
    meta: dict[str, Any] = {"slo_seconds": float(slo_seconds)}
    if beat is not None:
        meta["newest_heartbeat_ts"] = beat.isoformat()
    if newest_raw is None and beat is None:
        return CheckOutcome(False, Severity.WARN, "the raw log is empty: nothing has landed yet, so freshness is unknown", meta)
    read_to = lake.newest(newest_raw, beat)
    assert read_to is not None
    lag = (now - read_to).total_seconds()
    meta["lag_seconds"] = round(lag, 3)
    parts = []
    if newest_raw is not None:
        meta["newest_source_ts"] = newest_raw.isoformat()
        parts.append(f"newest source change is {(now - newest_raw).total_seconds():,.0f} s old")
    if beat is not None and (newest_raw is None or beat > newest_raw):
        parts.append(f"the connector's newest heartbeat, {lag:,.0f} s old, says the source was read up to then (idle since)")
    parts[-1] += f" (SLO {slo_seconds:,.0f} s)"
    passed = lag <= slo_seconds
    if newest_raw is not None and latest_state is not None and lake.exists(latest_state):
        current_to = _state_current_to(lake_dir, latest_state)
        behind = max(0.0, (newest_raw - current_to).total_seconds()) if current_to is not None else float("inf")
        meta["latest_state_behind_raw_seconds"] = round(behind, 3) if behind != float("inf") else -1.0
        if behind > slo_seconds:
            passed = False
        parts.append(f"latest state trails the raw log by {behind:,.0f} s" if behind != float("inf")
                     else "latest state holds nothing and no batch has finished")
    return CheckOutcome(passed, Severity.ERROR, "; ".join(parts), meta)


def _state_file(lake_dir: LakePath, name: str) -> Path:
    return lake_dir / CHECK_STATE_DIR / f"{name}.json"


def _read_state(lake_dir: LakePath, name: str) -> dict[str, Any]:
    path = _state_file(lake_dir, name)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _write_state(lake_dir: LakePath, name: str, state: dict[str, Any]) -> None:
    lake.write_json_atomic(_state_file(lake_dir, name), state)


def new_dead_letters(lake_dir: LakePath, *, advance: bool = True) -> CheckOutcome:
    """Dead-letter rows added since the previous evaluation (a WARN: the data is kept, a person should look).

    The cursor (the `dead_letter` row count last seen) lives in the lake, so it survives a reset of the
    Dagster instance and is shared by everyone checking the same lake.
    """
    path = lake.table_path(lake_dir, "dead_letter")
    stats = table_stats(path)
    seen = int(_read_state(lake_dir, "dead_letter").get("rows", 0))
    new = max(stats.rows - seen, 0)
    meta: dict[str, Any] = {"new_dead_letters": new, "total_dead_letters": stats.rows, "delta_version": stats.version}
    if new:
        reasons = _recent_reasons(path, new)
        meta["new_by_reason"] = reasons
        description = f"{new} new dead-letter row(s) since the last check: " + ", ".join(f"{k} ×{v}" for k, v in reasons.items())
    else:
        description = "no new dead-letter rows since the last check"
    if advance:
        _write_state(lake_dir, "dead_letter", {"rows": stats.rows, "version": stats.version})
    return CheckOutcome(new == 0, Severity.WARN, description, meta)


def _recent_reasons(path: Path, newest: int) -> dict[str, int]:
    """The reasons of the `newest` dead letters, read from the newest files only (`_newest_rows`)."""
    return _reason_counts(_newest_rows(lake.open_table(path), "dead_lettered_at", newest, ["reason_code", "dead_lettered_at"]))


def _reason_counts(rows: pa.Table) -> dict[str, int]:
    counts = rows.group_by("reason_code").aggregate([("reason_code", "count")])
    return {r["reason_code"]: int(r["reason_code_count"]) for r in counts.to_pylist()}


DEAD_LETTER_SAMPLE_COLUMNS = ("dead_lettered_at", "stage", "reason_code", "reason", "source_file", "table_id")


def newest_dead_letters(lake_dir: LakePath, n: int = 5) -> list[dict[str, Any]]:
    """The `n` newest dead-letter rows (newest first), the columns a person needs to act on them."""
    path = lake.table_path(lake_dir, "dead_letter")
    if not path.is_dir():
        return []
    return _newest_rows(lake.open_table(path), "dead_lettered_at", n, list(DEAD_LETTER_SAMPLE_COLUMNS)).to_pylist()


def _newest_rows(table: DeltaTable, column: str, n: int, columns: list[str]) -> pa.Table:
    """The `n` rows with the largest `column`, largest first, read with a filter the files' statistics prune
    (`newest_floor`): they cost the newest files, not the whole table."""
    dataset = table.to_pyarrow_dataset()
    floor = newest_floor(_add_actions(table), column, n)
    newer = None if floor is None else pc.field(column) >= pa.scalar(floor, dataset.schema.field(column).type)
    return dataset.to_table(columns=columns, filter=newer).sort_by([(column, "descending")]).slice(0, n)


def newest_floor(actions: pa.Table, column: str, n: int) -> Any:
    """A value at or below the `n`-th largest of `column`, from the files' statistics (`get_add_actions`), so a
    filter `column >= it` keeps the `n` largest rows and lets every file whose maximum is below it be skipped;
    None when the statistics cannot say (none kept, or fewer than `n` rows with them).

    The files with the largest maxima are taken until they hold `n` values; every value in them is at or above
    the smallest of their minima, so at least `n` rows are, and the `n` largest rows are among those.
    """
    lo, hi, nulls = f"min.{column}", f"max.{column}", f"null_count.{column}"
    if not {lo, hi, nulls} <= set(actions.column_names):
        return None
    files = [r for r in actions.select(["num_records", nulls, lo, hi]).to_pylist() if r[lo] is not None and r[hi] is not None]
    floor, held = None, 0
    for r in sorted(files, key=lambda r: r[hi], reverse=True):
        floor = r[lo] if floor is None else min(floor, r[lo])
        held += (r["num_records"] or 0) - (r[nulls] or 0)
        if held >= n:
            return floor
    return None


def batches_since(lake_dir: LakePath, after: dt.datetime | None, limit: int = 100) -> list[dict[str, Any]]:
    """Micro-batches from `pipeline_metrics` that finished after `after` (the oldest `limit` of them;
    without `after`, the newest `limit`), oldest first, each with its rows per second.

    Read from the table's files with delta-rs: a Dagster sensor calls this every 30 s in a process that
    has no Spark, and one small table does not warrant a JVM.
    """
    path = lake.table_path(lake_dir, "pipeline_metrics")
    if not path.is_dir():
        return []
    columns = ["query_id", "batch_id", "started_at", "finished_at", "rows_read", "change_events", "markers", "dead_letters",
               "duplicates_skipped", "lag_seconds", "newest_source_ts", "newest_heartbeat_ts"]
    metrics = lake.open_table(path)
    present = set(metrics.schema().to_arrow().names)  # a lake from before a column has rows without it
    wanted = [c for c in columns if c in present]
    if after is not None:
        # Filtered as it is read: the files' and row groups' statistics leave out the old batches without reading them.
        dataset = metrics.to_pyarrow_dataset()
        newer = pc.field("finished_at") > pa.scalar(after, dataset.schema.field("finished_at").type)
        table = dataset.to_table(columns=wanted, filter=newer).sort_by([("finished_at", "ascending")]).slice(0, limit)
    else:
        table = metrics.to_pyarrow_table(columns=wanted)
        table = table.sort_by([("finished_at", "descending")]).slice(0, limit).sort_by([("finished_at", "ascending")])
    rows = table.to_pylist()
    for row in rows:
        seconds = (row["finished_at"] - row["started_at"]).total_seconds()
        row["seconds"] = round(seconds, 3)
        row["rows_per_second"] = round(row["rows_read"] / seconds, 1) if seconds > 0 else None
    return rows


@dataclass(frozen=True)
class TableCensus:
    """Events per source table in the raw log as of one of its versions: what `raw_census` counts on from.

    Kept between runs of the onboarding sensor (its cursor, `to_cursor`/`from_cursor`), so a run reads only
    the files added since the last one instead of the whole log's `table_id` column every time.
    """

    version: int
    counts: dict[str, int]
    files_read: int = 0  # data files this census read (every file of the log when it started afresh)
    afresh: bool = True  # counted from the whole log, not on from an earlier census

    def to_cursor(self) -> str:
        return json.dumps({"version": self.version, "counts": self.counts}, sort_keys=True)

    @staticmethod
    def from_cursor(cursor: str | None) -> TableCensus | None:
        """The census a cursor holds; None for no cursor or one written by something else (counted afresh)."""
        try:
            doc = json.loads(cursor) if cursor else None
            return TableCensus(int(doc["version"]), {str(k): int(v) for k, v in doc["counts"].items()}, afresh=False)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def raw_census(lake_dir: LakePath, since: TableCensus | None = None) -> TableCensus | None:
    """Events per source table in the raw log (None before it exists), counted on from `since` when it can be.

    Reads one column through delta-rs (no Spark), batch by batch: the onboarding sensor runs every few
    minutes in Dagster's daemon, and the column of a long-lived raw log would not fit its memory whole.
    The raw log only grows (appends, one per batch), so the files added after `since`'s version hold every
    event it has not counted. A version that removed files (`cdc maintain`'s OPTIMIZE rewrites them), an
    older version than `since`'s (a lake made anew), or one whose log is gone (cleaned up) is counted afresh.
    """
    path = lake.table_path(lake_dir, "raw_change_events")
    if not lake.exists(path):
        return None
    table = lake.open_table(path)
    fragments = list(table.to_pyarrow_dataset().get_fragments())
    new_files = files_added_since(path, table, since.version) if since is not None else None
    if new_files is not None:
        added = [f for f in fragments if f.path in new_files]
        if len(added) == len(new_files):
            fragments = added
        else:  # the dataset names its files otherwise than the log (a store's URL form, say): count afresh
            new_files = None
    counts = dict(since.counts) if since is not None and new_files is not None else {}
    read = 0
    for fragment in fragments:
        read += 1
        for batch in fragment.to_batches(columns=["table_id"]):
            for entry in pc.value_counts(batch.column(0)).to_pylist():
                if entry["values"] is not None:
                    counts[entry["values"]] = counts.get(entry["values"], 0) + int(entry["counts"])
    return TableCensus(table.version(), counts, files_read=read, afresh=new_files is None)


def files_added_since(path: LakePath, table: DeltaTable, version: int) -> set[str] | None:
    """The data files of `table` (at its version) that came after `version`, when every file of that version
    is still there, so those files hold exactly the rows added since (the raw log only grows); None when that
    cannot be said: files were rewritten (OPTIMIZE) or removed, `version` is newer than the table (a lake
    made anew), or its log is gone (cleaned up). Paths are relative to the table, as its pyarrow dataset's
    fragments name them."""
    if version > table.version():
        return None
    try:
        before = _data_files(lake.open_snapshot(path, version))
    except Exception:  # noqa: BLE001 - delta-rs raises several kinds for a version it cannot load (log cleaned up)
        return None
    now = _data_files(table)
    return now - before if before <= now else None


def _data_files(table: DeltaTable) -> set[str]:
    return set(_add_actions(table).column("path").to_pylist())


def unconfigured(census: TableCensus | None, configured_sources: set[str]) -> dict[str, int]:
    """Source tables seen in the raw log that have no `tables:` entry, with their event counts."""
    return {} if census is None else {table_id: n for table_id, n in census.counts.items() if table_id not in configured_sources}


SAMPLE = 10


def coverage(spark: Any, lake_dir: LakePath, table: Any) -> CheckOutcome:
    """Every key whose last raw event (by position) leaves it alive is in the latest state at that
    position, and every live key of the latest state is one of those.

    Computed from the raw log with Spark, independently of the latest-state code: a key change deletes
    the old key at its position, and a truncate at P deletes every key last changed below P.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from cdc_platform.lake import lake_spark
    from cdc_platform.views import table_frame

    # Only this table and the raw log, pinned in that order: the raw log is never older than the state it checks.
    state = table_frame(spark, lake_dir, table.name).where(F.col(table.key[0]).isNotNull())
    raw = lake_spark.pinned(spark, lake.table_path(lake_dir, "raw_change_events"))[1].where(F.col("table_id") == table.source)
    types = {f.name: f.dataType for f in state.schema.fields}
    key_type = StructType([StructField(k, types.get(k, StringType())) for k in table.key])
    key_cols = [F.col(k) for k in table.key]
    events = raw.select(
        F.from_json("key", key_type).alias("k"), F.from_json("before", key_type).alias("bk"), "op", "position",
        F.coalesce("tx_total_order", F.lit(0)).alias("ord"),
    )
    changes = events.where("op != 't'").select("k", "position", "ord", (F.col("op") != "d").alias("live"))
    moved = events.where("op = 'u' AND bk IS NOT NULL AND bk != k").select(F.col("bk").alias("k"), "position", "ord", F.lit(False).alias("live"))
    last = changes.unionByName(moved).groupBy("k").agg(F.max(F.struct("position", "ord", "live")).alias("last"))
    truncated_at = events.where("op = 't'").agg(F.max("position")).collect()[0][0]
    expected = last.where(F.col("last.live"))
    if truncated_at is not None:
        expected = expected.where(F.col("last.position") >= F.lit(truncated_at))
    expected = expected.select(F.to_json("k").alias("key"), F.col("last.position").alias("expected_position"))
    actual = state.select(F.to_json(F.struct(*key_cols)).alias("key"), F.col("_position").alias("state_position"), F.col("_deleted"))
    joined = expected.join(actual, "key", "full_outer")
    kinds = {
        "missing": "expected_position IS NOT NULL AND (state_position IS NULL OR _deleted)",
        "wrong_position": "expected_position IS NOT NULL AND NOT _deleted AND state_position != expected_position",
        "extra": "expected_position IS NULL AND state_position IS NOT NULL AND NOT _deleted",
    }
    # One job for every count; the mismatched keys are read only when there are any (a passing check is the common case).
    totals = joined.agg(
        F.count_if(F.expr("expected_position IS NOT NULL")).alias("expected"),
        F.count_if(F.expr("state_position IS NOT NULL AND NOT _deleted")).alias("state"),
        *(F.count_if(F.expr(cond)).alias(name) for name, cond in kinds.items()),
    ).collect()[0]
    n_expected, n_state = int(totals["expected"]), int(totals["state"])
    counts = {name: int(totals[name]) for name in kinds}
    samples = {name: [r["key"] for r in joined.where(kinds[name]).select("key").orderBy("key").limit(SAMPLE).collect()]
               for name in kinds if counts[name]}
    covered = n_expected - counts["missing"] - counts["wrong_position"]
    pct = 100.0 * covered / n_expected if n_expected else 100.0
    meta: dict[str, Any] = {"expected_live_keys": n_expected, "state_live_keys": n_state, "coverage_percent": round(pct, 4), **counts}
    if samples:
        meta["mismatched_keys"] = samples
    if any(counts.values()):
        parts = [f"{n:,} {name.replace('_', ' ')}" for name, n in counts.items() if n]
        first = next(iter(samples.values()))[0]
        return CheckOutcome(False, Severity.ERROR, f"{table.name} differs from its raw log: {', '.join(parts)} (e.g. key {first}); "
                            f"run `cdc rebuild --table {table.name}` after fixing the cause", meta)
    return CheckOutcome(True, Severity.ERROR, f"{table.name}: all {n_expected:,} live keys of the raw log are in the latest state at their positions", meta)


def completeness(spark: Any, lake_dir: LakePath, timeout_seconds: float, retention_seconds: float | None = None) -> CheckOutcome:
    """Stripe's completeness measure: for every END whose table's stream has moved `timeout_seconds`
    past it, the distinct events landed for that table equal the count END announced; plus transactions
    that expired incomplete, and transactions still open `retention_seconds` (default 5 x timeout)
    after even the fastest stream moved past them.

    The clock is each table's own event time (kept by the transaction stage in `open_transactions`),
    never one global "newest timestamp": a topic read late is not a topic that lost events.
    """
    from pyspark.sql import functions as F

    from cdc_platform.views import register_tables

    register_tables(spark, lake_dir, ("open_transactions", "incomplete_transactions", "transaction_markers", "raw_change_events"))
    retention = retention_seconds if retention_seconds is not None else 5 * timeout_seconds
    newest = _as_utc(column_max(lake.table_path(lake_dir, "raw_change_events"), "source_ts"))
    meta: dict[str, Any] = {"timeout_seconds": float(timeout_seconds)}
    if newest is None:
        return CheckOutcome(True, Severity.ERROR, "the raw log is empty: no transaction to judge yet", meta)
    clocks = {r["stream"]: _as_utc(r["event_time"]) for r in
              spark.table("open_transactions").where("entry = 'stream'").select("stream", "event_time").collect() if r["event_time"] is not None}
    fastest = max(clocks.values(), default=newest)
    meta["stream_event_time"] = {k: v.isoformat() for k, v in sorted(clocks.items()) if v is not None}
    timeout = dt.timedelta(seconds=timeout_seconds)
    clock_rows = [(name, when - timeout) for name, when in clocks.items() if when is not None]
    cutoffs = spark.createDataFrame(clock_rows, "table_id string, cutoff timestamp") if clock_rows else None
    ends = (spark.table("transaction_markers").where(F.col("status") == "END")
            .select("transaction_id", "marker_ts", F.explode("data_collections").alias("table_id", "expected")))
    if cutoffs is not None:
        ends = ends.join(F.broadcast(cutoffs), "table_id", "left")
    else:
        ends = ends.withColumn("cutoff", F.lit(None).cast("timestamp"))
    ends = ends.where(F.col("marker_ts") < F.coalesce(F.col("cutoff"), F.lit(newest - timeout)))
    landed = (spark.table("raw_change_events").where(F.col("transaction_id").isNotNull())
              .groupBy("transaction_id", "table_id").agg(F.countDistinct("event_id").alias("landed")))
    per_table = ends.join(landed, ["transaction_id", "table_id"], "left").fillna(0, ["landed"]).cache()
    try:
        per_tx = per_table.groupBy("transaction_id").agg(F.max(F.col("landed") != F.col("expected")).alias("short"))
        seen = per_tx.agg(F.count("*").alias("checked"), F.count_if("short").alias("short")).collect()[0]
        checked, n_bad = int(seen["checked"]), int(seen["short"])
        bad_ids = ([r["transaction_id"] for r in per_tx.where("short").select("transaction_id").orderBy("transaction_id").limit(SAMPLE).collect()]
                   if n_bad else [])
        totals = {r["table_id"]: {"expected": int(r["e"]), "landed": int(r["l"])}
                  for r in per_table.groupBy("table_id").agg(F.sum("expected").alias("e"), F.sum("landed").alias("l")).collect()}
    finally:
        per_table.unpersist()
    cutoff = fastest - dt.timedelta(seconds=retention)
    incomplete = spark.table("incomplete_transactions")
    reasons = {r["reason"]: int(r["n"]) for r in incomplete.groupBy("reason").agg(F.count("*").alias("n")).collect()}
    n_incomplete = sum(reasons.values())
    stuck = (spark.table("open_transactions").where("entry = 'open'")
             .where(F.coalesce("end_ts", "last_event_ts", "begin_ts") < F.lit(cutoff)))
    n_stuck = stuck.count()
    # The ids are read only when there is something to show (a passing check is the common case).
    incomplete_ids = ([r["transaction_id"] for r in incomplete.select("transaction_id").orderBy("transaction_id").limit(SAMPLE).collect()]
                      if n_incomplete else [])
    stuck_ids = [r["transaction_id"] for r in stuck.select("transaction_id").orderBy("transaction_id").limit(SAMPLE).collect()] if n_stuck else []
    pct = 100.0 * (checked - n_bad) / checked if checked else 100.0
    meta |= {"retention_seconds": float(retention), "transactions_checked": checked, "count_mismatches": n_bad, "completeness_percent": round(pct, 4),
             "incomplete_transactions": n_incomplete, "open_past_timeout": n_stuck, "expected_vs_landed_per_table": totals}
    if reasons:
        meta["incomplete_by_reason"] = reasons
    problems = []
    if n_bad:
        meta["mismatched_transactions"] = bad_ids
        problems.append(f"{n_bad:,} transaction(s) whose END counts differ from the events landed (e.g. {bad_ids[0]})")
    if n_incomplete:
        meta["incomplete_transaction_ids"] = incomplete_ids
        problems.append(f"{n_incomplete:,} incomplete transaction(s) ({', '.join(f'{k} ×{v}' for k, v in reasons.items())}; e.g. {incomplete_ids[0]})")
    if n_stuck:
        meta["open_past_timeout_ids"] = stuck_ids
        problems.append(f"{n_stuck:,} transaction(s) still open {retention:,.0f} s of event time after the fastest stream passed them (e.g. {stuck_ids[0]})")
    if problems:
        return CheckOutcome(False, Severity.ERROR, "; ".join(problems), meta)
    return CheckOutcome(True, Severity.ERROR, f"all {checked:,} transactions past the timeout landed every event END announced", meta)
