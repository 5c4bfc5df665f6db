"""Coverage against the live source: a table's latest state compared with the source table itself.

The raw-log coverage check (`checks.coverage`) proves the latest state agrees with the lake's own log;
it cannot see an event that never reached the log. This check reads the source database
(`source_connection`) in one consistent snapshot, with the log position that snapshot saw, and
compares it with the lake row by row and value by value:

* a key the lake holds at a *higher* position than the read's was changed after the read: left out;
* every other source row must be live in the lake with equal values (`missing_in_lake`, `different_values`);
* every other live lake row must be in the source (`extra_in_lake`).

A stream that is merely behind looks like loss in a single read, so the keys that differ are read
again, from both sides, `recheck_after` seconds later (a new snapshot, a new position); only what
still differs fails the check. Values are compared after mapping both sides to one form (README,
"Types"): timestamps as UTC microseconds (a zone-less source value taken as UTC, as Debezium does),
numbers exactly, JSON by content, uuid/enum as text, time and interval as microseconds (the lake keeps
Debezium's integer, in ms, µs or ns by the column's precision).

Where the work runs. Neither side is held by the driver: it streams the source's rows from the
database cursor in chunks (`source_connection.read_table_chunks`) into a scratch folder of the lake
(`_scratch/`, Parquet, removed afterwards; a table of one chunk goes straight from the driver, without
the round trip), each row with the text of its key as both sides agree on it
(`key_of`); the executors add the same text to the lake's rows, both sides are cogrouped into buckets
by a hash of it, and each bucket runs `compare`, the per-key rules above. The driver collects the
buckets' counts and, when at most `MAX_RECHECK` keys differ, those keys (else a sample of them).
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import math
import pickle
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.checks import SAMPLE, CheckOutcome, Severity
from cdc_platform.config import TableConfig
from cdc_platform.errors import ConfigError
from cdc_platform.stages.latest_state.layout import RESERVED
from cdc_platform.sources.source_connection import SourceConnection, SourceRead, read_table_chunks
from cdc_platform.storage import LakePath

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
KINDS = ("missing_in_lake", "different_values", "extra_in_lake")
#: At most this many differing keys are read again; more than that is not a stream that is behind.
MAX_RECHECK = 10_000
#: Rows of each side a bucket of the compare holds, about (the buckets are sized from the source's rows).
BUCKET_ROWS = 25_000
#: The columns the compare adds: a row's key text (`key_text`), its bucket, a source row (pickled).
KEY, BUCKET, ROW = "_cov_key", "_cov_bucket", "_cov_row"
#: What each bucket returns: counts (`part` count: `name` a verdict, or `lake_rows`), per-column
#: differences (`column`), and each differing key (`key`: `name` its verdict, `shown`, `values` pickled).
PARTS = pa.schema([pa.field("part", pa.string()), pa.field("name", pa.string()), pa.field("n", pa.int64()),
                   pa.field("shown", pa.string()), pa.field("values", pa.binary())])

Key = tuple[Any, ...]


def _micros(value: dt.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _number(value: Any) -> decimal.Decimal | None:
    try:
        n = decimal.Decimal(str(value))
    except (decimal.InvalidOperation, ValueError):
        return None
    return n if n.is_finite() else None


def _json(value: Any) -> Any:
    """JSON content with numbers as exact decimals, so `1.50` and `1.5` agree and key order does not matter."""
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float, decimal.Decimal)):
        n = _number(value)
        return str(n.normalize()) if n is not None else str(value)
    return canonical(value)


def _parse_json(text: Any) -> Any:
    if not isinstance(text, str) or not text.lstrip().startswith(("{", "[")):
        return None
    try:
        return json.loads(text, parse_float=decimal.Decimal)
    except ValueError:
        return None


def canonical(value: Any) -> Any:
    """One comparable, hashable form of a value from either side (driver or lake)."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float, decimal.Decimal)):
        n = _number(value)
        return ("n", str(n.normalize())) if n is not None else ("n", str(value))
    if isinstance(value, dt.datetime):
        return ("ts", _micros(value))
    if isinstance(value, dt.date):
        return ("date", value.isoformat())
    if isinstance(value, dt.time):
        return ("us", ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000 + value.microsecond)
    if isinstance(value, dt.timedelta):
        return ("us", (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(value))
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (dict, list, tuple)):
        return ("json", json.dumps(_json(value), sort_keys=True))
    return str(value)


