"""Dagster wiring of the outbox consistency check: beside completeness on `transactions`, in the hourly check job,
reading the resource's config and lake (the check's logic: tests/cdc_platform/test_outbox_check.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from dagster import AssetCheckKey, AssetKey, DagsterInstance

from tests.cdc_platform.test_outbox_check import workload

KEY = AssetCheckKey(AssetKey("transactions"), "outbox_consistency")


def test_the_check_sits_beside_completeness_and_names_the_failing_transaction(tmp_path: Path, spark: Any) -> None:
    from cdc_platform.config import load_config
    from cdc_platform.run.ingest import IngestJob
    from dagster_project.checks import CHECK_JOB
    from dagster_project.definitions import build_defs

    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "part-1.jsonl").write_text("\n".join(workload()) + "\n", encoding="utf-8")
    doc = {"landing": "landing", "lake": "lake", "transaction_timeout": 1, "tables": {}}
    (tmp_path / "plain.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    assert KEY not in build_defs(tmp_path / "plain.yaml").resolve_asset_graph().asset_check_keys, "no outbox, no check"

    doc["outbox"] = {"table": "shop.outbox", "expectations": {"order_created": ["shop.orders"]}}
    config = tmp_path / "cdc.yaml"
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    IngestJob(load_config(config)).run_available_now(spark)
    defs = build_defs(config)
    assert KEY in defs.resolve_asset_graph().asset_check_keys
    job = defs.resolve_job_def(CHECK_JOB)
    assert KEY in set(job.asset_layer.asset_graph.asset_check_keys)
    run = job.execute_in_process(instance=DagsterInstance.ephemeral(), raise_on_error=False)
    evaluation = next(e for e in run.get_asset_check_evaluations() if e.check_name == "outbox_consistency")
    assert not evaluation.passed
    assert "transaction t2" in evaluation.description
    assert evaluation.metadata["failing_transactions"].value == [{"transaction_id": "t2", "events": ["e2"], "missing": ["shop.orders"]}]
