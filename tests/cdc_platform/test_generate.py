"""The sample workload must look like real Debezium MySQL output and agree with its own counts.

Downstream tests and benchmarks trust `GeneratedWorkload` blindly, so every figure and promise it makes
(counts, faults, positions, expected state) is checked here against the files actually written.
Pure Python, no Spark.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform.workload.generate import CDC_YAML, SERVER_UUID, GeneratedWorkload, append_workload, generate_workload
from cdc_platform.errors import ConfigError

TOPICS = {
    "payments.payments.customers": "customers",
    "payments.payments.charges": "charges",
    "payments.payments.refunds": "refunds",
}
MARKER_TOPIC = "payments.transaction"
ROW_FIELDS = {
    "customers": {"id": int, "name": str, "email": str, "country": str, "created_at": int},
    "charges": {"id": int, "customer_id": int, "amount_cents": int, "currency": str, "status": str, "updated_at": int},
    "refunds": {"id": int, "charge_id": int, "amount_cents": int, "reason": str},
}
SOURCE_KEYS = [
    "version", "connector", "name", "ts_ms", "snapshot", "db", "sequence", "table", "server_id",
    "gtid", "file", "pos", "row", "thread", "query",
]
ENVELOPE_KEYS = ["before", "after", "source", "op", "ts_ms", "transaction"]
GTID_RE = re.compile(rf"^{re.escape(SERVER_UUID)}:(\d+)$")
START_MS = 1_767_225_600_000


@dataclass
class Line:
    """One landing line, classified the way a downstream parser has to classify it."""

    topic: str
    file_index: int
    seq: int  # index within the topic, in file then line order
    text: str
    kind: str  # change | marker | tombstone | malformed
    obj: Any = None  # envelope (unwrapped) or marker
    schema: Any = None  # Connect schema when the line was schema-wrapped


def read_landing(landing: Path) -> dict[str, list[Line]]:
    topics: dict[str, list[Line]] = {}
    for topic_dir in sorted(p for p in landing.iterdir() if p.is_dir()):
        lines: list[Line] = []
        for path in sorted(topic_dir.iterdir()):
            assert re.fullmatch(r"part-\d{5}\.jsonl", path.name), path
            file_index = int(path.name[5:10])
            for text in path.read_text(encoding="utf-8").splitlines():
                line = Line(topic_dir.name, file_index, len(lines), text, "malformed")
                if text == "null":
                    line.kind = "tombstone"
                else:
                    try:
                        obj = json.loads(text)
                    except ValueError:
                        obj = None
                    if isinstance(obj, dict):
                        if set(obj) == {"schema", "payload"}:
                            line.schema, obj = obj["schema"], obj["payload"]
                        line.obj = obj
                        line.kind = "marker" if "status" in obj else "change"
                lines.append(line)
        topics[topic_dir.name] = lines
    return topics


def identity(env: dict[str, Any]) -> str:
    """A change's identity: the whole envelope except the redelivery-dependent `ts_ms`."""
    return json.dumps({k: v for k, v in env.items() if k != "ts_ms"}, sort_keys=True)


def position(env: dict[str, Any]) -> tuple[int, int, int]:
    src = env["source"]
    return int(src["file"].rsplit(".", 1)[1]), src["pos"], src["row"]


def distinct_changes(topics: dict[str, list[Line]]) -> list[Line]:
    """First arrival of every distinct change event, across all change topics."""
    seen: set[str] = set()
    out: list[Line] = []
    for topic in TOPICS:
        for line in topics.get(topic, []):
            if line.kind == "change":
                ident = identity(line.obj)
                if ident not in seen:
                    seen.add(ident)
                    out.append(line)
    return out


def in_history_order(changes: list[Line]) -> list[Line]:
    # Snapshot reads share one coordinate; sorting is stable so they keep their topic order.
    return sorted(changes, key=lambda line: position(line.obj))


