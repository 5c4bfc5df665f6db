"""Where a JVM's CPU went: a Java Flight Recorder recording summarised by thread, by frame, and by caller.

The small-batch measurements (benchmarks/README.md, "Jobs and commits in a small batch") come from JFR's
execution samples of the Spark driver's JVM. Record one around any benchmark - JDK 17's `java` launcher
reads `JDK_JAVA_OPTIONS`, so it reaches the JVM PySpark starts (and Spark's short launcher JVM, which
writes a small recording of its own beside it: take the largest file):

    mkdir -p /tmp/jfr
    JDK_JAVA_OPTIONS="-XX:StartFlightRecording:settings=profile,filename=/tmp/jfr/ -XX:FlightRecorderOptions:stackdepth=512" \\
        .venv/bin/python benchmarks/small_batches.py --steady --runs 12 --warmup 2 --variant session
    .venv/bin/python benchmarks/jfr_summary.py "$(ls -S /tmp/jfr/*.jfr | head -1)" --after 22:05:40 \\
        --frame 'OptimisticTransaction.*txnVersion' --frame 'Snapshot\\.cachedState' --callers 'UnsafeProjection\\$\\.create$'

`--after HH:MM:SS` drops the samples before that time (the warm-up runs: each run's line in the
benchmark's output comes at its end), `--before HH:MM:SS` those from that time on (one run of several). Printed: samples by thread (numbers folded, so "Executor task
launch worker-#" is every task thread), the frames samples were in (self), the share of samples with each
`--frame` pattern anywhere on the stack (inclusive), and for `--callers` the frames that called it.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


@dataclass
class Sample:
    time: str
    thread: str
    frames: list[str] = field(default_factory=list)  # innermost first, each `package.Class.method`


def samples(recording: str, depth: int) -> Iterator[Sample]:
    """The recording's `jdk.ExecutionSample` events, from `jfr print` (JDK 17's text form, read as it is printed:
    a few minutes of a benchmark print tens of MB at this depth)."""
    argv = ["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", str(depth), recording]
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        yield from _parse(proc.stdout)
    if proc.returncode != 0:
        raise SystemExit(f"`{' '.join(argv)}` failed (exit {proc.returncode})")


def _parse(lines: Iterable[str]) -> Iterator[Sample]:
    current: Sample | None = None
    for line in lines:
        s = line.strip()
        if s.startswith("jdk.ExecutionSample"):
            current = Sample("", "")
        elif current is None:
            continue
        elif s.startswith("startTime ="):
            current.time = s.split("=", 1)[1].strip()
        elif s.startswith("sampledThread ="):
            current.thread = s.split("=", 1)[1].strip().split(" (")[0].strip('"')
        elif s == "]":
            yield current
            current = None
        elif "(" in s and not s.startswith(("state", "stackTrace")):
            current.frames.append(re.sub(r"\(.*$", "", s))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recording", help="a .jfr file")
    parser.add_argument("--after", default="", help="only samples at or after this time of day (HH:MM:SS, as `jfr print` shows it)")
    parser.add_argument("--before", default="", help="only samples before this time of day (HH:MM:SS): with --after, one run of several")
    parser.add_argument("--frame", action="append", default=[], help="a regex; print the share of samples with a matching frame (repeatable)")
    parser.add_argument("--callers", action="append", default=[], help="a regex; print what called the outermost matching frame (repeatable)")
    parser.add_argument("--top", type=int, default=20, help="rows per table (default 20)")
    parser.add_argument("--depth", type=int, default=512, help="stack frames read per sample (default 512)")
    args = parser.parse_args()

    kept = [s for s in samples(args.recording, args.depth) if s.time >= args.after and (not args.before or s.time < args.before)]
    n = len(kept)
    if n == 0:
        raise SystemExit(f"no execution samples in {args.recording} at or after {args.after!r}")
    print(f"{n} samples")

    def table(title: str, counts: collections.Counter[str]) -> None:
        print(f"-- {title}")
        for key, count in counts.most_common(args.top):
            print(f"{count / n:6.1%}  {key}")

    table("threads", collections.Counter(re.sub(r"\d+", "#", s.thread) for s in kept))
    table("self (the frame the sample was in)", collections.Counter(s.frames[0] for s in kept if s.frames))
    if args.frame:
        print("-- inclusive (a matching frame anywhere on the stack)")
        for pattern in args.frame:
            count = sum(1 for s in kept if any(re.search(pattern, f) for f in s.frames))
            print(f"{count / n:6.1%}  {pattern}")
    for pattern in args.callers:
        callers: collections.Counter[str] = collections.Counter()
        for s in kept:
            hits = [i for i, f in enumerate(s.frames) if re.search(pattern, f)]
            if hits:
                outer = [f for f in s.frames[hits[-1] + 1:] if not f.startswith(("scala.", "java."))][:4]
                callers[" <- ".join(outer)] += 1
        table(f"callers of {pattern}", callers)


if __name__ == "__main__":
    main()
