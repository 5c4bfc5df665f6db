"""Identity dedup: only ids a table lacks are appended, once a batch; the lookup's files from the log (delta-rs)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.lake import insert_new, lake_spark
from cdc_platform.lake.footprints import Footprint

SCHEMA = "event_id STRING, event_date DATE, v BIGINT"
RANGED = "event_id STRING, event_date DATE, position STRING, v BIGINT"
D1, D2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)


def _table(spark: Any, path: Path, ddl: str) -> Path:
    from pyspark.sql.types import StructType

    lake_spark.ensure_table(spark, path, StructType.fromDDL(ddl), ["event_date"])
    return path


@pytest.fixture
def table(spark: Any, tmp_path: Path) -> Path:
    return _table(spark, tmp_path / "raw", SCHEMA)


@pytest.fixture
def ranged(spark: Any, tmp_path: Path) -> Path:
    return _table(spark, tmp_path / "raw_change_events", RANGED)


def rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in lake_spark.read(spark, path).collect())


def test_insert_new_once_dedups_by_identity_and_skips_a_replayed_batch(spark: Any, table: Path) -> None:
    first = spark.createDataFrame([("a", D1, 1), ("b", D2, 2)], SCHEMA)
    assert insert_new.insert_new_once(first, table, "event_id", "event_date", "q:raw", 0) == 2
    again = spark.createDataFrame([("a", D1, 1), ("c", D2, 3)], SCHEMA)
    assert insert_new.insert_new_once(again, table, "event_id", "event_date", "q:raw", 0) is None  # replay: skipped whole
    assert insert_new.insert_new_once(again, table, "event_id", "event_date", "q:raw", 1) == 1  # redelivered "a" inserts nothing
    assert rows(spark, table) == [("a", D1, 1), ("b", D2, 2), ("c", D2, 3)]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
    assert [h["operation"] for h in history] == ["CREATE TABLE", "WRITE", "WRITE"]


def test_insert_new_once_by_a_row_column_drops_that_column_and_the_known_rows(spark: Any, table: Path) -> None:
    first = spark.createDataFrame([("a", D1, 1)], SCHEMA)
    assert insert_new.insert_new_once(first, table, "event_id", "event_date", "q:raw", 0) == 1
    batch = spark.createDataFrame([("a", D1, 1, 10), ("b", D1, 2, 11), ("c", D2, 3, 12)], SCHEMA + ", _seq BIGINT")
    assert insert_new.insert_new_once(batch, table, "event_id", "event_date", "q:raw", 1, row_column="_seq") == 2
    assert lake_spark.read(spark, table).columns == ["event_id", "event_date", "v"]
    assert rows(spark, table) == [("a", D1, 1), ("b", D1, 2), ("c", D2, 3)]


def test_insert_new_once_counts_a_batch_of_nothing_but_redeliveries_as_zero(spark: Any, table: Path) -> None:
    first = spark.createDataFrame([("a", D1, 1), ("b", D2, 2)], SCHEMA)
    assert insert_new.insert_new_once(first, table, "event_id", "event_date", "q:raw", 0) == 2
    assert insert_new.insert_new_once(first, table, "event_id", "event_date", "q:raw", 1) == 0  # committed (the batch is recorded), nothing added
    assert rows(spark, table) == [("a", D1, 1), ("b", D2, 2)]


def test_insert_new_once_with_nothing_to_insert(spark: Any, table: Path) -> None:
    empty = spark.createDataFrame([], SCHEMA)
    assert insert_new.insert_new_once(empty, table, "event_id", "event_date", "q:raw", 0) == 0
    assert lake_spark.version(spark, table) == 0


def _position(n: int) -> str:
    """A 40-character position, as a MySQL binlog's (file, offset, row): longer than the 32 characters of a
    string Delta keeps in a file's statistics, so the files' bounds are truncated."""
    return f"{3:010d}{n:020d}{0:010d}"


def _footprint(parts: tuple[Any, ...], lo: str | None = None, hi: str | None = None, rows: int = 1) -> Footprint:
    return Footprint(rows=rows, parts=parts, null_part=False, lo=lo, hi=hi, complete_range=lo is not None)


def test_the_lookup_reads_only_the_files_whose_partition_and_position_range_can_hold_the_batch(spark: Any, ranged: Path) -> None:
    """Partition values and position statistics from the log prune the files as Delta would; positions of 40
    characters (statistics truncated to 32 plus a tie-breaker) still find their file."""
    first = spark.createDataFrame([("a", D1, _position(100), 1), ("b", D1, _position(200), 2)], RANGED)
    second = spark.createDataFrame([("c", D1, _position(300), 3), ("d", D2, _position(400), 4)], RANGED)
    assert insert_new.insert_new_once(first.coalesce(1), ranged, "event_id", "event_date", "q:raw", 0, range_column="position") == 2
    assert insert_new.insert_new_once(second.repartition(1, "event_date"), ranged, "event_id", "event_date", "q:raw", 1,
                                      range_column="position") == 2

    def files(fp: Footprint) -> list[str] | None:
        found = insert_new.candidate_files(ranged, fp, "event_date", "position")
        return None if found is None else sorted(Path(f).parent.name for f in found)

    assert files(_footprint((D1,), _position(150), _position(150))) == ["event_date=2026-01-01"], "the first batch's file only"
    assert files(_footprint((D1,), _position(200), _position(300))) == ["event_date=2026-01-01"] * 2
    assert files(_footprint((D2,), _position(100), _position(400))) == ["event_date=2026-01-02"]
    assert files(_footprint((D1, D2))) == ["event_date=2026-01-01"] * 2 + ["event_date=2026-01-02"], "no range: whole partitions"
    assert files(_footprint((D1, D2), _position(500), _position(900))) == [], "new positions: no file to read"
    assert files(_footprint((dt.date(2026, 1, 3),))) == []
    only = insert_new.candidate_files(ranged, _footprint((D1,), _position(200), _position(200)), "event_date", "position")
    assert only is not None and all(Path(f).is_file() and Path(f).is_absolute() for f in only)
    assert insert_new.candidate_files(str(ranged), _footprint((D1,), _position(200), _position(200)), "event_date", "position") == only

    # a redelivery of the last position of a file (its truncated maximum) and one new event: one row lands
    again = spark.createDataFrame([("b", D1, _position(200), 2), ("e", D1, _position(201), 5)], RANGED)
    assert insert_new.insert_new_once(again, ranged, "event_id", "event_date", "q:raw", 2, range_column="position") == 1
    assert [r[0] for r in rows(spark, ranged)] == ["a", "b", "c", "d", "e"]


def test_a_batch_of_new_positions_is_appended_without_reading_the_table(spark: Any, ranged: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = spark.createDataFrame([("a", D1, _position(1), 1)], RANGED)
    assert insert_new.insert_new_once(first, ranged, "event_id", "event_date", "q:raw", 0, range_column="position") == 1

    def no_read(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the table was read")

    monkeypatch.setattr(insert_new, "read_ids", no_read)
    monkeypatch.setattr(insert_new, "read", no_read)
    later = spark.createDataFrame([("b", D1, _position(2), 2), ("c", D2, _position(3), 3)], RANGED)
    assert insert_new.insert_new_once(later, ranged, "event_id", "event_date", "q:raw", 1, range_column="position") == 2
    assert [r[0] for r in rows(spark, ranged)] == ["a", "b", "c"]


def test_a_table_with_deletion_vectors_is_looked_up_through_deltas_own_read(spark: Any, table: Path) -> None:
    """A file's rows are not the table's once a deletion vector hides some: the log alone cannot say which ids the
    table holds, so Delta reads them, and an id whose row was deleted lands again."""
    spark.sql(f"ALTER TABLE delta.`{table}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    first = spark.createDataFrame([("a", D1, 1), ("b", D1, 2)], SCHEMA)
    assert insert_new.insert_new_once(first.coalesce(1), table, "event_id", "event_date", "q:raw", 0) == 2
    spark.sql(f"DELETE FROM delta.`{table}` WHERE event_id = 'a'")
    assert insert_new.candidate_files(table, _footprint((D1,)), "event_date", None) is None
    assert insert_new.insert_new_once(first, table, "event_id", "event_date", "q:raw", 1) == 1, "'a' is gone, 'b' is held"
    assert rows(spark, table) == [("a", D1, 1), ("b", D1, 2)]


def test_a_table_with_column_mapping_is_looked_up_through_deltas_own_read(spark: Any, table: Path) -> None:
    lake_spark.allow_any_column_names(spark, table)
    first = spark.createDataFrame([("a", D1, 1)], SCHEMA)
    assert insert_new.insert_new_once(first, table, "event_id", "event_date", "q:raw", 0) == 1
    assert insert_new.candidate_files(table, _footprint((D1,)), "event_date", None) is None
    assert insert_new.insert_new_once(first, table, "event_id", "event_date", "q:raw", 1) == 0
    assert rows(spark, table) == [("a", D1, 1)]


def test_a_file_is_a_candidate_unless_its_statistics_rule_it_out() -> None:
    assert insert_new._may_overlap(None, "b", "a", "a"), "no statistics: a candidate"
    assert not insert_new._may_overlap("c", "d", "a", "b") and not insert_new._may_overlap("a", "b", "c", "d")
    assert insert_new._may_overlap("0001", "0002\x7f", "00029", "00029"), "a truncated maximum keeps every value of its prefix"
    assert insert_new._may_overlap(1, 5, "a", "b"), "statistics of another type prune nothing"
