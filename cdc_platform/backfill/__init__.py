"""Backfill: load a snapshot of a source table into the raw log and the latest state, never over newer data.

A snapshot is what the table held at one source position (its *as-of*). Netflix DBLog's rule decides
which rows may land: a snapshot row whose key has a change in the log at a higher position is stale and
is dropped, whether that change is an update or a delete, so a backfill can neither overwrite a newer
row nor resurrect a deleted one. The rule is checked against the raw log, which keeps every delete, so
it holds even after maintenance has purged the latest state's tombstones; and the rows that do land are
applied by the same position-ordered merge as the stream, so a change that lands while the backfill
runs still wins by position.

Inputs, under `<snapshots>/<table name>/` (config `snapshots:`, default `<config dir>/snapshots`):

* `*.jsonl` / `*.json`: Debezium events (typically `op` r from an initial or ad-hoc snapshot), each
  carrying its own position;
* `*.csv` / `*.parquet`: plain rows, plus `as_of.json` naming the source position of the snapshot in the
  connector's own terms, e.g. `{"connector": "mysql", "file": "mysql-bin.000003", "pos": 4821}` or
  `{"connector": "postgresql", "lsn": 34078720}`, and optionally `ts_ms`.

Every row goes through the same parser as the stream (`envelope.parse_line`), so keys and positions are
normalised exactly as streamed events are; rows it rejects become dead letters (stage `backfill`).

Where the work runs: the snapshot is read and parsed on the driver, which holds its rows anyway; the
lake's side (each snapshot key's newest log position and its latest-state row) is computed on the
executors over the table's whole history and matched with the snapshot's keys there, so the driver
receives one entry per snapshot key whatever the length of the history.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import hashlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from cdc_platform import lake
from cdc_platform.lake import insert_new, lake_spark, schemas
from cdc_platform.spark import spark_jobs
from cdc_platform.config import PlatformConfig, TableConfig
from cdc_platform.parse.envelope import KeySpec, loads_json, parse_line
from cdc_platform.errors import ConfigError, LakeError
from cdc_platform.stages.latest_state.rows import image_key
from cdc_platform.parse.parsed_batches import rows_to_batch, split_parsed
from cdc_platform.stages.stage import DEAD_LETTER, RAW, BatchContext, dead_letter_rows

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

STAGE = "backfill"
AS_OF_FILE = "as_of.json"
_SCHEMA_NAMESPACE = frozenset({"postgresql", "sqlserver", "oracle", "db2"})
SAMPLE_KEYS = 10


@dataclass
class SnapshotDiff:
    """What a snapshot load did (or, on a dry run, would do) to one table."""

    table: str
    snapshot_rows: int = 0
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    skipped_stale: int = 0  # the log has a newer change to the key
    skipped_deleted: int = 0  # ... and that change is (or led to) a delete
    invalid: int = 0  # rows the parser rejected (dead letters when committed)
    dry_run: bool = False
    committed: bool = False
    samples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def applied(self) -> int:
        return self.inserted + self.updated + self.unchanged

    def as_metadata(self) -> dict[str, Any]:
        return {
            "snapshot_rows": self.snapshot_rows, "inserted": self.inserted, "updated": self.updated, "unchanged": self.unchanged,
            "skipped_stale": self.skipped_stale, "skipped_deleted": self.skipped_deleted, "invalid": self.invalid,
            "dry_run": self.dry_run, "committed": self.committed, "sample_keys": self.samples,
        }

    def summary(self) -> str:
        verb = "would insert" if self.dry_run else "inserted"
        return (f"{self.table}: {self.snapshot_rows:,} snapshot rows; {verb} {self.inserted:,}, updated {self.updated:,}, "
                f"unchanged {self.unchanged:,}; skipped {self.skipped_stale:,} stale and {self.skipped_deleted:,} deleted in the log; "
                f"{self.invalid:,} invalid" + (" (dry run: nothing committed)" if self.dry_run else ""))


def snapshot_dir(config: PlatformConfig, table: TableConfig) -> Path:
    base = config.snapshots if config.snapshots is not None else config.lake.parent / "snapshots"
    return base / table.name


def _json_default(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    raise TypeError(f"cannot serialise {type(value).__name__}")


def _as_of(directory: Path) -> dict[str, Any]:
    path = directory / AS_OF_FILE
    if not path.is_file():
        raise ConfigError(
            f"{directory} has CSV/Parquet rows but no {AS_OF_FILE}; add one naming the snapshot's source position, "
            'e.g. {"connector": "mysql", "file": "mysql-bin.000003", "pos": 4821} or {"connector": "postgresql", "lsn": 34078720}'
        )
    try:
        as_of = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc})") from exc
    if not isinstance(as_of, dict) or not isinstance(as_of.get("connector"), str):
        raise ConfigError(f"{path} must be an object with at least `connector` and the connector's position fields")
    return as_of


def _row_lines(rows: list[dict[str, Any]], table: TableConfig, as_of: dict[str, Any]) -> Iterator[str]:
    """Plain rows as Debezium snapshot reads at the as-of position, so the stream's parser normalises them."""
    namespace, name = table.source.split(".", 1)
    connector = as_of["connector"]
    source = {k: v for k, v in as_of.items()}
    source |= {"table": name, "snapshot": "true", ("schema" if connector in _SCHEMA_NAMESPACE else "db"): namespace}
    if connector in _SCHEMA_NAMESPACE:
        source.setdefault("db", namespace)
    ts = as_of.get("ts_ms")
    for row in rows:
        envelope = {"before": None, "after": row, "source": source, "op": "r", "ts_ms": ts, "transaction": None}
        yield json.dumps(envelope, default=_json_default, ensure_ascii=False)


