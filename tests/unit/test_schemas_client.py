"""The shared schema registry client (kanal_schemas) against the repository's test registry.

The registry is :class:`kanal_registry_proxy.testing.registry.Registry` (pinned to captured Karapace
traffic), served over HTTP in the test's own trio run; schemas are registered by calling its handler
directly. Caches expire on an injected clock, never on sleeps. Karapace has no GUIDs: the GUID tests
serve a subclass answering Confluent's GUID routes.
"""

from __future__ import annotations

import base64
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import fastavro
import orjson
import pytest
import trio
from kanal_registry_proxy.testing import Registry, TestRegistry, serve
from kanal_registry_proxy.testing.registry import VND
from kanal_schemas import (
    HttpClient,
    HttpResponse,
    RegistryUnavailable,
    SchemaNotFound,
    SchemaRegistryClient,
    TlsSettings,
    frame,
    guid_header,
    header_ref,
    id_header,
    prefix_ref,
    split,
)

Headers = list[tuple[bytes, bytes]]
GUIDS = uuid.UUID("6ba7b810-9dad-11d1-80b4-00c04fd430c8")


def guid_of(schema_id: int) -> str:
    return str(uuid.uuid5(GUIDS, str(schema_id)))


class GuidRegistry(Registry):
    """The test registry with Confluent's ``/schemas/guids/{guid}`` and ``/schemas/guids/{guid}/ids``
    (a schema's GUID: uuid5 of its id)."""

    def handle(
        self, method: str, raw_path: bytes, query: bytes, headers: Headers, body: bytes
    ) -> tuple[int, Headers, bytes]:
        parts = raw_path.decode().strip("/").split("/")
        if method == "GET" and parts[:2] == ["schemas", "guids"] and len(parts) in (3, 4):
            found = next((i for i in list(self.schemas) if guid_of(i) == parts[2]), None)
            if found is None:
                return 404, [(b"content-type", VND.encode())], b'{"error_code":40403,"message":"Schema not found"}'
            if len(parts) == 4:
                return 200, [(b"content-type", VND.encode())], orjson.dumps([{"id": found, "context": "."}])
            return super().handle(method, f"/schemas/ids/{found}".encode(), query, headers, body)
        return super().handle(method, raw_path, query, headers, body)


def register(
    registry: Registry, subject: str, schema: Any, *, schema_type: str = "AVRO", references: Any = (), user: str = ""
) -> int:
    document: dict[str, Any] = {"schema": json.dumps(schema), "schemaType": schema_type}
    if references:
        document["references"] = list(references)
    headers = [(b"content-type", VND.encode())]
    if user:
        headers.append((b"authorization", b"Basic " + base64.b64encode(user.encode())))
    status, _, body = registry.handle(
        "POST", f"/subjects/{subject}/versions".encode(), b"", headers, json.dumps(document).encode()
    )
    assert status == 200, body
    return int(orjson.loads(body)["id"])


def record(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "record",
        "name": name,
        "namespace": "test",
        "fields": [{"name": k, "type": v} for k, v in fields.items()],
    }


@asynccontextmanager
async def served(registry: Registry) -> AsyncIterator[str]:
    """``registry`` on a free local port for the duration; yields its URL."""
    async with trio.open_nursery() as nursery:
        bound: str = await nursery.start(serve, registry)
        yield "http://" + bound.split("//")[-1]
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def listener(handler: Callable[[trio.SocketStream], Awaitable[None]]) -> AsyncIterator[str]:
    """A TCP server running ``handler`` on each connection; yields its URL."""
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        yield f"http://127.0.0.1:{port}"
        nursery.cancel_scope.cancel()


