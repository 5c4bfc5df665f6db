"""Outbox consistency: every completed transaction holding outbox events also holds the business changes its
events' types say it should (`outbox.expectations`: an `order_created` with a change of `public.orders`).

Why it can be checked at all: a service writes its outbox row in the same database transaction as its
business change, and the transaction stage already groups a transaction's events, outbox row included, into
one `transactions` row once it is complete. An event whose transaction lacks the change is a service that
published something it did not do (or did elsewhere): the check names those transactions.

Only the outbox table's own change events carry a transaction; the Event Router's routed records do not
(the router drops Debezium's envelope), so this check reads the outbox table's events, whichever input
feeds the event tables. A failed check is data, never an exception (`checks` module doc).
"""

from __future__ import annotations

from typing import Any

from cdc_platform.checks import SAMPLE, CheckOutcome, Severity
from cdc_platform.config import PlatformConfig
from cdc_platform import lake

EVENT_OPS = ("c", "r")


def outbox_consistency(spark: Any, config: PlatformConfig) -> CheckOutcome:
    """Judge every completed transaction that holds outbox inserts of an expected type (module doc)."""
    from pyspark.sql import functions as F

    from cdc_platform.views import register_tables

    outbox = config.outbox
    meta: dict[str, Any] = {}
    if outbox is None or outbox.table is None:
        return CheckOutcome(True, Severity.WARN, "no outbox table is configured (`outbox.table`): only its change events carry the "
                                                 "transaction the check needs", meta)
    if not outbox.expectations:
        return CheckOutcome(True, Severity.WARN, "no `outbox.expectations` are configured: nothing to check", meta)
    if "transactions" not in lake.lake_tables(config.lake):
        return CheckOutcome(True, Severity.ERROR, "no completed transaction yet", meta)
    register_tables(spark, config.lake, ("transactions",))
    cols = outbox.columns
    changes = (spark.table("transactions").select("transaction_id", F.explode("events").alias("e"))
               .select("transaction_id", F.col("e.table_id").alias("table_id"), F.col("e.op").alias("op"), F.col("e.after").alias("after")))
    image = F.from_json(F.col("after"), "map<string,string>")
    events = (changes.where((F.col("table_id") == outbox.table) & F.col("op").isin(*EVENT_OPS))
              .select("transaction_id", image.getItem(cols.id).alias("event_id"), image.getItem(cols.type).alias("event_type")))
    rules = [(event_type, table_id, list(ops)) for event_type, required in outbox.expectations for table_id, ops in required]
    expected = spark.createDataFrame(rules, "event_type string, table_id string, ops array<string>")
    needs = events.join(F.broadcast(expected), "event_type")
    seen = changes.groupBy("transaction_id", "table_id").agg(F.collect_set("op").alias("seen_ops"))
    judged = needs.join(seen, ["transaction_id", "table_id"], "left").withColumn(
        "met", F.col("seen_ops").isNotNull() & ((F.size("ops") == 0) | F.arrays_overlap("ops", F.coalesce("seen_ops", F.array().cast("array<string>")))))
    per_tx = judged.groupBy("transaction_id").agg(
        F.min(F.col("met").cast("int")).alias("ok"),
        F.collect_set(F.when(~F.col("met"), F.col("event_id"))).alias("events"),
        F.collect_set(F.when(~F.col("met"), F.concat(F.col("table_id"), F.when(F.size("ops") > 0, F.concat(F.lit(" ("), F.array_join("ops", "/"), F.lit(")")))
                                                     .otherwise(F.lit(""))))).alias("missing"),
    ).cache()
    try:
        totals = per_tx.agg(F.count(F.lit(1)).alias("checked"), F.count_if(F.col("ok") == 0).alias("bad")).first()
        checked, n_bad = int(totals["checked"]), int(totals["bad"] or 0)
        bad = ([r.asDict() for r in per_tx.where("ok = 0").select("transaction_id", "events", "missing").orderBy("transaction_id").limit(SAMPLE).collect()]
               if n_bad else [])
    finally:
        per_tx.unpersist()
    meta |= {"transactions_checked": checked, "transactions_lacking_changes": n_bad,
             "expectations": {event_type: [t for t, _ in required] for event_type, required in outbox.expectations}}
    if n_bad:
        meta["failing_transactions"] = [
            {"transaction_id": r["transaction_id"], "events": sorted(r["events"]), "missing": sorted(r["missing"])} for r in bad]
        first = bad[0]
        return CheckOutcome(False, Severity.ERROR,
                            f"{n_bad:,} of {checked:,} completed transaction(s) hold outbox events without the business changes they announce "
                            f"(e.g. transaction {first['transaction_id']}: event(s) {', '.join(sorted(first['events']))} without a change of "
                            f"{', '.join(sorted(first['missing']))})", meta)
    return CheckOutcome(True, Severity.ERROR, f"all {checked:,} completed transactions with expected outbox events hold their business changes", meta)
