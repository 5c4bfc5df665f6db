"""The delta-rs lake: path safety, the exactly-once guard, insert-new dedup (Spark reads: test_lake_spark.py)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from cdc_platform import lake
from cdc_platform.errors import LakeError

SCHEMA = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("day", pa.date32(), nullable=False), pa.field("v", pa.int64())])


def rows(*items: tuple[str, int]) -> pa.Table:
    day = dt.date(2026, 1, 1)
    return pa.table({"id": [i for i, _ in items], "day": [day] * len(items), "v": [v for _, v in items]}, schema=SCHEMA)


@pytest.mark.parametrize("name", ["../x", "a/b", "..", "", "Upper", "a.b", "_hidden"])
def test_table_path_refuses_names_that_could_escape(tmp_path: Path, name: str) -> None:
    with pytest.raises(LakeError):
        lake.table_path(tmp_path, name)


def test_append_once_commits_each_version_once(tmp_path: Path) -> None:
    path = tmp_path / "t"
    lake.ensure_table(path, SCHEMA)
    assert lake.append_once(path, rows(("a", 1)), "q:t", 0)
    assert not lake.append_once(path, rows(("a", 1)), "q:t", 0), "a replayed batch commits nothing"
    assert not lake.append_once(path, rows(("a", 1)), "q:t", -1), "delta-rs would accept a lower version; the guard does not"
    assert lake.append_once(path, rows(("b", 2)), "q:t", 1)
    assert lake.append_once(path, rows(("c", 3)), "other:t", 0), "another application id has its own versions"
    assert lake.open_table(path).to_pyarrow_table().num_rows == 3
    assert lake.open_table(path).transaction_version("q:t") == 1


def test_insert_new_once_skips_known_ids(tmp_path: Path) -> None:
    path = tmp_path / "t"
    lake.ensure_table(path, SCHEMA, ["day"])
    assert lake.insert_new_once(path, rows(("a", 1), ("b", 2)), "id", "day", "q:t", 0) == 2
    assert lake.insert_new_once(path, rows(("b", 9), ("c", 3)), "id", "day", "q:t", 1) == 1
    assert lake.insert_new_once(path, rows(("d", 4)), "id", "day", "q:t", 1) is None, "version 1 is already committed"
    table = lake.open_table(path).to_pyarrow_table().sort_by("id")
    assert table.column("id").to_pylist() == ["a", "b", "c"]
    assert table.column("v").to_pylist() == [1, 2, 3], "the first copy wins"


POSITIONED = pa.schema([*SCHEMA, pa.field("position", pa.string())])


def positioned(*items: tuple[str, str | None]) -> pa.Table:
    day = dt.date(2026, 1, 1)
    n = len(items)
    return pa.table({"id": [i for i, _ in items], "day": [day] * n, "v": [0] * n, "position": [p for _, p in items]}, schema=POSITIONED)


def test_position_bounds_never_let_a_redelivered_id_through(tmp_path: Path) -> None:
    """Bounds prune files by their statistics; an id whose position is a file's min or max is still found."""
    path = tmp_path / "t"
    lake.ensure_table(path, POSITIONED, ["day"])
    long = "9" * 80  # longer than the statistics keep: delta-rs must round the truncated max up
    for version, batch in enumerate([[("a", "0010"), ("b", "0019")], [("c", "0020"), ("d", long)], [("e", None)], [("f", "it's")]]):
        assert lake.insert_new_once(path, positioned(*batch), "id", "day", "q:t", version, range_column="position") == len(batch)
    redelivered = [
        [("b", "0019"), ("g", "0030")],  # the max of the first file, with a new event above it
        [("a", "0010")],  # the min of the first file, alone: the bounds are one value
        [("d", long), ("c", "0020")],  # a truncated statistic
        [("e", None), ("h", "0040")],  # nulls: no bounds at all
        [("f", "it's"), ("i", "0050")],  # a quote, doubled in the bound's literal
    ]
    inserted = [lake.insert_new_once(path, positioned(*b), "id", "day", "q:t", 10 + i, range_column="position") for i, b in enumerate(redelivered)]
    assert inserted == [1, 0, 0, 1, 1]
    ids = lake.open_table(path).to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == ["a", "b", "c", "d", "e", "f", "g", "h", "i"], "every id once"