def read_snapshot(config: PlatformConfig, table: TableConfig) -> list[tuple[str, str]]:
    """All snapshot lines of a table as (line, source file), in file-name order."""
    directory = snapshot_dir(config, table)
    if not directory.is_dir():
        raise ConfigError(f"no snapshot for {table.name}: put Debezium JSONL, or CSV/Parquet plus {AS_OF_FILE}, in {directory}")
    lines: list[tuple[str, str]] = []
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != AS_OF_FILE and not p.name.startswith((".", "_")))
    for path in files:
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            lines += [(line, str(path)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        elif suffix in (".csv", ".parquet"):
            data = pacsv.read_csv(path) if suffix == ".csv" else pq.read_table(path)
            lines += [(line, str(path)) for line in _row_lines(data.to_pylist(), table, _as_of(directory))]
        else:
            raise ConfigError(f"{path}: unsupported snapshot file; use .jsonl/.json (Debezium events) or .csv/.parquet with {AS_OF_FILE}")
    if not lines:
        raise ConfigError(f"{directory} holds no snapshot rows")
    return lines


KEY = "__key"  # a snapshot key's canonical text (`image_key`) beside the lake's rows it is matched with


def _key_frame(spark: Any, keys: Iterable[str | None]) -> DataFrame:
    """The snapshot's keys (which the driver parsed from the snapshot) as a one-column frame to match the lake's rows with."""
    schema = pa.schema([(KEY, pa.string())])
    return lake_spark.from_arrow(spark, pa.table({KEY: pa.array(sorted({k for k in keys if k is not None}), pa.string())}), schema)


def _newest_raw_positions(config: PlatformConfig, table: TableConfig, keys: DataFrame) -> dict[str, tuple[str, str]]:
    """Per snapshot key, the highest position in the raw log and the op there (DBLog's 'log event in the window').

    Runs on the executors over the table's whole log, in one query; the driver gets one row per snapshot
    key it has, and the newest truncate under the key "", so a long history costs the executors, never the
    driver's memory.
    """
    from pyspark.sql import functions as F

    spark = lake_spark.session()
    raw = lake_spark.read(spark, lake.table_path(config.lake, RAW)).where(F.col("table_id") == table.source)
    logged = raw.where((F.col("op") != "t") & F.col("key").isNotNull()).select("key", "position", "op")
    moved = (raw.where((F.col("op") == "u") & F.col("before").isNotNull() & (F.col("before") != ""))  # a key change deletes the old key
             .select("key", "before", "position").mapInArrow(functools.partial(_moved_keys, table=table), "key string, position string, op string"))
    truncates = raw.where((F.col("op") == "t") & F.col("position").isNotNull()).select(F.lit("").alias("key"), "position", "op")
    newest = (logged.unionByName(moved).join(keys.withColumnRenamed(KEY, "key"), "key", "left_semi").unionByName(truncates)
              .groupBy("key").agg(F.max_by(F.struct("position", "op"), F.struct("position", "op")).alias("newest")))
    return {row["key"]: (row["newest"]["position"], row["newest"]["op"]) for row in newest.toArrow().to_pylist()}


def _moved_keys(batches: Iterator[pa.RecordBatch], table: TableConfig) -> Iterator[pa.RecordBatch]:
    """Updates whose before image has another key than the event's: that old key, deleted at the update's position."""
    for batch in batches:
        old_keys, positions = [], []
        for key, before, position in zip(*(batch.column(c).to_pylist() for c in ("key", "before", "position"))):
            old = image_key(loads_json(before), table.key)  # read as the stage reads it: every digit kept
            if old is not None and old != key:
                old_keys.append(old)
                positions.append(position)
        yield pa.RecordBatch.from_arrays(
            [pa.array(old_keys, pa.string()), pa.array(positions, pa.string()), pa.array(["d"] * len(old_keys), pa.string())],
            names=["key", "position", "op"],
        )


def _with_keys(batches: Iterator[pa.RecordBatch], table: TableConfig) -> Iterator[pa.RecordBatch]:
    """Latest-state rows with their key's canonical text, the form the snapshot's keys take."""
    for batch in batches:
        images = batch.select(list(table.key)).to_pylist()
        yield batch.append_column(KEY, pa.array([image_key(image, table.key) for image in images], pa.string()))


def _state_frame(config: PlatformConfig, table: TableConfig) -> DataFrame | None:
    """The table's current rows, one per key (tombstones included), each with its key's text in `KEY`; None if none landed."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from cdc_platform.stages.latest_state.compaction import fold_frame

    path = lake.table_path(config.lake, table.name)
    spark = lake_spark.session()
    if not lake_spark.is_table(spark, path):
        return None
    rows = lake_spark.read(spark, path)
    if any(k not in rows.columns for k in table.key):
        return None  # nothing has landed yet: the table has only its metadata columns
    folded = fold_frame(rows.where(F.col(lake.quote_identifier(table.key[0])).isNotNull()), table.key)
    schema = StructType([*folded.schema.fields, StructField(KEY, StringType())])
    return folded.mapInArrow(functools.partial(_with_keys, table=table), schema).where(F.col(KEY).isNotNull())


def _state_rows(state: DataFrame | None, keys: DataFrame) -> dict[str, dict[str, Any]]:
    """The latest-state rows (`_state_frame`) of the snapshot's keys, by key: matched on the executors, only those collected."""
    if state is None:
        return {}
    out = {}
    for row in state.join(keys, KEY, "left_semi").toArrow().to_pylist():
        out[row.pop(KEY)] = row
    return out


def _same_values(state: dict[str, Any], image: dict[str, Any]) -> bool:
    return all(json.dumps(state.get(c), default=_json_default) == json.dumps(v, default=_json_default) for c, v in image.items() if c in state)


def _sample(diff: SnapshotDiff, kind: str, key: str) -> None:
    keys = diff.samples.setdefault(kind, [])
    if len(keys) < SAMPLE_KEYS:
        keys.append(key)


def load_snapshot(config: PlatformConfig, name: str, *, dry_run: bool = False, progress: Callable[[str], None] | None = None) -> SnapshotDiff:
    """Load `<snapshots>/<name>/` into the raw log and the latest state; with `dry_run`, only report the diff."""
    lake_spark.session()  # started first, so that its jobs carry the label
    with spark_jobs.labelled("backfill", f"cdc backfill{' (dry run)' if dry_run else ''}: {name}"):
        return _load_snapshot(config, name, dry_run=dry_run, progress=progress)


def load_lines(config: PlatformConfig, name: str, lines: list[tuple[str, str]], *, dry_run: bool = False,
               progress: Callable[[str], None] | None = None) -> SnapshotDiff:
    """Debezium event lines of one table, each with where it came from, loaded by the same rules as a snapshot
    (`load_snapshot`): what the repair's removal of rows the source no longer has goes through."""
    lake_spark.session()
    with spark_jobs.labelled("backfill", f"cdc repair{' (dry run)' if dry_run else ''}: {name}"):
        return _load_snapshot(config, name, dry_run=dry_run, progress=progress, lines=lines)


def _load_snapshot(config: PlatformConfig, name: str, *, dry_run: bool, progress: Callable[[str], None] | None,
                   lines: list[tuple[str, str]] | None = None) -> SnapshotDiff:
    from cdc_platform.stages.latest_state import Events, LatestStateStage, apply_table

    say = progress or (lambda _m: None)
    table = config.table(name)
    spark = lake_spark.session()
    raw_path = lake.table_path(config.lake, RAW)
    if not lake_spark.is_table(spark, raw_path):
        raise LakeError(f"{config.lake} has no raw_change_events yet; run `cdc run` once before a backfill")
    # columns added since the lake was made
    lake_spark.ensure_table(spark, raw_path, lake_spark.spark_schema(schemas.RAW_CHANGE_EVENTS), schemas.RAW_PARTITION_BY)
    lines = read_snapshot(config, table) if lines is None else lines
    keys = KeySpec({table.source: table.key})
    parsed = pa.Table.from_batches([rows_to_batch([parse_line(line, src, keys) for line, src in lines])])
    batch = split_parsed(parsed, batch_id=0)
    events = batch.events.filter(pc.equal(batch.events.column("table_id"), table.source))
    stray = batch.events.num_rows - events.num_rows
    diff = SnapshotDiff(table=name, snapshot_rows=len(lines), invalid=batch.dead_letters.num_rows + batch.markers.num_rows + stray, dry_run=dry_run)

    snapshot_keys = _key_frame(spark, events.column("key").to_pylist())
    newest = _newest_raw_positions(config, table, snapshot_keys)
    truncated_at = newest.get("", ("", ""))[0]
    state = _state_rows(_state_frame(config, table), snapshot_keys)
    keep: list[int] = []
    for i, (key, position, op, after) in enumerate(zip(*(events.column(c).to_pylist() for c in ("key", "position", "op", "after")))):
        logged = newest.get(key)
        if (logged is not None and logged[0] > position) or truncated_at > position:
            deleted = truncated_at > position or (logged is not None and logged[1] == "d") or bool(state.get(key, {}).get("_deleted"))
            kind = "skipped_deleted" if deleted else "skipped_stale"
        elif op == "d":
            kind = "updated"
            keep.append(i)
        else:
            current = state.get(key)
            if current is None or current.get("_deleted"):
                kind = "inserted"
            elif current.get("_position", "") >= position:
                kind = "unchanged" if _same_values(current, json.loads(after or "{}")) else "skipped_stale"
            else:
                kind = "unchanged" if _same_values(current, json.loads(after or "{}")) else "updated"
            if kind != "skipped_stale":
                keep.append(i)
        setattr(diff, kind, getattr(diff, kind) + 1)
        _sample(diff, kind, key)
    say(diff.summary())
    if dry_run:
        return diff

    kept = events.take(pa.array(keep, pa.int64()))
    fingerprint = hashlib.blake2b("\n".join(sorted(kept.column("event_id").to_pylist())).encode(), digest_size=8).hexdigest()
    ctx = BatchContext(config, query_id=f"backfill-{name}-{fingerprint}", batch_id=0)
    if kept.num_rows:
        insert_new.insert_new_once(lake_spark.from_arrow(spark, kept, schemas.RAW_CHANGE_EVENTS), raw_path, "event_id", "event_date",
                                   ctx.app_id(RAW), 0, range_column="position")
    applied = apply_table(spark, config.lake, table, Events(kept), ctx=ctx, stage=LatestStateStage()) if kept.num_rows else None
    dead = [batch.dead_letters]
    if applied is not None and applied.dead:
        dead.append(dead_letter_rows(applied.dead, stage=STAGE, batch_id=None))
    dead_rows = pa.concat_tables(dead)
    if dead_rows.num_rows:
        dead_rows = dead_rows.set_column(dead_rows.schema.get_field_index("stage"), "stage", pa.array([STAGE] * dead_rows.num_rows))
        dead_path = lake.table_path(config.lake, DEAD_LETTER)
        lake_spark.ensure_table(spark, dead_path, lake_spark.spark_schema(schemas.DEAD_LETTER))
        lake_spark.append_once(lake_spark.from_arrow(spark, dead_rows, schemas.DEAD_LETTER), dead_path, ctx.app_id(DEAD_LETTER), 0)
    diff.committed = True
    return diff


def _extra_in_lake(state: DataFrame | None, keys: DataFrame, as_of: str, sample: int) -> tuple[int, list[str]]:
    """Live lake rows (`_state_frame`) at or below the snapshot's position whose key the snapshot lacks: how many, and the first keys."""
    from pyspark.sql import functions as F

    if state is None:
        return 0, []
    extra = state.join(keys, KEY, "left_anti").where(
        ~F.coalesce(F.col("_deleted"), F.lit(False)) & (F.coalesce(F.col("_position"), F.lit("")) <= as_of)
    ).select(KEY)
    count = extra.count()
    return count, [row[KEY] for row in extra.orderBy(KEY).limit(sample).collect()] if count else []


def compare_snapshot(config: PlatformConfig, name: str) -> Any:
    """Source rows (a snapshot in `<snapshots>/<name>/`) vs lake rows: coverage % and mismatched keys.

    Keys the lake changed after the snapshot's position are left out (the lake is rightly newer); of the
    rest, every snapshot row must be live in the latest state with the same values, and every live lake
    row at or below the snapshot's position must be in the snapshot.
    """
    from cdc_platform.checks import SAMPLE, CheckOutcome, Severity

    table = config.table(name)
    keys = KeySpec({table.source: table.key})
    lines = read_snapshot(config, table)
    parsed = pa.Table.from_batches([rows_to_batch([parse_line(line, src, keys) for line, src in lines])])
    events = split_parsed(parsed, batch_id=0).events
    events = events.filter(pc.equal(events.column("table_id"), table.source))
    snap = {k: (p, json.loads(a or "{}")) for k, p, a in zip(*(events.column(c).to_pylist() for c in ("key", "position", "after")))}
    as_of = max((p for p, _ in snap.values()), default="")
    snapshot_keys = _key_frame(lake_spark.session(), snap)
    frame = _state_frame(config, table)
    if frame is not None:
        frame = frame.persist()  # folded once for both questions asked of it
    try:
        state = _state_rows(frame, snapshot_keys)
        extra_count, extra = _extra_in_lake(frame, snapshot_keys, as_of, SAMPLE)
    finally:
        if frame is not None:
            frame.unpersist()
    counts = {"matched": 0, "newer_in_lake": 0, "missing_in_lake": 0, "different_values": 0, "extra_in_lake": 0}
    samples: dict[str, list[str]] = {}
    for key, (position, image) in snap.items():
        current = state.get(key)
        if current is not None and current.get("_position", "") > position:
            kind = "newer_in_lake"
        elif current is None or current.get("_deleted"):
            kind = "missing_in_lake"
        else:
            kind = "matched" if _same_values(current, image) else "different_values"
        counts[kind] += 1
        if kind not in ("matched", "newer_in_lake") and len(samples.setdefault(kind, [])) < SAMPLE:
            samples[kind].append(key)
    counts["extra_in_lake"] = extra_count
    if extra:
        samples["extra_in_lake"] = extra
    considered = len(snap) - counts["newer_in_lake"]
    pct = 100.0 * counts["matched"] / considered if considered else 100.0
    # Named apart from the raw-log coverage figures, which the same Dagster check reports beside these.
    meta: dict[str, Any] = {"snapshot_rows": len(snap), "snapshot_position": as_of, "snapshot_coverage_percent": round(pct, 4), **counts}
    bad = {k: v for k, v in counts.items() if k in ("missing_in_lake", "different_values", "extra_in_lake") and v}
    if bad:
        meta["snapshot_mismatched_keys"] = {k: samples[k] for k in bad}
        described = ", ".join(f"{v:,} {k.replace('_', ' ')}" for k, v in bad.items())
        return CheckOutcome(False, Severity.ERROR, f"{name} vs its source snapshot: {pct:.2f}% covered; {described}", meta)
    return CheckOutcome(True, Severity.ERROR, f"{name} vs its source snapshot: {pct:.2f}% covered ({counts['matched']:,} rows match, "
                        f"{counts['newer_in_lake']:,} newer in the lake)", meta)
