"""`cdc`: the command-line interface. Its subcommand and flag names are a public interface.

It keeps one promise for every command: a failure prints exactly one line, `error: <the cause in
words>`, on stderr and exits 2; `--verbose` adds the Python stack (and the JVM's, for a Spark error)
before that line. Spark's own error logging, which would print the JVM stack anyway, is switched off
for the CLI's session, because the error that reaches `main` carries the same stack for `--verbose`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from cdc_platform.spark import spark_errors
from cdc_platform.config import PlatformConfig, check_spark_master, lake_from_flag, load_config
from cdc_platform.errors import CdcError, LakeError, QueryError
from cdc_platform.serve.formats import format_rows
from cdc_platform.spark.processes import stop_on_signals
from cdc_platform.storage import is_remote

DEMO_DIR = Path(".cdc-demo")


def _say(message: str) -> None:
    print(f"[cdc] {message}", file=sys.stderr, flush=True)


def _config(args: argparse.Namespace) -> PlatformConfig:
    return load_config(
        args.config, landing=getattr(args, "landing", None), lake=getattr(args, "lake", None), spark_master=getattr(args, "master", None)
    )


def _spark(master: str | None = None, announce: bool = True, object_store: bool = False, conf: dict[str, str] | None = None) -> Any:
    from cdc_platform.spark.session import DEFAULT_MASTER, get_spark, submitted

    if announce:
        where = master or ("spark-submit's master" if submitted() else DEFAULT_MASTER)
        _say(f"starting Spark ({where}) ...")
    spark = get_spark(master=master, object_store=object_store, conf=conf)
    quiet_spark_error_logs(spark)
    return spark


#: Spark loggers that print a failed task's whole JVM stack at ERROR; the failure reaches `main` anyway.
_JVM_ERROR_LOGGERS = ("org.apache.spark.executor.Executor", "org.apache.spark.scheduler.TaskSetManager")
#: pyspark's Python loggers that print every SQL error with its JVM stack as it is raised (pyspark 4).
_PYSPARK_ERROR_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")


def quiet_pyspark_error_logs() -> None:
    """pyspark's own SQL error loggers off; they log in a Spark Connect client too, where there is no JVM."""
    from pyspark.logger import PySparkLogger

    for name in _PYSPARK_ERROR_LOGGERS:
        PySparkLogger.getLogger(name).disabled = True  # created as PySparkLogger: pyspark calls it with extra fields


def quiet_spark_error_logs(spark: Any) -> None:
    """Keep Spark from printing a stack on its own: the CLI prints one `error:` line (the stack with --verbose).

    Both kinds of logger would print the JVM stack of an error the CLI is about to report: log4j's for a
    task that failed in an executor (a bad cast, a division by zero), pyspark's for every SQL error.
    """
    quiet_pyspark_error_logs()
    jvm = spark.sparkContext._jvm
    if jvm is not None:
        off = jvm.org.apache.logging.log4j.Level.toLevel("OFF")
        for name in _JVM_ERROR_LOGGERS:
            jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, off)


def cmd_run(args: argparse.Namespace) -> int:
    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.stages.stage import RAW

    config = _config(args)
    spark = _spark(config.spark_master, object_store=config.lake_is_remote)
    job = IngestJob(config, progress=_say)
    with stop_on_signals(_stopping, _stop_now) as stop:
        report = job.run_available_now(spark, stop)
    landed = report.landed()
    _say(
        f"{'stopped' if report.stopped else 'done'} in {report.seconds:.1f} s: {len(report.batches)} batch(es), {report.total('rows_read'):,} lines read, "
        f"{landed.get(RAW, 0):,} new change events, {report.total('dead_letters'):,} dead letters, "
        f"{report.total('duplicates_skipped'):,} duplicates skipped, {report.total('tombstones'):,} tombstones"
    )
    if report.stopped:
        _say("interrupted before everything landed was read: the next `cdc run` reads the rest")
        return 130
    return 0


