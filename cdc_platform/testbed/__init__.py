"""The test bed of issue 11: a real Kafka broker (KRaft), Kafka Connect with Debezium's PostgreSQL and
MariaDB connectors, and real PostgreSQL and MariaDB servers, all on loopback ports chosen at run time.

Used by the tests (session fixture `testbed` in tests/conftest.py) and by users through
`make stack` / `make stack-status` / `make stack-stop` (`python -m cdc_platform.testbed`).

    from cdc_platform.testbed import Stack
    with Stack.start() as bed:
        config = bed.postgres_connector("pg", ["public.accounts"])
        bed.connect.register("pg", config)
        bed.wait_streaming(config)
        ...
"""

from cdc_platform.testbed.errors import TestbedError
from cdc_platform.testbed.install import ensure_installed
from cdc_platform.testbed.kafka import Record, consume, consume_all
from cdc_platform.testbed.stack import Stack

__all__ = ["Record", "Stack", "TestbedError", "consume", "consume_all", "ensure_installed"]
