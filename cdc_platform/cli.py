"""`cdc`: the command-line interface. Its subcommand and flag names are a public interface."""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import decimal
import io
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cdc_platform.config import PlatformConfig, check_spark_master, load_config
from cdc_platform.errors import CdcError

DEMO_DIR = Path(".cdc-demo")


def _say(message: str) -> None:
    print(f"[cdc] {message}", file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> PlatformConfig:
    return load_config(
        args.config, landing=getattr(args, "landing", None), lake=getattr(args, "lake", None), spark_master=getattr(args, "master", None)
    )


def _spark(master: str | None = None, announce: bool = True) -> Any:
    from cdc_platform.session import DEFAULT_MASTER, get_spark, submitted

    if announce:
        where = master or ("spark-submit's master" if submitted() else DEFAULT_MASTER)
        _say(f"starting Spark ({where}) ...")
    return get_spark(master=master)


def cmd_run(args: argparse.Namespace) -> int:
    from cdc_platform.ingest import IngestJob
    from cdc_platform.stage import RAW

    config = _config(args)
    spark = _spark(config.spark_master)
    job = IngestJob(config, progress=_say)
    report = job.run_available_now(spark)
    landed = report.landed()
    _say(
        f"done in {report.seconds:.1f} s: {len(report.batches)} batch(es), {report.total('rows_read'):,} lines read, "
        f"{landed.get(RAW, 0):,} new change events, {report.total('dead_letters'):,} dead letters, "
        f"{report.total('duplicates_skipped'):,} duplicates skipped, {report.total('tombstones'):,} tombstones"
    )
    return 0


def cmd_stream(args: argparse.Namespace) -> int:
    from cdc_platform.ingest import IngestJob

    config = _config(args)
    spark = _spark(config.spark_master)
    job = IngestJob(config, progress=_say)
    interval = args.trigger_interval or config.trigger_interval
    _say(f"streaming {config.landing} -> {config.lake} every {interval}; Ctrl-C to stop")
    job.run_continuously(spark, interval=interval, timeout=args.timeout)
    return 0


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "asDict"):
        return _jsonable(value.asDict(recursive=True))
    return value


def _cell(value: Any) -> str:
    plain = _jsonable(value)
    return json.dumps(plain, ensure_ascii=False) if isinstance(plain, (dict, list)) else str(plain)


def format_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    """Render query results; `json` is one array of row objects (a public, scripted format)."""
    if fmt == "json":
        return json.dumps([{c: _jsonable(v) for c, v in zip(columns, row)} for row in rows], ensure_ascii=False)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else _cell(v) for v in row])
        return buf.getvalue().rstrip("\n")
    cells = [["NULL" if v is None else _cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |", line]
    out += ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in cells]
    out.append(line)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)


def cmd_sql(args: argparse.Namespace) -> int:
    from cdc_platform.views import register_lake

    lake_dir = Path(args.lake).resolve()
    spark = _spark(check_spark_master(args.master), announce=args.format == "table")
    register_lake(spark, lake_dir)
    df = spark.sql(args.query)
    rows = [tuple(r) for r in df.collect()]
    print(format_rows(df.columns, rows, args.format))
    return 0


def _generate(out: Path, transactions: int, seed: int) -> Any:
    """The sample as if captured just now, so freshness checks judge it like a live database."""
    from cdc_platform.generate import generate_workload, recent_start_ms

    start = recent_start_ms(transactions, int(time.time() * 1000))
    return generate_workload(out, transactions=transactions, seed=seed, start_ms=start)


