"""`schema_registry.SchemaRegistry`: each id read once and kept, a 404 not kept, basic auth, retries, and the
errors that stop a run (the registry refusing the credentials, or not answering)."""

from __future__ import annotations

import pytest

from cdc_platform.sources.schema_registry import SchemaRegistry, SchemaRegistryError, SchemaRegistryUnavailable
from cdc_platform.testbed.process import free_ports
from tests.cdc_platform.registry_stub import stub_registry

AVRO = '{"type":"record","name":"K","fields":[{"name":"id","type":"int"}]}'


def test_each_id_is_read_once_and_kept() -> None:
    with stub_registry({1: AVRO, 2: {"schema": AVRO, "schemaType": "PROTOBUF"}}) as reg:
        client = SchemaRegistry(reg.url)
        first = client.schemas([1, 2, 1])
        assert first[1] is not None and first[1].text == AVRO and first[1].schema_type == "AVRO"
        assert first[2] is not None and first[2].schema_type == "PROTOBUF"
        assert client.schemas([2, 1]) == first
        assert reg.requests == ["/schemas/ids/1", "/schemas/ids/2"]


def test_an_unknown_id_is_none_and_asked_again_later() -> None:
    with stub_registry({1: AVRO}) as reg:
        client = SchemaRegistry(reg.url)
        assert client.schemas([7]) == {7: None}
        reg.schemas[7] = {"schema": AVRO, "references": [{"name": "x", "subject": "s", "version": 3}]}
        found = client.schemas([7])[7]
        assert found is not None and found.references == ("s:3",)
        assert reg.requests == ["/schemas/ids/7", "/schemas/ids/7"]


def test_basic_auth_is_sent_and_a_refusal_names_the_settings() -> None:
    with stub_registry({1: AVRO}, auth=("cdc", "s3cret")) as reg:
        assert SchemaRegistry(reg.url, user="cdc", password="s3cret").schemas([1])[1] is not None
        with pytest.raises(SchemaRegistryError, match="HTTP 401.*schema_registry_user") as err:
            SchemaRegistry(reg.url, user="cdc", password="wrong").schemas([1])
        assert not isinstance(err.value, SchemaRegistryUnavailable) and "s3cret" not in str(err.value)


def test_server_errors_are_retried_then_stop_the_run() -> None:
    pauses: list[float] = []
    with stub_registry({1: AVRO}) as reg:
        reg.fail_next = [503, 500]
        assert SchemaRegistry(reg.url, sleep=pauses.append).schemas([1])[1] is not None
        assert pauses == [0.5, 1.0]
        reg.fail_next = [503] * 4
        with pytest.raises(SchemaRegistryUnavailable, match="after 4 attempts.*HTTP 503.*replays"):
            SchemaRegistry(reg.url, sleep=pauses.append).schemas([1])


def test_an_unreachable_registry_stops_the_run() -> None:
    port = free_ports(1)[0]  # nothing listens there
    client = SchemaRegistry(f"http://127.0.0.1:{port}", attempts=2, sleep=lambda _s: None)
    with pytest.raises(SchemaRegistryUnavailable, match=rf"127.0.0.1:{port} did not answer for schema id 5 after 2 attempts"):
        client.schemas([5])
    assert client.lookups == 2


def test_a_url_that_is_no_registry_says_so() -> None:
    with stub_registry({}) as reg:
        reg.fail_next = [400]
        with pytest.raises(SchemaRegistryError, match="HTTP 400.*Confluent-compatible API"):
            SchemaRegistry(reg.url).schemas([1])
        reg.schemas[2] = {"not": "a schema"}
        with pytest.raises(SchemaRegistryError, match="not a schema"):
            SchemaRegistry(reg.url).schemas([2])


def test_a_subjects_versions_are_read_once_each_and_their_ids_kept() -> None:
    """The Avro decode reads its topics' subjects before the first batch; a later call reads only new versions.
    Each version's id is read by `/schemas/ids/<id>`, the path a record's id is read by, and kept."""
    other = '{"type":"record","name":"K","fields":[{"name":"id","type":"int"},{"name":"x","type":["null","int"],"default":null}]}'
    with stub_registry({4: AVRO, 9: other}, subjects={"pg.public.t-value": [4]}) as reg:
        client = SchemaRegistry(reg.url)
        assert [(s.schema_id, s.text) for s in client.subject_schemas("pg.public.t-value")] == [(4, AVRO)]
        reg.subjects["pg.public.t-value"].append(9)  # a column added: version 2
        assert [s.schema_id for s in client.subject_schemas("pg.public.t-value")] == [4, 9]
        assert client.subject_schemas("pg.public.t-key") == []  # no such subject
        assert client.schemas([4, 9])[9] is not None
        assert reg.requests == ["/subjects/pg.public.t-value/versions", "/subjects/pg.public.t-value/versions/1", "/schemas/ids/4",
                                "/subjects/pg.public.t-value/versions", "/subjects/pg.public.t-value/versions/2", "/schemas/ids/9",
                                "/subjects/pg.public.t-key/versions"]


def test_a_subject_the_registry_cannot_answer_stops_the_run() -> None:
    with stub_registry({4: AVRO}, subjects={"t-value": [4]}) as reg:
        reg.fail_next = [503] * 2
        with pytest.raises(SchemaRegistryUnavailable, match="did not answer for subject t-value after 2 attempts.*replays"):
            SchemaRegistry(reg.url, attempts=2, sleep=lambda _s: None).subject_schemas("t-value")
        reg.fail_next = [403]
        with pytest.raises(SchemaRegistryError, match="HTTP 403.*schema_registry_user"):
            SchemaRegistry(reg.url).subject_schemas("t-value")