def row_key(env: dict[str, Any]) -> int:
    return (env["after"] if env["after"] is not None else env["before"])["id"]


def file_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[GeneratedWorkload, dict[str, list[Line]]]:
    """Enough transactions and small files to exercise every fault and file rotation within a topic."""
    result = generate_workload(tmp_path_factory.mktemp("small"), transactions=1500, seed=11, events_per_file=40)
    return result, read_landing(result.landing_dir)


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> tuple[GeneratedWorkload, dict[str, list[Line]]]:
    result = generate_workload(tmp_path_factory.mktemp("default"))
    return result, read_landing(result.landing_dir)


@pytest.fixture(scope="module")
def appended(tmp_path_factory: pytest.TempPathFactory) -> tuple[GeneratedWorkload, dict[str, list[Line]]]:
    """The small workload plus an increment (`cdc generate --append`): every promise of this file must hold
    over base and increment together, as one database's history. Counts are summed over both writes."""
    out = tmp_path_factory.mktemp("appended")
    base = generate_workload(out, transactions=1500, seed=11, events_per_file=40)
    inc = append_workload(out, transactions=700, seed=11, events_per_file=40)
    combined = dataclasses.replace(
        inc,
        **{f: getattr(base, f) + getattr(inc, f) for f in
           ("transactions", "change_events", "duplicate_events", "markers", "malformed_lines", "tombstones", "files")},
    )
    return combined, read_landing(inc.landing_dir)


WORKLOADS = ["small", "default", "appended"]


@pytest.fixture(params=WORKLOADS)
def workload(request: pytest.FixtureRequest) -> tuple[GeneratedWorkload, dict[str, list[Line]]]:
    return request.getfixturevalue(request.param)


