"""Stop `make` with one clear line when Java 17+ is missing (stdlib only: runs before the venv exists)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

HELP = (
    "Java 17 or newer is required (Spark runs on the JVM): install it, e.g. `sudo apt-get install -y "
    "openjdk-17-jre-headless` on Debian/Ubuntu or `brew install openjdk@17` on macOS, then put `java` on "
    "PATH or set JAVA_HOME"
)


def main() -> int:
    home = os.environ.get("JAVA_HOME")
    exe = os.path.join(home, "bin", "java") if home and os.path.isfile(os.path.join(home, "bin", "java")) else shutil.which("java")
    if exe is None:
        print(f"error: no `java` found. {HELP}", file=sys.stderr)
        return 1
    out = subprocess.run([exe, "-version"], capture_output=True, text=True)
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    major = int(m.group(1)) if m else 0
    if major == 1 and m:
        major = int(m.group(2) or 0)
    if major < 17:
        print(f"error: {exe} is Java {major or 'of unknown version'}, older than 17. {HELP}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