def cmd_stream(args: argparse.Namespace) -> int:
    from cdc_platform.run.ingest import IngestJob

    config = _config(args)
    spark = _spark(config.spark_master, object_store=config.lake_is_remote)
    job = IngestJob(config, progress=_say)
    interval = args.trigger_interval or config.trigger_interval
    _say(f"streaming {config.describe_source()} -> {config.lake} every {interval}; Ctrl-C to stop")
    with stop_on_signals(_stopping, _stop_now) as stop:
        job.run_continuously(spark, interval=interval, timeout=args.timeout, stop=stop)
    return 0


def _stopping() -> None:
    _say("stopping after the current batch ... (Ctrl-C again to stop at once; that batch then runs again next time)")


def _stop_now() -> NoReturn:
    """The second Ctrl-C: exit now, mid-batch. Safe for the lake (the batch replays, as after a crash); the
    JVM exits when its parent's pipe closes. Not a Python exception: one raised inside a Py4J call leaves
    the connection to the JVM half-read, and PySpark's exit handlers then hang or print stacks."""
    print("error: interrupted (Ctrl-C) during a batch; it runs again on the next start", file=sys.stderr, flush=True)
    os._exit(130)


def cmd_sql(args: argparse.Namespace) -> int:
    lake_dir = lake_from_flag(args.lake)
    if not lake_dir.is_dir():  # before Spark starts: saying so costs no JVM
        raise LakeError(f"lake directory {lake_dir} does not exist; run `cdc run` first or pass the right --lake")
    if not args.local:
        from cdc_platform.serve.sql_client import query_lake_server

        answered = query_lake_server(lake_dir, args.query, _say)
        if answered is not None:
            columns, rows, info = answered
            if args.format == "table":
                _say(f"answered by cdc serve (pid {info.pid}) at {info.jdbc_url}")
            print(format_rows(columns, rows, args.format))
            return 0
    from cdc_platform.views import register_lake  # here: a query the server answers never loads the lake's readers
    spark = _spark(check_spark_master(args.master), announce=args.format == "table", object_store=is_remote(lake_dir))
    register_lake(spark, lake_dir, query=args.query)  # only the views of the tables the query names are planned
    try:
        df = spark.sql(args.query)
        rows = [tuple(r) for r in df.collect()]
    except Exception as exc:
        if not spark_errors.is_spark_error(exc):
            raise
        names = register_lake(spark, lake_dir) if spark_errors.unknown_relation(exc) else []  # the error lists every name
        raise QueryError(spark_errors.describe(exc, names)) from exc
    print(format_rows(df.columns, rows, args.format))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import signal
    import threading

    from dataclasses import replace

    from cdc_platform.config import check_catalog_schema, resolve_config_path
    from cdc_platform.config_serve import ServeConfig
    from cdc_platform.serve.server import Server
    from cdc_platform.serve.security import self_signed
    from cdc_platform.serve.sql_client import state_path

    if args.lake and not args.config and resolve_config_path(None) is None:
        lake_dir, schema, master = lake_from_flag(args.lake), args.schema or "cdc", check_spark_master(args.master)
        serve, base = ServeConfig(), Path.cwd()
    else:
        config = load_config(args.config, lake=args.lake, spark_master=args.master)
        lake_dir, schema, master = config.lake, args.schema or config.catalog.schema, config.spark_master
        serve, base = config.serve, config.source_file.resolve().parent if config.source_file else Path.cwd()
    schema = check_catalog_schema(schema)
    overrides = {k: v for k, v in (("host", args.host), ("connect_host", args.connect_host), ("expose", args.expose)) if v is not None}
    serve = replace(serve, **overrides)
    cert = None
    if args.self_signed:
        if serve.keystore is not None:
            raise CdcError(f"--self-signed makes a keystore, but serve.keystore already names {serve.keystore}; use one or the other")
        keystore, password_file, cert = self_signed(base / "serve-tls", [serve.host, serve.connect_address])
        serve = replace(serve, keystore=keystore, keystore_password_file=password_file)
        _say(f"TLS with the self-signed certificate {cert} (clients trust it; Java clients: {cert.parent / 'truststore.p12'}, password changeit)")
    server = Server(lake_dir, schema, serve=serve, connect_port=args.connect_port, jdbc_port=args.jdbc_port, master=master,
                    poll_interval=args.poll_interval, progress=_say, warm_up=not args.no_warm_up)
    server.cert = cert
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())  # `kill PID` stops it as cleanly as Ctrl-C
    try:
        info = server.start()
        quiet_spark_error_logs(server.spark)
        _say(f"serving {lake_dir} as schema `{schema}`; Ctrl-C to stop")
        token = " (token: SPARK_CONNECT_AUTHENTICATE_TOKEN)" if info.connect_token else ""
        login = f" (login: {info.jdbc_auth})" if info.jdbc_auth != "none" else ""
        print(f"spark connect: {info.connect_url}{token}\njdbc: {info.jdbc_url}{login}\nstate file: {state_path(lake_dir, info.expose)}", flush=True)
        server.serve_forever(stop, timeout=args.timeout)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        if server.spark is not None:
            _say("stopping ...")
        server.stop()
    return 0


