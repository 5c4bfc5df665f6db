"""The lake on delta-spark: exactly once by Delta's application transactions, identity dedup, reads."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from cdc_platform import lake_spark

SCHEMA = "event_id STRING, event_date DATE, v BIGINT"
D1, D2 = dt.date(2026, 1, 1), dt.date(2026, 1, 2)


@pytest.fixture
def table(spark: Any, tmp_path: Path) -> Path:
    from pyspark.sql.types import StructType

    path = tmp_path / "raw"
    lake_spark.ensure_table(spark, path, StructType.fromDDL(SCHEMA), ["event_date"])
    return path


def rows(spark: Any, path: Path) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in lake_spark.read(spark, path).collect())


def test_ensure_table_is_idempotent_and_partitions(spark: Any, table: Path) -> None:
    from pyspark.sql.types import StructType

    lake_spark.ensure_table(spark, table, StructType.fromDDL(SCHEMA), ["event_date"])
    assert lake_spark.version(spark, table) == 0
    detail = spark.sql(f"DESCRIBE DETAIL delta.`{table}`").first()
    assert detail["partitionColumns"] == ["event_date"]


def test_append_once_writes_a_batch_once_and_refuses_older_ones(spark: Any, table: Path) -> None:
    df = spark.createDataFrame([("a", D1, 1)], SCHEMA)
    assert lake_spark.append_once(df, table, "q:raw", 5) is True
    assert lake_spark.append_once(df, table, "q:raw", 5) is False  # the replay of batch 5
    assert lake_spark.append_once(df, table, "q:raw", 4) is False  # an older batch
    assert lake_spark.append_once(df, table, "other-query:raw", 5) is True  # another application
    assert rows(spark, table) == [("a", D1, 1), ("a", D1, 1)]


def test_insert_new_once_dedups_by_identity_and_skips_a_replayed_batch(spark: Any, table: Path) -> None:
    first = spark.createDataFrame([("a", D1, 1), ("b", D2, 2)], SCHEMA)
    assert lake_spark.insert_new_once(first, table, "event_id", "event_date", "q:raw", 0) == 2
    again = spark.createDataFrame([("a", D1, 1), ("c", D2, 3)], SCHEMA)
    assert lake_spark.insert_new_once(again, table, "event_id", "event_date", "q:raw", 0) is None  # replay: skipped whole
    assert lake_spark.insert_new_once(again, table, "event_id", "event_date", "q:raw", 1) == 1  # redelivered "a" inserts nothing
    assert rows(spark, table) == [("a", D1, 1), ("b", D2, 2), ("c", D2, 3)]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{table}`").orderBy("version").collect()
    assert [h["operation"] for h in history] == ["CREATE TABLE", "WRITE", "WRITE"]


def test_insert_new_once_with_nothing_to_insert(spark: Any, table: Path) -> None:
    empty = spark.createDataFrame([], SCHEMA)
    assert lake_spark.insert_new_once(empty, table, "event_id", "event_date", "q:raw", 0) == 0
    assert lake_spark.version(spark, table) == 0


def test_a_delta_spark_table_reads_in_delta_rs_during_the_move(spark: Any, table: Path) -> None:
    from deltalake import DeltaTable

    lake_spark.append_once(spark.createDataFrame([("a", D1, 1)], SCHEMA), table, "q:raw", 0)
    assert DeltaTable(str(table)).to_pyarrow_table().column("event_id").to_pylist() == ["a"]
    assert DeltaTable(str(table)).transaction_version("q:raw") == 0


def test_optimize_and_vacuum(spark: Any, table: Path) -> None:
    for batch in range(3):
        lake_spark.append_once(spark.createDataFrame([(f"e{batch}", D1, batch)], SCHEMA), table, "q:raw", batch)
    metrics = lake_spark.optimize(spark, table)
    assert metrics["metrics"]["numFilesRemoved"] == 3 and metrics["metrics"]["numFilesAdded"] == 1
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        lake_spark.vacuum(spark, table, 0)
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    assert len(list(table.glob("event_date=*/*.parquet"))) == 1
    assert rows(spark, table) == [("e0", D1, 0), ("e1", D1, 1), ("e2", D1, 2)]
