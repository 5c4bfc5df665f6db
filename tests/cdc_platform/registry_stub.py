"""A schema registry's `GET /schemas/ids/<id>` on a loopback port, for the tests of the client and the
decoder that need no test bed: it serves the schemas it is given, counts requests, and can demand basic
auth or fail the next requests on purpose. (The end-to-end tests use the test bed's Apicurio Registry.)"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class StubRegistry:
    schemas: dict[int, dict[str, Any]]  # id -> the JSON body of /schemas/ids/<id>
    auth: tuple[str, str] | None = None
    fail_next: list[int] = field(default_factory=list)  # statuses to answer the next requests with
    requests: list[str] = field(default_factory=list)
    url: str = ""


@contextmanager
def stub_registry(schemas: Mapping[int, str | dict[str, Any]], auth: tuple[str, str] | None = None) -> Iterator[StubRegistry]:
    """Serve `schemas` (id -> Avro schema text, or a whole response body) until the block ends."""
    state = StubRegistry({i: (s if isinstance(s, dict) else {"schema": s}) for i, s in schemas.items()}, auth=auth)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def answer(self, status: int, body: Any) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            state.requests.append(self.path)
            if state.fail_next:
                self.answer(state.fail_next.pop(0), {"error_code": 50001, "message": "failing on purpose"})
                return
            if state.auth is not None:
                expected = "Basic " + base64.b64encode(f"{state.auth[0]}:{state.auth[1]}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    self.answer(401, {"error_code": 40101, "message": "Unauthorized"})
                    return
            prefix = "/schemas/ids/"
            if self.path.startswith(prefix) and self.path[len(prefix):].isdigit() and int(self.path[len(prefix):]) in state.schemas:
                self.answer(200, state.schemas[int(self.path[len(prefix):])])
            else:
                self.answer(404, {"error_code": 40403, "message": "Schema not found"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