def same_value(source: Any, stored: Any) -> bool:
    """Whether the lake's value is the source's, under the type mapping of the module docstring."""
    a, b = canonical(source), canonical(stored)
    if a == b:
        return True
    if source is None or stored is None:
        return False
    if isinstance(source, (dict, list)) or isinstance(stored, str) and isinstance(source, str):
        left = source if isinstance(source, (dict, list)) else _parse_json(source)
        right = _parse_json(stored)
        return left is not None and right is not None and _json(left) == _json(right)
    if isinstance(source, (dt.time, dt.timedelta)) and isinstance(stored, int) and not isinstance(stored, bool):
        us = a[1]
        return stored in (us, us * 1000) or (us % 1000 == 0 and stored == us // 1000)
    if isinstance(stored, bool) and isinstance(source, int):  # MySQL's TINYINT(1), which Debezium calls boolean
        return source in (0, 1) and bool(source) == stored
    if isinstance(source, (int, float, decimal.Decimal)) and isinstance(stored, str):  # a decimal kept as exact text
        return _number(stored) is not None and canonical(_number(stored)) == a
    if isinstance(source, str) and isinstance(stored, (int, float, decimal.Decimal)):
        return _number(source) is not None and canonical(_number(source)) == b
    return False


def key_of(table: TableConfig, row: Mapping[str, Any]) -> Key:
    """A key as both sides agree on it (an integer id and the same id as a decimal are one key)."""
    return tuple(canonical(row[k]) for k in table.key)


@dataclass
class LakeSide:
    """The latest state of one table as the compare needs it: per key, source columns and position."""

    columns: tuple[str, ...]
    rows: dict[Key, dict[str, Any]]


def key_text(key: Key) -> str:
    """A key's text, equal for two rows exactly when `key_of` is: what the two sides are joined on."""
    return repr(key)


def lake_frame(spark: SparkSession, lake_dir: LakePath, table: TableConfig) -> DataFrame | None:
    """The folded latest state (tombstones included, with `_position` and `_deleted`) of the rows with a key,
    through Spark; None when nothing has landed yet (no table, or only its metadata columns)."""
    from pyspark.sql import functions as F

    from cdc_platform.views import table_frame

    if not lake.exists(lake.table_path(lake_dir, table.name)):
        return None
    frame = table_frame(spark, lake_dir, table.name)
    columns = [c for c in frame.columns if c not in RESERVED]
    if any(k not in columns for k in table.key):
        return None
    return frame.where(F.col(table.key[0]).isNotNull()).select(*columns, "_position", "_deleted")


@dataclass
class Compared:
    """Per-key verdicts of one compare; only keys that differ are kept by name."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(("matched", "changed_after_read", *KINDS), 0))
    differing: dict[Key, tuple[str, tuple[Any, ...]]] = field(default_factory=dict)  # key -> (kind, key values to re-read)
    different_columns: dict[str, int] = field(default_factory=dict)


def _column_map(source_columns: Sequence[str], lake_columns: Sequence[str]) -> dict[str, str]:
    exact = set(lake_columns)
    folded = {c.lower(): c for c in lake_columns}
    return {c: c if c in exact else folded[c.lower()] for c in source_columns if c in exact or c.lower() in folded}


def compare(read: SourceRead, stored: LakeSide, table: TableConfig, keys: set[Key] | None = None) -> Compared:
    """Judge every source row of `read` and every live lake row (or only `keys`) against each other."""
    out = Compared()
    columns = _column_map(read.columns, stored.columns)
    _require_key(table, read.columns)
    key_at = [read.columns.index(k) for k in table.key]
    seen: set[Key] = set()
    for row in read.rows:
        key_values = tuple(row[i] for i in key_at)
        key = tuple(canonical(v) for v in key_values)
        seen.add(key)
        current = stored.rows.get(key)
        if current is not None and current["_position"] > read.position:
            out.counts["changed_after_read"] += 1
            continue
        if current is None or current["_deleted"]:
            kind = "missing_in_lake"
        else:
            bad = [c for c, lc in columns.items() if not same_value(row[read.columns.index(c)], current.get(lc))]
            for c in bad:
                out.different_columns[c] = out.different_columns.get(c, 0) + 1
            kind = "different_values" if bad else "matched"
        out.counts[kind] += 1
        if kind != "matched":
            out.differing[key] = (kind, key_values)
    for key, current in stored.rows.items():
        if key in seen or current["_deleted"] or (keys is not None and key not in keys):
            continue
        if current["_position"] > read.position:
            out.counts["changed_after_read"] += 1
            continue
        out.counts["extra_in_lake"] += 1
        out.differing[key] = ("extra_in_lake", tuple(current[k] for k in table.key))
    return out


def _shown(table: TableConfig, values: Sequence[Any]) -> str:
    return json.dumps(dict(zip(table.key, values)), default=str, sort_keys=True)


class _Text:
    """A source value of a type only its database driver knows (a range, say), as its text: that is all the
    compare makes of such a value (`canonical`'s last rule), and executors need not have the driver."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __str__(self) -> str:
        return self.text


_PLAIN = (type(None), bool, int, float, decimal.Decimal, str, bytes, bytearray, dt.datetime, dt.date, dt.time, dt.timedelta,
          uuid.UUID, dict, list, tuple)


def _portable(row: tuple[Any, ...], key_at: Sequence[int]) -> tuple[Any, ...]:
    """A source row as executors unpickle it; key values stay as the driver read them (a recheck sends them back)."""
    return tuple(v if i in key_at or isinstance(v, _PLAIN) else _Text(str(v)) for i, v in enumerate(row))


@dataclass
class Verdicts:
    """One compare of a table, as the driver sees it: the counts, and the keys that differ when few do."""

    position: str
    source_columns: tuple[str, ...]
    lake_columns: tuple[str, ...]
    source_rows: int
    lake_rows: int
    counts: dict[str, int]
    different_columns: dict[str, int]
    differing: list[tuple[str, str, tuple[Any, ...]]] | None  # (verdict, key shown, key values), if at most MAX_RECHECK
    samples: dict[str, list[str]]  # per verdict of KINDS, the first SAMPLE keys shown, in order


def _bucket_function(table: TableConfig, position: str, source_columns: tuple[str, ...], lake_columns: tuple[str, ...],
                     keys: set[Key] | None) -> Callable[[tuple[pa.Scalar, ...], pa.Table, pa.Table], pa.Table]:
    """What each bucket runs: `compare` over its source rows and lake rows, as `PARTS` rows."""

    def run(_bucket: tuple[pa.Scalar, ...], source: pa.Table, stored: pa.Table) -> pa.Table:
        rows = [pickle.loads(b) for b in source.column(ROW).to_pylist()]
        lake_rows = stored.drop_columns([c for c in (KEY, BUCKET) if c in stored.column_names]).to_pylist()
        side = LakeSide(lake_columns, {key_of(table, r): r for r in lake_rows})
        got = compare(SourceRead(position, source_columns, rows), side, table, keys)
        out: list[dict[str, Any]] = [{"part": "count", "name": k, "n": n} for k, n in got.counts.items() if n]
        out.append({"part": "count", "name": "lake_rows", "n": len(side.rows)})
        out += [{"part": "column", "name": c, "n": n} for c, n in got.different_columns.items()]
        out += [{"part": "key", "name": kind, "n": 1, "shown": _shown(table, values), "values": pickle.dumps(values)}
                for kind, values in got.differing.values()]
        return pa.Table.from_pylist(out, schema=PARTS)

    return run


def keyed_lake(frame: DataFrame, table: TableConfig) -> DataFrame:
    """The lake's rows with their key text, computed on the executors by the same `key_of` the source's rows get."""
    from pyspark.sql.types import StringType, StructField, StructType

    key_columns = list(table.key)

    def add_keys(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            keys = [key_text(key_of(table, r)) for r in batch.select(key_columns).to_pylist()]
            yield pa.RecordBatch.from_arrays([*batch.columns, pa.array(keys, pa.string())], names=[*batch.schema.names, KEY])

    return frame.mapInArrow(add_keys, StructType([*frame.schema.fields, StructField(KEY, StringType())]))


def compare_in_spark(spark: SparkSession, lake_dir: LakePath, table: TableConfig, connection: SourceConnection,
                     key_values: Sequence[Sequence[Any]] | None = None, keys: set[Key] | None = None) -> Verdicts:
    """Read the source (or only `key_values` of it) and compare it with the lake on the executors (module doc)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    scratch = lake_dir / "_scratch" / f"source_coverage-{table.name}-{uuid.uuid4().hex[:12]}"
    location = lake_spark.location(scratch)
    source_schema = pa.schema([pa.field(KEY, pa.string()), pa.field(ROW, pa.binary())])
    wrote = False
    held: list[pa.Table] = []  # the first chunk, written out only when a second one comes (a small table never is)

    def sink(columns: tuple[str, ...], chunk: list[tuple[Any, ...]]) -> None:
        nonlocal wrote
        _require_key(table, columns)
        at = [columns.index(k) for k in table.key]
        held.append(pa.table({KEY: [key_text(tuple(canonical(row[i]) for i in at)) for row in chunk],
                              ROW: [pickle.dumps(_portable(row, at), protocol=pickle.HIGHEST_PROTOCOL) for row in chunk]}, schema=source_schema))
        if wrote or len(held) > 1:
            while held:
                lake_spark.from_arrow(spark, held.pop(0), source_schema).write.mode("append").parquet(location)
            wrote = True

    try:
        scan = read_table_chunks(connection, table.source, sink, table.key, key_values)
        if scan.columns:
            _require_key(table, scan.columns)  # also when the table is empty: a wrong key is a config error either way
        stored = lake_frame(spark, lake_dir, table)
        lake_columns = tuple(c for c in stored.columns if c not in ("_position", "_deleted")) if stored is not None else ()
        source = (spark.read.parquet(location) if wrote
                  else lake_spark.from_arrow(spark, held[0] if held else source_schema.empty_table(), source_schema))
        keyed = (keyed_lake(stored, table) if stored is not None
                 else spark.createDataFrame([], f"{KEY} string, _position string, _deleted boolean"))
        buckets = max(int(spark.conf.get("spark.sql.shuffle.partitions")), math.ceil(scan.rows / BUCKET_ROWS))
        bucket = F.pmod(F.xxhash64(KEY), F.lit(buckets)).cast("int").alias(BUCKET)
        run = _bucket_function(table, scan.position, scan.columns, lake_columns, keys)
        parts = (source.select(bucket, *source.columns).groupBy(BUCKET)
                 .cogroup(keyed.select(bucket, *keyed.columns).groupBy(BUCKET))
                 .applyInArrow(run, schema=lake_spark.spark_schema(PARTS))).persist()
        try:
            totals = parts.where(F.col("part").isin("count", "column")).groupBy("part", "name").agg(F.sum("n").alias("n")).collect()
            counts = dict.fromkeys(("matched", "changed_after_read", *KINDS), 0)
            columns: dict[str, int] = {}
            lake_rows = 0
            for r in totals:
                if r["part"] == "column":
                    columns[r["name"]] = int(r["n"])
                elif r["name"] == "lake_rows":
                    lake_rows = int(r["n"])
                else:
                    counts[r["name"]] = int(r["n"])
            differing_count = sum(counts[k] for k in KINDS)
            keyed_parts = parts.where(F.col("part") == "key")
            differing: list[tuple[str, str, tuple[Any, ...]]] | None = None
            if not differing_count:
                found = []
            elif differing_count <= MAX_RECHECK:
                found = keyed_parts.select("name", "shown", "values").collect()
            else:
                first = F.row_number().over(Window.partitionBy("name").orderBy("shown"))
                found = keyed_parts.select("name", "shown", "values").withColumn("_n", first).where(F.col("_n") <= SAMPLE).collect()
            if differing_count <= MAX_RECHECK:
                differing = [(r["name"], r["shown"], pickle.loads(r["values"])) for r in found]
            samples: dict[str, list[str]] = {}
            for r in sorted(found, key=lambda r: r["shown"]):
                if len(samples.setdefault(r["name"], [])) < SAMPLE:
                    samples[r["name"]].append(r["shown"])
        finally:
            parts.unpersist()
    finally:
        if wrote:
            _remove(spark, location)
    return Verdicts(scan.position, scan.columns, lake_columns, scan.rows, lake_rows, counts, dict(sorted(columns.items())),
                    differing, samples)


def _require_key(table: TableConfig, columns: Sequence[str]) -> None:
    missing = [k for k in table.key if k not in columns]
    if missing:
        raise ConfigError(f"the source table {table.source} has no key column {', '.join(missing)} "
                          f"(its columns: {', '.join(columns)}); fix `key:` of {table.name} in the config")


def _remove(spark: SparkSession, location: str) -> None:
    """Delete a scratch folder (on any file system Spark writes to)."""
    fs, path = lake_spark.hadoop_file(spark, location)
    fs.delete(path, True)


@dataclass
class CoverageResult:
    """A source coverage check's outcome and what a repair needs of it: the keys that still differ after the
    recheck, each as (verdict, key shown, key values as read), or None when more than `MAX_RECHECK` differ."""

    outcome: CheckOutcome
    position: str  # the first read's position, in the lake's format
    differing: list[tuple[str, str, tuple[Any, ...]]] | None

    def keys(self, *kinds: str) -> list[tuple[Any, ...]]:
        """The key values of the differing keys of these verdicts (all when none is named), in key order."""
        return [values for kind, _, values in sorted(self.differing or (), key=lambda d: d[1]) if not kinds or kind in kinds]


def source_coverage(spark: SparkSession, lake_dir: LakePath, table: TableConfig, connection: SourceConnection, *,
                    sleep: Callable[[float], None] = time.sleep) -> CheckOutcome:
    """The latest state of `table` against its live source table (module docstring)."""
    return coverage_result(spark, lake_dir, table, connection, sleep=sleep).outcome


def coverage_result(spark: SparkSession, lake_dir: LakePath, table: TableConfig, connection: SourceConnection, *,
                    sleep: Callable[[float], None] = time.sleep) -> CoverageResult:
    """`source_coverage`, with the keys that still differ (what `backfill.repair` re-reads)."""
    first = compare_in_spark(spark, lake_dir, table, connection)
    counts, different_columns, samples, rechecked = dict(first.counts), first.different_columns, first.samples, 0
    differing = first.differing
    if first.differing and connection.recheck_after >= 0:
        sleep(connection.recheck_after)
        rechecked = len(first.differing)
        keys = {tuple(canonical(v) for v in values) for _, _, values in first.differing}
        second = compare_in_spark(spark, lake_dir, table, connection, [values for _, _, values in first.differing], keys)
        for kind in KINDS:  # every key of these verdicts was judged again
            counts[kind] = 0
        for kind, n in second.counts.items():
            counts[kind] += n
        different_columns, samples, differing = second.different_columns, second.samples, second.differing
    considered = sum(counts[k] for k in ("matched", "missing_in_lake", "different_values"))
    pct = 100.0 * counts["matched"] / considered if considered else 100.0
    meta: dict[str, Any] = {"source": connection.describe(), "source_position": first.position, "source_rows": first.source_rows,
                            "live_coverage_percent": round(pct, 4), **counts, "rechecked_keys": rechecked}
    compared_columns = _column_map(first.source_columns, first.lake_columns)
    not_in_lake = [c for c in first.source_columns if c not in compared_columns]
    if not_in_lake and first.lake_rows:  # a column no change event has carried yet (added, never written since): not compared
        meta["source_columns_not_in_lake"] = not_in_lake
    if different_columns:
        meta["different_columns"] = different_columns
    bad = {k: counts[k] for k in KINDS if counts[k]}
    if bad:
        meta["live_mismatched_keys"] = {k: samples.get(k, []) for k in bad}
        described = ", ".join(f"{n:,} {k.replace('_', ' ')}" for k, n in bad.items())
        example = meta["live_mismatched_keys"][next(iter(bad))][0]
        when = f", still after a recheck {connection.recheck_after:g} s later" if rechecked else ""
        return CoverageResult(CheckOutcome(
            False, Severity.ERROR, f"{table.name} vs the live {table.source}: {pct:.2f}% covered; {described} (e.g. key {example}){when}; "
            f"find the cause (dead letters, a connector's lost events), then `cdc repair --table {table.name}` (the connector re-reads "
            f"exactly these keys), `cdc rebuild --table {table.name}` or a snapshot load", meta), first.position, differing)
    return CoverageResult(CheckOutcome(
        True, Severity.ERROR, f"{table.name} vs the live {table.source}: {pct:.2f}% covered ({counts['matched']:,} rows equal, "
        f"{counts['changed_after_read']:,} changed after the read)", meta), first.position, differing or [])
