"""Type fuzzing: the property of tests/cdc_platform/test_latest_state_type_props.py with many more examples.

    .venv/bin/python benchmarks/type_fuzz.py                         # 5,000 generated tables
    .venv/bin/python benchmarks/type_fuzz.py --examples 20000 --seed 7
    .venv/bin/python benchmarks/type_fuzz.py --families decimal_numeric,plain_big_int --examples 500

Each example is one generated source table (`tests/strategies/debezium_types.py`): a key `id` plus a
few columns of one type family, or of several (the `mixed_*` targets; every target gets the same
share of the examples), with a handful of create/update events in the wrapped (`{"schema", "payload"}`) or the plain form. The events go through the parser
and the latest-state typing exactly as in the stage (`tests/strategies/type_property.py`, no Spark),
and every value is compared with the oracle's. Unlike the test, a failure does not stop the run: it
is counted by the column's family, declared type and kind of difference, and the shortest failing
line of each is printed. Exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as `python benchmarks/type_fuzz.py` without installing the repo
    sys.path.insert(0, str(REPO))

from _common import banner, say  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.strategies.debezium_types import FAMILIES, PLAIN, WRAPPED, TableCase, table_cases  # noqa: E402
from tests.strategies.type_property import Failure, check_case  # noqa: E402

TARGETS: dict[str, tuple[str, ...]] = {**{f: (f,) for f in FAMILIES}, "mixed_wrapped": WRAPPED, "mixed_plain": PLAIN}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=5000, help="generated tables in all (default 5000)")
    parser.add_argument("--seed", type=int, default=None, help="Hypothesis seed (default: a random one, printed)")
    parser.add_argument("--families", default="", help=f"comma-separated targets (default all): {', '.join(TARGETS)}")
    parser.add_argument("--max-events", type=int, default=8, help="events per table at most (default 8)")
    args = parser.parse_args(argv)
    targets = [t.strip() for t in args.families.split(",") if t.strip()] or list(TARGETS)
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        parser.error(f"unknown families {unknown}; known: {', '.join(TARGETS)}")
    run_seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000

    banner(f"type fuzz: {args.examples:,} tables over {len(targets)} targets, seed {run_seed}")
    examples: Counter[str] = Counter()  # tables per target
    columns: Counter[str] = Counter()  # columns per family
    events = 0
    failing_tables: Counter[str] = Counter()  # tables with at least one failure, per target
    failures: Counter[tuple[str, str, str]] = Counter()  # (family, declared type, what) -> failing values
    sample: dict[tuple[str, str, str], Failure] = {}

    def record(target: str, case: TableCase) -> None:
        nonlocal events
        examples[target] += 1
        events += len(case.events)
        columns.update(c.kind.family for c in case.columns)
        found = check_case(case)
        if found:
            failing_tables[target] += 1
        for f in found:
            key = (f.family, f.label, f.what)
            failures[key] += 1
            if key not in sample or len(f.line or "") < len(sample[key].line or ""):
                sample[key] = f

    per_target = -(-args.examples // len(targets))  # the same share for every target, rounded up
    t0 = time.perf_counter()
    for target in targets:
        strategy = table_cases(TARGETS[target], max_columns=5 if target.startswith("mixed") else 3, max_events=args.max_events)

        @seed(run_seed)
        @settings(max_examples=per_target, deadline=None, database=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(strategy.map(lambda case, t=target: (t, case)))
        def fuzz(pair: tuple[str, TableCase]) -> None:
            record(*pair)

        fuzz()
    seconds = time.perf_counter() - t0

    say(f"\n{sum(examples.values()):,} tables, {events:,} events, {sum(columns.values()):,} columns in {seconds:.1f} s "
        f"({sum(examples.values()) / max(seconds, 1e-9):.0f} tables/s)")
    say(f"\n{'target':<24}{'tables':>8}{'failing':>9}   {'columns of the family':>22}")
    for t in targets:
        say(f"{t:<24}{examples[t]:>8,}{failing_tables[t]:>9,}   {columns[t] if t in FAMILIES else '':>22}")
    if not failures:
        say("\nno differences from the oracle")
        return 0
    say(f"\n{sum(failures.values()):,} differences from the oracle, by family / declared type / kind:")
    for (family, label, what), n in sorted(failures.items()):
        say(f"  {n:>7,}  {family:<24}{label:<44}{what}")
    say("\nshortest failing line of each:")
    for key in sorted(sample):
        say("  " + sample[key].describe().replace("\n", "\n  "))
    return 1


if __name__ == "__main__":
    sys.exit(main())