def cmd_serve_user(args: argparse.Namespace) -> int:
    """`cdc serve-user add|remove|list`: the JDBC endpoint's password file (`serve.password_file`)."""
    from cdc_platform.serve import passwords

    if args.password_file:
        path = Path(args.password_file).expanduser().resolve()
    else:
        path = _config(args).serve.password_file
        assert path is not None
    if args.extra:  # never echoed: a password typed here is already in the shell's history, not also in a log
        raise CdcError("`cdc serve-user` takes no password on the command line (`ps` and shell histories show it); "
                       "it asks on the terminal or reads one line of standard input")
    if args.action == "list":
        print("\n".join(sorted(passwords.read_entries(path))))
        return 0
    if not args.name:
        raise CdcError(f"`cdc serve-user {args.action}` needs the user's NAME")
    if args.action == "remove":
        if not passwords.remove_user(path, args.name):
            raise CdcError(f"no user {args.name!r} in {path}")
        _say(f"removed {args.name} from {path}")
        return 0
    passwords.check_name(args.name)
    replaced = passwords.add_user(path, args.name, passwords.read_password())
    _say(f"{'new password for' if replaced else 'added'} {args.name} in {path} (a running server reads it at the next login)")
    return 0


def _generate(out: Path, transactions: int, seed: int, append: bool = False) -> Any:
    """The sample as if captured just now, so freshness checks judge it like a live database."""
    from cdc_platform.workload.generate import append_workload, generate_workload, recent_start_ms

    now_ms = int(time.time() * 1000)
    if append:
        return append_workload(out, transactions=transactions, seed=seed, now_ms=now_ms)
    return generate_workload(out, transactions=transactions, seed=seed, start_ms=recent_start_ms(transactions, now_ms))


def cmd_generate(args: argparse.Namespace) -> int:
    from cdc_platform.workload.demo import cdc_command, shell_path

    w = _generate(Path(args.out), args.transactions, args.seed, append=args.append)
    what = "an increment of" if args.append else ""
    _say(
        f"wrote {what + ' ' if what else ''}{w.files} files to {w.landing_dir}: {w.transactions:,} transactions, {w.change_events:,} change events, "
        f"{w.markers:,} markers, {w.duplicate_events} duplicates, {w.malformed_lines} malformed, {w.tombstones} tombstones"
    )
    _say(f"config: {w.config_path}  (next: {cdc_command()} run --config {shell_path(w.config_path)})")
    return 0


#: Up to this many transactions `cdc demo` starts a short-lived JVM (`session.SHORT_LIVED_JVM`, the JIT's quick tier):
#: one job, then exit. 500 transactions: medians 38.4 s against 43.4; 50,000: 69.5 against 77.4 (benchmarks/README.md,
#: "An eleventh session"). Beyond that, C2's optimised code may pay back.
DEMO_QUICK_JIT_TRANSACTIONS = 50_000


