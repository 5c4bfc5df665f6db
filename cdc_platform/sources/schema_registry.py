"""A schema registry's Confluent-compatible REST API, read by id: what an Avro record's schema id names.

Confluent's wire format puts a 4-byte schema id in front of each record's Avro bytes; the registry
serves that id's schema at `GET <url>/schemas/ids/<id>`, the one path every Confluent-compatible
registry answers (Confluent Schema Registry, Apicurio Registry's `/apis/ccompat/v7`, Karapace, Redpanda).
An id names one schema forever (a registry never reuses it), so a schema read once is kept for the
process: the ingest job asks only for the ids it has not seen, once per micro-batch, from the driver.
Before its first batch it also reads its topics' subjects (`GET <url>/subjects/<subject>/versions` and
each version, which names its id and schema), so that a stream's batches can be decoded with the ids
already known, without first collecting the ids each names (`avro_decode.AvroLines`).

What can happen, and what becomes of it:

* 200: the schema text, its type (`schemaType`, absent for Avro) and its references;
* 404: the registry does not know the id. That is about the data (a record written against another
  registry, a schema deleted since), so its records become dead letters (`avro_decode`); the answer is
  not kept, so a later batch asks again;
* 401/403: the credentials are wrong or missing: `SchemaRegistryError`, which stops the run and says
  which settings to check;
* no answer, a 5xx, a 429: tried `attempts` times with a growing pause, then
  `SchemaRegistryUnavailable`, which stops the run before the batch commits anything, so the batch
  replays from the stream's checkpoint once the registry is back.

Basic-auth credentials come from the config, which took them from the environment; they are sent as an
`Authorization` header and never written anywhere.
"""

from __future__ import annotations

import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from cdc_platform.errors import CdcError

#: How many schemas the process keeps (an id's schema never changes; this only bounds memory).
CACHE_LIMIT = 10_000
DEFAULT_ATTEMPTS = 4
DEFAULT_TIMEOUT = 10.0


class SchemaRegistryError(CdcError):
    """The schema registry refused the platform or answered what no registry should (not a missing id:
    those records are dead letters); the message says what to check."""


class SchemaRegistryUnavailable(SchemaRegistryError):
    """The schema registry did not answer (or answered 5xx) after every attempt: the micro-batch is not
    committed and replays from the checkpoint when the stream starts again with the registry back."""


@dataclass(frozen=True)
class RegistrySchema:
    """What a schema id names in the registry."""

    schema_id: int
    text: str
    schema_type: str = "AVRO"  # AVRO, PROTOBUF or JSON (the API leaves it out for Avro)
    references: tuple[str, ...] = ()  # `subject:version` of each schema reference


