"""Where a batch's rows can already be in a table: the bound that keeps identity dedup's lookup the batch's size.

The raw log and markers insert only ids they do not hold (`insert_new.insert_new_once`). The lookup of held
ids reads only the partitions the batch's rows fall in and, where the id determines a column with a range
(a change event's source position, a marker's transaction id), only that range of it: so its cost follows
the batch, not the table. The batch's aggregate computes the footprint as a few columns
(`footprint_columns`), folded into an aggregate it runs anyway; `footprint_of` reads them back, from one
row or from the rows of a grouped aggregate.
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


def footprint_of(rows: Sequence[Mapping[str, Any]], prefix: str, *, ranged: bool) -> Footprint:
    """The footprint from `footprint_columns`' values: one aggregate row, or the rows of an aggregate grouped
    for another reason, combined here. `ranged`: the columns were made with a range column."""
    def total(name: str) -> int:
        return sum(int(r[f"{prefix}{name}"]) for r in rows)

    def present(name: str) -> list[Any]:
        return [r[f"{prefix}{name}"] for r in rows if r[f"{prefix}{name}"] is not None]

    n = total("rows")
    return Footprint(
        rows=n,
        parts=tuple(sorted({part for r in rows for part in r[f"{prefix}parts"] or ()})),
        null_part=total("with_part") < n,
        lo=min(present("lo"), default=None) if ranged else None,
        hi=max(present("hi"), default=None) if ranged else None,
        complete_range=ranged and total("with_range") == n,
    )
