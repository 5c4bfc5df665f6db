"""The bad-input corpus (tests/data/bad_input): every line ends in exactly one place, and the stream lives.

Three views of the same corpus. The parser test checks each line's fate one by one (no Spark),
splitting files as Spark's text source does. The stream test runs the ingest stream (in-process,
continuous trigger) over the whole corpus, then lands a normal file to show the stream is still alive,
and checks the accounting invariant on what the lake and `pipeline_metrics` say:

    input lines = raw events landed + markers landed + duplicates skipped + dead letters + tombstones

Duplicates count as their own outcome: a redelivered event is neither lost nor landed twice.
The stage test feeds the parsed corpus through every stage `cdc run` has (latest state, transactions,
whatever `default_stages` finds): a bad line may become a stage's dead letter, never an exception.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cdc_platform import lake
from cdc_platform.parse.envelope import KeySpec, parse_bytes

CORPUS = Path(__file__).resolve().parents[1] / "data" / "bad_input"
EXPECTED = json.loads((CORPUS / "expected.json").read_text(encoding="utf-8"))
KEYS = KeySpec({source: spec["key"] for source, spec in EXPECTED["tables"].items()})


def _make_corpus() -> Any:
    spec = importlib.util.spec_from_file_location("make_corpus", CORPUS / "make_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def spark_lines(data: bytes) -> list[bytes]:
    """Lines as Hadoop's LineRecordReader (Spark's text source) splits them: on \\n, \\r\\n or \\r."""
    if not data:
        return []
    parts = re.split(rb"\r\n|\r|\n", data)
    return parts[:-1] if parts[-1] == b"" else parts


def outcome_of(row: dict[str, Any]) -> str:
    kind = row["kind"]
    if kind == "change":
        return "raw"
    if kind == "dead_letter":
        return f"dead:{row['reason_code']}"
    return kind


def test_corpus_covers_at_least_thirty_kinds_and_matches_its_generator() -> None:
    files = EXPECTED["files"]
    assert len(files) >= 30
    committed = {p.name for p in CORPUS.glob("*.jsonl")}
    assert committed == {name for name, spec in files.items() if not spec.get("generated")}, "rerun make_corpus.py"
    reasons = {o.split(":", 1)[1] for spec in files.values() for o in spec["outcomes"] if o.startswith("dead:")}
    assert {"not_json", "not_utf8", "invalid_field", "missing_key", "unsafe_table_name", "out_of_range"} <= reasons


@pytest.mark.parametrize("name", sorted(n for n, s in EXPECTED["files"].items() if not s.get("generated")))
def test_each_line_has_its_expected_fate_in_the_parser(name: str) -> None:
    lines = spark_lines((CORPUS / name).read_bytes())
    expected = EXPECTED["files"][name]["outcomes"]
    assert len(lines) == len(expected), f"{name}: {len(lines)} lines, expected.json lists {len(expected)}"
    got = [outcome_of(parse_bytes(raw, name, KEYS)) for raw in lines]
    # a duplicate is a valid event or marker as far as the parser can tell; the lake decides
    want = [o if o != "duplicate" else got[i] if got[i] in ("raw", "marker") else "raw or marker" for i, o in enumerate(expected)]
    assert got == want
    for raw in lines:
        row = parse_bytes(raw, name, KEYS)
        if row["kind"] == "dead_letter":
            assert row["reason"] and "{detail}" not in row["reason"]
            assert row["line"], "the dead letter keeps the line for the operator"


def test_corpus_through_the_stream(tmp_path: Path, spark: Any, make_config: Any) -> None:
    from cdc_platform.run.ingest import IngestJob

    cfg = make_config(EXPECTED["tables"], max_files_per_trigger=8)
    landing = cfg.landing
    for path in CORPUS.glob("*.jsonl"):
        (landing / path.name).write_bytes(path.read_bytes())
    _make_corpus().write_generated(landing)
    per_file = {name: spec["outcomes"] for name, spec in EXPECTED["files"].items()}
    total_lines = sum(len(o) for o in per_file.values())
    for name, outcomes in per_file.items():
        assert len(spark_lines((landing / name).read_bytes())) == len(outcomes), name

    job = IngestJob(cfg, stages=[])  # the ingest contract; later stages: test_every_stage_survives_the_corpus
    sentinel_landed = threading.Event()
    done = threading.Event()

    def feeder() -> None:
        """After the corpus is in, land one ordinary file; stop the stream once that is in too."""
        # Generous: it ends as soon as the sentinel is in; under load (two pytest-xdist workers on 2 cores)
        # the corpus alone has taken over 150 s, and a deadline that stops the stream mid-corpus failed the test.
        deadline = time.monotonic() + 480
        while time.monotonic() < deadline:
            read = sum(b.rows_read for b in list(job.reports))
            if not sentinel_landed.is_set() and read >= total_lines:
                tmp = landing / ".sentinel.jsonl.tmp"
                tmp.write_text(_make_corpus().line(_make_corpus().event(row={"id": 5_000_001, "email": "alive@example.com"})) + "\n", encoding="utf-8")
                tmp.rename(landing / "zz_sentinel.jsonl")
                sentinel_landed.set()
            if sentinel_landed.is_set() and read >= total_lines + 1:
                break
            time.sleep(0.2)
        done.set()  # the job stops after the batch in flight (a bare `query.stop()` interrupts it: a failed run)

    thread = threading.Thread(target=feeder, daemon=True)
    thread.start()
    report = job.run_continuously(spark, interval="500 milliseconds", timeout=500, stop=done)
    thread.join()
    assert sentinel_landed.is_set(), "the corpus was never fully read"
    assert report.total("rows_read") == total_lines + 1, "the stream stopped before the file after the corpus"

    raw = lake.open_table(job.path("raw_change_events")).to_pyarrow_table(columns=["source_file", "after", "line"]).to_pylist()
    markers = lake.open_table(job.path("transaction_markers")).to_pyarrow_table(columns=["source_file"]).to_pylist()
    dead = lake.open_table(job.path("dead_letter")).to_pyarrow_table(columns=["source_file", "reason_code", "stage", "line"]).to_pylist()
    metrics = lake.open_table(job.path("pipeline_metrics")).to_pyarrow_table().to_pylist()
    ingest_dead = [d for d in dead if d["stage"] == "ingest"]

    def file_of(uri: str) -> str:
        return uri.rsplit("/", 1)[-1]

    got_raw = collections.Counter(file_of(r["source_file"]) for r in raw)
    got_markers = collections.Counter(file_of(m["source_file"]) for m in markers)
    got_dead = collections.Counter((file_of(d["source_file"]), d["reason_code"]) for d in ingest_dead)
    for name, outcomes in per_file.items():
        counts = collections.Counter(outcomes)
        assert got_raw.get(name, 0) == counts["raw"], name
        assert got_markers.get(name, 0) == counts["marker"], name
        for outcome, n in counts.items():
            if outcome.startswith("dead:"):
                assert got_dead.get((name, outcome[5:]), 0) == n, (name, outcome)
    assert sum(got_dead.values()) == sum(1 for o in per_file.values() for x in o if x.startswith("dead:"))

    want = collections.Counter(x for o in per_file.values() for x in o)
    tombstones = sum(m["tombstones"] for m in metrics)
    duplicates = sum(m["duplicates_skipped"] for m in metrics)
    dead_ingest = len(ingest_dead)
    landed_raw = sum(dict(m["rows_landed"]).get("raw_change_events", 0) for m in metrics)
    landed_markers = sum(dict(m["rows_landed"]).get("transaction_markers", 0) for m in metrics)
    assert tombstones == want["tombstone"]
    assert duplicates == want["duplicate"]
    assert landed_raw == want["raw"] + 1 and len(raw) == landed_raw  # + the sentinel
    assert landed_markers == want["marker"] == len(markers)
    rows_read = sum(m["rows_read"] for m in metrics)
    assert rows_read == total_lines + 1
    assert rows_read == landed_raw + landed_markers + duplicates + dead_ingest + tombstones

    # Column names that try SQL injection are data: they sit in the after image's JSON text unchanged.
    injected = [json.loads(r["after"]) for r in raw if file_of(r["source_file"]).startswith("14_") and r["after"]]
    assert injected and all("id; DROP TABLE customers;--" in a and "a' OR '1'='1" in a for a in injected)
    big = [r for r in raw if file_of(r["source_file"]).startswith("04_") and len(r["line"]) > 10 * 1024 * 1024]
    assert len(big) == 1 and len(json.loads(big[0]["after"])["note"]) == 10 * 1024 * 1024
    bad_bytes = [d["line"] for d in ingest_dead if d["reason_code"] == "not_utf8"]
    assert bad_bytes and all("\\x" in line for line in bad_bytes), "bad bytes stay visible as \\x escapes"


#: Stage failures on corpus lines that are reported and being fixed by the stage's owner: (module, exception).
#: Empty now: latest_state's int64 overflow (28_) and case-only column twins (38_) were fixed in 5502fc6.
KNOWN_STAGE_FAILURES: set[tuple[str, str]] = set()


def test_every_stage_survives_the_corpus(tmp_path: Path, spark: Any, make_config: Any) -> None:
    import traceback

    import pyarrow as pa

    from cdc_platform.run.ingest import IngestJob
    from cdc_platform.parse.parsed_batches import rows_to_batch

    cfg = make_config(EXPECTED["tables"])
    jobs = [IngestJob(cfg)]
    jobs[0].setup()
    # The generated 10 MB line is left to the stream test: here it would only make every replay slow.
    names = sorted(n for n, spec in EXPECTED["files"].items() if not spec.get("generated"))
    failures: list[tuple[str, str, str]] = []
    batch_ids = iter(range(10_000))

    def feed(group: list[str]) -> tuple[str, str] | None:
        rows = [parse_bytes(raw, name, KEYS) for name in group for raw in spark_lines((CORPUS / name).read_bytes())]
        try:
            jobs[-1].process_parsed(pa.Table.from_batches([rows_to_batch(rows)]), next(batch_ids), "corpus")
        except Exception as exc:  # noqa: BLE001 - collected and judged below
            jobs.append(IngestJob(cfg))  # a failed batch kills the process: go on as a restarted stream would
            where = traceback.extract_tb(exc.__traceback__)
            module = next((f.filename.rsplit("/", 1)[-1] for f in reversed(where) if "/cdc_platform/" in f.filename), "?")
            return module, type(exc).__name__
        return None

    def bisect(group: list[str]) -> None:
        """One batch for the whole corpus; a failing batch is split in halves until the culprit is named."""
        failed = feed(group)
        if failed is None:
            return
        if len(group) == 1:
            failures.append((group[0], *failed))
            return
        bisect(group[: len(group) // 2])
        bisect(group[len(group) // 2 :])

    bisect(names)
    dead = lake.open_table(jobs[-1].path("dead_letter")).to_pyarrow_table().to_pylist()
    assert all(d["reason_code"] and d["reason"] for d in dead)
    unknown = [f for f in failures if (f[1], f[2]) not in KNOWN_STAGE_FAILURES]
    assert not unknown, f"a stage raised on bad input instead of dead-lettering it: {unknown}"
    if failures:
        pytest.xfail(f"known stage bug, reported to its owner: {failures}")
