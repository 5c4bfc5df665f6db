"""Where a batch's rows can already be in a table: the bound that keeps identity dedup's lookup the batch's size.

The raw log and markers insert only ids they do not hold (`lake_spark.insert_new_once`). The lookup of held
ids reads only the partitions the batch's rows fall in and, where the id determines a column with a range
(a change event's source position, a marker's transaction id), only that range of it: so its cost follows
the batch, not the table. The batch's aggregate computes the footprint as a few columns
(`footprint_columns`), folded into an aggregate it runs anyway; `footprint_of` reads them back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import Column


@dataclass(frozen=True)
class Footprint:
    """Where a batch's rows can already be in a table: its partition values and its range of a column the id determines."""

    rows: int
    parts: tuple[Any, ...]
    null_part: bool
    lo: Any = None
    hi: Any = None
    complete_range: bool = False  # every row has a value in the range column

    def condition(self, partition_column: str, range_column: str | None) -> Column:
        """The rows of a table that this footprint's rows can match: a filter Delta prunes partitions and files by."""
        from pyspark.sql import functions as F

        partition = F.col(partition_column)
        condition = partition.isin(list(self.parts)) if self.parts else F.lit(False)
        if self.null_part:
            condition = condition | partition.isNull()
        if range_column is not None and self.complete_range:
            condition = condition & F.col(range_column).between(F.lit(self.lo), F.lit(self.hi))
        return condition


def footprint_columns(prefix: str, partition: Column, ranged: Column | None, where: Column | None = None) -> list[Column]:
    """Aggregate columns that `footprint_of` reads back: so a caller can fold them into an aggregate it runs anyway."""
    from pyspark.sql import functions as F

    def only(c: Column) -> Column:
        return c if where is None else F.when(where, c)

    columns = [
        F.count(only(F.lit(1))).alias(f"{prefix}rows"),
        F.collect_set(only(partition)).alias(f"{prefix}parts"),
        F.count(only(partition)).alias(f"{prefix}with_part"),
    ]
    if ranged is not None:
        columns += [F.min(only(ranged)).alias(f"{prefix}lo"), F.max(only(ranged)).alias(f"{prefix}hi"),
                    F.count(only(ranged)).alias(f"{prefix}with_range")]
    return columns


def footprint_totals(rows: Sequence[Mapping[str, Any]], prefix: str, *, ranged: bool) -> dict[str, Any]:
    """`footprint_columns`' values of groups of rows (one aggregate row each) combined into their values over all
    the rows, as `footprint_of` reads them: for an aggregate that is grouped for another reason. `ranged`: the
    columns were made with a range column."""
    def present(name: str) -> list[Any]:
        return [r[name] for r in rows if r[name] is not None]

    totals: dict[str, Any] = {f"{prefix}{name}": sum(int(r[f"{prefix}{name}"]) for r in rows) for name in ("rows", "with_part")}
    totals[f"{prefix}parts"] = sorted({part for r in rows for part in r[f"{prefix}parts"] or ()})
    if ranged:
        lows, highs = present(f"{prefix}lo"), present(f"{prefix}hi")
        totals |= {f"{prefix}lo": min(lows) if lows else None, f"{prefix}hi": max(highs) if highs else None,
                   f"{prefix}with_range": sum(int(r[f"{prefix}with_range"]) for r in rows)}
    return totals


def footprint_of(row: Mapping[str, Any], prefix: str) -> Footprint:
    n = int(row[f"{prefix}rows"])
    ranged = f"{prefix}lo" in row
    return Footprint(
        rows=n,
        parts=tuple(sorted(row[f"{prefix}parts"])),
        null_part=int(row[f"{prefix}with_part"]) < n,
        lo=row.get(f"{prefix}lo"),
        hi=row.get(f"{prefix}hi"),
        complete_range=ranged and int(row[f"{prefix}with_range"]) == n,
    )
