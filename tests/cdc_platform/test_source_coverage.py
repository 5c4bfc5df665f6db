"""Coverage against the live source, without a database: the value mapping, the per-key verdicts, the
recheck that tells a stream that is behind from a lake that lost a row, and the connection's config.
The same check against real PostgreSQL and MariaDB is in tests/testbed/test_capture.py."""

from __future__ import annotations

import datetime as dt
import socket
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from cdc_platform.parse import envelope
from cdc_platform.sources import source_connection
from cdc_platform.checks import source_coverage
from cdc_platform.config import TableConfig, load_config
from cdc_platform.errors import ConfigError
from cdc_platform.lake import write_registry
from cdc_platform.sources.source_connection import (
    SourceConnection,
    SourceConnectionError,
    SourceRead,
    SourceScan,
    binlog_position,
    parse_source_connection,
    pg_lsn_position,
    read_table_chunks,
)
from cdc_platform.checks.source_coverage import LakeSide, compare, same_value

UTC = dt.timezone.utc
TABLE = TableConfig(source="public.accounts", name="accounts", key=("id",))
ENV = {"U": "reader", "P": "s3cret"}
CONN = SourceConnection("postgresql", "127.0.0.1", 5432, "app", "reader", "s3cret", recheck_after=7.0)


@pytest.mark.parametrize(("source", "stored"), [
    (Decimal("10.50"), Decimal("10.5")),
    (Decimal("7"), 7),
    (Decimal("12345678901234567890.123"), "12345678901234567890.123"),  # wider than 38 digits: kept as exact text
    (dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(hours=2))), dt.datetime(2024, 1, 2, 1, 4, 5, 6, tzinfo=UTC)),
    (dt.datetime(2021, 2, 3, 4, 5, 6, 7), dt.datetime(2021, 2, 3, 4, 5, 6, 7, tzinfo=UTC)),  # zone-less: taken as UTC, as Debezium does
    (dt.date(2000, 2, 29), dt.date(2000, 2, 29)),
    ({"tier": 1, "tags": ["a"]}, '{"tags": ["a"], "tier": 1}'),  # jsonb read by the driver vs Debezium's text
    ('{"a": 1.50}', '{"a":1.5}'),  # MariaDB's JSON is text on both sides
    (uuid.UUID(int=5), "00000000-0000-0000-0000-000000000005"),
    (b"\x00\xff", bytearray(b"\x00\xff")),
    (memoryview(b"ab"), b"ab"),
    (dt.time(1, 2, 3, 4), 3_723_000_004),  # MicroTime
    (dt.time(1, 2, 3), 3_723_000),  # Time (ms)
    (dt.timedelta(hours=1), 3_600_000_000),  # MySQL TIME read as a duration; MicroDuration
    (1, True),  # MySQL TINYINT(1), which Debezium calls boolean
    ("paid", "paid"),
    (None, None),
    (1.25, 1.25),
])
def test_equal_values_under_the_type_mapping(source: Any, stored: Any) -> None:
    assert same_value(source, stored)


@pytest.mark.parametrize(("source", "stored"), [
    (Decimal("10.50"), Decimal("10.51")),
    (None, 0),
    ("x", None),
    (dt.datetime(2021, 2, 3, 4, 5, 6, 7), dt.datetime(2021, 2, 3, 4, 5, 6, 8, tzinfo=UTC)),
    ({"a": 1}, '{"a": 2}'),
    ("not json", "not json!"),
    (2, True),
    (True, False),
    (b"a", b"b"),
    (dt.time(0, 0, 1), 999),
])
def test_different_values_stay_different(source: Any, stored: Any) -> None:
    assert not same_value(source, stored)


def lake(*rows: tuple[int, str | None, str, bool]) -> LakeSide:
    """Lake rows as (id, name, position, deleted)."""
    return LakeSide(("id", "name"), {source_coverage.key_of(TABLE, {"id": i}): {"id": i, "name": n, "_position": p, "_deleted": d}
                                     for i, n, p, d in rows})


