"""The sample workload end to end: after `cdc run`, every full view equals the state the generator says
the source database ended in (duplicates, a late event, deletes, snapshot reads, the schema wrapper)."""

from __future__ import annotations

from typing import Any

from cdc_platform.config import load_config
from cdc_platform.workload.generate import generate_workload


def test_full_views_equal_the_generators_expected_state(tmp_path, run_pipeline, query) -> None:
    workload = generate_workload(tmp_path / "w", transactions=150, seed=11, events_per_file=40)
    cfg = load_config(workload.config_path)
    run_pipeline(cfg)
    for table in cfg.tables:
        expected = {key[0]: row for key, row in workload.expected_state[table.source].items() if row is not None}
        rows = query(cfg, f"SELECT * FROM {table.name}__full_view")
        got: dict[Any, dict[str, Any]] = {r["id"]: {k: v for k, v in r.items() if not k.startswith("_")} for r in rows}
        assert got == expected, table.name
        deleted = {key[0] for key, row in workload.expected_state[table.source].items() if row is None}
        tombs = {r["id"] for r in query(cfg, f"SELECT id FROM {table.name} WHERE _deleted")}
        assert deleted <= tombs, table.name
    types = {r["col_name"]: r["data_type"] for r in query(cfg, "DESCRIBE customers__full_view")}
    assert types["id"] == "int"  # customers carry the Connect schema: exact int32, not an inferred bigint
