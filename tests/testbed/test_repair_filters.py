"""The repair's key filters on the real databases: for a key of every type the README's type table lists (as a
source column type), with values chosen to break naive quoting, the filter the repair writes selects exactly the
keys asked for, read in a session whose time zone is not the reader's (the connector's may be anything).

Keys are read as the repair reads them (`read_table_chunks`, the coverage check's reader), so the literals are
written from the very values the drivers return; only the databases run here, no connector."""

from __future__ import annotations

from typing import Any

import pytest

from cdc_platform.backfill.repair import key_columns
from cdc_platform.backfill.repair_signal import plan_signals
from cdc_platform.config import TableConfig
from cdc_platform.sources.source_connection import SourceConnection, read_table_chunks
from cdc_platform.testbed import Stack
from cdc_platform.testbed.databases import DATABASE, PASSWORD, USER

TRICKY = ["plain", "it's", 'quo"te', "back\\slash", "naïve ☃ 𝄞", "--", "a'); drop table x; --", "tab\there", "new\nline", "%s", "\\x00"]

# (column type, values inserted as SQL literals); the repair asks for every other key.
POSTGRES_KEYS: dict[str, tuple[str, list[str]]] = {
    "int2": ("smallint", ["-32768", "0", "32767"]),
    "int4": ("integer", ["-2147483648", "7", "2147483647"]),
    "int8": ("bigint", ["-9223372036854775808", "9007199254740993", "9223372036854775807"]),
    "float4": ("real", ["0.1", "-3.4e38", "'NaN'", "'Infinity'"]),
    "float8": ("double precision", ["0.1", "1e-300", "'-Infinity'", "123456789.123456789"]),
    "bool": ("boolean", ["true", "false"]),
    "text": ("text", [f"$q${t}$q$" for t in TRICKY]),
    "varchar": ("varchar(40)", [f"$q${t}$q$" for t in TRICKY]),
    "bpchar": ("char(4)", ["'ab'", "'it''s'", "'☃'"]),
    "bytea": ("bytea", ["'\\x00ff'::bytea", "'\\x27'::bytea", "''::bytea", "'\\x5c'::bytea"]),
    "numeric": ("numeric(12,2)", ["10.50", "-0.01", "9999999999.99"]),
    "wide": ("numeric(50,5)", ["123456789012345678901234567890123456789012.34567", "-1.00001"]),
    "varscale": ("numeric", ["1.5", "1.50000000000000000000000000001", "'NaN'"]),
    "date": ("date", ["'2000-02-29'", "'0001-01-01'", "'9999-12-31'"]),
    "time": ("time(6)", ["'00:00:00'", "'23:59:59.999999'", "'12:34:56.000001'"]),
    "ts": ("timestamp(6)", ["'2024-01-02 03:04:05.123456'", "'1970-01-01 00:00:00'", "'2024-03-31 02:30:00'"]),
    "tstz": ("timestamptz", ["'2024-01-02 03:04:05.123456+00'", "'2024-03-31 02:30:00+02'", "'1969-12-31 23:59:59.999999+00'"]),
    "uuid": ("uuid", ["'00000000-0000-0000-0000-000000000001'", "gen_random_uuid()"]),
    "enum": ("rf_mood", ["'ok'", "'it''s'", "'☃'"]),
    "interval": ("interval", ["'1 day 2 hours'", "'-3 microseconds'", "'1 mon'"]),
}
MARIADB_KEYS: dict[str, tuple[str, list[str]]] = {
    "int1": ("tinyint", ["-128", "0", "127"]),
    "int8": ("bigint", ["-9223372036854775808", "9007199254740993"]),
    "uint8": ("bigint unsigned", ["18446744073709551615", "0"]),
    "dbl": ("double", ["0.1", "1e-300", "123456789.123456789"]),
    "flag": ("boolean", ["true", "false"]),
    "text": ("varchar(60)", ["'" + t.replace("\\", "\\\\").replace("'", "''") + "'" for t in TRICKY]),
    "bin": ("varbinary(8)", ["x'00ff'", "x'27'", "x''", "x'5c'"]),
    "numeric": ("decimal(12,2)", ["10.50", "-0.01"]),
    "wide": ("decimal(40,3)", ["123456789012345678901234567890123456.789", "-0.001"]),
    "date": ("date", ["'2000-02-29'", "'1000-01-01'"]),
    "time": ("time(6)", ["'-838:59:59.000000'", "'12:34:56.000001'", "'00:00:00'"]),
    "dt": ("datetime(6)", ["'2024-01-02 03:04:05.123456'", "'1000-01-01 00:00:00'"]),
    "ts": ("timestamp(6)", ["'2024-01-02 03:04:05.123456'", "'1970-01-02 00:00:00'", "'2038-01-19 03:14:07'"]),
    "enum": ("enum('ok','it''s','☃')", ["'ok'", "'it''s'", "'☃'"]),
}


