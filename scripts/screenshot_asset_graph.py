"""Take a headless-Chromium screenshot of the Dagster asset graph for a lake.

Usage: .venv/bin/python scripts/screenshot_asset_graph.py [--config cdc.yaml] [--out asset-graph.png]
Needs Debian's `chromium` (`sudo apt-get install -y chromium`). Without --config it uses $CDC_CONFIG,
or generates the sample workload into .cdc-demo/ first.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cdc_platform.config import resolve_config_path  # noqa: E402
from dagster_project.webserver import serve  # noqa: E402

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="cdc.yaml (default: $CDC_CONFIG, else the demo's)")
    parser.add_argument("--out", default="asset-graph.png")
    parser.add_argument("--path", default="/asset-groups", help="UI page to capture")
    parser.add_argument("--size", default="1600,1000")
    args = parser.parse_args()

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        print("error: no chromium on PATH; install it with `sudo apt-get install -y chromium`", file=sys.stderr)
        return 2
    config = resolve_config_path(args.config)
    if config is None:
        config = REPO / ".cdc-demo" / "cdc.yaml"
        if not config.is_file():
            from cdc_platform.workload.generate import generate_workload

            generate_workload(REPO / ".cdc-demo")
    out = Path(args.out).resolve()
    with serve(Path(config)) as url, tempfile.TemporaryDirectory() as profile:
        cmd = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--window-size={args.size}",
               "--virtual-time-budget=20000", f"--screenshot={out}", f"{url}{args.path}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    if done.returncode != 0 or not out.is_file():
        print(f"error: chromium failed ({done.returncode}): {done.stderr[-500:]}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
