"""A schema registry's `GET /schemas/ids/<id>` (and `/subjects/<subject>/versions[/<version>]`) on a loopback port, for the tests of the client and the
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
from urllib.parse import unquote


@dataclass
class StubRegistry:
    schemas: dict[int, dict[str, Any]]  # id -> the JSON body of /schemas/ids/<id>
    subjects: dict[str, list[int]] = field(default_factory=dict)  # subject -> the ids of its versions 1, 2, ...
    auth: tuple[str, str] | None = None
    fail_next: list[int] = field(default_factory=list)  # statuses to answer the next requests with
    requests: list[str] = field(default_factory=list)
    url: str = ""


@contextmanager
def stub_registry(
    schemas: Mapping[int, str | dict[str, Any]], auth: tuple[str, str] | None = None, subjects: Mapping[str, list[int]] | None = None,
) -> Iterator[StubRegistry]:
    """Serve `schemas` (id -> Avro schema text, or a whole response body), and `subjects` (subject -> the ids of
    its versions, in order), until the block ends."""
    state = StubRegistry({i: (s if isinstance(s, dict) else {"schema": s}) for i, s in schemas.items()},
                         subjects={k: list(v) for k, v in (subjects or {}).items()}, auth=auth)

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
            parts = self.path.split("/")  # "", "subjects", <subject>, "versions"[, <version>]
            if self.path.startswith(prefix) and self.path[len(prefix):].isdigit() and int(self.path[len(prefix):]) in state.schemas:
                self.answer(200, state.schemas[int(self.path[len(prefix):])])
            elif len(parts) in (4, 5) and parts[1] == "subjects" and parts[3] == "versions" and unquote(parts[2]) in state.subjects:
                ids = state.subjects[unquote(parts[2])]
                if len(parts) == 4:
                    self.answer(200, list(range(1, len(ids) + 1)))
                elif parts[4].isdigit() and 1 <= int(parts[4]) <= len(ids):
                    schema_id = ids[int(parts[4]) - 1]
                    self.answer(200, {"subject": unquote(parts[2]), "version": int(parts[4]), "id": schema_id, **state.schemas[schema_id]})
                else:
                    self.answer(404, {"error_code": 40402, "message": "Version not found"})
            elif len(parts) >= 3 and parts[1] == "subjects":
                self.answer(404, {"error_code": 40401, "message": "Subject not found"})
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
