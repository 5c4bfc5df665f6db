"""The outbox consistency check (`checks/outbox.py`), without Dagster: completed transactions holding outbox events
hold the business changes `outbox.expectations` names, and the ones that do not are named."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdc_platform.checks.outbox import outbox_consistency
from tests.cdc_platform.test_outbox import T0, change, outbox_row


def marker(status: str, tx: str, pos: int, counts: dict[str, int] | None = None) -> str:
    return json.dumps({"status": status, "id": tx, "ts_ms": T0 + pos, "event_count": None if counts is None else sum(counts.values()),
                       "data_collections": None if counts is None else [{"data_collection": k, "event_count": v} for k, v in counts.items()]})


def transaction(tx: str, pos: int, business: list[tuple[str, str, dict[str, Any]]], event_id: str, type_: str) -> list[str]:
    """A service's transaction: its business changes, its outbox insert, and the outbox row deleted right after."""
    lines = [marker("BEGIN", tx, pos)]
    order = 0
    for table, op, row in business:
        order += 1
        lines.append(change(table, op, pos + order, row, tx=tx, order=order))
    ob = outbox_row(event_id, "Order", "1", type_, {"e": event_id})
    lines.append(change("outbox", "c", pos + order + 1, ob, tx=tx, order=order + 1))
    lines.append(change("outbox", "d", pos + order + 2, ob, tx=tx, order=order + 2))
    counts: dict[str, int] = {}
    for table, _op, _row in business:
        counts[f"shop.{table}"] = counts.get(f"shop.{table}", 0) + 1
    counts["shop.outbox"] = 2
    lines.append(marker("END", tx, pos + order + 3, counts))
    return lines


def workload() -> list[str]:
    return [
        *transaction("t1", 100, [("orders", "c", {"id": 1})], "e1", "order_created"),
        *transaction("t2", 200, [("customers", "u", {"id": 5})], "e2", "order_created"),  # announces an order it never made
        *transaction("t3", 300, [], "e3", "order_noted"),  # a type without expectations: not judged
        *transaction("t4", 400, [("orders", "u", {"id": 1})], "e4", "order_shipped"),
        # Later transactions move every stream's event time on, so the ones above are judged complete.
        *transaction("t9", 10_000, [("orders", "c", {"id": 9}), ("customers", "c", {"id": 9})], "e9", "order_created"),
    ]


def test_every_transaction_with_outbox_events_holds_the_expected_changes(make_config, land, run_pipeline, spark) -> None:
    cfg = make_config(transaction_timeout=1, outbox={"table": "shop.outbox", "expectations": {
        "order_created": ["shop.orders"], "order_shipped": {"shop.orders": ["u"]}}})
    land(None, [line for line in workload() if '"t2"' not in line])
    run_pipeline(cfg)
    outcome = outbox_consistency(spark, cfg)
    assert outcome.passed, outcome.description
    assert outcome.metadata["transactions_checked"] == 3  # t1, t4, t9 (t3's type has no expectation)


def test_a_transaction_lacking_its_business_change_fails_the_check_by_name(make_config, land, run_pipeline, spark) -> None:
    cfg = make_config(transaction_timeout=1, outbox={"table": "shop.outbox", "expectations": {
        "order_created": ["shop.orders"], "order_shipped": {"shop.orders": ["c"]}}})  # a shipment that must create: t4 fails too
    land(None, workload())
    run_pipeline(cfg)
    outcome = outbox_consistency(spark, cfg)
    assert not outcome.passed
    assert "transaction t2" in outcome.description and "e2" in outcome.description and "shop.orders" in outcome.description
    failing = outcome.metadata["failing_transactions"]
    assert failing == [{"transaction_id": "t2", "events": ["e2"], "missing": ["shop.orders"]},
                       {"transaction_id": "t4", "events": ["e4"], "missing": ["shop.orders (c)"]}]
    assert outcome.metadata["transactions_checked"] == 4 and outcome.metadata["transactions_lacking_changes"] == 2


@pytest.mark.parametrize("outbox", [{"topics": ["outbox.event.order"]}, {"table": "shop.outbox"}])
def test_without_an_outbox_table_or_expectations_there_is_nothing_to_judge(outbox, make_config, spark, tmp_path) -> None:
    kafka = {"source": {"kind": "kafka", "bootstrap_servers": "127.0.0.1:9", "topics": ["outbox.event.order"]}} if "topics" in outbox else {}
    cfg = make_config(outbox=outbox, **kafka)
    outcome = outbox_consistency(spark, cfg)
    assert outcome.passed and outcome.severity.value == "WARN"
    assert ("outbox.table" in outcome.description) if "topics" in outbox else ("outbox.expectations" in outcome.description)
