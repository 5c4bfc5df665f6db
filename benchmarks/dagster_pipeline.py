"""Time `cdc_pipeline` the way the UI runs it: `dagster dev` (webserver and daemon, as `make ui`) queues
the launched run, the daemon starts it (one process for the run), on the demo's sample workload
(500 transactions, as `cdc demo`).

Prints the wall time from the launch to the run's end, the run's steps, and every asset check's
result (ERROR checks must all pass). Target (issue 12): under 60 s on the 2-core machine.

    .venv/bin/python benchmarks/dagster_pipeline.py [--transactions N] [--screenshots DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from _common import OUT, banner, fresh_dir, load_average, say

from cdc_platform.workload.generate import generate_workload, recent_start_ms
from dagster_project.webserver import graphql, serve

LAUNCH = """
mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } ... on RunConfigValidationInvalid { errors { message } } } }
"""
RUN = """
query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status startTime endTime
  stepStats { stepKey status startTime endTime }
  assetCheckEvaluations: eventConnection(afterCursor: null, limit: 100000) { events { __typename
    ... on AssetCheckEvaluationEvent { evaluation { checkName assetKey { path } success severity description } }
    ... on MaterializationEvent { assetKey { path } } } } } } }
"""
DONE = {"SUCCESS", "FAILURE", "CANCELED"}
PAGES = {"asset-graph.png": "/asset-groups", "raw_change_events.png": "/assets/raw_change_events", "dead_letter.png": "/assets/dead_letter"}


def capture(url: str, folder: Path) -> None:
    """Headless-Chromium screenshots of the UI pages a person looks at after a run."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        say("no chromium on PATH: no screenshots (apt-get install -y chromium)")
        return
    folder.mkdir(parents=True, exist_ok=True)
    for name, page in PAGES.items():
        with tempfile.TemporaryDirectory() as profile:
            subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--user-data-dir={profile}",
                            "--window-size=1600,1000", "--virtual-time-budget=20000", f"--screenshot={(folder / name).resolve()}",
                            f"{url}{page}"], capture_output=True, timeout=180)
        say(f"screenshot of {page}: {folder / name}" if (folder / name).is_file() else f"no screenshot of {page}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=500, help="sample size (default 500: `cdc demo`'s, 677 change events)")
    parser.add_argument("--screenshots", type=Path, default=None, metavar="DIR",
                        help="also capture the asset graph and two asset pages after the run into DIR (headless Chromium)")
    args = parser.parse_args()
    banner("cdc_pipeline in Dagster")
    work = OUT / "dagster_pipeline"
    fresh_dir(work)
    workload = generate_workload(work / "sample", transactions=args.transactions, start_ms=recent_start_ms(120, int(time.time() * 1000)))
    say(f"sample: {workload.transactions:,} transactions, {workload.change_events:,} change events; {workload.config_path}")
    with serve(workload.config_path, daemon=True) as url:
        params = {"selector": {"repositoryLocationName": "dagster_project", "repositoryName": "__repository__", "jobName": "cdc_pipeline"},
                  "runConfigData": {}}
        t0 = time.monotonic()
        launched = graphql(url, LAUNCH, {"params": params})["launchRun"]
        if launched["__typename"] != "LaunchRunSuccess":
            say(f"launch failed: {launched}")
            return 1
        run_id = launched["run"]["runId"]
        while True:
            run = graphql(url, RUN, {"id": run_id})["runOrError"]
            if run["status"] in DONE:
                break
            time.sleep(1)
        wall = time.monotonic() - t0
        say(f"cdc_pipeline {run['status']} in {wall:.1f} s from launch to end (run {run['endTime'] - run['startTime']:.1f} s "
            f"from start to end)  [{load_average()}]")
        for step in run["stepStats"]:
            say(f"  step {step['stepKey']}: {step['status']} {(step['endTime'] or 0) - (step['startTime'] or 0):.1f} s")
        events = run["assetCheckEvaluations"]["events"]
        materialised = sorted({"/".join(e["assetKey"]["path"]) for e in events if e["__typename"] == "MaterializationEvent"})
        say(f"  {len(materialised)} assets materialised")
        failed_error = 0
        for e in events:
            if e["__typename"] != "AssetCheckEvaluationEvent":
                continue
            ev = e["evaluation"]
            mark = "pass" if ev["success"] else f"FAIL ({ev['severity']})"
            failed_error += (not ev["success"]) and ev["severity"] == "ERROR"
            say(f"  check {'/'.join(ev['assetKey']['path'])}:{ev['checkName']}: {mark}")
        say(f"ERROR checks failed: {failed_error}")
        if args.screenshots is not None:
            capture(url, args.screenshots)
    return 0 if run["status"] == "SUCCESS" and not failed_error else 1


if __name__ == "__main__":
    raise SystemExit(main())