def cmd_generate(args: argparse.Namespace) -> int:
    w = _generate(Path(args.out), args.transactions, args.seed)
    _say(
        f"wrote {w.files} files to {w.landing_dir}: {w.transactions:,} transactions, {w.change_events:,} change events, "
        f"{w.markers:,} markers, {w.duplicate_events} duplicates, {w.malformed_lines} malformed, {w.tombstones} tombstones"
    )
    _say(f"config: {w.config_path}  (next: cdc run --config {w.config_path})")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from cdc_platform.ingest import IngestJob
    from cdc_platform.stage import RAW
    from cdc_platform.views import register_lake

    t0 = time.perf_counter()
    out = Path(args.dir)
    if out.exists():
        shutil.rmtree(out)
    _say(f"generating a sample payments workload ({args.transactions} transactions) into {out}/ ...")
    w = _generate(out, args.transactions, args.seed)
    config = load_config(w.config_path)
    spark = _spark()
    _say("running the pipeline over the landing files ...")
    report = IngestJob(config, progress=_say).run_available_now(spark)
    names = register_lake(spark, config.lake)
    print()
    print(f"Landed in {config.lake} ({report.seconds:.1f} s for the pipeline, {time.perf_counter() - t0:.1f} s in all):")
    for name in names:
        count = spark.sql(f"SELECT count(*) AS n FROM `{name}`").collect()[0]["n"]
        print(f"  {name:<34} {count:>8,} rows")
    landed = report.landed()
    print(
        f"\n{report.total('rows_read'):,} lines read, {landed.get(RAW, 0):,} change events, "
        f"{report.total('dead_letters'):,} dead letters, {report.total('duplicates_skipped'):,} duplicates skipped."
    )
    lake_arg = config.lake
    print("\nTry next:")
    tries = [
        "SELECT reason_code, count(*) AS n FROM dead_letter GROUP BY reason_code",
        "SELECT table_id, op, count(*) AS n FROM raw_change_events GROUP BY table_id, op ORDER BY table_id, op",
    ]
    if "transactions" in names:
        tries[1] = "SELECT transaction_id, event_count, events_per_table FROM transactions ORDER BY end_ts DESC LIMIT 5"
    if "customers__clean_view" in names:
        tries.append("SELECT * FROM customers__clean_view ORDER BY id LIMIT 5")
    else:
        tries.append("SELECT batch_id, rows_read, duplicates_skipped, lag_seconds FROM pipeline_metrics ORDER BY batch_id")
    for q in tries:
        print(f'  cdc sql --lake {lake_arg} "{q}"')
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    from cdc_platform.latest_state import rebuild_table

    config = _config(args)
    rebuild_table(config, args.table, progress=_say)
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    from cdc_platform.lake import registered_tables
    from cdc_platform.maintenance import maintain

    from cdc_platform.config import resolve_config_path
    from cdc_platform.errors import ConfigError, LakeError

    master = check_spark_master(args.master)
    if args.lake and not args.config:
        lake_dir = Path(args.lake).resolve()
        tables = registered_tables(lake_dir)  # the lake says which tables are latest-state tables
    elif resolve_config_path(args.config) is not None:
        config = load_config(args.config, lake=args.lake, spark_master=args.master)
        configured = {t.name for t in config.tables}
        lake_dir = config.lake
        master = config.spark_master
        tables = config.tables + tuple(t for t in registered_tables(lake_dir) if t.name not in configured)
    else:
        raise ConfigError("cdc maintain needs the lake: pass --lake DIR, or --config FILE (or set CDC_CONFIG)")
    if not lake_dir.is_dir():  # before starting Spark for nothing
        raise LakeError(f"lake directory {lake_dir} does not exist; pass the right --lake")
    _say(f"maintaining {lake_dir} (vacuum keeps files removed less than {args.vacuum_hours:g} hours ago) ...")
    spark = _spark(master)  # OPTIMIZE and VACUUM run on delta-spark
    reports = maintain(spark, lake_dir, tables=tables, vacuum_hours=args.vacuum_hours, progress=print)
    _say(f"done: {len(reports)} tables")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cdc", description="Lakehouse change-data-capture platform (Debezium -> Spark -> Delta).")
    sub = parser.add_subparsers(dest="command", required=True)

    def add_paths(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="cdc.yaml (default: $CDC_CONFIG)")
        p.add_argument("--landing", help="landing directory of JSON-lines files (overrides the config)")
        p.add_argument("--lake", help="lake directory of Delta tables (overrides the config)")

    def add_master(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--master",
            help="Spark master URL, e.g. spark://host:7077 (overrides the config's spark_master; default local[2], or spark-submit's)",
        )

    p = sub.add_parser("run", help="process everything that has landed, then exit")
    add_paths(p)
    add_master(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("stream", help="run the streaming job continuously")
    add_paths(p)
    add_master(p)
    p.add_argument("--trigger-interval", help="micro-batch interval, e.g. '2 seconds' (default: config, 5 seconds)")
    p.add_argument("--timeout", type=float, help="stop after this many seconds (default: run until Ctrl-C)")
    p.set_defaults(func=cmd_stream)

    p = sub.add_parser("sql", help="run Spark SQL over the lake's tables and views")
    p.add_argument("--lake", required=True, help="lake directory")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table")
    add_master(p)
    p.add_argument("query")
    p.set_defaults(func=cmd_sql)

    p = sub.add_parser("generate", help="write a sample payments workload (Debezium MySQL) and its cdc.yaml")
    p.add_argument("--out", required=True, help="output directory (gets landing/ and cdc.yaml)")
    p.add_argument("--transactions", type=int, default=200)
    p.add_argument("--seed", type=int, default=7)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("demo", help="generate the sample into ./.cdc-demo/, run the pipeline, show what landed")
    p.add_argument("--dir", default=str(DEMO_DIR))
    p.add_argument("--transactions", type=int, default=500)
    p.add_argument("--seed", type=int, default=7)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("rebuild", help="rebuild a latest-state table (and its history) from the raw log; stop the stream first")
    add_paths(p)
    p.add_argument("--table", required=True, help="lake name of the table, e.g. customers")
    p.set_defaults(func=cmd_rebuild)

    p = sub.add_parser("maintain", help="fold pending changes, purge expired tombstones, compact small files, vacuum")
    p.add_argument("--lake", help="lake directory (its registry names the tables); or use --config")
    p.add_argument("--config", help="cdc.yaml (default: $CDC_CONFIG when --lake is not given)")
    p.add_argument("--vacuum-hours", type=float, default=168.0, help="keep unreferenced files younger than this (default 168 = 7 days)")
    add_master(p)
    p.set_defaults(func=cmd_maintain)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CdcError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