def cmd_demo(args: argparse.Namespace) -> int:
    from cdc_platform.workload import demo
    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.spark.session import SHORT_LIVED_JVM
    from cdc_platform.views import register_lake

    t0 = time.perf_counter()
    out = Path(args.dir)
    demo.prepare_dir(out)
    _say(f"generating a sample payments workload ({args.transactions} transactions) into {out}/ ...")
    w = _generate(out, args.transactions, args.seed)
    config = load_config(w.config_path)
    t_generated = time.perf_counter()
    spark = _spark(conf=SHORT_LIVED_JVM if args.transactions <= DEMO_QUICK_JIT_TRANSACTIONS else None)
    t_spark = time.perf_counter()
    _say("running the pipeline over the landing files ...")
    report = IngestJob(config, progress=_say).run_available_now(spark)
    t_pipeline = time.perf_counter()
    names = register_lake(spark, config.lake)
    _say("counting what landed ...")
    counts = demo.count_lake(spark, config, names)
    t_end = time.perf_counter()
    timing = demo.Timing(
        generate=t_generated - t0, spark=t_spark - t_generated, pipeline=t_pipeline - t_spark, counting=t_end - t_pipeline, total=t_end - t0
    )
    demo.write_counts(w.config_path.parent / demo.COUNTS_FILE, counts)
    print(demo.render(config, names, counts, report, timing))
    return 0


def cmd_rebuild(args: argparse.Namespace) -> int:
    from cdc_platform.stages.latest_state import rebuild_table

    config = _config(args)
    _spark(config.spark_master, object_store=config.lake_is_remote)
    rebuild_table(config, args.table, progress=_say)
    return 0


def cmd_maintain(args: argparse.Namespace) -> int:
    from cdc_platform.lake import registered_tables
    from cdc_platform.maintenance import maintain, selected_tables

    from cdc_platform.config import resolve_config_path
    from cdc_platform.errors import ConfigError, LakeError

    master = check_spark_master(args.master)
    if args.lake and not args.config:
        lake_dir = lake_from_flag(args.lake)
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
    selected_tables(lake_dir, args.table)  # a misspelt --table, too
    _say(f"maintaining {lake_dir} (vacuum keeps files removed less than {args.vacuum_hours:g} hours ago) ...")
    spark = _spark(master, object_store=is_remote(lake_dir))  # OPTIMIZE and VACUUM run on delta-spark
    reports = maintain(spark, lake_dir, tables=tables, only=args.table, vacuum_hours=args.vacuum_hours, progress=print)
    _say(f"done: {len(reports)} tables")
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    from cdc_platform.backfill.repair import repair_table

    config = _config(args)
    tables = [config.table(name) for name in args.table] if args.table else list(config.tables)
    if not tables:
        raise LakeError("the config names no tables under `tables:`; there is nothing to repair")
    if config.source_connection is None:
        from cdc_platform.errors import ConfigError

        raise ConfigError("cdc repair compares the lake with the live source and asks its connector to re-read rows: "
                          "set `source_connection:` (and `repair:`) in the config")
    spark = _spark(config.spark_master, object_store=config.lake_is_remote)
    healed = True
    for table in tables:
        report = repair_table(spark, config, table, dry_run=args.dry_run, remove_absent=True if args.remove_absent else None,
                              wait=args.wait, progress=_say)
        print(f"{table.name}: {report.outcome}: {report.message}", flush=True)
        for text in report.signal_texts if args.dry_run else ():
            print(text, flush=True)
        healed = healed and (report.succeeded or report.outcome == "planned")
    return 0 if healed else 1


def cmd_backfill(args: argparse.Namespace) -> int:
    from cdc_platform.backfill import load_snapshot

    config = _config(args)
    _spark(config.spark_master, object_store=config.lake_is_remote)
    diff = load_snapshot(config, args.table, dry_run=args.dry_run, progress=_say)
    print(diff.summary(), flush=True)
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's promise: a usage mistake is one `error:` line and exit 2, like any other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