def test_each_key_gets_one_verdict_and_changes_after_the_read_are_left_out() -> None:
    read = SourceRead("0050", ("id", "name"), [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (6, "f")])
    stored = lake((1, "a", "0010", False),  # equal
                  (2, "B", "0020", False),  # different
                  (3, None, "0030", True),  # deleted in the lake, live in the source
                  (4, "x", "0060", False),  # changed after the read: the lake is rightly newer
                  (5, "e", "0040", False),  # live in the lake, not in the source
                  (7, "g", "0070", False),  # inserted after the read
                  (8, None, "0045", True))  # deleted on both sides
    got = compare(read, stored, TABLE)
    assert got.counts == {"matched": 1, "changed_after_read": 2, "missing_in_lake": 2, "different_values": 1, "extra_in_lake": 1}
    assert {k[0][1]: v[0] for k, v in got.differing.items()} == {"2": "different_values", "3": "missing_in_lake", "6": "missing_in_lake",
                                                                 "5": "extra_in_lake"}
    assert got.different_columns == {"name": 1}


def test_a_source_without_the_key_column_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="no key column id"):
        compare(SourceRead("1", ("uid",), []), lake(), TABLE)


class FakeSide:
    """Successive source reads and lake states, as `source_coverage` asks for them: the reads go to the check's
    sink in chunks of two rows, the lake states are Spark frames, so the compare runs as it does on a real lake."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, spark: Any, reads: list[SourceRead], lakes: list[LakeSide]) -> None:
        self.reads, self.lakes, self.asked = reads, lakes, []
        monkeypatch.setattr(source_coverage, "read_table_chunks", self.read_table_chunks)
        monkeypatch.setattr(source_coverage, "lake_frame", lambda spark_, lake_dir, table: self.frame(spark, self.lakes.pop(0)))

    def read_table_chunks(self, conn: SourceConnection, source: str, sink: Any, key: tuple[str, ...] = (), key_values: Any = None) -> SourceScan:
        self.asked.append(None if key_values is None else sorted(tuple(v) for v in key_values))
        read = self.reads.pop(0)
        for i in range(0, len(read.rows), 2):
            sink(read.columns, read.rows[i:i + 2])
        return SourceScan(read.position, read.columns, len(read.rows))

    @staticmethod
    def frame(spark: Any, side: LakeSide) -> Any:
        return spark.createDataFrame(list(side.rows.values()), "id long, name string, _position string, _deleted boolean")


def scratch_left(lake_dir: Path) -> list[Path]:
    return sorted((lake_dir / "_scratch").glob("*")) if (lake_dir / "_scratch").exists() else []


def test_the_check_gives_each_key_the_verdict_compare_gives_it_across_buckets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spark: Any
) -> None:
    """The executors' compare (source rows chunked into the lake's scratch folder, both sides bucketed) judges
    every key as `compare` does in one piece, with more buckets than keys; the scratch folder is gone after."""
    read = SourceRead("0050", ("id", "name"), [(1, "a"), (2, "b"), (3, "c"), (4, "d"), (6, "f")])
    stored = lake((1, "a", "0010", False), (2, "B", "0020", False), (3, None, "0030", True), (4, "x", "0060", False),
                  (5, "e", "0040", False), (7, "g", "0070", False), (8, None, "0045", True))
    monkeypatch.setattr(source_coverage, "BUCKET_ROWS", 1)
    removed: list[str] = []
    remove = source_coverage._remove
    monkeypatch.setattr(source_coverage, "_remove", lambda spark_, location: (removed.append(location), remove(spark_, location)))
    FakeSide(monkeypatch, spark, [read, SourceRead("0080", ("id", "name"), [(2, "b"), (3, "c"), (6, "f")])], [stored, stored])
    out = source_coverage.source_coverage(spark, tmp_path, TABLE, CONN, sleep=lambda s: None)
    assert len(removed) == 2, "both reads came in more than one chunk: through the scratch folder"
    whole = compare(read, stored, TABLE)
    assert not out.passed
    assert {k: out.metadata[k] for k in whole.counts} == {**whole.counts, "matched": 1, "changed_after_read": 2}
    assert out.metadata["live_mismatched_keys"] == {"different_values": ['{"id": 2}'], "missing_in_lake": ['{"id": 3}', '{"id": 6}'],
                                                    "extra_in_lake": ['{"id": 5}']}
    assert out.metadata["different_columns"] == {"name": 1} and out.metadata["rechecked_keys"] == 4
    assert out.metadata["source_rows"] == 5 and out.metadata["source_position"] == "0050"
    assert scratch_left(tmp_path) == []


def test_a_stream_that_is_only_behind_passes_on_the_recheck(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spark: Any) -> None:
    side = FakeSide(monkeypatch, spark,
                    [SourceRead("0050", ("id", "name"), [(1, "a"), (2, "b2")]), SourceRead("0070", ("id", "name"), [(2, "b3")])],
                    [lake((1, "a", "0010", False), (2, "b", "0020", False)), lake((1, "a", "0010", False), (2, "b3", "0065", False))])
    slept: list[float] = []
    out = source_coverage.source_coverage(spark, tmp_path, TABLE, CONN, sleep=slept.append)
    assert out.passed, out.description
    assert slept == [7.0] and side.asked == [None, [(2,)]], "only the differing key is read again, recheck_after later"
    assert out.metadata["matched"] == 2 and out.metadata["rechecked_keys"] == 1 and out.metadata["live_coverage_percent"] == 100.0


def test_a_lost_row_fails_naming_its_key(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spark: Any) -> None:
    FakeSide(monkeypatch, spark, [SourceRead("0050", ("id", "name"), [(1, "a"), (2, "b")]), SourceRead("0051", ("id", "name"), [(2, "b")])],
             [lake((1, "a", "0010", False)), lake((1, "a", "0010", False))])
    monkeypatch.setattr(source_coverage, "_remove", lambda spark_, location: pytest.fail("one chunk needs no scratch folder"))
    out = source_coverage.source_coverage(spark, tmp_path, TABLE, CONN, sleep=lambda s: None)
    assert not out.passed
    assert out.metadata["live_mismatched_keys"] == {"missing_in_lake": ['{"id": 2}']}
    assert out.metadata["live_coverage_percent"] == 50.0
    assert 'e.g. key {"id": 2}' in out.description and "still after a recheck 7 s later" in out.description


def test_too_many_differing_keys_are_not_read_again_and_the_sample_is_the_first_keys(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spark: Any
) -> None:
    monkeypatch.setattr(source_coverage, "MAX_RECHECK", 1)
    rows = [(i, "x") for i in range(25)]
    side = FakeSide(monkeypatch, spark, [SourceRead("0050", ("id", "name"), rows)], [lake()])
    out = source_coverage.source_coverage(spark, tmp_path, TABLE, CONN, sleep=lambda s: pytest.fail("no recheck expected"))
    assert not out.passed and out.metadata["missing_in_lake"] == 25 and out.metadata["rechecked_keys"] == 0
    assert side.asked == [None]
    assert out.metadata["live_mismatched_keys"] == {"missing_in_lake": sorted(f'{{"id": {i}}}' for i in range(25))[:source_coverage.SAMPLE]}


def test_a_value_of_a_type_only_the_driver_knows_is_compared_as_its_text(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spark: Any) -> None:
    """A PostgreSQL range, say: the executors get its text, which is all `canonical` makes of such a value."""

    class Span:  # defined here, so an executor could not unpickle it
        def __init__(self, text: str) -> None:
            self.text = text

        def __str__(self) -> str:
            return self.text

    assert same_value(Span("[1,5)"), "[1,5)") and not same_value(Span("[1,5)"), "[1,6)")
    FakeSide(monkeypatch, spark, [SourceRead("0050", ("id", "name"), [(1, Span("[1,5)")), (2, Span("[2,3)"))]),
                                  SourceRead("0051", ("id", "name"), [(2, Span("[2,3)"))])],
             [lake((1, "[1,5)", "0010", False), (2, "[2,4)", "0020", False)), lake((2, "[2,4)", "0020", False))])
    out = source_coverage.source_coverage(spark, tmp_path, TABLE, CONN, sleep=lambda s: None)
    assert (out.metadata["matched"], out.metadata["different_values"]) == (1, 1)
    assert out.metadata["live_mismatched_keys"] == {"different_values": ['{"id": 2}']}


def test_a_source_without_the_key_column_fails_the_check_as_a_config_error_and_leaves_no_scratch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, spark: Any
) -> None:
    for rows in ([(1, "a"), (2, "b"), (3, "c")], []):  # a read with rows stops at its first chunk; an empty one after the read
        FakeSide(monkeypatch, spark, [SourceRead("0050", ("uid", "name"), rows)], [lake((1, "a", "0010", False))])
        with pytest.raises(ConfigError, match="no key column id"):
            source_coverage.source_coverage(spark, tmp_path, TABLE, CONN, sleep=lambda s: None)
        assert scratch_left(tmp_path) == []


class FakeCursor:
    def __init__(self, rows: list[tuple[Any, ...]], fail_at: int | None = None) -> None:
        self.rows, self.fetches, self.fail_at = list(rows), [], fail_at
        self.description = [type("Column", (), {"name": n})() for n in ("id", "name")]

    def __enter__(self) -> FakeCursor:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def execute(self, sql: str, params: Any = None) -> FakeCursor:
        return self

    def fetchone(self) -> tuple[str]:
        return ("1/16B3748",)

    def fetchmany(self, n: int) -> list[tuple[Any, ...]]:
        if self.fail_at is not None and len(self.fetches) == self.fail_at:
            raise OSError("server closed the connection unexpectedly")
        chunk, self.rows = self.rows[:n], self.rows[n:]
        self.fetches.append(len(chunk))
        return chunk


class FakeConnection:
    def __init__(self, cursor: FakeCursor) -> None:
        self.cur, self.rolled_back = cursor, False

    def execute(self, sql: str) -> FakeCursor:
        return self.cur

    def cursor(self, name: str | None = None) -> FakeCursor:
        return self.cur

    def rollback(self) -> None:
        self.rolled_back = True


def test_a_read_streams_its_rows_in_chunks_and_says_whose_error_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver holds one chunk at a time; the database's errors name the source, the sink's stay its own."""
    from contextlib import contextmanager

    def connect_to(cursor: FakeCursor) -> Any:
        @contextmanager
        def fake(conn: SourceConnection, *, read_only: bool = True) -> Any:
            yield FakeConnection(cursor)
        return fake

    rows = [(i, memoryview(b"ab")) for i in range(7)]
    cursor = FakeCursor(rows)
    monkeypatch.setattr(source_connection, "connect", connect_to(cursor))
    got: list[list[tuple[Any, ...]]] = []
    scan = read_table_chunks(CONN, "public.accounts", lambda columns, chunk: got.append(chunk), chunk_rows=3)
    assert scan == SourceScan(pg_lsn_position("1/16B3748"), ("id", "name"), 7)
    assert [len(c) for c in got] == [3, 3, 1] and cursor.fetches == [3, 3, 1, 0]
    assert got[0][0] == (0, b"ab")  # bytes, not a view of the driver's buffer

    monkeypatch.setattr(source_connection, "connect", connect_to(FakeCursor(rows)))
    with pytest.raises(ZeroDivisionError):
        read_table_chunks(CONN, "public.accounts", lambda columns, chunk: 1 / 0, chunk_rows=3)

    monkeypatch.setattr(source_connection, "connect", connect_to(FakeCursor(rows, fail_at=1)))
    with pytest.raises(SourceConnectionError, match="cannot read public.accounts from .*: server closed the connection unexpectedly"):
        read_table_chunks(CONN, "public.accounts", lambda columns, chunk: None, chunk_rows=3)