def test_files_and_config_written(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    result, topics = workload
    assert result.config_path == result.out_dir / "cdc.yaml"
    assert result.landing_dir == result.out_dir / "landing"
    text = result.config_path.read_text(encoding="utf-8")
    assert text == CDC_YAML
    assert yaml.safe_load(text) == {
        "landing": "landing",
        "lake": "lake",
        "tables": {
            "payments.customers": {"key": ["id"], "mask": ["email"]},
            "payments.charges": {"key": ["id"]},
            "payments.refunds": {"key": ["id"]},
        },
    }
    assert set(topics) == {*TOPICS, MARKER_TOPIC}
    per_file_limit = 40 if result.transactions == 1500 else 500
    files = 0
    for topic_dir in result.landing_dir.iterdir():
        names = sorted(p.name for p in topic_dir.iterdir())
        assert names == [f"part-{i:05d}.jsonl" for i in range(len(names))]
        for name in names:
            data = (topic_dir / name).read_text(encoding="utf-8")
            assert data.endswith("\n")
            assert 1 <= data.count("\n") <= per_file_limit
        files += len(names)
    assert files == result.files


def test_change_event_shapes(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    _, topics = workload
    snapshot: list[dict[str, Any]] = []
    for topic, table in TOPICS.items():
        for line in topics[topic]:
            if line.kind != "change":
                continue
            env = line.obj
            assert list(env) == ENVELOPE_KEYS
            src = env["source"]
            assert list(src) == SOURCE_KEYS
            assert (src["version"], src["connector"], src["name"], src["db"], src["table"]) == (
                "2.7.3.Final", "mysql", "payments", "payments", table,
            )
            assert src["server_id"] == 223344 and src["sequence"] is None and src["query"] is None
            assert re.fullmatch(r"mysql-bin\.\d{6}", src["file"]) and src["pos"] > 0 and src["row"] == 0
            assert src["ts_ms"] >= START_MS and env["ts_ms"] > src["ts_ms"]
            op = env["op"]
            assert op in {"c", "u", "d", "r"}
            assert (env["before"] is None) == (op in {"c", "r"})
            assert (env["after"] is None) == (op == "d")
            for image in (env["before"], env["after"]):
                if image is not None:
                    assert {k: type(v) for k, v in image.items()} == ROW_FIELDS[table]
                    if table == "customers":
                        assert re.fullmatch(r"[A-Z]{2}", image["country"]) and "@" in image["email"]
                    if table == "charges":
                        assert image["status"] in {"pending", "succeeded", "failed", "refunded"}
                        assert re.fullmatch(r"[A-Z]{3}", image["currency"]) and image["amount_cents"] > 0
            if op == "u":
                assert env["before"]["id"] == env["after"]["id"] and env["before"] != env["after"]
            if op == "r":
                assert table == "customers" and env["transaction"] is None and src["gtid"] is None
                assert src["thread"] is None and src["snapshot"] in {"true", "last"}
                snapshot.append(env)
            else:
                assert src["snapshot"] == "false"
                tx = env["transaction"]
                assert list(tx) == ["id", "total_order", "data_collection_order"]
                assert GTID_RE.match(tx["id"]) and src["gtid"] == tx["id"]
                assert isinstance(src["thread"], int)
    distinct_snapshot = {identity(env): env for env in snapshot}
    snaps = sorted(distinct_snapshot.values(), key=lambda env: env["after"]["id"])
    assert snaps, "workload starts with a snapshot"
    assert [env["source"]["snapshot"] for env in snaps] == ["true"] * (len(snaps) - 1) + ["last"]
    assert len({position(env) for env in snaps}) == 1, "snapshot reads share one binlog coordinate"


def test_marker_shapes(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    _, topics = workload
    for line in topics[MARKER_TOPIC]:
        assert line.kind == "marker" and line.schema is None
        marker = line.obj
        assert list(marker) == ["status", "id", "ts_ms", "event_count", "data_collections"]
        assert GTID_RE.match(marker["id"]) and marker["ts_ms"] >= START_MS
        if marker["status"] == "BEGIN":
            assert marker["event_count"] is None and marker["data_collections"] is None
        else:
            assert marker["status"] == "END" and marker["event_count"] >= 1
            for dc in marker["data_collections"]:
                assert list(dc) == ["data_collection", "event_count"]
                assert dc["data_collection"] in {"payments.customers", "payments.charges", "payments.refunds"}


def test_counts_match_files(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    result, topics = workload
    kinds: Counter[str] = Counter()
    for topic, lines in topics.items():
        for line in lines:
            kinds[line.kind] += 1
            if topic == MARKER_TOPIC:
                assert line.kind == "marker"
            else:
                assert line.kind != "marker"
    distinct = len(distinct_changes(topics))
    assert result.change_events == distinct
    assert result.duplicate_events == kinds["change"] - distinct
    assert result.markers == kinds["marker"] == 2 * result.transactions
    assert result.malformed_lines == kinds["malformed"]
    assert result.tombstones == kinds["tombstone"]
    assert result.duplicate_events >= 1 and result.malformed_lines >= 1


def test_same_seed_is_byte_identical_and_seed_matters(tmp_path: Path) -> None:
    a = generate_workload(tmp_path / "a", transactions=300, seed=3, events_per_file=50)
    b = generate_workload(tmp_path / "b", transactions=300, seed=3, events_per_file=50, track_state=False)
    c = generate_workload(tmp_path / "c", transactions=300, seed=4, events_per_file=50)
    assert file_tree(a.out_dir) == file_tree(b.out_dir), "track_state must not change the files"
    assert file_tree(a.out_dir) != file_tree(c.out_dir)
    assert b.expected_state == {} and a.expected_state
    assert (a.change_events, a.duplicate_events, a.tombstones, a.files) == (
        b.change_events, b.duplicate_events, b.tombstones, b.files,
    )


def test_history_is_ordered_by_binlog_position(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    _, topics = workload
    history = in_history_order(distinct_changes(topics))
    streaming = [line.obj for line in history if line.obj["op"] != "r"]
    # Every streaming change has its own position; GTIDs and commit times follow it.
    assert len({position(env) for env in streaming}) == len(streaming)
    gtids = [int(GTID_RE.match(env["transaction"]["id"]).group(1)) for env in streaming]
    assert gtids == sorted(gtids)
    commit_ts = [env["source"]["ts_ms"] for env in streaming]
    assert commit_ts == sorted(commit_ts)
    snapshot_positions = {position(line.obj) for line in history if line.obj["op"] == "r"}
    assert max(snapshot_positions) < position(streaming[0])

    last_after: dict[tuple[str, int], dict | None] = {}
    last_pos: dict[tuple[str, int], tuple[int, int, int]] = {}
    for line in history:
        env = line.obj
        key = (env["source"]["table"], row_key(env))
        if key in last_pos:
            assert position(env) > last_pos[key], f"{key} has two changes at one position"
            assert env["op"] in {"u", "d"}, f"{key} created twice"
            assert env["before"] == last_after[key], f"{key}: before image is not the previous after image"
        else:
            assert env["op"] in {"c", "r"}, f"{key} changed before it existed"
        assert last_after.get(key, {}) is not None, f"{key} changed after its delete"
        last_pos[key] = position(env)
        last_after[key] = env["after"]


def test_end_markers_match_events(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    result, topics = workload
    by_tx: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for line in distinct_changes(topics):
        if line.obj["transaction"] is not None:
            by_tx[line.obj["transaction"]["id"]].append(line.obj)
    begun: set[str] = set()
    ended: dict[str, dict[str, Any]] = {}
    for line in topics[MARKER_TOPIC]:
        marker = line.obj
        if marker["status"] == "BEGIN":
            assert marker["id"] not in begun
            begun.add(marker["id"])
        else:
            assert marker["id"] in begun and marker["id"] not in ended, "END follows its BEGIN once"
            ended[marker["id"]] = marker
    assert set(ended) == begun == set(by_tx)
    assert len(ended) == result.transactions
    for tx_id, marker in ended.items():
        events = sorted(by_tx[tx_id], key=position)
        assert marker["event_count"] == len(events)
        assert [e["transaction"]["total_order"] for e in events] == list(range(1, len(events) + 1))
        per_table = Counter(f"payments.{e['source']['table']}" for e in events)
        assert {dc["data_collection"]: dc["event_count"] for dc in marker["data_collections"]} == per_table
        assert len(marker["data_collections"]) == len(per_table)
        seen: Counter[str] = Counter()
        for e in events:
            seen[e["source"]["table"]] += 1
            assert e["transaction"]["data_collection_order"] == seen[e["source"]["table"]]
            assert e["source"]["ts_ms"] == marker["ts_ms"]
            assert 10 <= e["ts_ms"] - e["source"]["ts_ms"] <= 500


def test_multi_table_transactions(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    result, topics = workload
    two_table = [
        line.obj for line in topics[MARKER_TOPIC] if line.obj["status"] == "END" and len(line.obj["data_collections"]) >= 2
    ]
    assert two_table
    assert len(two_table) >= result.transactions // 10, "a good fraction of transactions span two tables"
    collections = {tuple(dc["data_collection"] for dc in m["data_collections"]) for m in two_table}
    assert ("payments.charges", "payments.refunds") in collections


def test_schema_wrapped_customers_files(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    _, topics = workload
    wrapped_files: dict[tuple[str, int], list[Line]] = defaultdict(list)
    for topic, lines in topics.items():
        for line in lines:
            wrapped_files[(topic, line.file_index)].append(line)
    wrapped = [line for lines in topics.values() for line in lines if line.schema is not None]
    assert wrapped, "at least one customers file uses schemas.enable=true"
    for (topic, _index), lines in wrapped_files.items():
        parsed = [line for line in lines if line.kind == "change"]
        if any(line.schema is not None for line in parsed):
            assert topic == "payments.payments.customers"
            assert all(line.schema is not None for line in parsed), "a converter setting applies per file"
    for line in wrapped:
        schema = line.schema
        assert schema["type"] == "struct" and schema["optional"] is False
        assert schema["name"] == "payments.payments.customers.Envelope"
        fields = {f["field"]: f for f in schema["fields"]}
        assert list(fields) == ENVELOPE_KEYS
        assert fields["op"]["type"] == "string" and fields["ts_ms"]["type"] == "int64"
        for image in ("before", "after"):
            struct = fields[image]
            assert struct["type"] == "struct" and struct["optional"] is True
            assert struct["name"] == "payments.payments.customers.Value"
            assert {f["field"]: f["type"] for f in struct["fields"]} == {
                "id": "int32", "name": "string", "email": "string", "country": "string", "created_at": "int64",
            }
            assert not any(f["optional"] for f in struct["fields"])
        source_fields = {f["field"]: f for f in fields["source"]["fields"]}
        assert list(source_fields) == SOURCE_KEYS
        assert source_fields["pos"]["type"] == "int64" and source_fields["row"]["type"] == "int32"
        assert source_fields["gtid"]["optional"] is True and source_fields["file"]["optional"] is False
        tx_fields = {f["field"]: f["type"] for f in fields["transaction"]["fields"]}
        assert tx_fields == {"id": "string", "total_order": "int64", "data_collection_order": "int64"}
        env = line.obj
        assert list(env) == ENVELOPE_KEYS and env["source"]["table"] == "customers"
        for image in (env["before"], env["after"]):
            if image is not None:
                assert list(image) == [f["field"] for f in fields["after"]["fields"]]


def test_injected_faults(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    _, topics = workload
    late_found = False
    for topic in TOPICS:
        lines = topics.get(topic, [])
        # Tombstones: exactly the line after each delete.
        for i, line in enumerate(lines):
            if line.kind == "change" and line.obj["op"] == "d":
                assert lines[i + 1].kind == "tombstone"
            if line.kind == "tombstone":
                assert lines[i - 1].kind == "change" and lines[i - 1].obj["op"] == "d"
        # Duplicates: later in the same topic, identical but for the envelope ts_ms.
        first: dict[str, Line] = {}
        for line in lines:
            if line.kind != "change":
                continue
            ident = identity(line.obj)
            if ident in first:
                original = first[ident]
                assert line.seq > original.seq and line.obj["ts_ms"] != original.obj["ts_ms"]
                assert {**line.obj, "ts_ms": 0} == {**original.obj, "ts_ms": 0}
            else:
                first[ident] = line
        # Malformed lines are truncated copies of real lines of the same topic.
        full_texts = [line.text for line in lines if line.kind == "change"]
        for line in lines:
            if line.kind == "malformed":
                assert topic in {"payments.payments.customers", "payments.payments.charges"}
                assert line.text and any(text.startswith(line.text) for text in full_texts)
        # Late arrival: an older update of a key sits in a later file than a newer update of it.
        newest_file: dict[int, list[tuple[tuple[int, int, int], int]]] = defaultdict(list)
        for line in first.values():
            if line.obj["op"] == "u":
                newest_file[row_key(line.obj)].append((position(line.obj), line.file_index))
        for updates in newest_file.values():
            for pos_a, file_a in updates:
                for pos_b, file_b in updates:
                    if pos_a < pos_b and file_a > file_b:
                        late_found = True
    assert late_found


def test_expected_state_matches_replay(workload: tuple[GeneratedWorkload, dict[str, list[Line]]]) -> None:
    result, topics = workload
    replay: dict[str, dict[tuple, dict | None]] = {f"payments.{t}": {} for t in ROW_FIELDS}
    for line in in_history_order(distinct_changes(topics)):
        env = line.obj
        replay[f"payments.{env['source']['table']}"][(row_key(env),)] = env["after"]
    assert result.expected_state == replay
    assert any(v is None for table in replay.values() for v in table.values()), "deletes are part of the history"


def test_refuses_non_empty_landing(tmp_path: Path) -> None:
    generate_workload(tmp_path, transactions=5)
    with pytest.raises(ConfigError, match="already contains files"):
        generate_workload(tmp_path, transactions=5)
    other = tmp_path / "other"
    (other / "landing" / "payments.payments.customers").mkdir(parents=True)
    (other / "landing" / "payments.payments.customers" / "stray.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match="choose an empty out_dir"):
        generate_workload(other)


@pytest.mark.parametrize("kwargs", [{"transactions": 0}, {"transactions": -3}, {"events_per_file": 0}])
def test_rejects_bad_arguments(tmp_path: Path, kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match=">= 1"):
        generate_workload(tmp_path, **kwargs)


def test_tiny_workloads_still_carry_every_guaranteed_fault(tmp_path: Path) -> None:
    for transactions in (1, 2):
        result = generate_workload(tmp_path / str(transactions), transactions=transactions, events_per_file=1)
        topics = read_landing(result.landing_dir)
        kinds = Counter(line.kind for lines in topics.values() for line in lines)
        assert result.duplicate_events >= 1 and result.malformed_lines >= 1
        assert kinds["marker"] == 2 * transactions
        assert result.files == sum(len(lines) for lines in topics.values()), "one line per file"
        assert any(line.schema is not None for line in topics["payments.payments.customers"])


def test_binlog_rotation_keeps_positions_ordered(tmp_path: Path) -> None:
    """After ~5000 transactions the binlog rotates and `pos` restarts; only (file, pos, row) orders changes."""
    result = generate_workload(tmp_path, transactions=5200, seed=5, events_per_file=5000, track_state=False)
    streaming = [
        line.obj for line in in_history_order(distinct_changes(read_landing(result.landing_dir))) if line.obj["op"] != "r"
    ]
    files = [env["source"]["file"] for env in streaming]
    assert files[0] == "mysql-bin.000003" and files[-1] == "mysql-bin.000004"
    first_after_rotation = files.index("mysql-bin.000004")
    assert streaming[first_after_rotation]["source"]["pos"] < streaming[first_after_rotation - 1]["source"]["pos"]
    gtids = [int(GTID_RE.match(env["transaction"]["id"]).group(1)) for env in streaming]
    assert gtids == sorted(gtids)


def test_start_time_moves_the_source_clock_only(tmp_path: Path) -> None:
    from cdc_platform.workload.generate import START_MS, recent_start_ms

    fixed = generate_workload(tmp_path / "a", transactions=30, seed=5)
    moved = generate_workload(tmp_path / "b", transactions=30, seed=5, start_ms=START_MS + 86_400_000)
    first = json.loads((fixed.landing_dir / "payments.transaction" / "part-00000.jsonl").read_text().splitlines()[0])
    shifted = json.loads((moved.landing_dir / "payments.transaction" / "part-00000.jsonl").read_text().splitlines()[0])
    assert shifted["ts_ms"] - first["ts_ms"] == 86_400_000
    assert (fixed.change_events, fixed.markers) == (moved.change_events, moved.markers)
    assert recent_start_ms(1000, 2_000_000) == 2_000_000 - 325_000


def test_append_continues_where_the_files_stop(tmp_path: Path) -> None:
    """An increment adds to the files, never rewrites them, and continues ids, GTIDs, positions and the clock;
    it changes existing rows (updates, deletes) besides adding new ones."""
    base = generate_workload(tmp_path, transactions=400, seed=5, events_per_file=60)
    before = file_tree(base.landing_dir)
    base_changes = distinct_changes(read_landing(base.landing_dir))
    inc = append_workload(tmp_path, transactions=300, seed=5, events_per_file=60, now_ms=START_MS)
    after = file_tree(inc.landing_dir)
    assert {k: after[k] for k in before} == before, "an increment never rewrites a landed file"
    new_files = sorted(set(after) - set(before))
    assert len(new_files) == inc.files and not any(Path(k).name.startswith(".") for k in after), "no temporary file is left"
    for topic in {Path(k).parent.name for k in new_files}:
        old = [int(Path(k).name[5:10]) for k in before if Path(k).parent.name == topic]
        new = [int(Path(k).name[5:10]) for k in new_files if Path(k).parent.name == topic]
        assert min(new) == max(old, default=-1) + 1, topic
    assert inc.transactions == 300 and inc.markers == 600 and inc.config_path.read_text() == CDC_YAML

    seen = {identity(line.obj) for line in base_changes}
    new_changes = [line for line in distinct_changes(read_landing(inc.landing_dir)) if identity(line.obj) not in seen]
    assert len(new_changes) == inc.change_events
    assert min(position(line.obj) for line in new_changes) > max(position(line.obj) for line in base_changes)
    base_gtids = {int(GTID_RE.match(line.obj["transaction"]["id"]).group(1)) for line in base_changes if line.obj["transaction"]}
    new_gtids = {int(GTID_RE.match(line.obj["transaction"]["id"]).group(1)) for line in new_changes}
    assert min(new_gtids) == max(base_gtids) + 1 and len(new_gtids) == 300
    assert min(line.obj["source"]["ts_ms"] for line in new_changes) > max(line.obj["source"]["ts_ms"] for line in base_changes)
    assert all(line.obj["op"] != "r" for line in new_changes), "the snapshot is not repeated"

    base_keys = {(line.obj["source"]["table"], row_key(line.obj)) for line in base_changes}
    touched = Counter((line.obj["op"], (line.obj["source"]["table"], row_key(line.obj)) in base_keys) for line in new_changes)
    assert touched[("u", True)] > 0 and touched[("d", True)] > 0, "updates and deletes of existing rows"
    assert touched[("c", True)] == 0 and touched[("c", False)] > 0, "new rows get new ids"
    for table in ROW_FIELDS:
        old_max = max((k for t, k in base_keys if t == table), default=0)
        created = [row_key(line.obj) for line in new_changes if line.obj["op"] == "c" and line.obj["source"]["table"] == table]
        assert all(k > old_max for k in created), table


def test_each_increment_is_new(tmp_path: Path) -> None:
    """Appending twice with the same seed writes two different increments (the dice depend on where the files stop)."""
    generate_workload(tmp_path, transactions=50, seed=2)
    first = append_workload(tmp_path, transactions=50, seed=2)
    second = append_workload(tmp_path, transactions=50, seed=2)
    topics = read_landing(second.landing_dir)
    assert len([line for line in topics[MARKER_TOPIC] if line.obj["status"] == "END"]) == 150
    assert first.expected_state != second.expected_state


def test_append_needs_a_generated_workload(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nothing to append to"):
        append_workload(tmp_path / "none")
    (tmp_path / "other" / "landing" / "topic").mkdir(parents=True)
    (tmp_path / "other" / "landing" / "topic" / "part-00000.jsonl").write_text('{"a": 1}\nnot json\n')
    with pytest.raises(ConfigError, match="holds no generated workload"):
        append_workload(tmp_path / "other")
    generate_workload(tmp_path / "ok", transactions=5)
    with pytest.raises(ConfigError, match=">= 1"):
        append_workload(tmp_path / "ok", transactions=0)


def test_a_writer_never_overwrites_a_landed_file(tmp_path: Path) -> None:
    import random

    from cdc_platform.workload.generate_files import TopicWriter

    (tmp_path / "part-00003.jsonl").write_text("landed\n")
    writer = TopicWriter(tmp_path, 10, random.Random(1), faults=False, first_file=3)
    writer.add_marker({"status": "BEGIN"})
    with pytest.raises(FileExistsError, match="would overwrite landed input"):
        writer.close()
    assert (tmp_path / "part-00003.jsonl").read_text() == "landed\n"
