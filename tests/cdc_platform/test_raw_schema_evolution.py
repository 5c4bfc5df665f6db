"""A lake made before the raw log had its Kafka origin columns keeps working: `setup` adds them."""

from __future__ import annotations

import pyarrow as pa
import pytest

from cdc_platform import lake
from cdc_platform.lake import schemas
from cdc_platform.errors import LakeError
from cdc_platform.run.ingest import IngestJob
from tests.cdc_platform.test_ingest import event

OLD_RAW = pa.schema([f for f in schemas.RAW_CHANGE_EVENTS if f.name not in schemas.KAFKA_ORIGIN_COLUMNS])


def raw_columns(path) -> list[str]:  # noqa: ANN001
    return [f.name for f in pa.schema(lake.open_table(path).schema().to_arrow())]


def test_an_old_raw_log_gains_the_origin_columns_and_keeps_its_rows(
    make_config, land, run_pipeline, query, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    cfg = make_config({"payments.customers": {"key": ["id"]}})
    raw_path = lake.table_path(cfg.lake, "raw_change_events")
    with monkeypatch.context() as old_version:  # the pipeline as it was: the raw log without the columns
        old_version.setattr(schemas, "RAW_CHANGE_EVENTS", OLD_RAW)
        land("a.jsonl", [event(pos=100, row_id=1), event(pos=200, row_id=2)])
        run_pipeline(cfg)
    assert raw_columns(raw_path) == OLD_RAW.names

    land("b.jsonl", [event(pos=300, row_id=3), event(pos=400, op="u", row_id=1)])
    report = run_pipeline(cfg)
    assert report.landed()["raw_change_events"] == 2
    gained = raw_columns(raw_path)
    assert gained[:len(OLD_RAW)] == OLD_RAW.names and sorted(gained) == sorted(schemas.RAW_CHANGE_EVENTS.names), \
        "setup added the columns, nothing else changed"
    rows = query(cfg, "SELECT position, kafka_topic, kafka_partition, kafka_offset FROM raw_change_events ORDER BY position")
    assert len(rows) == 4 and all(r["kafka_topic"] is None and r["kafka_offset"] is None for r in rows), "null for files, old and new"
    assert [r["id"] for r in query(cfg, "SELECT id FROM customers__full_view ORDER BY id")] == [1, 2, 3]
    version = lake.open_table(raw_path).version()
    IngestJob(cfg).setup()
    assert lake.open_table(raw_path).version() == version, "a lake that has the columns is left alone"


def test_a_missing_required_column_is_refused_on_delta_spark(spark, tmp_path) -> None:  # noqa: ANN001
    from pyspark.sql.types import StructType

    from cdc_platform.lake import lake_spark

    path = tmp_path / "t"
    lake_spark.ensure_table(spark, path, StructType.fromDDL("a STRING"))
    lake_spark.ensure_table(spark, path, StructType.fromDDL("a STRING, c BIGINT"))
    assert lake_spark.read(spark, path).columns == ["a", "c"]
    with pytest.raises(LakeError, match="lacks the required column"):
        lake_spark.ensure_table(spark, path, lake_spark.spark_schema(pa.schema([pa.field("a", pa.string()), pa.field("b", pa.string(), nullable=False)])))