def test_registry_round_trip(tmp_path: Path, make_config: Any) -> None:
    cfg = make_config({"payments.customers": {"key": ["id"], "mask": ["email"]}})
    lake.write_registry(cfg)
    (tables,) = [lake.registered_tables(cfg.lake)]
    assert tables[0].name == "customers" and tables[0].mask == ("email",)
    (cfg.lake / lake.REGISTRY_FILE).write_text('{"version": 99}')
    with pytest.raises(LakeError, match="newer cdc-platform"):
        lake.read_registry(cfg.lake)
    (cfg.lake / lake.REGISTRY_FILE).write_text("{")
    with pytest.raises(LakeError, match="not valid JSON"):
        lake.read_registry(cfg.lake)


def test_with_retries_gives_up_with_an_actionable_error() -> None:
    from deltalake.exceptions import CommitFailedError

    from cdc_platform.errors import CommitConflictError

    calls = {"n": 0}

    def always_conflicts() -> None:
        calls["n"] += 1
        raise CommitFailedError("conflict")

    with pytest.raises(CommitConflictError, match="only one stream writes this lake"):
        lake.with_retries(always_conflicts, what="test", attempts=3)
    assert calls["n"] == 3

    outcome = iter([CommitFailedError("conflict"), None])

    def conflicts_once() -> str:
        err = next(outcome)
        if err:
            raise err
        return "ok"

    assert lake.with_retries(conflicts_once, what="test") == "ok"


def test_scan_filters_files_that_merge_wrote_as_string_view(tmp_path: Path) -> None:
    """delta-rs MERGE writes string_view parquet columns; a dataset filter on them would raise."""
    path = tmp_path / "t"
    lake.ensure_table(path, SCHEMA, ["day"])
    lake.append_once(path, rows(("a", 1)), "q:t", 0)
    lake.insert_new_once(path, rows(("b", 2), ("c", 3)), "id", "day", "q:t", 1)
    table = lake.open_table(path)
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    assert any(pq.read_schema(f).field("id").type == pa.string_view() for f in table.file_uris()), "the premise still holds"
    with pytest.raises(pa.ArrowNotImplementedError):
        table.to_pyarrow_dataset().to_table(filter=pc.field("id") == "b")
    assert lake.scan(table, ["id", "v"], pc.field("id") == "b").to_pylist() == [{"id": "b", "v": 2}]


def test_kept_handles_follow_the_table_and_notice_a_recreated_one(tmp_path: Path) -> None:
    """open_table keeps a handle per thread; it must never serve a stale or foreign snapshot."""
    import shutil
    import threading

    from deltalake import write_deltalake

    path = tmp_path / "t"
    lake.ensure_table(path, SCHEMA, ["day"])
    first = lake.open_table(path)
    write_deltalake(str(path), rows(("a", 1)), mode="append")  # a writer that does not go through the handle
    assert lake.open_table(path) is first, "the handle is kept"
    assert first.to_pyarrow_table().column("id").to_pylist() == ["a"], "and moved to the latest version"

    shutil.rmtree(path)  # dropped and created again at the same path, with as many commits
    lake.ensure_table(path, SCHEMA, ["day"])
    write_deltalake(str(path), rows(("b", 2)), mode="append")
    again = lake.open_table(path)
    assert again is not first, "a recreated table gets a fresh open"
    assert again.to_pyarrow_table().column("id").to_pylist() == ["b"]

    shutil.rmtree(path)
    with pytest.raises(LakeError, match="is not a Delta table"):
        lake.open_table(path)

    lake.ensure_table(path, SCHEMA, ["day"])
    seen: list[Any] = []
    worker = threading.Thread(target=lambda: seen.append(lake.open_table(path)))
    worker.start()
    worker.join()
    assert seen[0] is not lake.open_table(path), "threads never share a mutable handle"
