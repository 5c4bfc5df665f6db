"""The latest-state stage's per-event work, run on Spark's executors, one source table per task.

Why this shape. Typing a batch is a decision over all of one table's events in it (a new column takes
the newest declared type, an inferred integer may fit a narrower stored column, a placeholder takes the
key's previous value), so the batch is grouped by table (`groupBy("table_id").applyInArrow`) and each
group runs the same code the driver ran before the move (`apply.prepare_table`: change rows, typing,
the last change per key, the unavailable-value fill). Tables are spread over the executors; no event
reaches the driver.

A group's output rows have one fixed Spark schema (`STAGED`), whatever the table's columns are: each
row is one part of the table's result, its rows encoded as an Arrow IPC stream in `payload`:

* `plan`: the table's schema after this batch (`payload`: the Arrow schema), whether a column widened
  (a rewrite first), the history's schema, and the batch's figures (`info`, JSON). Small: the driver
  collects these, and only these.
* `state`, `history`: the rows to append to `<name>` and `<name>_history`, in chunks. They stay on the
  executors (the staged frame is persisted for the batch); the driver decodes them per table with
  `arrow_parts.decoder`, in `mapInArrow`, straight into the Delta write.
* `dead`: dead-letter rows (`DEAD_LETTER`), the stage's own and the poison events', likewise.
* `need`: the typed keys whose unavailable-value placeholder nothing in the batch resolves. The driver
  reads their stored values with Spark and stages that table again with them (`TableInput.lookup`);
  placeholders are rare and a second pass of one table is cheaper than reading the lake from an executor.
* `failure`: the stage cannot go on for a reason that is not one event (see `stage.isolate`); the
  driver raises it as `StageFailure`, and the batch replays on restart.

Poison events are isolated here, on the executor, by the same bisection the driver ran (`stage.prepare_isolated`):
one event the stage cannot take is a dead letter (`stage_error`), the rest of its table lands.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from cdc_platform.lake import schemas
from cdc_platform.lake.arrow_parts import chunks, encode, parts_schema
from cdc_platform.config import TableConfig
from cdc_platform.stages.stage import ParsedBatch, StageFailure, dead_letter_rows, poison_rows, prepare_isolated

#: What `apply.prepare_table` returns (apply imports this module, so it is named, not imported, here).
TablePlan = Any

#: The input order of an event within its batch (the parser's `_seq`); the group is sorted by it.
ORDER = "_seq"

STAGED = parts_schema(pa.field("table_id", pa.string()))
PLAN, STATE, HISTORY, DEAD, NEED, FAILURE = "plan", "state", "history", "dead", "need", "failure"

#: The figures of one table's batch, in `plan` rows' info and the stage's metrics.
FIGURES = ("rows", "tombstones", "truncates", "added_columns", "widened_columns", "unavailable_filled", "unavailable_unresolved")

#: A stored lookup's result: typed key tuple -> {column: stored value}.
Stored = dict[tuple[Any, ...], dict[str, Any]]
#: What a group runs: (table, stored schema of <name>, of <name>_history, the table's events, lookup) -> plan.
Prepare = Callable[[TableConfig, pa.Schema, "pa.Schema | None", Any, Callable[..., Stored]], TablePlan]  # Any: `rows.Events`


@dataclass(frozen=True)
class TableInput:
    """What a group needs about its table, decided by the driver before the job: small, pickled into it."""

    table: TableConfig
    state_schema: pa.Schema  # `<name>` as stored (metadata columns only when nothing landed yet)
    history_schema: pa.Schema | None  # `<name>_history` as stored, when the table keeps history
    lookup: Stored | None = None  # stored values of the keys a first pass asked for (`need`)


@dataclass(frozen=True)
class StagingContext:
    tables: Mapping[str, TableInput]  # by source table id (`db.table`)
    stage: str
    batch_id: int
    prepare: Prepare  # `apply.prepare_table`, unless a test injects a failure


class _Recorder:
    """The stored lookup a group sees: answers from the driver's reads, and notes what nobody read yet."""

    def __init__(self, known: Stored | None) -> None:
        self.known = known
        self.missing: list[tuple[Any, ...]] = []
        self.columns: list[str] = []

    def __call__(self, keys: list[tuple[Any, ...]], columns: list[str]) -> Stored:
        if self.known is not None:
            return {k: v for k, v in self.known.items() if k in set(keys)}
        self.missing, self.columns = list(keys), list(columns)
        return {}


# --- encoding parts -----------------------------------------------------------------------------------

