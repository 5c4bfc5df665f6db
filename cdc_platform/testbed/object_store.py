"""An S3-compatible server on loopback for the object-store lake: moto's server, in a process of its own.

Its own process, not moto's in-process thread: delta-rs holds the GIL in some calls that wait on the
network (`DeltaTable.is_deltatable`), so a server thread in the same interpreter cannot answer them and
the call hangs until its 180 s timeout. moto keeps everything in memory; stopping the process drops it.

    with S3Server.start(work_dir) as s3:
        s3.create_bucket("lake")
        config = load_config(path, environ=s3.environ())   # with `object_store: {endpoint: s3.endpoint, ...}`
"""

from __future__ import annotations

import sys
import urllib.request
from pathlib import Path
from types import TracebackType

from cdc_platform.testbed.process import HOST, Service, free_ports

#: moto accepts any credentials; these are the ones its documentation uses.
ACCESS_KEY = "testing"
SECRET_KEY = "testing"
REGION = "us-east-1"


class S3Server:
    def __init__(self, service: Service, port: int) -> None:
        self.service = service
        self.port = port

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @classmethod
    def start(cls, work_dir: Path, timeout: float = 60.0) -> S3Server:
        port = free_ports(1)[0]
        service = Service("s3 (moto)", work_dir / "s3.log")
        service.launch([sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)], cwd=work_dir)
        server = cls(service, port)
        try:
            service.wait_until(server.ready, f"waiting for {server.endpoint}", timeout)
        except BaseException:
            service.stop(kill=True)
            raise
        return server

    def ready(self) -> bool:
        with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2) as resp:
            return bool(resp.status == 200)

    def object_store(self) -> dict[str, object]:
        """The `object_store:` entry of a cdc.yaml whose lake is on this server."""
        return {"endpoint": self.endpoint, "region": REGION, "path_style_access": True}

    def environ(self) -> dict[str, str]:
        """The credentials, as the environment would give them (`load_config(..., environ=...)`)."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION, aws_access_key_id=ACCESS_KEY,
                     aws_secret_access_key=SECRET_KEY).create_bucket(Bucket=name)

    def stop(self) -> None:
        self.service.stop()

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
