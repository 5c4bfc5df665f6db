"""Capture real connector output for `tests/cdc_platform/test_avro_decode.py`: the same changes written by
Debezium's PostgreSQL and MariaDB connectors twice, once with the JSON converter (`schemas.enable=true`)
and once with Apicurio's Avro converter to the test bed's registry, into `connectors.json`.

The Avro connectors have the JSON ones' topic prefix (so schema names and `source.name` agree) and a
RegexRouter SMT that puts their records on `avro.<topic>`; the registry's schemas of every id they wrote
are saved beside the records. Re-run after a Debezium or converter upgrade:

    .venv/bin/python tests/data/avro/capture.py
"""

from __future__ import annotations

import base64
import json
import struct
import time
from pathlib import Path
from typing import Any

from cdc_platform.testbed import Stack, consume_all

OUT = Path(__file__).with_name("connectors.json")
# Two connectors with one topic prefix register the same JMX metrics names unless tagged apart.
ROUTE = {"custom.metric.tags": "converter=avro", "transforms": "route", "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
         "transforms.route.regex": "(.*)", "transforms.route.replacement": "avro.$1"}
PG_DDL = [
    "create extension if not exists hstore",
    "create type mood as enum ('sad', 'ok', 'happy')",
    """create table types (id int primary key, i2 smallint, i8 bigint, r4 real, f8 double precision, n numeric(10,3),
       nv numeric, money_v money, b boolean, t text, vc varchar(10), c char(3), d date, tm time, tmtz timetz,
       ts timestamp(6), tstz timestamptz, iv interval, j json, jb jsonb, u uuid, bin bytea, m mood, ia int[], ta text[],
       ip inet, pt point, x xml, h hstore)""",
]
PG_ROW = """insert into types values (1, -32768, 9223372036854775807, 1.5, -2.25e-300, 1234567.891, 123.456789012345678901234567890,
    12.34, true, 'tëxt "quoted"', 'vc', 'c', '2024-02-29', '13:14:15.123456', '13:14:15+02', '2024-05-06 07:08:09.123456',
    '2024-05-06 07:08:09.123456+00', '1 year 2 months 3 days 04:05:06.789', '{"a": [1, 2.5, null]}', '{"b": {"c": true}}',
    '00000000-0000-0000-0000-00000000002a', '\\x00ff10', 'happy', '{1,2,null}', '{"a","b c"}', '10.0.0.1/32', '(1.5,-2)',
    '<a>x</a>', 'k1 => v1, k2 => NULL')"""
MARIA_DDL = [
    """create table mtypes (id int primary key, tb tinyint(1), i2 smallint, i3 mediumint, u8 bigint unsigned, r4 float, f8 double,
       n decimal(20,4), d date, dt datetime(6), ts timestamp(3) null, tm time(6), y year, bt bit(3), e enum('x','y'),
       s set('p','q'), j json, bl blob, vc varchar(20), c char(2))""",
]
MARIA_ROW = """insert into mtypes (id, tb, i2, i3, u8, r4, f8, n, d, dt, ts, tm, y, bt, e, s, j, bl, vc, c) values (1, 1, -32768, 8388607, 18446744073709551615, 1.5, -2.25e-300, 1234567890123456.7891,
    '2024-02-29', '2024-05-06 07:08:09.123456', '2024-05-06 07:08:09.123', '13:14:15.123456', 2024, b'101', 'y', 'p,q',
    '{"a": [1, 2.5, null]}', x'00ff10', 'tëxt', 'c')"""


def pg_connector(bed: Stack, avro: bool) -> dict[str, Any]:
    suffix = "avro" if avro else "json"
    extra = {**bed.registry.avro_converter_config(), **ROUTE} if avro else {}
    return bed.postgres_connector("pg", ["public.types"], slot_name=f"pg_{suffix}_slot", publication_name=f"pg_{suffix}_pub",
                                  skipped_operations="none", heartbeat_interval_ms=1000, **extra)


def maria_connector(bed: Stack, avro: bool) -> dict[str, Any]:
    suffix = "avro" if avro else "json"
    extra = {**bed.registry.avro_converter_config(), **ROUTE} if avro else {}
    return bed.mariadb_connector("mdb", ["cdc.mtypes"], **{"schema.history.internal.kafka.topic": f"mdb.history.{suffix}"},
                                 heartbeat_interval_ms=1000, **extra)


def b64(raw: bytes | None) -> str | None:
    return None if raw is None else base64.b64encode(raw).decode("ascii")


def main() -> None:
    with Stack.start() as bed:
        with bed.postgres.connect() as conn:
            for ddl in PG_DDL:
                conn.execute(ddl)
            conn.execute(PG_ROW)  # read by the snapshot
        with bed.mariadb.connect() as conn, conn.cursor() as cur:
            for ddl in MARIA_DDL:
                cur.execute(ddl)
            cur.execute(MARIA_ROW)
            conn.commit()
        configs = {"pg-json": pg_connector(bed, False), "pg-avro": pg_connector(bed, True),
                   "mdb-json": maria_connector(bed, False), "mdb-avro": maria_connector(bed, True)}
        for name, config in configs.items():
            bed.connect.register(name, config)
            bed.wait_streaming(config)
        time.sleep(3)
        with bed.postgres.connect() as conn:
            conn.execute("update types set n = -0.001, nv = 'NaN', t = null, ia = '{}' where id = 1")
            conn.execute("alter table types add column extra int default 7")
            conn.execute(PG_ROW.replace("(1,", "(2,", 1))
            conn.execute("select pg_logical_emit_message(false, 'cdc', 'ping')")
            conn.execute("delete from types where id = 2")
            conn.execute("truncate types")
        with bed.mariadb.connect() as conn, conn.cursor() as cur:
            cur.execute("update mtypes set n = -0.0001, vc = null where id = 1")
            cur.execute("alter table mtypes add column extra varchar(5) default 'z'")
            cur.execute(MARIA_ROW.replace("(1,", "(2,", 1))
            cur.execute("delete from mtypes where id = 2")
            conn.commit()
        time.sleep(8)
        topics = sorted(t for t in bed.broker.topics() if t.split(".")[0] in ("pg", "mdb", "avro", "__debezium-heartbeat")
                        and "history" not in t)
        records = consume_all(bed.broker.bootstrap, topics)
        ids = sorted({struct.unpack(">I", raw[1:5])[0] for r in records if r.topic.startswith("avro.")
                      for raw in (r.key, r.value) if raw and raw[0] == 0})
        schemas = {str(i): bed.registry.request(f"/schemas/ids/{i}")[1]["schema"] for i in ids}
        by_place = {(r.topic, r.offset): r for r in records}
        pairs = []
        for r in records:
            if not r.topic.startswith("avro.") or ("heartbeat" in r.topic and r.offset > 1):  # two heartbeats a topic do
                continue
            twin = by_place.get((r.topic.removeprefix("avro."), r.offset))
            pairs.append({"topic": r.topic, "offset": r.offset, "key": b64(r.key), "value": b64(r.value),
                          "json_key": None if twin is None or twin.key is None else twin.key.decode(),
                          "json_value": None if twin is None or twin.value is None else twin.value.decode(),
                          "twin": twin is not None})
        OUT.write_text(json.dumps({"schemas": schemas, "records": pairs}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{len(pairs)} Avro records ({sum(p['twin'] for p in pairs)} with a JSON twin), {len(schemas)} schemas -> {OUT}")


if __name__ == "__main__":
    main()
