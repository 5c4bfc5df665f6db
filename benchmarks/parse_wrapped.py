"""The JVM parser on the JSON converter's records with schemas (`{"schema":..., "payload":...}`) against the same
payloads without them: what the Connect schema in front of every record costs the parse.

The records are the real connectors' (`tests/data/avro/connectors.json`: Debezium's PostgreSQL and MariaDB
connectors over a table of every type, captured with the JSON converter, `schemas.enable=true`, Kafka Connect's
default). Each record's `after.id` is made distinct per line (so no line repeats and Spark folds nothing), the
lines are parsed in Spark as the stream parses them (`jvm_parse.parse_rows`, two tasks), and the time to parse
and aggregate their fields is printed, best of `--repeat`, with the load average beside it.

    .venv/bin/python benchmarks/parse_wrapped.py                 # 200,000 lines per form
    .venv/bin/python benchmarks/parse_wrapped.py --lines 50000 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _common import banner, load_average, say  # noqa: E402

RECORDS = REPO / "tests" / "data" / "avro" / "connectors.json"


def forms() -> dict[str, str]:
    """Each captured change record of the types tables as the JSON converter wrote it, and its payload alone;
    `after.id` is `__ID__`, which each line replaces with its number."""
    doc = json.loads(RECORDS.read_text(encoding="utf-8"))
    out: dict[str, str] = {}
    for record in doc["records"]:
        text = record.get("json_value")
        if not text or '"op"' not in text:
            continue
        wrapped = json.loads(text)
        payload = wrapped.get("payload") or {}
        if not isinstance(payload.get("after"), dict) or "id" not in payload["after"]:
            continue
        name = record["topic"].rsplit(".", 1)[-1]
        if f"{name}, wrapped" in out:
            continue
        payload["after"]["id"] = "__ID__"
        out[f"{name}, wrapped"] = json.dumps(wrapped, separators=(",", ":")).replace('"__ID__"', "__ID__")
        out[f"{name}, payload only"] = json.dumps(payload, separators=(",", ":")).replace('"__ID__"', "__ID__")
    return out


def timed(spark: Any, template: str, lines: int) -> float:
    from pyspark.sql import functions as F

    from cdc_platform.parse import jvm_parse
    from cdc_platform.parse.envelope import KeySpec

    head, tail = template.split("__ID__", 1)
    frame = spark.range(lines, numPartitions=2).select(
        F.concat(F.lit(head), F.col("id").cast("string"), F.lit(tail)).alias("value"), F.lit("bench").alias("source_file"))
    parsed = jvm_parse.parse_rows(frame, KeySpec({}))
    t0 = time.perf_counter()
    parsed.agg(F.sum(F.length("event_id")), F.sum(F.length("after")), F.sum(F.length("row_schema")), F.count("kind")).collect()
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000, help="lines parsed per form")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each form (the best is printed)")
    args = parser.parse_args()

    from cdc_platform.spark.session import get_spark

    banner(f"the JVM parser, the JSON converter's records with and without their schemas: {args.lines:,} lines per form")
    spark = get_spark()
    templates = forms()
    for name, template in templates.items():
        say(f"{name}: {len(template):,} bytes a line")
    timed(spark, next(iter(templates.values())), min(args.lines, 20_000))  # the JIT's first pass
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        for name, template in templates.items():
            seconds = timed(spark, template, args.lines)
            best[name] = min(best.get(name, seconds), seconds)
    for name, seconds in best.items():
        say(f"{name}: best {seconds:.2f} s, {args.lines / seconds:,.0f} lines/s   [{load_average()}]")
    for name in templates:
        if name.endswith(", wrapped"):
            plain = name.replace(", wrapped", ", payload only")
            say(f"{name.split(',')[0]}: wrapped / payload only = {best[name] / best[plain]:.2f}x the time")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