def _row(table_id: str, part: str, chunk: int = 0, payload: bytes | None = None, info: Any = None) -> dict[str, Any]:
    return {"table_id": table_id, "part": part, "chunk": chunk, "payload": payload,
            "info": None if info is None else json.dumps(info, sort_keys=True)}


def _chunks(table_id: str, part: str, rows: pa.Table | None) -> list[dict[str, Any]]:
    if rows is None or rows.num_rows == 0:
        return []
    return [_row(table_id, part, i, payload) for i, payload in enumerate(chunks(rows))]


def _schema_text(schema: pa.Schema | None) -> str | None:
    return None if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode("ascii")


def schema_of(text: str | None) -> pa.Schema | None:
    return None if text is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


# --- the group function ---------------------------------------------------------------------------------

def _events_of(rows: pa.Table, key: list[str] | tuple[str, ...]) -> pa.Table:
    """The group's rows in batch order, shaped as the raw log (the columns the shuffle left out are null), with
    the `key` of events that landed before their table was configured filled from their row images."""
    from cdc_platform.stages.latest_state.rows import fill_keys

    rows = rows.sort_by(ORDER) if ORDER in rows.column_names else rows
    return fill_keys(schemas.conform(rows, schemas.RAW_CHANGE_EVENTS), key)


def stage_table(ctx: StagingContext, table_id: str, rows: pa.Table) -> pa.Table:
    """One table's events of the batch -> its `STAGED` parts (see the module doc)."""
    out = _stage_table(ctx, table_id, rows)
    return pa.Table.from_pylist(out, schema=STAGED)


def _stage_table(ctx: StagingContext, table_id: str, rows: pa.Table) -> list[dict[str, Any]]:
    from cdc_platform.stages.latest_state.rows import Events

    given = ctx.tables.get(table_id)
    if given is None or rows.num_rows == 0:
        return []
    prepare = ctx.prepare
    events = _events_of(rows, given.table.key)
    batch = ParsedBatch(batch_id=ctx.batch_id, events=events, markers=schemas.TRANSACTION_MARKERS.empty_table(),
                        dead_letters=schemas.DEAD_LETTER.empty_table(), tombstones=0, rows_read=events.num_rows,
                        in_batch_duplicates=0, ingested_at=_now())
    lookup = _Recorder(given.lookup)

    def probe(part: ParsedBatch) -> TablePlan:
        lookup.missing = []  # what the last probe asked for is what counts
        return prepare(given.table, given.state_schema, given.history_schema, Events(part.events), lookup)

    dead: list[pa.Table] = []
    figures: dict[str, float] = {}
    try:
        plan, found = prepare_isolated(probe, batch, stage=ctx.stage)
        if found.failed:
            dead.append(poison_rows(batch, found, ctx.stage))
            figures["isolated_events"] = float(len(found.failed))
            figures["isolation_probes"] = float(found.probes)
    except StageFailure as failure:
        return [_row(table_id, FAILURE, info={"message": str(failure)})]

    if lookup.missing:
        assert plan.typed is not None  # a lookup happens only while typing
        keys = pa.table({k: pa.array([key[i] for key in lookup.missing], plan.typed.columns[k]) for i, k in enumerate(given.table.key)})
        return [_row(table_id, NEED, payload=encode(keys), info={"columns": lookup.columns})]

    result = plan.out
    figures.update({k: float(getattr(result, k)) for k in FIGURES})
    figures["rows"] = float(plan.state.num_rows) if plan.state is not None else 0.0
    if result.dead:
        dead.append(dead_letter_rows(result.dead, stage=ctx.stage, batch_id=ctx.batch_id))
    dead_rows = pa.concat_tables(dead) if dead else None
    info = {
        "dead": 0 if dead_rows is None else dead_rows.num_rows,
        "table": given.table.name,
        "figures": figures,
        "state_rewrite": plan.state_rewrite,
        "history_rewrite": plan.history_rewrite,
        "history_schema": _schema_text(plan.history_target),
        "history_rows": 0 if plan.history is None else plan.history.num_rows,
    }
    parts = [_row(table_id, PLAN, payload=None if plan.state_target is None else plan.state_target.serialize().to_pybytes(), info=info)]
    parts += _chunks(table_id, STATE, plan.state)
    parts += _chunks(table_id, HISTORY, plan.history)
    parts += _chunks(table_id, DEAD, dead_rows)
    return parts


def _now() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc)


def group_function(ctx: StagingContext) -> Callable[[tuple[pa.Scalar, ...], pa.Table], pa.Table]:
    """The function `applyInArrow` runs per table: its key is the group's `table_id`."""

    def run(key: tuple[pa.Scalar, ...], rows: pa.Table) -> pa.Table:
        return stage_table(ctx, key[0].as_py(), rows)

    return run
