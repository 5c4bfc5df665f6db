"""How `cdc sql` prints a query's rows: a table for people, CSV and JSON for scripts (JSON is one array of
row objects, a public format), the same whether the rows came from the local Spark or a server."""

from __future__ import annotations

import csv
import datetime as dt
import decimal
import io
import json
from typing import Any, Sequence


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if hasattr(value, "asDict"):  # a struct: pyspark's Row is a tuple, so this goes before the tuple case
        return _jsonable(value.asDict(recursive=True))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def _cell(value: Any) -> str:
    plain = _jsonable(value)
    return json.dumps(plain, ensure_ascii=False) if isinstance(plain, (dict, list)) else str(plain)


def format_rows(columns: Sequence[str], rows: Sequence[Sequence[Any]], fmt: str) -> str:
    """Render query results; `json` is one array of row objects (a public, scripted format)."""
    if fmt == "json":
        return json.dumps([{c: _jsonable(v) for c, v in zip(columns, row)} for row in rows], ensure_ascii=False)
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else _cell(v) for v in row])
        return buf.getvalue().rstrip("\n")
    cells = [["NULL" if v is None else _cell(v) for v in row] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    out = [line, "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths)) + " |", line]
    out += ["| " + " | ".join(v.ljust(w) for v, w in zip(r, widths)) + " |" for r in cells]
    out.append(line)
    out.append(f"({len(rows)} row{'s' if len(rows) != 1 else ''})")
    return "\n".join(out)
