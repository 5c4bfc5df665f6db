"""A Spark standalone cluster on this machine's loopback: one master and N workers, from pyspark's own classes.

To try the platform on a real cluster manager without having one, and for the test and the benchmark that
run `cdc run --master spark://...` against it:

    python -m cdc_platform.spark.cluster --workers 2     # prints the master URL; Ctrl-C stops the cluster
    cdc run --config cdc.yaml --master spark://127.0.0.1:<port>

Every server is `bin/spark-class` of the installed pyspark (`org.apache.spark.deploy.master.Master`,
`...worker.Worker`), listens on 127.0.0.1 only, on ports the OS handed out free at start (master RPC, master
web UI, each worker's RPC and web UI; the master's REST submission server, fixed at 6066 by default, is off).
Each worker offers one core and `memory` (default 1g) to executors; the Python they run is the driver's
choice (the platform's session makes it the driver's own interpreter), this machine's venv here. The cluster is healthy when the master's JSON status lists every worker ALIVE. Each server
leads its own process group, which `stop()` ends whole (executors and their Python workers with it): SIGTERM,
then SIGKILL after a grace period. On Linux the servers also get SIGTERM when the thread that started them
dies, so a killed test run leaves no cluster behind.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdc_platform.errors import EnvironmentNotReadyError
from cdc_platform.spark.processes import HOST, die_with_parent, free_ports, log_tail, port_open, stop_group

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"

#: Settings every server of the cluster reads (its own SPARK_CONF_DIR, so a user's or the CLI's does not leak in).
#: maxRetries 0: a port taken between the OS handing it out and the server binding it fails the start (and it is
#: retried on new ports) instead of Spark quietly binding the next port, where nobody would look for it.
SPARK_DEFAULTS = {
    "spark.master.rest.enabled": "false",
    "spark.port.maxRetries": "0",
    "spark.worker.cleanup.enabled": "false",
}


#: JVM options of the master and the workers, which only schedule: the quick-starting compiler and a small
#: collector halve their start here (9.6 s against 18-19 s for a master and two workers at load 10 on 2 cores).
#: Executors, which do the work, are started by the workers with the application's options, not these.
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


class ClusterError(EnvironmentNotReadyError):
    """The local standalone cluster did not start (the message names the server and its log)."""


class _ServerExited(ClusterError):
    """A server died during start-up: most often a port taken in the moment between choosing and binding it."""


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark (the same version the driver runs)."""
    from pyspark.find_spark_home import _find_spark_home

    home = Path(_find_spark_home())
    if not (home / "bin" / "spark-class").is_file():
        raise ClusterError(f"{home} has no bin/spark-class; reinstall pyspark (`make setup`) or set SPARK_HOME to a Spark 4.1 distribution")
    return home


