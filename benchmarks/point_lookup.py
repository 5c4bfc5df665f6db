"""How long does a point lookup on a full view take through `cdc serve`? (issue 12: under 1 s end to end)

Builds the demo's sample lake (`cdc run` on 500 generated transactions, 677 change events), starts
`cdc serve` on free loopback ports, and times, after one warm-up round:

* over Spark Connect, from a client session already connected (a notebook, a BI tool's open
  connection): `SELECT 1`, a lookup by key on `customers__stored` (the storage, no fold), on
  `customers__full_view` and on `customers__clean_view`;
* the same over the JDBC/ODBC (HiveServer2) endpoint, a new connection per query, as `cdc sql` makes;
* `cdc sql "<lookup>"` as a command, end to end: the Python process, finding the server, the query.

Medians and extremes of `--repeats` runs are printed with the load average, and each query's first run
(`first`: the warm-up, left out of the median); nothing is asserted. The lookups start once the server's own
warm-up query is done (`cdc serve` runs one in the background when ready), as a user's a minute after the start
would; `--cold` starts them at once, beside it, and `first` is then what a new server's first user waits.
`--rounds 2` times the Spark Connect and JDBC lookups a second time: the first round meets a server
started seconds before (its JIT has not compiled the plan's code yet), the second one that has served
a few dozen queries, as a server does after its first minutes.

    .venv/bin/python benchmarks/point_lookup.py [--repeats 10] [--rounds 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from _common import OUT, REPO, banner, exit_now, fresh_dir, load_average, say

from cdc_platform.serve import sql_client
from cdc_platform.workload.generate import generate_workload
from cdc_platform.spark.processes import die_with_parent, free_ports, stop_group

CDC = Path(sys.executable).parent / "cdc"


def timed(label: str, run: Callable[[], object], repeats: int) -> list[float]:
    t0 = time.perf_counter()
    run()  # warm-up: the server's first plan of this query shape
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    say(f"  {label:<44} median {statistics.median(times):.3f} s  (min {min(times):.3f}, max {max(times):.3f}; first {first:.3f})")
    return times


def wait_for_warm_up(log: Path, timeout: float) -> str:
    """The server's line about its warm-up query (`Server.warm_up`), once its log has it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if "warmed up in" in line or "warm-up query failed" in line:
                return line.split("] ", 1)[-1]
        time.sleep(0.5)
    return f"no warm-up line in {timeout:.0f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10, help="timed runs per query after one warm-up (default 10)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the Connect and JDBC lookups (default 1)")
    parser.add_argument("--cold", action="store_true",
                        help="query as soon as the server is ready, beside its warm-up (default: after the warm-up, as a user a minute later)")
    args = parser.parse_args()
    banner("point lookup through cdc serve")
    work = fresh_dir(OUT / "point_lookup")
    sample = generate_workload(work / "sample", transactions=500)
    t0 = time.monotonic()
    subprocess.run([str(CDC), "run", "--config", str(sample.config_path)], check=True, capture_output=True, cwd=REPO)
    say(f"lake built by `cdc run` in {time.monotonic() - t0:.1f} s: {sample.change_events:,} change events")
    lake_dir = sample.config_path.parent / "lake"
    connect_port, jdbc_port = free_ports(2)
    log = work / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(CDC), "serve", "--config", str(sample.config_path), "--connect-port", str(connect_port),
                                 "--jdbc-port", str(jdbc_port)], stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent())
    try:
        t0 = time.monotonic()
        try:
            info = sql_client.wait_for_state(lake_dir, proc.poll, log, 300)
        except sql_client.ServerUnavailable as exc:
            say(str(exc))
            return 1
        say(f"cdc serve ready in {time.monotonic() - t0:.1f} s  [{load_average()}]")
        if not args.cold:
            warmed = wait_for_warm_up(log, 300)
            say(f"cdc serve's own warm-up query: {warmed} ({time.monotonic() - t0:.1f} s after the start)")
        _, rows, session = sql_client.connect_query(info, "SELECT id FROM customers__stored ORDER BY id LIMIT 1")
        key = rows[0][0]
        lookups = {
            "SELECT 1": "SELECT 1",
            "customers__stored by id": f"SELECT * FROM customers__stored WHERE id = {key}",
            "customers__full_view by id": f"SELECT * FROM customers__full_view WHERE id = {key}",
            "customers__clean_view by id": f"SELECT * FROM customers__clean_view WHERE id = {key}",
        }
        for round_ in range(1, args.rounds + 1):
            which = f", round {round_} of {args.rounds}" if args.rounds > 1 else ""
            say(f"Spark Connect, connected client ({args.repeats} runs each{which}):")
            for label, query in lookups.items():
                timed(label, lambda q=query: session.sql(q).collect(), args.repeats)
            say(f"JDBC/ODBC (HiveServer2) endpoint, a new connection per query, as `cdc sql` ({args.repeats} runs each{which}):")
            for label, query in lookups.items():
                timed(label, lambda q=query: sql_client.remote_query(info, q), args.repeats)
        say(f"`cdc sql` end to end ({args.repeats} runs):")
        lookup = lookups["customers__full_view by id"]
        timed("cdc sql <full_view by id>", lambda: subprocess.run(
            [str(CDC), "sql", "--lake", str(lake_dir), lookup], check=True, capture_output=True), args.repeats)
        say(f"[{load_average()}]")
    finally:
        stop_group(proc.pid, reap=proc.poll)
    return 0


if __name__ == "__main__":
    exit_now(main())  # the Spark Connect client's threads keep the interpreter from exiting once the server is gone