def _connection(bed: Stack, kind: str) -> SourceConnection:
    server = bed.postgres if kind == "postgresql" else bed.mariadb
    return SourceConnection(kind, "127.0.0.1", server.port, DATABASE, USER, PASSWORD, recheck_after=0)


def _execute(bed: Stack, kind: str, statements: list[str]) -> None:
    if kind == "postgresql":
        with bed.postgres.connect() as conn:
            for sql in statements:
                conn.execute(sql)
        return
    conn = bed.mariadb.connect()
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
    finally:
        conn.close()


def _select(bed: Stack, kind: str, sql: str) -> int:
    """How many rows `sql` finds, in a session whose time zone differs from the reader's (UTC)."""
    if kind == "postgresql":
        with bed.postgres.connect() as conn:
            conn.execute("set TimeZone = 'America/New_York'")
            return len(conn.execute(sql).fetchall())
    conn = bed.mariadb.connect()
    try:
        with conn.cursor() as cur:
            cur.execute("set time_zone = '+05:30'")
            cur.execute(sql)
            return len(cur.fetchall())
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_a_filter_selects_exactly_the_keys_asked_for_of_every_type(testbed: Stack, kind: str) -> None:
    keys = POSTGRES_KEYS if kind == "postgresql" else MARIADB_KEYS
    connection = _connection(testbed, kind)
    setup = ["create type rf_mood as enum ('ok', 'it''s', '☃')"] if kind == "postgresql" else []
    charset = "" if kind == "postgresql" else " character set utf8mb4"
    for name, (sql_type, values) in keys.items():
        setup.append(f"create table rf_{name} (k {sql_type} primary key, n int){charset}")
        setup += [f"insert into rf_{name} values ({v}, {i})" for i, v in enumerate(values)]
    _execute(testbed, kind, setup)
    try:
        failures = []
        for name in keys:
            schema = "public" if kind == "postgresql" else DATABASE
            table = TableConfig(source=f"{schema}.rf_{name}", name=f"rf_{name}", key=("k",))
            rows: list[tuple[Any, ...]] = []
            read_table_chunks(connection, table.source, lambda _c, chunk: rows.extend(chunk), table.key)
            asked = [(row[0],) for row in rows[::2]]
            plan = plan_signals(table.source, key_columns(connection, table), asked, kind, max_chars=10_000)
            if plan.unexpressible:
                failures.append(f"{name}: {plan.unexpressible}")
                continue
            (signal,) = plan.signals
            condition = signal.data["additional-conditions"][0]["filter"]
            quoted = '"' if kind == "postgresql" else "`"
            found = _select(testbed, kind, f"select k from {quoted}rf_{name}{quoted} where {condition}")
            if found != len(asked):
                failures.append(f"{name}: {condition} found {found} of {len(asked)} row(s)")
        assert not failures, failures
    finally:
        drops = [f"drop table rf_{name}" for name in keys] + (["drop type rf_mood"] if kind == "postgresql" else [])
        _execute(testbed, kind, drops)
