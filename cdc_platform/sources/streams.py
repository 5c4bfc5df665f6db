"""Where the ingest stream reads from: landing files (the default) or Kafka topics, as one column contract.

`IngestJob` parses whatever `stream` returns with `parsed_batches.parse_arrow_batches`, so both sources give
the same columns:

| column | files | Kafka |
|---|---|---|
| `value` (string) | one line of a file | the record's value; null for a tombstone (the parser counts it as one) |
| `source_file` (string) | the file's path | `kafka:<topic>/<partition>@<offset>`: dead letters and markers, which have no Kafka columns, still name the record |
| `kafka_key` (string) | - | the record's key as JSON text: the file dump's `{"key": ...}`, naming the row of a delete without `before` |
| `kafka_topic`, `kafka_partition`, `kafka_offset` | - | the record's origin, kept in the raw log (null there for files) |
| `kafka_headers`, `kafka_timestamp` | - | only when `outbox.topics` names routed topics: the record's headers and timestamp (`outbox_routed.py`; the parser never reads them) |
| `reject_code`, `reject_reason` (string) | - | `format: avro` only: why the record is no line (its schema id unknown to the registry, its bytes not Avro); the parser dead-letters it with these, `value` then holds its bytes in base64 |

The Kafka stream goes through Spark's Kafka connector (`format("kafka")`, jars from `jvm/jars/`).
Values and keys are bytes in Kafka. With `format: json` they are cast to string without a UTF-8 check,
as Spark's text source passes file bytes, and the parser dead-letters a value that is not UTF-8
(`not_utf8`). With `format: avro` the stream keeps them as bytes, and each micro-batch is made into
lines by `batch_lines` (`avro_decode.AvroLines`: the schema registry's ids looked up on the driver, the
records decoded on the executors) before the parser sees it.

Exactly once: Spark records each micro-batch's offset ranges per partition in the checkpoint before
the batch runs, so a restart replays an unfinished batch with the same records and continues after
the last one; the raw log's identity dedup makes a redelivery (a connector restart, a lost
checkpoint) land nothing twice. With `subscribe_pattern` the connector lists topics at every trigger,
so a topic created later is read from its first offset without a restart (new partitions always start
at the earliest offset, whatever `starting_offsets` says).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cdc_platform.config import PlatformConfig
from cdc_platform.config_source import KafkaSourceConfig
from cdc_platform.errors import CdcError, ConfigError
from cdc_platform.lake.schemas import KAFKA_ORIGIN_COLUMNS, RECORD_KEY_COLUMN, REJECT_CODE, REJECT_REASON

#: With routed outbox topics (`outbox_routed.py`): each record's headers and timestamp beside the contract's columns.
HEADERS_COLUMN = "kafka_headers"
TIMESTAMP_COLUMN = "kafka_timestamp"

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

#: Every column a source may deliver, in order; files deliver the first two.
LINE_COLUMNS: tuple[str, ...] = ("value", "source_file")
#: What the Kafka stream delivers (`format: avro` makes each micro-batch of it into these plus the reject columns).
KAFKA_COLUMNS: tuple[str, ...] = (*LINE_COLUMNS, RECORD_KEY_COLUMN, *KAFKA_ORIGIN_COLUMNS)
INPUT_COLUMNS: tuple[str, ...] = (*KAFKA_COLUMNS, REJECT_CODE, REJECT_REASON)


def stream(spark: SparkSession, config: PlatformConfig) -> DataFrame:
    """The streaming DataFrame of the configured source, in the column contract above."""
    if config.source.kafka is not None:
        return kafka_stream(spark, config.source.kafka, headers=config.outbox is not None and bool(config.outbox.topics))
    return file_stream(spark, config)


class BatchLines(Protocol):
    """Makes one micro-batch of `stream` into lines; `release` lets go of what it held for that batch.

    Lines it could not make yet carry the reject code `schemas.LINES_INCOMPLETE`; the ingest then calls it
    again on the same records with `learn=True`, which makes every line (or rejects it for good)."""

    def __call__(self, records: DataFrame, *, learn: bool = False) -> DataFrame: ...

    def release(self) -> None: ...


def batch_lines(config: PlatformConfig) -> BatchLines:
    """What makes one micro-batch of `stream` into lines: nothing for files and JSON topics, the Avro
    decoder (with its schema registry client, which keeps the schemas it has read) for Avro topics."""
    kafka = config.source.kafka
    if kafka is None or kafka.schema_registry is None:
        return AsIs()
    from cdc_platform.sources.avro_decode import AvroLines, subjects_of
    from cdc_platform.sources.schema_registry import SchemaRegistry

    reg = kafka.schema_registry
    # A pattern's topics are not known up front: its first batch learns the ids it names (`AvroLines`).
    return AvroLines(SchemaRegistry(reg.url, user=reg.user, password=reg.password), subjects_of(kafka.topics))


class AsIs:
    """Lines that need no making: the files' and JSON topics' micro-batches as they come."""

    def __call__(self, records: DataFrame, *, learn: bool = False) -> DataFrame:
        return records

    def release(self) -> None:
        return None


def file_stream(spark: SparkSession, config: PlatformConfig) -> DataFrame:
    """The landing files, at any depth, as (value, source_file) lines; new files are picked up as they land."""
    from pyspark.sql import functions as F

    landing = config.landing
    if not landing.is_dir():
        raise ConfigError(f"landing directory {landing} does not exist; create it or pass --landing DIR")
    return (
        spark.readStream.format("text")
        .option("recursiveFileLookup", "true")
        .option("maxFilesPerTrigger", str(config.max_files_per_trigger))
        .load(str(landing))
        .select(F.col("value"), F.col("_metadata.file_path").alias("source_file"))
    )


def kafka_stream(spark: SparkSession, kafka: KafkaSourceConfig, *, headers: bool = False) -> DataFrame:
    """The Kafka records of the configured topics (or pattern), one row per record (keys and values as
    bytes for `format: avro`, which `batch_lines` decodes per micro-batch). With `headers` (the outbox's
    routed topics are read: `outbox.topics`) also each record's headers and timestamp, which the routed
    records carry their event id, type and time in (`outbox_routed.py`); the parser never reads them."""
    from pyspark.sql import functions as F

    reader = spark.readStream.format("kafka")
    options = kafka.spark_options()
    if "minPartitions" not in options:  # one task per topic partition would leave the other cores idle
        options["minPartitions"] = str(default_parallelism(spark))
    for name, value in options.items():
        reader = reader.option(name, value)
    if headers:
        reader = reader.option("includeHeaders", "true")
    records = reader.load()
    text = kafka.format != "avro"
    return records.select(
        (F.col("value").cast("string") if text else F.col("value")).alias("value"),
        F.concat(F.lit("kafka:"), F.col("topic"), F.lit("/"), F.col("partition").cast("string"), F.lit("@"),
                 F.col("offset").cast("string")).alias("source_file"),
        (F.col("key").cast("string") if text else F.col("key")).alias(RECORD_KEY_COLUMN),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").cast("int").alias("kafka_partition"),
        F.col("offset").cast("long").alias("kafka_offset"),
        *([F.col("headers").alias(HEADERS_COLUMN), F.col("timestamp").alias(TIMESTAMP_COLUMN)] if headers else []),
    )


def default_parallelism(spark: SparkSession) -> int:
    """The session's default parallelism: its cores in local mode, its executors' cores on a cluster."""
    return max(1, int(spark.sparkContext.defaultParallelism))


def input_columns(names: list[str]) -> list[str]:
    """The columns of a collected micro-batch that the parser reads (the contract's, in its order)."""
    missing = [c for c in LINE_COLUMNS if c not in names]
    if missing:
        raise CdcError(f"a source delivered no {', '.join(missing)} column; sources.py defines what each source gives")
    return [c for c in INPUT_COLUMNS if c in names]
