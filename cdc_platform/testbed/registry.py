"""The test bed's schema registry: Apicurio Registry 2.6 (a Quarkus application from Maven Central's
`apicurio-registry-app-<version>-all.zip`, unpacked by `install.ensure_jars`), on a loopback port.

It serves two APIs over one store, and each side of the bed uses its own:

* Apicurio's own REST API (`/apis/registry/v2`): what Apicurio's Kafka Connect converter registers and
  looks schemas up with (`avro_converter_config`, merged into a connector's config);
* the Confluent-compatible API (`/apis/ccompat/v7`): `schema_registry_url` of the platform, which reads
  `/schemas/ids/{id}` with the id the converter wrote into each record.

For the two to agree on ids the converter writes Confluent's wire format (magic byte 0, a 4-byte id, the
Avro binary; `apicurio.registry.as-confluent`) with the schema's content id (`use-id: contentId`), which
is the id the ccompat API serves under `/schemas/ids/` (unless the registry runs in its legacy id mode),
and puts the id in the value, not in Kafka headers (`headers.enabled: false`).

The store is H2 in a file of the bed's folder (the distribution's default is in memory), so a registry
stopped and started again (`Stack.restart("registry")`) still knows every schema.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cdc_platform.testbed import install
from cdc_platform.testbed.errors import TestbedError
from cdc_platform.testbed.kafka import AVRO_CONVERTER
from cdc_platform.testbed.process import HOST, Service, port_open

#: A Quarkus application that serves a few schemas: a small heap, C1 only (it starts in ~5 s here).
JVM_FLAGS = ["-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true"]


@dataclass
class Registry:
    root: Path
    port: int
    java: str = "java"
    service: Service | None = None

    @property
    def url(self) -> str:
        """The Confluent-compatible API: what `source.schema_registry_url` names."""
        return f"http://{HOST}:{self.port}/apis/ccompat/v7"

    @property
    def api_url(self) -> str:
        """Apicurio's own API: what its converters register schemas through."""
        return f"http://{HOST}:{self.port}/apis/registry/v2"

    def prepare(self) -> None:
        if install.registry_runner() is None:
            raise TestbedError(f"test bed: Apicurio Registry is not unpacked in {install.REGISTRY_HOME}; run `make testbed`")
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(exist_ok=True)

    def launch(self, die_with_parent: bool = True) -> None:
        runner = install.registry_runner()
        assert runner is not None
        env = {
            **os.environ,
            "HTTP_PORT": str(self.port),
            "QUARKUS_HTTP_HOST": HOST,
            # A file, not the distribution's in-memory default: a restarted registry keeps its schemas.
            "REGISTRY_DATASOURCE_URL": f"jdbc:h2:file:{self.root / 'data' / 'registry'}",
            # The production profile opens 20 connections at start (min-size); one bed's few schemas need two.
            "_PROD_QUARKUS_DATASOURCE_JDBC_MIN_SIZE": "2",
            "_PROD_QUARKUS_DATASOURCE_JDBC_INITIAL_SIZE": "2",
            "_PROD_QUARKUS_DATASOURCE_JDBC_MAX_SIZE": "10",
        }
        tmp = self.root / "tmp"
        self.service = Service("schema registry", self.root / "registry.log")
        self.service.launch(
            [self.java, *JVM_FLAGS, f"-Djava.io.tmpdir={tmp}", f"-Dvertx.cacheDirBase={tmp / 'vertx'}", "-jar", str(runner)],
            env=env,
            cwd=self.root,
            die_with_parent=die_with_parent,
        )

    def request(self, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        """GET a path of the Confluent-compatible API; (status, parsed JSON body)."""
        req = urllib.request.Request(self.url + path, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as err:
            body = err.read()
            try:
                return err.code, json.loads(body or b"null")
            except ValueError:
                return err.code, body.decode(errors="replace")

    def healthy(self) -> bool:
        """The port answers and the ccompat API lists subjects (so the store is open)."""
        return port_open(self.port) and self.request("/subjects", timeout=3)[0] == 200

    def wait_ready(self, timeout: float = 90.0) -> None:
        assert self.service is not None
        self.service.wait_until(self.healthy, "waiting for the registry's /apis/ccompat/v7/subjects", timeout)

    def subjects(self) -> list[str]:
        status, body = self.request("/subjects")
        if status != 200:
            raise TestbedError(f"test bed: the registry answered HTTP {status} to /subjects: {body}")
        return list(body)

    def avro_converter_config(self) -> dict[str, str]:
        """The key and value converter properties that make a connector write Avro to this registry, in
        Confluent's wire format (what `.stack/avro-converter.json` holds; merge them into a connector's config)."""
        config: dict[str, str] = {}
        for side in ("key", "value"):
            prefix = f"{side}.converter"
            config[prefix] = AVRO_CONVERTER
            config.update({
                f"{prefix}.apicurio.registry.url": self.api_url,
                f"{prefix}.apicurio.registry.auto-register": "true",
                f"{prefix}.apicurio.registry.find-latest": "true",
                f"{prefix}.apicurio.registry.as-confluent": "true",
                f"{prefix}.apicurio.registry.use-id": "contentId",
                f"{prefix}.apicurio.registry.headers.enabled": "false",
            })
        return config
