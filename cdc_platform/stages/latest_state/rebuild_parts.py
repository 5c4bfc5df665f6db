"""The per-event work of `cdc rebuild` (and onboarding), run on Spark's executors in two passes.

Why two passes. A rebuild gives each column the type its newest events carry, over the table's whole
history, and folds every key to its last change. The first is a decision over all events; the second
needs all of one key's events together. So, over one pinned version of the raw log:

1. `votes_pass` (`mapInArrow`, any partitioning): summarises what the values say about the column types
   (`rows.type_votes`), one row per partition; the driver merges those (small: a few entries per
   column) and decides the types (`decide_types`).
2. `keys_pass` (`mapInArrow`, narrow) fills the keys of events that landed before the table was
   configured and finds each key change's old key; then `bucket_pass` (`groupBy(bucket).applyInArrow`)
   types every bucket with the decided types and folds it by the stage's own code (`change_rows`, the
   unavailable-value fill, `type_rows`, `last_per_key`, `build_rows`). A key change's event goes to the
   bucket of its new key and, when it hashes elsewhere, to its old key's too, each copy owning the rows
   of its key (`NEW`/`OLD`), so a key's rows never leave its bucket.

Events are ordered by first arrival (`ARRIVAL_COLUMNS`, as the stream's batches met them): the votes
compare those columns' values, a bucket sorts its events by them. A bucket's results (latest-state rows,
history rows, dead letters) leave it as Arrow parts (`arrow_parts`) in one fixed schema (`PARTS`) and are
decoded on the executors into the Delta writes; the driver sees counts. A bucket holds about
`rebuild.BUCKET_EVENTS` events, whatever the table's past.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from cdc_platform.parse import envelope
from cdc_platform.stages import unavailable
from cdc_platform.lake.arrow_parts import BUCKET_PARTS, part_row, part_rows
from cdc_platform.config import TableConfig
from cdc_platform.stages.latest_state.layout import BASE, LAYER
from cdc_platform.stages.latest_state.rows import Events, build_rows, change_rows, dead_rows, fill_keys, last_per_key, moved_from, type_rows, type_votes
from cdc_platform.stages.latest_state.type_votes import TableVotes, merge_votes
from cdc_platform.stages.stage import dead_letter_rows

#: Columns the passes add: an event's old key (a key change), a partition's type summary, an event's
#: bucket, and which of its rows a copy owns.
OLD_KEY, VOTES, EVENTS, BUCKET, NEW, OLD = "_old_key", "_votes", "_events", "bucket", "_new", "_old"
STATE, HISTORY, DEAD, COUNT = "state", "history", "dead", "count"
#: First-arrival order: the raw log keeps each event's first copy, so ties at one position fold as the stream did.
ARRIVAL_COLUMNS = ("ingested_at", "kafka_topic", "kafka_partition", "kafka_offset", "event_id")

PARTS = BUCKET_PARTS

#: The raw-log columns the passes read (the original `line` is not among them: the widest column, and
#: the fold never reads it; dead letters get theirs back by event id).
COLUMNS = ("event_id", "table_id", "op", "key", "before", "after", "row_schema", "position", "source_ts",
           "transaction_id", "tx_total_order", "ingested_at", "source_file", "kafka_topic", "kafka_partition", "kafka_offset")


def arrival_keys(raw: pa.Table) -> list[tuple[Any, ...]]:
    """Each event's place in first-arrival order, comparable across partitions (a missing value sorts last)."""
    columns = [raw.column(c).to_pylist() for c in ARRIVAL_COLUMNS]
    return [tuple((1, 0) if v is None else (0, v) for v in values) for values in zip(*columns)]


def in_arrival_order(raw: pa.Table) -> pa.Table:
    return raw.take(pc.sort_indices(raw, sort_keys=[(c, "ascending", "at_end") for c in ARRIVAL_COLUMNS]))