@dataclass
class Server:
    """One server process (master or worker), leader of its own process group."""

    name: str
    log: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        return None if self.popen is None else self.popen.pid

    def launch(self, cmd: list[str], env: dict[str, str], cwd: Path) -> None:
        with self.log.open("ab") as out:
            out.write(f"$ {' '.join(cmd)}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                start_new_session=True, preexec_fn=die_with_parent(),
            )

    def exited(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def stop(self, grace: float) -> None:
        """SIGTERM to the whole group (the worker's executors and their Python workers are in it), then SIGKILL."""
        if self.popen is None:
            return
        stop_group(self.popen.pid, signal.SIGTERM, timeout=grace, reap=self.popen.poll, kill_wait=10.0)
        self.popen.poll()


class LocalCluster:
    """A standalone master and `workers` workers on 127.0.0.1. Use as a context manager, or `start()` / `stop()`."""

    def __init__(
        self,
        workers: int = 2,
        *,
        cores: int = 1,
        memory: str = "1g",
        work_dir: Path | str | None = None,
        python: str | None = None,
        daemon_memory: str = "512m",
        start_timeout: float = 120.0,
        attempts: int = 3,
    ) -> None:
        if workers < 1:
            raise ValueError("a cluster needs at least one worker")
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.python = python or sys.executable
        self.daemon_memory = daemon_memory
        self.start_timeout = start_timeout
        self.attempts = attempts
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix="cdc-cluster-"))
        self.servers: list[Server] = []
        self.master_port: int | None = None
        self.web_port: int | None = None
        self.started_seconds: float | None = None
        self._deadline = 0.0

    # -- addresses ------------------------------------------------------------------------------------
    @property
    def master_url(self) -> str:
        if self.master_port is None:
            raise ClusterError("the cluster is not started")
        return f"spark://{HOST}:{self.master_port}"

    @property
    def web_url(self) -> str:
        if self.web_port is None:
            raise ClusterError("the cluster is not started")
        return f"http://{HOST}:{self.web_port}"

    def state(self) -> dict[str, Any]:
        """The master's JSON status (workers, their state, cores, running and completed applications)."""
        with urllib.request.urlopen(f"{self.web_url}/json/", timeout=5) as resp:
            return json.loads(resp.read().decode("utf-8"))

    def alive_workers(self) -> int:
        state = self.state()
        return sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE") if state.get("status") == "ALIVE" else 0

    # -- life cycle -----------------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        from cdc_platform.spark.session import require_java

        require_java()
        home = spark_home()
        t0 = time.perf_counter()
        last: ClusterError | None = None
        for attempt in range(1, self.attempts + 1):
            try:
                self._start_once(home, attempt)
                self.started_seconds = time.perf_counter() - t0
                return self
            except ClusterError as exc:
                self._stop_servers()
                last = exc
                if not isinstance(exc, _ServerExited):
                    break  # a timeout will not go away on other ports
            except BaseException:  # anything else (Ctrl-C included): leave no server behind
                self._stop_servers()
                raise
        assert last is not None
        raise last

    def _start_once(self, home: Path, attempt: int) -> None:
        self._deadline = time.monotonic() + self.start_timeout
        run_dir = self.work_dir / f"start-{attempt}"
        conf = run_dir / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in SPARK_DEFAULTS.items()), encoding="utf-8")
        ports = free_ports(2 + 2 * self.workers)
        self.master_port, self.web_port = ports[0], ports[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_GATEWAY_", "SPARK_"))}
        env.update(
            SPARK_HOME=str(home),
            SPARK_CONF_DIR=str(conf),
            SPARK_LOCAL_IP=HOST,
            SPARK_PUBLIC_DNS=HOST,
            SPARK_DAEMON_MEMORY=self.daemon_memory,
            SPARK_DAEMON_JAVA_OPTS=DAEMON_JAVA_OPTS,
            SPARK_WORKER_CORES=str(self.cores),
            SPARK_WORKER_MEMORY=self.memory,
            PYSPARK_PYTHON=self.python,
        )
        spark_class = str(home / "bin" / "spark-class")
        master = Server("master", run_dir / "master.log")
        master.launch(
            [spark_class, MASTER_CLASS, "--host", HOST, "--port", str(self.master_port), "--webui-port", str(self.web_port)], env, run_dir
        )
        self.servers = [master]
        # Workers start once the master listens: a worker that finds no master retries only 5-15 s later.
        self._wait(lambda: port_open(self.master_port), "the master to listen")
        for i in range(self.workers):
            rpc, ui = ports[2 + 2 * i], ports[3 + 2 * i]
            work = run_dir / f"worker-{i + 1}"
            work.mkdir()
            worker = Server(f"worker {i + 1}", run_dir / f"worker-{i + 1}.log")
            worker.launch(
                [
                    spark_class, WORKER_CLASS, "--host", HOST, "--port", str(rpc), "--webui-port", str(ui),
                    "--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(work), self.master_url,
                ],
                env,
                run_dir,
            )
            self.servers.append(worker)
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        self._wait(lambda: self.alive_workers() >= self.workers, f"{self.workers} workers ALIVE in the master's status")

    def _wait(self, check: Callable[[], bool], what: str) -> None:
        """Poll `check` until true; fail at once when a server dies, or after `start_timeout`."""
        deadline = self._deadline
        last_error = ""
        while True:
            for server in self.servers:
                code = server.exited()
                if code is not None:
                    raise _ServerExited(
                        f"Spark {server.name} exited with code {code} while waiting for {what}: {log_tail(server.log, 3)} (log: {server.log})"
                    )
            try:
                if check():
                    return
            except (OSError, ValueError) as exc:  # the master's web UI is not up yet, or answered half a page
                last_error = f"; last error: {exc}"
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the local Spark cluster was not ready after {self.start_timeout:.0f} s: still waiting for {what}{last_error} "
                    f"(logs: {self.servers[0].log.parent})"
                )
            time.sleep(0.2)

    def _stop_servers(self, grace: float = 15.0) -> None:
        for server in reversed(self.servers):  # workers first: their executors go with them
            server.stop(grace)
        self.servers = []

    def stop(self, grace: float = 15.0, *, keep_logs: bool = False) -> None:
        self._stop_servers(grace)
        if self._own_dir and not keep_logs:
            import shutil

            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cdc_platform.spark.cluster",
        description="Start a Spark standalone cluster on 127.0.0.1 (master + workers from pyspark's own classes) until Ctrl-C.",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores each worker offers (default 1)")
    parser.add_argument("--memory", default="1g", help="memory each worker offers its executors (default 1g)")
    parser.add_argument("--work-dir", help="logs and executor work directories (default: a temporary directory, removed at stop)")
    args = parser.parse_args(argv)
    cluster = LocalCluster(args.workers, cores=args.cores, memory=args.memory, work_dir=args.work_dir)
    try:
        cluster.start()
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = {"now": False}

    def on_signal(*_: object) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)  # also when started in the background, where a shell ignores SIGINT
    print(f"master {cluster.master_url}  (web UI {cluster.web_url}, {args.workers} workers, logs {cluster.work_dir}); Ctrl-C stops it", flush=True)
    print(f"try: cdc run --config cdc.yaml --master {cluster.master_url}", flush=True)
    try:
        while not stop["now"]:
            time.sleep(0.5)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
