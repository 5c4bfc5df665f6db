"""Coverage that heals itself, on the real connectors (issue 46): a failed source coverage is repaired by the
platform through Debezium's incremental snapshots, while the stream runs and a workload writes.

* PostgreSQL's table rewrite while the initial snapshot runs (`ALTER TABLE ... TYPE` after the slot's snapshot
  was exported, before the table was read): the snapshot sees the table empty, its rows never reach Kafka and
  later updates arrive with TOAST placeholders; coverage finds it, Dagster's `source_repair` brings every row
  back with its full values.
* PostgreSQL and MariaDB: the lake loses rows on purpose, the source changes rows behind the stream's back;
  `cdc repair` re-reads them (PostgreSQL's signals through the signalling table, MariaDB's through a Kafka signal
  topic) while a workload updates and deletes the very keys being repaired, and while a
  transaction that updated one of them before the re-read commits only after the re-read's window closed.
  Afterwards every full view equals `SELECT *`, both coverage checks pass, and per key the raw log's positions
  follow the topic's order (no row went back in time). The key is composite, with quotes and unicode.
* A row deleted at the source where the connector cannot see it leaves the lake through `--remove-absent`.
* Without a signal channel the repair names the keys and the backfill; a channel that cannot be used is an error.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdc_platform import checks, cli
from cdc_platform.backfill import repair_log
from cdc_platform.checks.source_coverage import coverage_result
from cdc_platform.config import PlatformConfig, load_config
from cdc_platform.testbed import Stack, consume
from cdc_platform.testbed.databases import DATABASE, PASSWORD, USER
from tests.testbed.streaming import Running, rows_once_set_up

SIGNAL = "rp_signal"
TENANTS = ["plain", "it's", 'quo"te', "naïve ☃", "back\\slash", "𝄞 ü"]
LOST = [(t, 1) for t in TENANTS]  # every stored version of these is deleted from the lake
BEHIND = [("plain", 2), ("naïve ☃", 2)]  # changed at the source where the connector cannot see it
IN_FLIGHT = ("it's", 1)  # updated before the re-read, committed after its window closed
DELETED = [("quo\"te", 1), ("back\\slash", 1)]  # deleted by the workload while they are repaired
EXTRA = ("plain", 5)  # deleted at the source where the connector cannot see it: only the removal path takes it away


@dataclass
class Source:
    kind: str  # postgresql | mariadb
    bed: Stack
    prefix: str

    @property
    def namespace(self) -> str:
        return "public" if self.kind == "postgresql" else DATABASE

    def connect(self, autocommit: bool = True) -> Any:
        return self.bed.postgres.connect(autocommit=autocommit) if self.kind == "postgresql" else self.bed.mariadb.connect(autocommit=autocommit)

    def run(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        conn = self.connect(autocommit=False)
        try:
            cur = conn.cursor()
            for sql, params in statements:
                cur.execute(sql, params)
            conn.commit()
        finally:
            conn.close()

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        conn = self.connect()
        try:
            cur = conn.cursor()
            cur.execute(sql)
            return [tuple(bytes(v) if isinstance(v, memoryview) else v for v in r) for r in cur.fetchall()]
        finally:
            conn.close()

    def connector(self, tables: list[str], **extra: Any) -> dict[str, Any]:
        names = [f"{self.namespace}.{t}" for t in [*tables, SIGNAL]]
        make = self.bed.postgres_connector if self.kind == "postgresql" else self.bed.mariadb_connector
        return make(self.prefix, names, **{"signal.data.collection": f"{self.namespace}.{SIGNAL}", **extra})

    def config(self, root: Path, tables: dict[str, Any], repair: dict[str, Any] | None) -> PlatformConfig:
        server = self.bed.postgres if self.kind == "postgresql" else self.bed.mariadb
        doc = {
            "lake": "lake", "transaction_timeout": 3600,
            "source": {"kind": "kafka", "bootstrap_servers": self.bed.broker.bootstrap, "subscribe_pattern": rf"{self.prefix}\..*"},
            "source_connection": {"kind": self.kind, "host": "127.0.0.1", "port": server.port, "database": DATABASE,
                                  "user": "${RP_SOURCE_USER}", "password": "${RP_SOURCE_PASSWORD}", "recheck_after": 1},
            "tables": tables,
        }
        if repair is not None:
            doc["repair"] = repair
        root.mkdir(parents=True, exist_ok=True)
        (root / "cdc.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
        return load_config(root / "cdc.yaml")


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RP_SOURCE_USER", USER)
    monkeypatch.setenv("RP_SOURCE_PASSWORD", PASSWORD)


def signal_table(source: Source) -> str:
    return f"create table {SIGNAL} (id varchar(64) primary key, type varchar(32) not null, data text)"


@pytest.fixture
def connector(testbed: Stack) -> Iterator[Any]:
    """Registers connectors by prefix and removes them, whatever the test did."""
    names: list[str] = []

    def register(name: str, config: dict[str, Any]) -> None:
        names.append(name)
        testbed.connect.register(name, config)

    yield register
    for name in names:
        testbed.connect.delete(name)


def wait_until(what: str, condition: Any, stream: Running, timeout: float = 240.0) -> None:
    stream.wait(what, condition, timeout)


# --- PostgreSQL: the table rewrite while the initial snapshot runs, repaired from Dagster ------------------------

DOCS = "rp_docs"


def test_a_table_rewritten_during_the_initial_snapshot_is_repaired_from_dagster(testbed: Stack, spark: Any, tmp_path: Path, query,  # noqa: ANN001
                                                                                connector) -> None:  # noqa: ANN001
    from dagster import DagsterInstance, materialize

    from dagster_project.assets import build_repair_asset
    from dagster_project.resources import CdcResource

    source = Source("postgresql", testbed, "rp_rewrite")
    big = "repeat(md5(g::text), 256)"  # 8 KB, stored out of line: an update leaving it alone sends the placeholder
    source.run([(f"create table {DOCS} (id int primary key, n int, doc text)", ()), (f"alter table {DOCS} alter column doc set storage external", ()),
                (f"insert into {DOCS} select g, g, {big} from generate_series(1, 20) g", ()), (signal_table(source), ())])
    config = source.connector([DOCS], snapshot_delay_ms=6000)  # the slot's snapshot is exported, then the snapshot waits
    cfg = source.config(tmp_path, {f"public.{DOCS}": {"key": ["id"]}}, {"signal_table": f"public.{SIGNAL}", "wait": 180, "poll": 2})
    try:
        connector(source.prefix, config)

        def slot() -> bool:
            with testbed.postgres.connect(testbed.postgres.superuser, testbed.postgres.superuser_password) as conn:
                return conn.execute("select count(*) from pg_replication_slots where slot_name = %s", (config["slot.name"],)).fetchone()[0] == 1

        deadline = time.monotonic() + 60
        while not slot():
            assert time.monotonic() < deadline, "the connector made no slot"
            time.sleep(0.2)
        source.run([(f"alter table {DOCS} alter column n type bigint", ())])  # rewrites the table after the snapshot was taken
        testbed.wait_streaming(config, timeout=120)
        stream = Running(spark, cfg)
        try:
            source.run([(f"update {DOCS} set n = n + 100 where id <= 5", ())])  # streamed, with doc as Debezium's placeholder
            wait_until("the updates landed", lambda: (rows_once_set_up(query, cfg, f"select count(*) as n from {DOCS}__full_view") or [{"n": 0}])[0]["n"] == 5, stream)

            found = coverage_result(spark, cfg.lake, cfg.tables[0], cfg.source_connection)
            assert not found.outcome.passed
            assert (found.outcome.metadata["missing_in_lake"], found.outcome.metadata["different_values"]) == (15, 5), found.outcome.description
            assert found.outcome.metadata["different_columns"] == {"doc": 5}, "the placeholder landed as NULL"
            assert "cdc repair --table rp_docs" in found.outcome.description

            result = materialize([build_repair_asset(cfg)], partition_key=DOCS, instance=DagsterInstance.ephemeral(),
                                 resources={"cdc": CdcResource(config_path=str(cfg.source_file))})
            assert result.success
            meta = next(e for e in result.get_asset_materialization_events()).materialization.metadata
            assert meta["outcome"].value == "repaired" and meta["keys_asked"].value == meta["keys_landed"].value == 20, meta
            assert meta["coverage_after_percent"].value == 100.0 and meta["reread_events"].value >= 20
        finally:
            stream.stop()
        lake = [(r["id"], r["n"], r["doc"]) for r in query(cfg, f"select id, n, doc from {DOCS}__full_view order by id")]
        assert lake == source.rows(f"select id, n, doc from {DOCS} order by id"), "every row back, with its full values"
        assert coverage_result(spark, cfg.lake, cfg.tables[0], cfg.source_connection).outcome.passed
        (recorded,) = repair_log.repairs(cfg.lake, DOCS)
        assert (recorded["outcome"], recorded["keys_asked"], recorded["keys_landed"], recorded["channel"]) == ("repaired", 20, 20, "source")
    finally:
        source.run([(f"drop table if exists {DOCS}", ()), (f"drop table if exists {SIGNAL}", ())])


# --- PostgreSQL and MariaDB: lost rows, rows changed behind the stream's back, a workload racing the repair --------

ACC = "rp_acc"


class Workload:
    """Updates every repaired key but the in-flight one, inserts new rows, and once the repair's signal (or its
    snapshot's first window) is in the signalling table deletes two of the keys being repaired; until stopped."""

    def __init__(self, source: Source) -> None:
        self.source, self.stop, self.error, self.done, self.deleted_after_signal = source, threading.Event(), None, 0, 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        keys = [k for k in LOST + BEHIND if k != IN_FLIGHT and k not in DELETED]
        try:
            n, signalled = 0, None
            while not self.stop.is_set():
                n += 1
                statements = [(f"update {ACC} set balance = balance + 1, name = %s where tenant = %s and id = %s", (f"w{n}", *keys[n % len(keys)])),
                              (f"insert into {ACC} values (%s, %s, %s, %s)", ("new", n, f"new {n}", Decimal(n)))]
                if signalled is None and self.source.rows(f"select count(*) from {SIGNAL}")[0][0]:  # the request, or its first window
                    signalled = n
                if signalled is not None and n - signalled in (0, 4):
                    statements.append((f"delete from {ACC} where tenant = %s and id = %s", DELETED[(n - signalled) // 4]))
                    self.deleted_after_signal += 1
                self.source.run(statements)
                self.done = n
                time.sleep(0.5)  # what a stream on a loaded 2-core machine keeps up with (test_faults)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def _acc_rows(source: Source) -> list[tuple[Any, ...]]:
    return sorted(source.rows(f"select tenant, id, name, balance from {ACC}"))


def _lake_acc(query: Any, cfg: PlatformConfig) -> list[tuple[Any, ...]] | None:
    rows = rows_once_set_up(query, cfg, f"select tenant, id, name, balance from {ACC}__full_view")
    return None if rows is None else sorted(tuple(r.values()) for r in rows)


def _behind_the_streams_back(source: Source, publication: str) -> None:
    """Change rows where the connector cannot see it: MariaDB without the binlog, PostgreSQL outside the publication."""
    update = [(f"update {ACC} set name = 'behind the back' where tenant = %s and id = %s", key) for key in BEHIND]
    update.append((f"delete from {ACC} where tenant = %s and id = %s", EXTRA))
    if source.kind == "mariadb":
        conn = source.connect(autocommit=True)  # sql_log_bin cannot change inside a transaction
        try:
            cur = conn.cursor()
            cur.execute("set session sql_log_bin = 0")
            for sql, params in update:
                cur.execute(sql, params)
        finally:
            conn.close()
    else:
        source.run([(f"alter publication {publication} drop table {ACC}", ())])
        source.run(update)
        source.run([(f"alter publication {publication} add table {ACC}", ())])


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_lost_and_changed_rows_are_repaired_from_the_cli_while_a_workload_writes(kind: str, testbed: Stack, spark: Any, tmp_path: Path,
                                                                                 query, connector, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: ANN001
    source = Source(kind, testbed, f"rp_{kind[:5]}")
    types = "varchar(40), id int, name varchar(60), balance decimal(12,2)" if kind == "mariadb" else "text, id int, name text, balance numeric(12,2)"
    charset = " character set utf8mb4" if kind == "mariadb" else ""
    source.run([(f"create table {ACC} (tenant {types}, primary key (tenant, id)){charset}", ()), (signal_table(source) + charset, ())]
               + [(f"insert into {ACC} values (%s, %s, %s, %s)", (t, i, f"{t} {i}", Decimal(i) / 4)) for t in TENANTS for i in range(1, 6)])
    # One channel each: PostgreSQL's repair writes the signalling table, MariaDB's sends on a Kafka signal topic.
    topic = f"{source.prefix}_signals"  # outside the stream's subscribe pattern
    kafka = {"signal.enabled.channels": "source,kafka", "signal.kafka.topic": topic, "signal.kafka.bootstrap.servers": testbed.broker.bootstrap}
    config = source.connector([ACC], **(kafka if kind == "mariadb" else {}))
    table_id = f"{source.namespace}.{ACC}"
    channel = {"signal_topic": topic, "topic_prefix": source.prefix} if kind == "mariadb" else {"signal_table": f"{source.namespace}.{SIGNAL}"}
    cfg = source.config(tmp_path, {table_id: {"key": ["tenant", "id"]}}, {**channel, "wait": 240, "poll": 2})
    table = cfg.tables[0]
    in_flight = None
    try:
        connector(source.prefix, config)
        testbed.wait_streaming(config)
        stream = Running(spark, cfg)
        workload = Workload(source)
        try:
            wait_until("the snapshot landed", lambda: _lake_acc(query, cfg) == _acc_rows(source), stream)
            # The lake loses every stored version of LOST; the source changes BEHIND where the connector cannot see.
            condition = " or ".join("(tenant = '{}' and id = {})".format(t.replace("\\", "\\\\").replace("'", "\\'"), i) for t, i in LOST)
            spark.sql(f"DELETE FROM delta.`{cfg.lake / ACC}` WHERE {condition}")
            _behind_the_streams_back(source, config.get("publication.name", ""))
            found = coverage_result(spark, cfg.lake, table, cfg.source_connection)
            counts = tuple(found.outcome.metadata[k] for k in ("missing_in_lake", "different_values", "extra_in_lake"))
            assert counts == (6, 2, 1), found.outcome.description
            assert sorted(found.keys()) == sorted(LOST + BEHIND + [EXTRA])

            # The in-flight transaction: it updates a lost key before the re-read, and commits once the re-read row is in Kafka.
            in_flight = source.connect(autocommit=False)
            in_flight.cursor().execute(f"update {ACC} set name = 'in flight' where tenant = %s and id = %s", IN_FLIGHT)

            def commit_after_the_reread() -> None:
                def reread(records: list[Any]) -> bool:
                    return any(r.value and json.loads(r.value)["payload"]["op"] == "r" and json.loads(r.value)["payload"]["source"]["snapshot"] == "incremental"
                               and (json.loads(r.value)["payload"]["after"]["tenant"], json.loads(r.value)["payload"]["after"]["id"]) == IN_FLIGHT
                               for r in records)
                consume(testbed.broker.bootstrap, [f"{source.prefix}.{table_id}"], until=reread, timeout=180)
                in_flight.commit()

            committer = threading.Thread(target=commit_after_the_reread, daemon=True)
            committer.start()
            workload.thread.start()
            code = cli.main(["repair", "--config", str(cfg.source_file), "--table", ACC, "--remove-absent"])
            out = capsys.readouterr().out
            committer.join(timeout=60)
            # The repair reads coverage itself, while the workload writes: a new row the stream has not landed yet may be
            # asked for beside the 8 (re-reading it is harmless), and a lost or changed key the workload updated before
            # that read has landed through the connector already (its update carries the whole row) and is not asked
            # for. The in-flight key and the two the workload deletes after the signal are never healed that way: at
            # least those 3 are asked. Every key asked for landed; the lake equals the source at the end either way.
            asked = int(out.split(": repaired: ")[1].split()[0]) if ": repaired: " in out else 0
            unhealed = 1 + len(DELETED)
            assert code == 0 and asked >= unhealed and out.startswith(f"{ACC}: repaired: {asked} of {asked} re-read key(s) landed"), out
            assert "1 of 1 row(s) the source no longer has removed" in out, out
        finally:
            workload.stop.set()
            if workload.thread.is_alive():
                workload.thread.join(timeout=30)
            try:
                assert workload.error is None, workload.error
                assert workload.deleted_after_signal == 2, "the workload deleted repaired keys while they were re-read"
                wait_until("the lake caught up with the workload", lambda: _lake_acc(query, cfg) == _acc_rows(source), stream)
            finally:
                stream.stop()

        assert _lake_acc(query, cfg) == _acc_rows(source), "every full view equals SELECT *"
        assert not set(DELETED) & {(r[0], r[1]) for r in _acc_rows(source)}, "the deletes raced the repair and won"
        assert ("it's", 1, "in flight") in {r[:3] for r in _acc_rows(source)}
        assert coverage_result(spark, cfg.lake, table, cfg.source_connection).outcome.passed
        assert checks.coverage(spark, cfg.lake, table).passed, "the latest state is the newest raw event of every key"
        # No row went back in time: per key, the raw log's positions follow the topic's order (one partition per key).
        events = query(cfg, f"select key, op, snapshot, position, kafka_offset from raw_change_events where table_id = '{table_id}' "
                            "and kafka_offset is not null order by kafka_offset")
        by_key: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            by_key.setdefault(e["key"], []).append(e)
        behind = {k: [e["position"] for e in v] for k, v in by_key.items() if [e["position"] for e in v] != sorted(e["position"] for e in v)}
        assert behind == {}, behind
        flight = by_key[json.dumps({"id": IN_FLIGHT[1], "tenant": IN_FLIGHT[0]}, separators=(",", ":"), ensure_ascii=False)]
        reread = [e for e in flight if e["op"] == "r" and e["kafka_offset"] > min(x["kafka_offset"] for x in flight)]
        assert reread and flight[-1]["op"] == "u" and reread[-1]["position"] < flight[-1]["position"], flight
        removed = query(cfg, f"select position, op, source_file from raw_change_events where table_id = '{table_id}' and kafka_offset is null")
        extra = by_key[json.dumps({"id": EXTRA[1], "tenant": EXTRA[0]}, separators=(",", ":"), ensure_ascii=False)]
        assert len(removed) == 1 and removed[0]["op"] == "d" and removed[0]["source_file"].startswith("cdc-repair:")
        assert removed[0]["position"] > max(e["position"] for e in extra), "the removal's delete sits past the row it removes"
        (recorded,) = repair_log.repairs(cfg.lake, ACC)
        assert (recorded["outcome"], recorded["keys_asked"], recorded["keys_landed"]) == ("repaired", asked, asked)
        assert recorded["channel"] == ("kafka" if kind == "mariadb" else "source") and (recorded["keys_absent"], recorded["keys_removed"]) == (1, 1)

        # Without a channel the repair names the keys and the backfill; a channel that cannot be used is an error.
        spark.sql(f"DELETE FROM delta.`{cfg.lake / ACC}` WHERE tenant = 'plain' and id = 3")
        bare = source.config(tmp_path / "bare", {table_id: {"key": ["tenant", "id"]}}, None)
        (tmp_path / "bare" / "cdc.yaml").write_text((tmp_path / "bare" / "cdc.yaml").read_text().replace("lake: lake", f"lake: {cfg.lake}"))
        assert cli.main(["repair", "--config", str(bare.source_file)]) == 1
        said = capsys.readouterr().out
        assert '"id":"3","tenant":"plain"' in said and "no signal channel is configured" in said and f"cdc backfill --table {ACC}" in said
        wrong = source.config(tmp_path / "wrong", {table_id: {"key": ["tenant", "id"]}}, {"signal_table": f"{source.namespace}.rp_no_such_table"})
        (tmp_path / "wrong" / "cdc.yaml").write_text((tmp_path / "wrong" / "cdc.yaml").read_text().replace("lake: lake", f"lake: {cfg.lake}"))
        assert cli.main(["repair", "--config", str(wrong.source_file)]) == 2
        err = capsys.readouterr().err
        assert f"error: the signalling table {source.namespace}.rp_no_such_table" in err and "does not exist" in err, err
    finally:
        if in_flight is not None:
            in_flight.close()
        source.run([(f"drop table if exists {ACC}", ()), (f"drop table if exists {SIGNAL}", ())])