def dead_url() -> str:
    """A local port nothing listens on (connections are refused)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- framing --------------------------------------------------------------------------------------


def test_confluent_framing_and_the_header_forms() -> None:
    framed = frame(258, b"body")
    assert framed == b"\x00\x00\x00\x01\x02body"
    assert prefix_ref(framed) == 258 and split(framed) == (258, b"body")
    assert prefix_ref(b"{}") is None and prefix_ref(None) is None and split(b"\x01\x00\x00\x00\x01x") is None
    guid = str(uuid.uuid4())
    assert header_ref(guid_header(guid)) == guid  # magic 1 + 16 bytes (confluent-kafka)
    assert header_ref(uuid.UUID(guid).bytes) == guid  # a bare 16-byte GUID
    assert header_ref(guid.encode()) == guid  # the GUID as text
    assert header_ref(id_header(7)) == 7 and header_ref(b"\x00\x00\x00\x07") == 7 and header_ref(b" 7 ") == 7
    assert header_ref(b"1234567890123456") == 1234567890123456  # 16 digits: an id as text, not a GUID
    assert header_ref(b"not a ref") is None and header_ref(b"\xff\xfe") is None and header_ref(None) is None


# -- lookups and caches ---------------------------------------------------------------------------


def test_schemas_by_id_are_cached_with_their_type() -> None:
    registry = Registry()
    avro_id = register(registry, "orders-value", record("Order", id="long"))
    json_id = register(registry, "events-value", {"type": "object"}, schema_type="JSON")

    async def main() -> None:
        async with served(registry) as url:
            client = SchemaRegistryClient(url)
            schema = await client.schema_by_id(avro_id)
            assert schema.id == avro_id and schema.schema_type == "AVRO" and json.loads(schema.text)["name"] == "Order"
            assert (await client.schema_by_id(json_id)).schema_type == "JSON"
            before = registry.requests
            assert await client.schema_by_id(avro_id) is schema  # the cache answers
            assert client.cached(avro_id) is schema and client.cached(999) is None
            assert registry.requests == before
            await client.aclose()

    trio.run(main)


def test_the_found_cache_is_bounded_least_recently_used_first() -> None:
    registry = Registry()
    ids = [register(registry, f"s{n}-value", record(f"R{n}", id="long")) for n in range(3)]

    async def main() -> None:
        async with served(registry) as url:
            client = SchemaRegistryClient(url, cache_size=2)
            for schema_id in ids:
                await client.schema_by_id(schema_id)
            assert client.cached(ids[0]) is None and client.cached(ids[2]) is not None
            before = client.lookups
            await client.schema_by_id(ids[0])
            assert client.lookups == before + 1
            await client.aclose()

    trio.run(main)


def test_unknown_ids_are_remembered_until_the_negative_ttl_expires() -> None:
    registry = Registry()
    clock = Clock()

    async def main() -> None:
        async with served(registry) as url:
            client = SchemaRegistryClient(url, negative_ttl=5.0, clock=clock)
            with pytest.raises(SchemaNotFound, match="schema id 1 is not in the schema registry"):
                await client.schema_by_id(1)
            assert register(registry, "late-value", record("Late", id="long")) == 1
            before = registry.requests
            clock.now += 4.9
            with pytest.raises(SchemaNotFound):  # still remembered: the registry is not asked
                await client.schema_by_id(1)
            assert isinstance(client.cached(1), SchemaNotFound) and registry.requests == before
            clock.now += 0.1
            assert client.cached(1) is None
            assert (await client.schema_by_id(1)).id == 1
            assert registry.requests == before + 1
            await client.aclose()

    trio.run(main)


def test_failures_are_remembered_for_the_failure_ttl_then_retried() -> None:
    clock = Clock()

    async def main() -> None:
        client = SchemaRegistryClient(dead_url(), failure_ttl=1.0, negative_ttl=5.0, clock=clock)
        with pytest.raises(RegistryUnavailable, match="cannot connect to the schema registry") as failure:
            await client.schema_by_id(1)
        assert failure.value.response is None and not failure.value.timeout
        assert client.lookups == 1
        with pytest.raises(RegistryUnavailable):
            await client.schema_by_id(1)
        assert client.lookups == 1  # the failure answered
        clock.now += 1.0
        with pytest.raises(RegistryUnavailable):
            await client.schema_by_id(1)
        assert client.lookups == 2

    trio.run(main)


def test_a_registry_that_does_not_answer_in_time() -> None:
    async def silent(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async def main() -> None:
        async with listener(silent) as url:
            client = SchemaRegistryClient(url, timeout=0.2)
            with pytest.raises(RegistryUnavailable, match=r"did not answer within 0\.2 s") as failure:
                await client.schema_by_id(1)
            assert failure.value.timeout

    trio.run(main)


def test_failover_between_urls_sticks_to_the_url_that_answered() -> None:
    registry = Registry()
    first = register(registry, "a-value", record("A", id="long"))
    second = register(registry, "b-value", record("B", id="long"))
    accepted: list[int] = []

    async def hang_up(stream: trio.SocketStream) -> None:  # a broken registry: accepts, then closes
        accepted.append(1)
        await stream.aclose()

    async def main() -> None:
        async with listener(hang_up) as broken, served(registry) as url:
            client = SchemaRegistryClient(f"{dead_url()},{broken},{url}")
            assert (await client.schema_by_id(first)).id == first
            assert len(accepted) == 1
            assert (await client.schema_by_id(second)).id == second  # starts with the URL that answered
            assert len(accepted) == 1
            await client.aclose()
            everything_down = SchemaRegistryClient([dead_url(), broken])
            with pytest.raises(RegistryUnavailable) as failure:
                await everything_down.schema_by_id(first)
            assert "cannot connect" in str(failure.value) and "closed the connection" in str(failure.value)

    trio.run(main)


def test_basic_auth() -> None:
    registry = Registry({"gw": "pw"}, [{"username": "gw", "operation": "Write", "resource": ".*"}])
    schema_id = register(registry, "orders-value", record("Order", id="long"), user="gw:pw")

    async def main() -> None:
        async with served(registry) as url:
            with pytest.raises(RegistryUnavailable, match="HTTP 401 for schema id") as failure:
                await SchemaRegistryClient(url).schema_by_id(schema_id)
            assert failure.value.status == 401
            with pytest.raises(RegistryUnavailable, match="HTTP 401"):
                await SchemaRegistryClient(url, user_info="gw:wrong").schema_by_id(schema_id)
            assert (await SchemaRegistryClient(url, user_info="gw:pw").schema_by_id(schema_id)).id == schema_id
            with_credentials = url.replace("http://", "http://gw:pw@")
            assert (await SchemaRegistryClient(with_credentials).schema_by_id(schema_id)).id == schema_id
            assert next(v for k, v in registry.seen[-1][3] if k == b"authorization") == b"Basic " + base64.b64encode(
                b"gw:pw"
            )

    trio.run(main)


def test_references_are_resolved_each_before_its_users() -> None:
    registry = Registry()
    register(registry, "address", record("Address", street="string"))
    register(
        registry,
        "customer",
        record("Customer", full_name="string", address="test.Address"),
        references=[{"name": "test.Address", "subject": "address", "version": 1}],
    )
    order_id = register(
        registry,
        "orders-value",
        record("Order", customer="test.Customer", billing="test.Address"),
        references=[
            {"name": "test.Customer", "subject": "customer", "version": 1},
            {"name": "test.Address", "subject": "address", "version": 1},
        ],
    )

    async def main() -> None:
        async with served(registry) as url:
            client = SchemaRegistryClient(url)
            order = await client.schema_by_id(order_id)
            assert [(r.name, r.subject, r.version) for r in order.references] == [
                ("test.Customer", "customer", 1),
                ("test.Address", "address", 1),
            ]
            referenced = await client.references(order)
            assert [(s.subject, s.version) for s in referenced] == [("address", 1), ("customer", 1)]
            named: dict[str, Any] = {}
            for schema in referenced:
                fastavro.parse_schema(json.loads(schema.text), named_schemas=named)
            fastavro.parse_schema(json.loads(order.text), named_schemas=named)  # parses: nothing missing
            before = registry.requests
            assert [s.subject for s in await client.references(order)] == ["address", "customer"]
            assert registry.requests == before  # subject versions are cached
            latest = await client.subject_version("customer")  # "latest" is asked every time
            assert latest.subject == "customer" and latest.version == 1 and registry.requests == before + 1
            with pytest.raises(SchemaNotFound, match="subject nothing version 1"):
                await client.subject_version("nothing", 1)
            await client.aclose()

    trio.run(main)


# -- who holds a schema ---------------------------------------------------------------------------


def test_subject_lists_are_kept_until_refreshed_or_expired() -> None:
    registry = Registry()
    clock = Clock()
    schema = record("Order", id="long")
    schema_id = register(registry, "a-value", schema)
    register(registry, "b-value", schema)

    async def main() -> None:
        async with served(registry) as url:
            client = SchemaRegistryClient(url, subjects_ttl=300.0, clock=clock)
            assert await client.subjects_of_id(schema_id) == ["a-value", "b-value"]
            register(registry, "c-value", schema)
            before = registry.requests
            assert await client.subjects_of_id(schema_id) == ["a-value", "b-value"]  # cached
            assert client.cached_subjects_of_id(schema_id) == ["a-value", "b-value"]
            assert registry.requests == before
            assert await client.subjects_of_id(schema_id, refresh=True) == ["a-value", "b-value", "c-value"]
            assert registry.seen[-1][1:3] == (f"/schemas/ids/{schema_id}/versions".encode(), b"")
            await client.subjects_of_id(schema_id, deleted=True, context=":.ctx:")  # another key, asked
            assert registry.seen[-1][2] == b"deleted=true&subject=:.ctx:"
            clock.now += 300.0
            assert client.cached_subjects_of_id(schema_id) is None
            # an unknown id holds no subject (Karapace answers []), and an empty list is not kept
            assert await client.subjects_of_id(999) == [] and client.cached_subjects_of_id(999) is None
            await client.aclose()

    trio.run(main)


def test_guids() -> None:
    registry = GuidRegistry()
    schema = record("Order", id="long")
    schema_id = register(registry, "a-value", schema)
    register(registry, "b-value", schema)
    guid = guid_of(schema_id)

    async def main() -> None:
        async with served(registry) as url:
            client = SchemaRegistryClient(url)
            found = await client.schema_by_guid(guid)
            assert found.guid == guid and json.loads(found.text)["name"] == "Order"
            assert await client.schema(guid) is found and client.cached(guid) is found
            assert await client.ids_of_guid(guid) == [(".", schema_id)]
            assert await client.subjects_of_guid(guid) == ["a-value", "b-value"]
            before = registry.requests
            assert client.cached_ids_of_guid(guid) == [(".", schema_id)]
            assert await client.subjects_of_guid(guid) == ["a-value", "b-value"]
            assert registry.requests == before
            unknown = str(uuid.uuid4())
            with pytest.raises(SchemaNotFound, match=f"schema GUID {unknown} is not in the schema registry"):
                await client.schema_by_guid(unknown)
            await client.aclose()

    trio.run(main)


def test_a_registry_without_guids_gives_its_404() -> None:
    registry = Registry()  # Karapace's dialect: no GUID routes

    async def main() -> None:
        async with served(registry) as url:
            client = SchemaRegistryClient(url)
            with pytest.raises(SchemaNotFound) as failure:
                await client.ids_of_guid(str(uuid.uuid4()))
            assert failure.value.response is not None and failure.value.response.status == 404
            assert orjson.loads(failure.value.response.body) == "Not Found"

    trio.run(main)


def test_a_call_of_the_caller_replaces_the_clients_own() -> None:
    registry = Registry()
    schema_id = register(registry, "a-value", record("A", id="long"))
    routes: list[str] = []

    async def main() -> None:
        async with served(registry) as url:
            http = HttpClient.for_url(url)
            client = SchemaRegistryClient(transports=[http])

            async def send(method: str, target: bytes, route: str) -> HttpResponse:
                routes.append(route)
                return await http.request(method, target, [(b"accept", VND.encode())])

            assert await client.subjects_of_id(schema_id, send=send) == ["a-value"]
            assert (await client.schema_by_id(schema_id, send=send)).id == schema_id
            assert routes == ["/schemas/ids/{id}/versions", "/schemas/ids/{id}"]
            await http.aclose()

    trio.run(main)


# -- connections ------------------------------------------------------------------------------------


def test_a_client_kept_between_trio_runs() -> None:
    """Kept-alive connections belong to the trio run that opened them: the next run opens its own."""
    with TestRegistry() as running:
        assert running.registry is not None
        first = register(running.registry, "a-value", record("A", id="long"))
        second = register(running.registry, "b-value", record("B", id="long"))
        client = SchemaRegistryClient(running.url)
        assert trio.run(client.schema_by_id, first).id == first
        assert trio.run(client.schema_by_id, second).id == second


def test_tls_settings() -> None:
    strict = TlsSettings().context()
    assert strict.verify_mode == ssl.CERT_REQUIRED and strict.check_hostname
    other_host = TlsSettings(check_hostname=False).context()
    assert other_host.verify_mode == ssl.CERT_REQUIRED and not other_host.check_hostname
    anything = TlsSettings(check_hostname=False, verify=False).context()
    assert anything.verify_mode == ssl.CERT_NONE
    with pytest.raises(OSError):
        TlsSettings(certificate_location="/nonexistent/client.pem").context()
