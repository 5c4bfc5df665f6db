"""The driver's delta-rs reads of the lake, path safety and the registry (delta-spark writes: test_lake_spark.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform import lake
from cdc_platform.errors import LakeError

SCHEMA = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("day", pa.date32(), nullable=False), pa.field("v", pa.int64())])


def rows(*items: tuple[str, int]) -> pa.Table:
    day = dt.date(2026, 1, 1)
    return pa.table({"id": [i for i, _ in items], "day": [day] * len(items), "v": [v for _, v in items]}, schema=SCHEMA)


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "", "Upper", "a.b", "_hidden"])
def test_table_path_refuses_names_that_could_escape(tmp_path: Path, name: str) -> None:
    with pytest.raises(LakeError):
        lake.table_path(tmp_path, name)


def test_registry_round_trip(tmp_path: Path, make_config: Any) -> None:
    cfg = make_config({"payments.customers": {"key": ["id"], "mask": ["email"]}})
    lake.write_registry(cfg)
    (tables,) = [lake.registered_tables(cfg.lake)]
    assert tables[0].name == "customers" and tables[0].mask == ("email",)
    (cfg.lake / lake.REGISTRY_FILE).write_text('{"version": 99}')
    with pytest.raises(LakeError, match="newer cdc-platform"):
        lake.read_registry(cfg.lake)
    (cfg.lake / lake.REGISTRY_FILE).write_text("{")
    with pytest.raises(LakeError, match="not valid JSON"):
        lake.read_registry(cfg.lake)


def test_scan_filters_files_that_merge_wrote_as_string_view(tmp_path: Path) -> None:
    """delta-rs MERGE (how lakes from before the move inserted) writes string_view parquet columns; a
    dataset filter on them would raise."""
    from deltalake import DeltaTable, write_deltalake

    path = tmp_path / "t"
    write_deltalake(str(path), rows(("a", 1)), partition_by=["day"])
    DeltaTable(str(path)).merge(source=rows(("b", 2), ("c", 3)), predicate="t.id = s.id", source_alias="s",
                                target_alias="t").when_not_matched_insert_all().execute()
    table = lake.open_table(path)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    assert any(pq.read_schema(f).field("id").type == pa.string_view() for f in table.file_uris()), "the premise still holds"
    with pytest.raises(pa.ArrowNotImplementedError):
        table.to_pyarrow_dataset().to_table(filter=pc.field("id") == "b")
    assert lake.scan(table, ["id", "v"], pc.field("id") == "b").to_pylist() == [{"id": "b", "v": 2}]


def test_kept_handles_follow_the_table_and_notice_a_recreated_one(tmp_path: Path) -> None:
    """open_table keeps a handle per thread; it must never serve a stale or foreign snapshot."""
    import shutil
    import threading

    from deltalake import DeltaTable, write_deltalake

    path = tmp_path / "t"
    DeltaTable.create(str(path), SCHEMA, partition_by=["day"])
    first = lake.open_table(path)
    write_deltalake(str(path), rows(("a", 1)), mode="append")  # a writer that does not go through the handle
    assert lake.open_table(path) is first, "the handle is kept"
    assert first.to_pyarrow_table().column("id").to_pylist() == ["a"], "and moved to the latest version"

    shutil.rmtree(path)  # dropped and created again at the same path, with as many commits
    DeltaTable.create(str(path), SCHEMA, partition_by=["day"])
    write_deltalake(str(path), rows(("b", 2)), mode="append")
    again = lake.open_table(path)
    assert again is not first, "a recreated table gets a fresh open"
    assert again.to_pyarrow_table().column("id").to_pylist() == ["b"]

    shutil.rmtree(path)
    with pytest.raises(LakeError, match="is not a Delta table"):
        lake.open_table(path)

    DeltaTable.create(str(path), SCHEMA, partition_by=["day"])
    seen: list[Any] = []
    worker = threading.Thread(target=lambda: seen.append(lake.open_table(path)))
    worker.start()
    worker.join()
    assert seen[0] is not lake.open_table(path), "threads never share a mutable handle"


def test_row_count_reads_the_log_and_says_none_where_the_log_cannot_say(spark: Any, tmp_path: Path) -> None:
    """A table's rows from its files' `numRecords`; None for files written without statistics and for a table
    with deletion vectors (a file's count does not subtract its deleted rows), where `count(*)` must run."""
    rows = [(i, f"v{i}") for i in range(7)]
    counted = tmp_path / "counted"
    spark.createDataFrame(rows, "id INT, v STRING").write.format("delta").save(str(counted))
    spark.createDataFrame(rows[:3], "id INT, v STRING").write.format("delta").mode("append").save(str(counted))
    assert lake.row_count(counted) == 10

    empty = tmp_path / "empty"
    spark.createDataFrame([], "id INT, v STRING").write.format("delta").save(str(empty))
    assert lake.row_count(empty) == 0

    unstated = tmp_path / "unstated"
    spark.conf.set("spark.databricks.delta.stats.collect", "false")
    try:
        spark.createDataFrame(rows, "id INT, v STRING").write.format("delta").save(str(unstated))
    finally:
        spark.conf.unset("spark.databricks.delta.stats.collect")
    assert lake.row_count(unstated) is None

    deleted = tmp_path / "deleted"
    spark.sql(f"CREATE TABLE delta.`{deleted}` (id INT, v STRING) USING delta TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.createDataFrame(rows, "id INT, v STRING").write.format("delta").mode("append").save(str(deleted))
    spark.sql(f"DELETE FROM delta.`{deleted}` WHERE id < 2")
    assert spark.read.format("delta").load(str(deleted)).count() == 5
    assert lake.row_count(deleted) is None


def test_appends_from_version_zero_only_for_a_whole_log_of_appends(spark: Any, tmp_path: Path) -> None:
    """A stage query starts a young raw log at version 0 only when its commits still say what its snapshot holds."""
    from delta.tables import DeltaTable

    path = tmp_path / "t"
    assert not lake.appends_from_version_zero(path)  # no table
    for i in range(3):
        spark.createDataFrame([(i, "x")], "id BIGINT, v STRING").write.format("delta").mode("append").save(str(path))
    assert lake.appends_from_version_zero(path)
    assert not lake.appends_from_version_zero(path, most=2)  # a longer log is not read
    DeltaTable.forPath(spark, str(path)).optimize().executeCompaction()  # removes files (dataChange false)
    assert not lake.appends_from_version_zero(path)

    cleaned = tmp_path / "cleaned"
    for i in range(2):
        spark.createDataFrame([(i, "x")], "id BIGINT, v STRING").write.format("delta").mode("append").save(str(cleaned))
    (cleaned / "_delta_log" / f"{0:020d}.json").unlink()  # what log cleanup does to an old table's first commits
    assert not lake.appends_from_version_zero(cleaned)