def test_the_reads_position_is_written_as_the_lakes_positions_are() -> None:
    lsn = (1 << 32) | 0x16B3748
    assert pg_lsn_position("1/16B3748") == envelope._position("postgresql", {"lsn": lsn}, None, None)[0]
    assert binlog_position("binlog.000003", 1234) == envelope._position("mariadb", {"file": "binlog.000003", "pos": 1234, "row": 0}, None, None)[0]
    # A change of the next row of the same binlog event sorts after the read's position, one of the event before it before.
    assert envelope._position("mysql", {"file": "binlog.000003", "pos": 1234, "row": 1}, None, None)[0] > binlog_position("binlog.000003", 1234)
    assert envelope._position("mysql", {"file": "binlog.000002", "pos": 9999, "row": 0}, None, None)[0] < binlog_position("binlog.000003", 4)


def test_credentials_come_from_the_environment_only() -> None:
    raw = {"kind": "postgres", "host": "db", "database": "app", "user": "${U}", "password": "${P}"}
    conn = parse_source_connection(raw, "cdc.yaml", environ=ENV)
    assert conn == SourceConnection("postgresql", "db", 5432, "app", "reader", "s3cret")
    assert "s3cret" not in repr(conn) and conn.describe() == "postgresql://reader@db:5432/app"
    assert parse_source_connection({**raw, "kind": "mariadb"}, "x", environ=ENV).port == 3306  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match=r"password must come from the environment"):
        parse_source_connection({**raw, "password": "hunter2"}, "cdc.yaml", environ=ENV)
    with pytest.raises(ConfigError, match=r"\$\{NOPE\}, which is not set"):
        parse_source_connection({**raw, "user": "${NOPE}"}, "cdc.yaml", environ=ENV)
    with pytest.raises(ConfigError, match="unknown key"):
        parse_source_connection({**raw, "dsn": "x"}, "cdc.yaml", environ=ENV)
    with pytest.raises(ConfigError, match="kind must be one of"):
        parse_source_connection({**raw, "kind": "oracle"}, "cdc.yaml", environ=ENV)
    with pytest.raises(ConfigError, match="host is required"):
        parse_source_connection({k: v for k, v in raw.items() if k != "host"}, "cdc.yaml", environ=ENV)
    with pytest.raises(ConfigError, match="recheck_after must be a number"):
        parse_source_connection({**raw, "recheck_after": "soon"}, "cdc.yaml", environ=ENV)


