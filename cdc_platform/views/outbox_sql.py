"""The outbox event tables' views, pure text: `<aggregatetype>_events__latest_view`, each aggregate's latest event.

Latest means last in source order, as the stage keeps it (`stages/outbox/`): source position, then the
transaction's order (events of one transaction may share a PostgreSQL position), then arrival. The routed
input's position is its Kafka partition and offset, and the Event Router keys every record by its aggregate
id, so one aggregate's events are in one partition and that order is theirs too.
"""

from __future__ import annotations

from collections.abc import Sequence

from cdc_platform.lake import quote_identifier as q

LATEST_SUFFIX = "__latest_view"
#: The order of one aggregate's events, newest first.
NEWEST_FIRST = "source_position DESC NULLS LAST, source_order DESC NULLS LAST, ingested_at DESC, arrival DESC NULLS LAST, event_id DESC"


def latest_view_name(table: str) -> str:
    return f"{table}{LATEST_SUFFIX}"


def latest_event_sql(relation: str, columns: Sequence[str]) -> str:
    """Each aggregate's newest event of the event table `relation` (an identifier or path relation), with its columns."""
    cols = ", ".join(q(c) for c in columns)
    return (f"SELECT {cols} FROM (SELECT {cols}, row_number() OVER (PARTITION BY `aggregate_id` ORDER BY {NEWEST_FIRST}) AS `__rank` "
            f"FROM {relation}) WHERE `__rank` = 1")
