"""Restarting a service of the test bed in place (what the fault tests of issue 11 build on): Kafka
Connect comes back on the same port with its connector, which resumes from its committed offset."""

from __future__ import annotations

from cdc_platform.testbed import Stack, consume


def test_connect_restart_resumes_the_connector(testbed: Stack) -> None:
    with testbed.postgres.connect() as conn:
        conn.execute("create table restart_probe (id int primary key, v text)")
    config = testbed.postgres_connector("restart_pg", ["public.restart_probe"])
    topic = "restart_pg.public.restart_probe"
    testbed.connect.register("restart_pg", config)
    try:
        testbed.wait_streaming(config)
        with testbed.postgres.connect() as conn:
            conn.execute("insert into restart_probe values (1, 'before')")
        consume(testbed.broker.bootstrap, [topic], until=lambda rs: len(rs) >= 1, timeout=60)

        port = testbed.connect.port
        seconds = testbed.restart("connect")
        assert testbed.connect.port == port and seconds < 90
        testbed.connect.wait_running("restart_pg")
        testbed.wait_streaming(config)
        with testbed.postgres.connect() as conn:
            conn.execute("insert into restart_probe values (2, 'after')")

        records = consume(testbed.broker.bootstrap, [topic], until=lambda rs: any(r.json_value()["payload"]["after"]["id"] == 2 for r in rs), timeout=90)
        ids = [r.json_value()["payload"]["after"]["id"] for r in records]
        assert set(ids) == {1, 2}, "nothing lost across the restart (a redelivery would only repeat)"
        assert {r.json_value()["payload"]["op"] for r in records} == {"c"}
    finally:
        testbed.connect.delete("restart_pg")
        with testbed.postgres.connect() as conn:
            conn.execute("drop table restart_probe")