def test_the_connection_is_in_the_config_and_never_in_the_lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CDC_TEST_SOURCE_USER", "reader")
    monkeypatch.setenv("CDC_TEST_SOURCE_PASSWORD", "s3cret-value")
    (tmp_path / "cdc.yaml").write_text(
        "landing: landing\nlake: lake\ntables: {public.accounts: {key: [id]}}\nsource_connection: {kind: postgresql, host: db, "
        "database: app, user: '${CDC_TEST_SOURCE_USER}', password: '${CDC_TEST_SOURCE_PASSWORD}'}\n", encoding="utf-8")
    cfg = load_config(tmp_path / "cdc.yaml")
    assert cfg.source_connection is not None and cfg.source_connection.password == "s3cret-value"
    registry = write_registry(cfg)
    assert "s3cret-value" not in registry.read_text(encoding="utf-8")


def test_an_unreachable_source_is_one_line_naming_it() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conn = SourceConnection("postgresql", "127.0.0.1", port, "app", "reader", "pw", connect_timeout=2)
    with pytest.raises(SourceConnectionError, match=rf"cannot read public.accounts from postgresql://reader@127.0.0.1:{port}/app: .*check source_connection") as err:
        read_table_chunks(conn, "public.accounts", lambda columns, chunk: None)
    assert "\n" not in str(err.value)


def test_a_missing_driver_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pymysql", None)
    conn = SourceConnection("mariadb", "127.0.0.1", 3306, "app", "reader", "pw")
    with pytest.raises(SourceConnectionError, match=r"needs its Python driver \(pymysql\): pip install 'cdc-platform\[sources\]'"):
        read_table_chunks(conn, "app.accounts", lambda columns, chunk: None)
