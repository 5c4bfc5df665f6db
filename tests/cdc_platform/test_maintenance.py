"""`cdc maintain`: folding, tombstone purge by retention, small-file compaction, vacuum; and the stream's
own compaction threshold. The state seen through the views never changes because of maintenance.
"""

from __future__ import annotations

import datetime as dt

import pyarrow.compute as pc

from cdc_platform import lake
from cdc_platform.lake import lake_spark
from cdc_platform.cli import main
from cdc_platform.stages.latest_state import BASE, DELTA, LAYER, LatestStateStage, purge_tombstones
from cdc_platform.maintenance import maintain
from tests.cdc_platform.test_latest_state import Feed, c, d, state, truncate, u
from tests.cdc_platform.test_spark_jobs import tagged_jobs

ORDERS = {"shop.orders": {"key": ["id"], "tombstone_retention": "1 hours"}}


def layers(cfg) -> dict[str, int]:  # type: ignore[no-untyped-def]
    table = lake.open_table(lake.table_path(cfg.lake, "orders")).to_pyarrow_table(columns=[LAYER])
    col = table.column(LAYER).cast("string")
    return {BASE: int(pc.sum(pc.equal(col, BASE)).as_py() or 0), DELTA: int(pc.sum(pc.equal(col, DELTA)).as_py() or 0)}


def test_cdc_maintain_folds_compacts_vacuums_and_keeps_the_state(make_config, query, capsys, spark) -> None:
    cfg = make_config(ORDERS)
    feed = Feed(cfg)
    for i in range(3):  # three batches of small files (each batch a Spark run: more add nothing to what is checked)
        feed([c(10 + i, 100 + i, amount=i), u(1, 200 + i, amount=i)])
    feed([d(10, 300)])
    before = state(query, cfg)
    assert layers(cfg)[DELTA] > 0
    raw = lake.table_path(cfg.lake, "raw_change_events")
    files = lake_spark.file_count(spark, raw)
    labelled = tagged_jobs(spark, "maintain")
    assert main(["maintain", "--lake", str(cfg.lake), "--vacuum-hours", "0"]) == 0
    assert tagged_jobs(spark, "maintain") - labelled, "the tables' jobs are named in the Spark UI"
    out = capsys.readouterr().out
    assert "orders: folded 7 pending changes into the base" in out  # 3 creates, 3 updates of key 1, the delete
    assert "raw_change_events: compacted" in out and "vacuumed" in out
    assert layers(cfg) == {BASE: 4, DELTA: 0}  # 3 + key 1, the delete kept as a tombstone
    assert lake_spark.file_count(spark, raw) < files
    operations = [h["operation"] for h in lake_spark.history(spark, raw, 3)]
    assert operations == ["VACUUM END", "VACUUM START", "OPTIMIZE"], "delta-spark compacted and vacuumed"
    assert state(query, cfg) == before
    feed([u(10, 250, amount=99)])  # stale change after the delete: the base tombstone still holds
    assert state(query, cfg) == before


def test_expired_tombstones_are_purged_and_live_rows_kept(make_config, query, spark) -> None:
    cfg = make_config(ORDERS)
    feed = Feed(cfg)
    feed([c(1, 100), c(2, 100), c(3, 100)])
    feed([d(1, 200), truncate(150)])  # the truncate tombstones 2 and 3 too (their position is lower)
    feed([c(4, 400)])
    reports = maintain(spark, cfg.lake, vacuum_hours=168)
    assert [r.name for r in reports] == list(lake.lake_tables(cfg.lake))  # the lake's order, though maintained side by side
    assert {r.name: r.purged for r in reports}["orders"] == 0  # younger than the retention
    later = dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=2)
    assert purge_tombstones(lake.table_path(cfg.lake, "orders"), cfg.tables[0], now=later) == 4  # 3 tombstones + the marker
    assert [r["id"] for r in state(query, cfg)] == [4]
    assert query(cfg, "SELECT count(*) AS n FROM orders WHERE _deleted")[0]["n"] == 0


def test_stream_compacts_on_its_own_past_the_threshold(make_config, query) -> None:
    cfg = make_config(ORDERS)
    feed = Feed(cfg, stage=LatestStateStage(compact_min_changes=3, compact_ratio=0.5))
    first = feed([c(1, 1), c(2, 2)])
    assert layers(cfg) == {BASE: 0, DELTA: 2}
    second = feed([c(3, 3), u(1, 4, amount=1)])
    assert layers(cfg) == {BASE: 3, DELTA: 0}
    assert first.rows_landed["orders"] == 2 and second.rows_landed["orders"] == 2
    feed([c(4, 5)])
    assert layers(cfg) == {BASE: 3, DELTA: 1}  # 1 < max(3, 0.5 x 3)
    assert [r["id"] for r in state(query, cfg)] == [1, 2, 3, 4]
    metrics = query(cfg, "SELECT stage_figures['latest_state.compacted'] AS folded FROM stage_progress WHERE query = 'latest_state' ORDER BY batch_id")
    assert [m["folded"] for m in metrics] == [0.0, 4.0, 0.0]