@dataclass
class SchemaRegistry:
    """A registry's `/schemas/ids/<id>` by base URL (`url` ends before `/schemas`), with the schemas it has read."""

    url: str
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    timeout: float = DEFAULT_TIMEOUT
    attempts: int = DEFAULT_ATTEMPTS
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    _known: dict[int, RegistrySchema] = field(default_factory=dict, repr=False)
    _versions: dict[str, dict[int, int]] = field(default_factory=dict, repr=False)  # subject -> version -> id, read
    lookups: int = 0  # requests made (a test reads it: each id once)

    def schemas(self, ids: Iterable[int]) -> dict[int, RegistrySchema | None]:
        """Each id's schema; None for an id the registry does not know (404). Raises when it cannot be asked."""
        found: dict[int, RegistrySchema | None] = {}
        for schema_id in sorted(set(ids)):
            known = self._known.get(schema_id)
            if known is None:
                known = self._fetch(schema_id)
                if known is not None:
                    self._keep(known)
            found[schema_id] = known
        return found

    def subject_schemas(self, subject: str) -> list[RegistrySchema]:
        """Every schema registered under `subject` (`GET /subjects/<subject>/versions`, then each version not
        read before); [] when the registry has no such subject. The Avro decode asks for its topics' subjects
        (`<topic>-value` and `<topic>-key`, the converters' default naming) before the first batch, so it
        need not read a batch twice to learn the ids it names (`avro_decode.AvroLines`)."""
        base = f"{self.url.rstrip('/')}/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        raw = self._get(base, f"subject {subject}")
        if raw is None:
            return []
        try:
            versions = [int(v) for v in json.loads(raw)]
        except (ValueError, TypeError) as exc:
            raise SchemaRegistryError(f"{base} answered what is not a list of versions ({exc}: {raw[:200]!r}); "
                                      "is source.schema_registry_url the registry's Confluent-compatible API?") from None
        read = self._versions.setdefault(subject, {})
        for version in versions:
            if version in read:
                continue
            where = f"{base}/{version}"
            body = self._get(where, f"subject {subject} version {version}")
            if body is None:  # deleted between the two requests
                continue
            try:
                read[version] = int(json.loads(body)["id"])
            except (ValueError, KeyError, TypeError) as exc:
                raise SchemaRegistryError(f"{where} answered what is not a subject version ({exc}: {body[:200]!r}); "
                                          "is source.schema_registry_url the registry's Confluent-compatible API?") from None
        # The schemas themselves come from `/schemas/ids/<id>`, the path a record's id is read by: were a registry's
        # versions to name ids of another kind (a global id beside content ids), an id would still get its own schema.
        found = self.schemas(read.values())
        return [found[i] for i in sorted(set(read.values())) if found[i] is not None]  # type: ignore[misc]

    def _keep(self, schema: RegistrySchema) -> None:
        if len(self._known) >= CACHE_LIMIT:
            self._known.clear()
            self._versions.clear()
        self._known[schema.schema_id] = schema

    def _fetch(self, schema_id: int) -> RegistrySchema | None:
        where = f"{self.url.rstrip('/')}/schemas/ids/{schema_id}"
        raw = self._get(where, f"schema id {schema_id}")
        return None if raw is None else _schema(schema_id, raw, where)

    def _get(self, where: str, what: str) -> bytes | None:
        """The body of a GET, None on 404; raises on refusals, and when the registry does not answer after every attempt."""
        headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if self.user is not None:
            token = base64.b64encode(f"{self.user}:{self.password or ''}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        pause = 0.5
        problem = ""
        for attempt in range(1, self.attempts + 1):
            self.lookups += 1
            try:
                with urllib.request.urlopen(urllib.request.Request(where, headers=headers), timeout=self.timeout) as resp:
                    return resp.read()  # type: ignore[no-any-return]
            except urllib.error.HTTPError as err:
                if err.code == 404:
                    return None
                if err.code in (401, 403):
                    raise SchemaRegistryError(
                        f"the schema registry refused {where} (HTTP {err.code}): check source.schema_registry_user and "
                        "schema_registry_password (the environment variables they name)") from None
                if err.code < 500 and err.code != 429:
                    raise SchemaRegistryError(f"the schema registry answered HTTP {err.code} to {where}: {_body(err)}; "
                                              "is source.schema_registry_url the registry's Confluent-compatible API?") from None
                problem = f"HTTP {err.code}: {_body(err)}"
            except (urllib.error.URLError, OSError) as err:  # refused, reset, timed out, name not found
                problem = str(getattr(err, "reason", err))
            if attempt < self.attempts:
                self.sleep(pause)
                pause *= 2
        raise SchemaRegistryUnavailable(
            f"the schema registry at {self.url} did not answer for {what} after {self.attempts} attempts "
            f"({problem}); nothing of this micro-batch was committed: start the stream again once the registry is back "
            "and the batch replays")


def _schema(schema_id: int, raw: bytes, where: str) -> RegistrySchema:
    try:
        body = json.loads(raw)
        text = body["schema"]
        if not isinstance(text, str):
            raise TypeError("schema is not a string")
    except (ValueError, KeyError, TypeError) as exc:
        raise SchemaRegistryError(f"{where} answered what is not a schema ({exc}: {raw[:200]!r}); "
                                  "is source.schema_registry_url the registry's Confluent-compatible API?") from None
    refs = tuple(f"{r.get('subject')}:{r.get('version')}" for r in body.get("references") or () if isinstance(r, dict))
    return RegistrySchema(schema_id=schema_id, text=text, schema_type=str(body.get("schemaType") or "AVRO").upper(), references=refs)


def _body(err: urllib.error.HTTPError) -> str:
    try:
        return err.read()[:200].decode("utf-8", "replace")
    except OSError:
        return ""
