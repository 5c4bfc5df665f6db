"""Rows the source no longer has leave the lake only through delete events one step past their row's position, loaded
by the snapshot rules: a key the raw log changed later stays, a key the lake does not hold gets no delete."""

from __future__ import annotations

import json
from typing import Any

from cdc_platform import checks, lake
from cdc_platform.backfill.absent_rows import delete_lines, remove_absent
from cdc_platform.config import load_config

TABLES = {"public.acc": {"key": ["tenant", "id"]}}


def pg(op: str, tenant: str, row_id: int, name: str, **source: Any) -> str:
    image = {"tenant": tenant, "id": row_id, "name": name}
    return json.dumps({"before": None, "after": image, "op": op, "ts_ms": 1767225600500, "transaction": None,
                       "source": {"connector": "postgresql", "name": "pg", "db": "app", "schema": "public", "table": "acc",
                                  "ts_ms": 1767225600000, **source}}, ensure_ascii=False)


def test_absent_rows_are_tombstoned_just_past_their_own_position_by_the_snapshot_rules(lake_at: Any, tmp_path: Any, spark: Any, query: Any) -> None:
    lake_at(tmp_path, TABLES, [
        pg("c", "it's ☃", 1, "streamed", lsn=100, sequence='["90","100"]', snapshot="false"),
        pg("r", "it's ☃", 2, "re-read", sequence='["500","500"]', snapshot="incremental"),  # placed by `sequence` alone
        pg("c", "b", 3, "behind", lsn=200, snapshot="false"),
        pg("u", "b", 3, "newer", lsn=300, snapshot="false"),
    ])
    cfg = load_config(tmp_path / "cdc.yaml")
    table = cfg.tables[0]
    # The latest state falls behind its own raw log for ("b", 3): its row is the create at 200, the raw log has 300.
    (created,) = query(cfg, f"SELECT event_id FROM raw_change_events WHERE position = '{200:020d}'")
    spark.sql(f"UPDATE delta.`{cfg.lake / 'acc'}` SET _position = '{200:020d}', _event_id = '{created['event_id']}' WHERE id = 3")
    keys = [("it's ☃", 1), ("it's ☃", 2), ("b", 3), ("nobody", 9)]
    lines, kept = delete_lines(spark, cfg, table, keys, "repair-1", 1767225700000)
    assert kept == [('{"id":"9","tenant":"nobody"}', "no live row of it in the lake")]
    deletes = {(e["before"]["tenant"], e["before"]["id"]): e for e in (json.loads(line) for line, _ in lines)}
    assert deletes[("it's ☃", 2)]["source"]["lsn"] == 501 and "sequence" not in deletes[("it's ☃", 2)]["source"], "placed by its sequence: 500"
    assert deletes[("it's ☃", 1)]["source"]["lsn"] == 101 and deletes[("it's ☃", 1)]["source"]["cdc_repair"] == "repair-1"
    assert all(e["op"] == "d" and e["after"] is None and e["transaction"] is None for e in deletes.values())

    removal = remove_absent(spark, cfg, table, keys, "repair-1", 1767225700000)
    assert removal.removed == 2
    assert ('{"id":3,"tenant":"b"}', "the raw log holds a newer change of it: the latest state is behind its own log (`cdc rebuild`)") in removal.kept
    live = {(r["tenant"], r["id"]) for r in query(cfg, "SELECT tenant, id FROM acc__full_view")}
    assert live == {("b", 3)}
    raw = query(cfg, "SELECT key, position, op FROM raw_change_events WHERE op = 'd' ORDER BY position")
    assert [(r["position"], r["op"]) for r in raw] == [(f"{101:020d}", "d"), (f"{501:020d}", "d")], "each delete one step past its row"
    stored = lake.open_table(cfg.lake / "acc").to_pyarrow_table(columns=["id", "_deleted", "_position"]).to_pylist()
    assert {(r["id"], r["_position"]) for r in stored if r["_deleted"]} >= {(1, f"{101:020d}"), (2, f"{501:020d}")}
    assert checks.coverage(spark, cfg.lake, table).metadata["missing"] == 0, "the raw log's own fold agrees: the deletes are the last events"
