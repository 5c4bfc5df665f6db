"""`python -m cdc_platform.testbed install|start|status|stop` (what `make stack*` runs).

`start` leaves the servers running after it returns; their process ids, ports and folder are kept in
`<dir>/state.json` (default dir: `.stack/` in the checkout), which `status` and `stop` read."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from cdc_platform.testbed import install
from cdc_platform.testbed.errors import TestbedError
from cdc_platform.testbed.stack import Stack, read_state, state_status, stop_state

DEFAULT_DIR = install.REPO / ".stack"
AVRO_CONVERTER_FILE = "avro-converter.json"


def _print_endpoints(state: dict, state_dir: Path) -> None:
    ep = state["endpoints"]
    print(f"  Kafka bootstrap   {ep['kafka']}")
    print(f"  Kafka Connect     {ep['connect']}   (REST: curl {ep['connect']}/connectors)")
    print(f"  PostgreSQL        {ep['postgres']}   (wal_level=logical; superuser postgres/postgres)")
    print(f"  MariaDB           {ep['mariadb']}   (binlog ROW, FULL images, GTIDs)")
    print(f"  schema registry   {ep['schema_registry']}   (Apicurio, Confluent-compatible API; Avro converter settings: "
          f"{state_dir / AVRO_CONVERTER_FILE})")
    print(f"  folder            {state['root']}   (logs: */*.log)")
    print(f"  shell variables   . {state_dir / 'env'}   (then: psql; mariadb -u cdc cdc)")


def _write_env(state: dict, state_dir: Path) -> None:
    ep = state["endpoints"]
    ports = state["ports"]
    lines = [
        f"export CDC_KAFKA_BOOTSTRAP={ep['kafka']}",
        f"export CDC_CONNECT_URL={ep['connect']}",
        f"export CDC_POSTGRES_URL={ep['postgres']}",
        f"export CDC_MARIADB_URL={ep['mariadb']}",
        "export PGHOST=127.0.0.1",
        f"export PGPORT={ports['postgres']}",
        "export PGUSER=cdc PGPASSWORD=cdc PGDATABASE=cdc",
        f"export MYSQL_HOST=127.0.0.1 MYSQL_TCP_PORT={ports['mariadb']} MYSQL_PWD=cdc",
        f"export CDC_SCHEMA_REGISTRY_URL={ep['schema_registry']}",
    ]
    (state_dir / "env").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # What a connector's config takes to write Avro to the bed's registry (the README's Avro walkthrough merges it).
    (state_dir / AVRO_CONVERTER_FILE).write_text(json.dumps(state["avro_converter"], indent=2) + "\n", encoding="utf-8")


def cmd_start(state_dir: Path) -> int:
    state_file = state_dir / "state.json"
    state = read_state(state_file)
    if state and any(state_status(state).values()):
        print("test bed: already running (make stack-stop to stop it):")
        _print_endpoints(state, state_dir)
        return 0
    if state_dir.exists():
        shutil.rmtree(state_dir)
    state_dir.mkdir(parents=True)
    (state_dir / ".gitignore").write_text("*\n", encoding="utf-8")
    print("test bed: starting Kafka (KRaft), Kafka Connect + Debezium, PostgreSQL, MariaDB, a schema registry ...", flush=True)
    stack = Stack.start(state_dir / "run", die_with_parent=False)
    state = stack.to_state()
    state_file.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    _write_env(state, state_dir)
    print(f"test bed: up in {stack.timings['total']:.0f} s (jars and packages: {stack.timings['install']:.0f} s)")
    _print_endpoints(state, state_dir)
    print("  stop with         make stack-stop")
    return 0


def cmd_status(state_dir: Path) -> int:
    state = read_state(state_dir / "state.json")
    if not state:
        print("test bed: not started (make stack)")
        return 1
    alive = state_status(state)
    for name, up in alive.items():
        print(f"  {name:<14} {'running' if up else 'STOPPED'}  pid {state['services'][name]['pid']}")
    if all(alive.values()):
        _print_endpoints(state, state_dir)
        return 0
    return 1


def cmd_stop(state_dir: Path) -> int:
    state = read_state(state_dir / "state.json")
    if not state:
        print("test bed: not started")
        return 0
    t = time.monotonic()
    stop_state(state)
    (state_dir / "state.json").unlink()
    print(f"test bed: stopped in {time.monotonic() - t:.0f} s (logs and data stay in {state['root']} until the next start)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cdc_platform.testbed", description=__doc__)
    parser.add_argument("command", choices=["install", "start", "status", "stop"])
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="state folder (default: .stack/ in the checkout)")
    args = parser.parse_args(argv)
    try:
        if args.command == "install":
            t = time.monotonic()
            programs = install.ensure_installed()
            print(f"test bed: jars in {install.TARGET}, servers {programs.postgres}, {programs.mariadbd} ({time.monotonic() - t:.0f} s)")
            return 0
        return {"start": cmd_start, "status": cmd_status, "stop": cmd_stop}[args.command](args.dir.resolve())
    except TestbedError as err:
        print(err, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