def package_version() -> str:
    """The installed distribution's version (pyproject.toml), so `cdc --version` names what pip installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("cdc-platform")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from cdc_platform import __version__

        return f"{__version__} (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="cdc",
        description="Lakehouse change-data-capture platform: Debezium change events -> Spark -> Delta tables and SQL views.",
        epilog="Errors print one line starting `error:` and exit 2; add --verbose for the stack. `cdc COMMAND --help` describes a command.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}", help="print the version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="on an error, print the Python (and JVM) stack before the `error:` line (default: off)")
    # Also accepted after the command (`cdc sql --verbose ...`); SUPPRESS keeps the top-level value otherwise.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="on an error, print the Python (and JVM) stack before the `error:` line (default: off)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=summary, description=description, parents=[common])

    def add_paths(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", metavar="FILE", help="the cdc.yaml to use (default: $CDC_CONFIG)")
        p.add_argument("--landing", metavar="DIR", help="landing directory of JSON-lines files (default: the config's `landing`)")
        p.add_argument("--lake", metavar="DIR", help="lake directory of Delta tables (default: the config's `lake`)")

    def add_master(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--master", metavar="URL",
            help="Spark master URL, e.g. spark://host:7077 (default: the config's spark_master, else local[2], or spark-submit's)",
        )

    p = command("run", "process everything that has landed, then exit",
                "Process every landing file not processed before (an available-now trigger), then exit 0. "
                "Running it again over the same landing changes nothing: the checkpoint in the lake remembers each file.")
    add_paths(p)
    add_master(p)
    p.set_defaults(func=cmd_run)

    p = command("stream", "run the same job continuously until Ctrl-C",
                "Run the streaming job continuously: each trigger interval picks up the files that landed since. "
                "Ctrl-C stops it after the current micro-batch.")
    add_paths(p)
    add_master(p)
    p.add_argument("--trigger-interval", metavar="INTERVAL",
                   help="micro-batch interval, e.g. '2 seconds' (default: the config's trigger_interval, itself 5 seconds by default)")
    p.add_argument("--timeout", type=float, metavar="S", help="stop after this many seconds (default: run until Ctrl-C)")
    p.set_defaults(func=cmd_stream)

    p = command("sql", "run Spark SQL over the lake's tables and views",
                "Run one Spark SQL query with every lake table and view registered by name (`SHOW TABLES` lists them). "
                "Needs only the lake: its registry names the tables, keys and masks.")
    p.add_argument("--lake", required=True, metavar="DIR", help="lake directory (required)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   help="output: a text table, CSV with a header, or one JSON array of row objects (default: %(default)s)")
    add_master(p)
    p.add_argument("--local", action="store_true",
                   help="run in a local Spark session even when `cdc serve` serves the lake (default: use the server when one runs)")
    p.add_argument("query", help="the SQL query; quote it for the shell")
    p.set_defaults(func=cmd_sql)

    p = command("serve", "serve the lake over Spark Connect and JDBC/ODBC, its tables and views in a catalog",
                "Run one long-lived Spark for the lake with Spark Connect (notebooks, `cdc sql`) and the Spark Thrift "
                "JDBC/ODBC server (BI tools) on loopback (or --host, with logins), every table and view registered under one schema and kept "
                "current as tables and columns appear. Writes LAKE/_serve.json so `cdc sql` finds it; Ctrl-C stops it.")
    add_paths(p)
    add_master(p)
    p.add_argument("--schema", metavar="NAME", help="schema (database) of the views (default: the config's catalog.schema, itself cdc)")
    p.add_argument("--connect-port", type=int, default=15002, metavar="PORT", help="Spark Connect port (default: %(default)s)")
    p.add_argument("--jdbc-port", type=int, default=10000, metavar="PORT",
                   help="Thrift JDBC/ODBC (HiveServer2) port (default: %(default)s)")
    p.add_argument("--poll-interval", type=float, default=5.0, metavar="S",
                   help="seconds between checks of the lake for new tables and changed schemas (default: %(default)g)")
    p.add_argument("--timeout", type=float, metavar="S", help="stop after this many seconds (default: run until Ctrl-C)")
    p.add_argument("--no-warm-up", action="store_true",
                   help="skip the lookup through one view the server runs in the background once ready, which spares a "
                        "user's first query the cold JVM's seconds (default: run it)")
    p.add_argument("--host", metavar="ADDR",
                   help="address both endpoints listen on; not loopback only with a login on both (default: the config's serve.host, itself 127.0.0.1)")
    p.add_argument("--connect-host", metavar="ADDR", help="Spark Connect's own address, e.g. loopback behind a TLS proxy (default: --host)")
    p.add_argument("--expose", choices=("all", "clean"),
                   help="register every table and view, or only the masked (clean and consistent) views (default: the config's serve.expose, itself all)")
    p.add_argument("--self-signed", action="store_true",
                   help="TLS on the JDBC endpoint with a self-signed certificate keytool makes beside cdc.yaml in serve-tls/, for trying TLS "
                        "(default: the config's serve.keystore, if any)")
    p.set_defaults(func=cmd_serve)

    p = command("serve-user", "add, remove or list the JDBC/ODBC endpoint's users (its password file)",
                "Manage the password file `cdc serve` checks JDBC/ODBC logins against (serve.jdbc_auth: password_file): salted "
                "PBKDF2 hashes, owner-only. `add` reads the password from the terminal (asked twice) or one line of standard input, "
                "never from the command line. A running server reads the file at every login.")
    p.add_argument("action", choices=("add", "remove", "list"), help="add a user (or set a new password), remove one, or list the names")
    p.add_argument("name", nargs="?", help="the user's name (add, remove)")
    p.add_argument("extra", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--config", metavar="FILE", help="the cdc.yaml whose serve.password_file to change (default: $CDC_CONFIG)")
    p.add_argument("--password-file", metavar="FILE", help="the password file itself (default: the config's serve.password_file, "
                                                            "itself serve-users beside cdc.yaml)")
    p.set_defaults(func=cmd_serve_user)

    p = command("generate", "write a sample payments workload (Debezium MySQL) and its cdc.yaml",
                "Write a sample payments database (customers, charges, refunds) as Debezium's MySQL connector emits it, with "
                "multi-table transactions, BEGIN/END markers and injected faults, into DIR/landing/, and DIR/cdc.yaml. "
                "With --append, write a further increment of the same database (new rows, updates and deletes of existing ones) "
                "for a second `cdc run`.")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory; gets landing/ and cdc.yaml (required)")
    p.add_argument("--transactions", type=int, default=200, metavar="N",
                   help="source transactions to write (with --append: new ones) (default: %(default)s)")
    p.add_argument("--seed", type=int, default=7, metavar="S", help="random seed; the same seed writes the same files (default: %(default)s)")
    p.add_argument("--append", action="store_true",
                   help="add an increment to the workload already in DIR, continuing its ids, positions and clock (default: off)")
    p.set_defaults(func=cmd_generate)

    p = command("demo", "generate a sample, run the pipeline, show what landed",
                "Generate the sample into DIR (replacing a previous demo there), run the pipeline over it, count what "
                "landed and print queries to try next.")
    p.add_argument("--dir", default=str(DEMO_DIR), metavar="DIR", help="where the sample and its lake go (default: %(default)s)")
    p.add_argument("--transactions", type=int, default=500, metavar="N", help="source transactions to generate (default: %(default)s)")
    p.add_argument("--seed", type=int, default=7, metavar="S", help="random seed (default: %(default)s)")
    p.set_defaults(func=cmd_demo)

    p = command("rebuild", "rebuild a latest-state table (and its history) from the raw log; stop the stream first",
                "Rebuild one latest-state table and its history from the raw log, the newest type of each column winning "
                "(e.g. after an `incompatible_type` dead letter). Stop the stream first: one writer per lake.")
    add_paths(p)
    p.add_argument("--table", required=True, metavar="NAME", help="lake name of the table, e.g. customers (required)")
    p.set_defaults(func=cmd_rebuild)

    p = command("repair", "re-read the rows a failed source coverage names, through the connector's incremental snapshots",
                "Compare each table (or the ones named) with the live source (`source_connection`), then ask the source's Debezium "
                "connector to re-read exactly the keys that are missing or differ, through an incremental snapshot signal on the "
                "channel `repair:` names; wait until they have landed (a running `cdc stream` lands them), check coverage again and "
                "record the repair in the lake's source_repairs table. Exit 0 when every table is healed (or was whole), 1 when not.")
    add_paths(p)
    add_master(p)
    p.add_argument("--table", action="append", metavar="NAME", help="repair only this table (lake name); repeat for more (default: every table)")
    p.add_argument("--dry-run", action="store_true", help="print the signals a repair would send, send nothing (default: off)")
    p.add_argument("--remove-absent", action="store_true",
                   help="also remove lake rows the source no longer has, by the backfill rules (default: the config's repair.remove_absent)")
    p.add_argument("--wait", type=float, metavar="S", help="seconds to wait for the re-read rows to land (default: the config's repair.wait, 600)")
    p.set_defaults(func=cmd_repair)

    p = command("backfill", "load a table's source snapshot from snapshots/<table>/ into the lake, never over newer data",
                "Load the Debezium JSON lines, or CSV/Parquet rows with as_of.json, in the config's snapshots/<table>/ into the raw log "
                "and the latest state: a row whose key the raw log changed later is skipped (never overwrites, never resurrects). "
                "Dagster's snapshot_load does the same.")
    add_paths(p)
    add_master(p)
    p.add_argument("--table", required=True, metavar="NAME", help="lake name of the table, e.g. customers (required)")
    p.add_argument("--dry-run", action="store_true", help="only print what would be loaded (default: off)")
    p.set_defaults(func=cmd_backfill)

    p = command("maintain", "fold pending changes, purge expired tombstones, compact small files, vacuum",
                "Fold pending changes and purge expired tombstones of latest-state tables, then compact small files and "
                "vacuum every table, one line per table. Each step is an ordinary Delta commit, safe beside a running stream.")
    p.add_argument("--lake", metavar="DIR", help="lake directory (its registry names the tables) (default: the config's `lake`)")
    p.add_argument("--config", metavar="FILE", help="the cdc.yaml to use when --lake is not given (default: $CDC_CONFIG)")
    p.add_argument("--vacuum-hours", type=float, default=168.0, metavar="H",
                   help="vacuum keeps unreferenced files younger than this many hours (default: %(default)g, 7 days)")
    p.add_argument("--table", action="append", metavar="NAME",
                   help="maintain only this lake table, e.g. raw_change_events or customers_history; repeat for more (default: every table)")
    add_master(p)
    p.set_defaults(func=cmd_maintain)
    return parser


def describe_error(exc: BaseException) -> str:
    """The cause of a failed command in words, on one line, for `error: ...`."""
    if isinstance(exc, CdcError):
        return " ".join(str(exc).split()) or type(exc).__name__
    if spark_errors.is_spark_error(exc):
        return spark_errors.describe(exc)
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if getattr(exc, "filename", None) else ""
        return f"{exc.strerror or spark_errors.first_line(str(exc)) or type(exc).__name__}{where} (a file or the disk failed; check the path and space, then run again)"
    text = spark_errors.first_line(str(exc))
    return (f"unexpected {type(exc).__name__}{': ' + text if text else ''}; this is a defect of the platform: "
            "run the command again with --verbose and report the stack")


def print_stack(exc: BaseException) -> None:
    """`--verbose`: Python's traceback (with the chain of causes), then the JVM's for a Spark error."""
    traceback.print_exception(exc, file=sys.stderr)
    stack = spark_errors.jvm_stack(exc)
    if stack:
        print(f"JVM stack:\n{stack.rstrip()}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("error: interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        return 130
    except Exception as exc:  # every failure, whatever raised it, ends as one line and exit 2
        if args.verbose:
            print_stack(exc)
        print(f"error: {describe_error(exc)}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