def votes_pass(table: TableConfig) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Pass 1 (module doc): a partition's events -> one row holding their type votes (`VOTES`, pickled)
    and how many they were (`EVENTS`)."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        found: list[TableVotes] = []
        count = 0
        for batch in batches:
            if batch.num_rows == 0:
                continue
            raw = pa.Table.from_batches([batch])
            count += raw.num_rows
            events = Events(fill_keys(raw, table.key))
            rows, _ = change_rows(events, table.key)
            unavailable.strip_placeholders(rows, events)
            found.append(type_votes(rows, events, table, arrival_keys(raw)))
        if found:
            yield pa.RecordBatch.from_pydict({VOTES: pa.array([pickle.dumps(merge_votes(found), protocol=pickle.HIGHEST_PROTOCOL)], pa.binary()),
                                              EVENTS: pa.array([count], pa.int64())})

    return run


def old_keys(raw: pa.Table, key_columns: Sequence[str]) -> list[str | None]:
    """The key an update moved its row away from (its `before` image's key, when that differs), as
    `change_rows` finds it for the old key's tombstone; None for every other event."""
    out: list[str | None] = [None] * raw.num_rows
    ops, keys, befores = (raw.column(c).to_pylist() for c in ("op", "key", "before"))
    for i, (op, key, before) in enumerate(zip(ops, keys, befores)):
        if op != "u" or key is None or before is None:
            continue
        try:
            out[i] = moved_from(envelope.loads_json(before), key, key_columns)
        except ValueError:
            continue  # the stage dead-letters the event; it has no old key to tombstone
    return out


def keys_pass(table: TableConfig) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """Before the shuffle: each event with its key filled (`fill_keys`) and its old key when it changes the key."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            raw = fill_keys(pa.Table.from_batches([batch]), table.key)
            yield from raw.append_column(OLD_KEY, pa.array(old_keys(raw, table.key), pa.string())).to_batches()

    return run


def read_votes(payloads: list[bytes]) -> TableVotes:
    return merge_votes(pickle.loads(p) for p in payloads)


def bucket_pass(table: TableConfig, decided: Mapping[str, pa.DataType]) -> Callable[[tuple[pa.Scalar, ...], pa.Table], pa.Table]:
    """Pass 2 (module doc): one bucket's events -> its `PARTS`."""

    def run(key: tuple[pa.Scalar, ...], rows: pa.Table) -> pa.Table:
        return pa.Table.from_pylist(fold_bucket(table, decided, key[0].as_py(), rows), schema=PARTS)

    return run


def fold_bucket(table: TableConfig, decided: Mapping[str, pa.DataType], bucket: int, rows: pa.Table) -> list[dict[str, Any]]:
    """Type and fold one bucket's events the way the stage does, with the types decided over the history."""
    raw = in_arrival_order(rows)
    raw = raw.append_column("line", pa.nulls(raw.num_rows, pa.string()))
    events = Events(raw)
    new, old = events.col(NEW), events.col(OLD)
    changes, bad = change_rows(events, table.key)
    typed, _, _ = unavailable.resolve_batch(changes, events, lambda: type_rows(changes, events, {}, table, decided=decided), table.key, None)
    for e, code, reason in bad:
        typed.dead.setdefault(e, (code, reason))

    def owned(i: int) -> bool:
        r = changes[i]
        return bool(old[r.event]) if r.sub == 0 else bool(new[r.event])

    live = [i for i, r in enumerate(changes) if r.event not in typed.dead and owned(i)]
    winners = [live[i] for i in last_per_key([changes[i] for i in live], events)]
    markers = [i for i in live if changes[i].key is None]
    state = build_rows(typed, events, sorted(winners + markers), table.key, seq=0)
    state = state.set_column(state.schema.get_field_index(LAYER), LAYER, pa.array([BASE] * state.num_rows, pa.string()))
    out = part_rows(bucket, STATE, state)
    history_rows = 0
    if table.history:
        # `_batch_order` is the row's place in the bucket (first arrival, a key change's tombstone first), as in
        # a stream's batch: the views compare it within a key and position only
        history = build_rows(typed, events, live, table.key, seq=0, history=True)
        history_rows = history.num_rows
        out += part_rows(bucket, HISTORY, history)
    dead = {e: why for e, why in typed.dead.items() if new[e]}  # once, by the copy in the event's own bucket
    if dead:
        out += part_rows(bucket, DEAD, dead_letter_rows(dead_rows(events, dead), stage="rebuild", batch_id=None))
    info = {"state": state.num_rows, "markers": len(markers), "history": history_rows, "dead": len(dead)}
    out.append(part_row(bucket, COUNT, info=info))
    return out
