"""Outbox events: services' domain events, written to an outbox table in the same transaction as their business
change, landed as one append-only Delta table per aggregate type (`<aggregatetype>_events`), once per event id.

Modules, each importing only the ones before it: `events` (outbox rows of the raw log -> events, in Spark's
functions: fields, canonical payload, table name, dead-letter reasons), `tables` (the event tables' schemas and
the lake's list of them), `landing` (the stage: dedup by event id, id conflicts, the idempotent appends). This
package re-exports what the rest of the platform uses; its modules import each other directly, never through it.
"""

from __future__ import annotations

from cdc_platform.stages.outbox.events import STAGE, safe_name
from cdc_platform.stages.outbox.landing import OutboxStage
from cdc_platform.stages.outbox.tables import event_tables

__all__ = ["STAGE", "OutboxStage", "event_tables", "safe_name"]