def test_maintain_needs_a_lake(capsys, monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("CDC_CONFIG", raising=False)
    assert main(["maintain"]) == 2
    assert "pass --lake DIR" in capsys.readouterr().err
    assert main(["maintain", "--lake", str(tmp_path / "missing")]) == 2


def test_maintain_with_table_touches_those_tables_and_a_wrong_name_touches_none(make_config, spark, capsys) -> None:  # type: ignore[no-untyped-def]
    """`--table NAME` (repeatable) maintains those tables alone; a name the lake lacks is one line naming the
    lake's tables, said before any table (or Spark) is touched."""
    cfg = make_config(ORDERS)
    feed = Feed(cfg)
    feed([c(1, 100), u(1, 200, amount=1)])
    feed([u(1, 300, amount=2)])
    names = list(lake.lake_tables(cfg.lake))

    def versions() -> dict[str, int]:
        return {n: lake.open_table(lake.table_path(cfg.lake, n)).version() for n in names}

    before = versions()
    capsys.readouterr()
    assert main(["maintain", "--lake", str(cfg.lake), "--table", "nope", "--table", "orders"]) == 2
    err = capsys.readouterr().err
    assert "has no table named nope; its tables: " in err and "raw_change_events" in err
    assert versions() == before

    chosen = {"orders", "raw_change_events"}
    assert main(["maintain", "--lake", str(cfg.lake), "--table", "orders", "--table", "raw_change_events", "--vacuum-hours", "0"]) == 0
    out = capsys.readouterr().out
    assert {line.split(":")[0] for line in out.splitlines() if ":" in line and not line.startswith("[")} == chosen
    after = versions()
    assert {n for n in names if after[n] != before[n]} == chosen
    for name in chosen:
        assert lake_spark.history(spark, lake.table_path(cfg.lake, name), 1)[0]["operation"] == "VACUUM END"


def test_compaction_is_redone_on_a_conflict_and_a_lasting_one_says_to_rerun_cdc_maintain(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """OPTIMIZE racing the stream loses to its commits like any writer: redone, and when it never wins, one line."""
    import pytest
    from delta.exceptions import base

    from cdc_platform import errors, maintenance
    from cdc_platform.errors import CommitConflictError

    monkeypatch.setattr(errors.time, "sleep", lambda _s: None)
    calls: list[int] = []

    def optimize(spark, path):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) < 3:
            raise base.ConcurrentAppendException(message="files were added by a concurrent update")
        return {}

    monkeypatch.setattr(lake_spark, "optimize", optimize)
    maintenance._optimize(None, tmp_path / "orders", "orders")
    assert len(calls) == 3

    def never(spark, path):  # type: ignore[no-untyped-def]
        raise base.ConcurrentAppendException(message="files were added by a concurrent update")

    monkeypatch.setattr(lake_spark, "optimize", never)
    with pytest.raises(CommitConflictError, match=r"compacting the files of orders: .* after 8 attempts .*; rerun `cdc maintain`"):
        maintenance._optimize(None, tmp_path / "orders", "orders")


def test_a_table_that_fails_leaves_the_others_maintained_and_its_error_is_raised(make_config, spark, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The tables are maintained side by side: one failing neither stops nor hides the others, and its error is raised."""
    import pytest

    from cdc_platform import maintenance
    from cdc_platform.errors import LakeError

    cfg = make_config(ORDERS)
    feed = Feed(cfg)
    feed([c(1, 100), u(1, 200, amount=1)])
    real = maintenance._optimize

    def optimize(spark, path, name):  # type: ignore[no-untyped-def]
        if name in ("orders", "raw_change_events"):
            raise LakeError(f"{name} refused")
        return real(spark, path, name)

    monkeypatch.setattr(maintenance, "_optimize", optimize)
    said: list[str] = []
    names = list(lake.lake_tables(cfg.lake))
    with pytest.raises(LakeError, match=f"^{min(('orders', 'raw_change_events'), key=names.index)} refused$"):
        maintain(spark, cfg.lake, tables=cfg.tables, vacuum_hours=168, progress=said.append)
    assert sorted(line.split(":")[0] for line in said) == sorted(names), "every table's outcome is said"
    assert {line for line in said if "failed" in line} == {"orders: failed: orders refused", "raw_change_events: failed: raw_change_events refused"}
    others = [n for n in names if n not in ("orders", "raw_change_events")]
    assert others and all(lake_spark.history(spark, lake.table_path(cfg.lake, n), 1)[0]["operation"] == "VACUUM END" for n in others)
