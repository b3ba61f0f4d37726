"""The proxy over HTTP in front of the test upstream: the Errors table, routes, encoding, bodies, filtering,
id and GUID authorization, and the three modes (topic-acl against a scripted Kafka endpoint, since
Tansu has no ACL APIs: see srp_acl_broker)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import trio
from kanal_registry_proxy.acl import OP_ALL, OP_READ, OP_WRITE, PATTERN_LITERAL, PATTERN_PREFIXED, AclBinding
from kanal_registry_proxy.authorization import Authorization, ReactiveMode
from kanal_registry_proxy.metrics import ProxyMetrics
from kanal_registry_proxy.proxy import ProxyRequest, RegistryProxy
from kanal_registry_proxy.reactive import PermissionStore, application_instance
from kanal_registry_proxy.testing import TestRegistry
from kanal_registry_proxy.testing.proxy import ProxyThread
from kanal_registry_proxy.upstream import UpstreamResponse
from kio.schema.errors import ErrorCode

from registry_proxy.srp_acl_broker import AclBroker
from registry_proxy.srp_helpers import AVRO_ORDER, VND, basic, reactive, register

ORDER_V2 = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "namespace": "com.acme",
        "fields": [{"name": "id", "type": "long"}, {"name": "note", "type": ["null", "string"], "default": None}],
    }
)


@pytest.fixture
def proxy(make_proxy: Callable[..., ProxyThread]) -> ProxyThread:
    return make_proxy()


# -- Errors table ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pair",
    [None, ("alice", "wrong"), ("mallory", "alice-pass"), ("alice", "x" * 73), ("alice", "alice-pass" + "y" * 70)],
    ids=["none", "wrong-password", "unknown-user", "73-bytes", "long-password"],
)
def test_authentication_failures_are_401(proxy: ProxyThread, pair: tuple[str, str] | None) -> None:
    headers = basic(*pair) if pair else {}
    response = httpx.get(f"{proxy.url}/subjects", headers=headers)
    assert response.status_code == 401
    assert response.json() == {"error_code": 401, "message": "Unauthorized"}
    assert response.headers["www-authenticate"].startswith("Basic")
    assert response.headers["content-type"] == VND


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", "/subjects/orders-value"),
        ("DELETE", "/subjects/orders-value/versions/1"),
        ("PUT", "/config"),
        ("DELETE", "/config"),
        ("PUT", "/config/orders-value"),
        ("DELETE", "/config/orders-value"),
        ("PUT", "/mode"),
        ("DELETE", "/mode"),
        ("PUT", "/mode/orders-value"),
        ("DELETE", "/mode/orders-value"),
        ("GET", "/exporters"),
        ("POST", "/exporters"),
        ("GET", "/v1/metadata/id"),
    ],
)
def test_routes_not_proxied_are_404_and_never_reach_the_registry(
    proxy: ProxyThread, upstream: TestRegistry, method: str, path: str
) -> None:
    assert register(proxy.url, "orders-value").status_code == 200
    assert upstream.registry is not None
    before = upstream.registry.requests
    response = httpx.request(method, proxy.url + path, headers={**basic("root"), "Content-Type": VND}, content=b"{}")
    assert response.status_code == 404
    assert response.json() == {"error_code": 404, "message": "HTTP 404 Not Found"}
    assert upstream.registry.requests == before
    assert httpx.get(f"{proxy.url}/subjects/orders-value/versions", headers=basic("root")).json() == [1]


def test_read_only_mode_reads_pass_writes_403(proxy: ProxyThread) -> None:
    assert register(proxy.url, "orders-value", user="root").status_code == 200  # super user bypasses the block
    response = register(proxy.url, "orders-value", user="alice")
    assert response.status_code == 403
    assert response.json() == {
        "error_code": 40301,
        "message": "User is denied operation Write on Subject: orders-value",
    }
    for path in (
        "/subjects",
        "/subjects/orders-value/versions/latest",
        "/schemas/ids/1",
        "/config",
        "/mode",
        "/schemas/types",
    ):
        assert httpx.get(proxy.url + path, headers=basic("alice")).status_code == 200, path
    compat = httpx.post(
        f"{proxy.url}/compatibility/subjects/orders-value/versions/latest",
        content=json.dumps({"schema": ORDER_V2}),
        headers={**basic("alice"), "Content-Type": VND},
    )
    assert compat.json() == {"is_compatible": True}


def test_reactive_mode_permissions_apply_live(proxy: ProxyThread) -> None:
    store = reactive(
        proxy, {"alice": [("PREFIXED", "orders-", ["Read", "Write"])], "bob": [("LITERAL", "orders-value", ["Read"])]}
    )
    assert register(proxy.url, "orders-value", user="alice").status_code == 200
    assert register(proxy.url, "orders-value", user="bob").status_code == 403  # Read only
    assert register(proxy.url, "payments-value", user="alice").status_code == 403
    assert httpx.get(f"{proxy.url}/subjects/orders-value/versions", headers=basic("bob")).status_code == 200
    # a new command: applied at once, no restart
    store.apply(*application_instance("app-bob", "bob", [("LITERAL", "orders-value", ["Read", "Write"])]))
    assert register(proxy.url, "orders-value", user="bob").status_code == 200
    store.apply(b"ApplicationInstance/app-bob", None)  # deleted
    assert httpx.get(f"{proxy.url}/subjects/orders-value/versions", headers=basic("bob")).status_code == 403
    # Write does not imply Read
    store.apply(*application_instance("app-alice", "alice", [("LITERAL", "w-value", ["Write"])]))
    assert register(proxy.url, "w-value", user="alice").status_code == 200
    assert httpx.get(f"{proxy.url}/subjects/w-value/versions", headers=basic("alice")).status_code == 403
    # wildcard
    store.apply(*application_instance("app-bob", "bob", [("LITERAL", "*", ["Read"])]))
    assert httpx.get(f"{proxy.url}/subjects/w-value/versions", headers=basic("bob")).status_code == 200


# -- topic-acl mode against the scripted Kafka endpoint ------------------------------------------------


@pytest.fixture
def acl_broker() -> Iterator[AclBroker]:
    broker = AclBroker().start()
    yield broker
    broker.stop()


def test_topic_acl_mode(make_proxy: Callable[..., ProxyThread], acl_broker: AclBroker) -> None:
    acl_broker.bindings = [
        AclBinding(PATTERN_LITERAL, "orders", "User:alice", "*", OP_READ, 3),
        AclBinding(PATTERN_PREFIXED, "orders", "User:alice", "*", OP_WRITE, 3),
        AclBinding(PATTERN_LITERAL, "payments", "User:*", "*", OP_READ, 3),
        AclBinding(PATTERN_LITERAL, "payments", "User:bob", "*", OP_ALL, 2),  # DENY beats ALLOW
        AclBinding(PATTERN_LITERAL, "audit", "User:bob", "*", OP_ALL, 3),
        AclBinding(PATTERN_LITERAL, "payments", "User:root", "*", OP_ALL, 2),  # a super user passes even this
    ]
    proxy = make_proxy(
        AUTHORIZATION_MODE="topic-acl",
        KAFKA_BOOTSTRAP_SERVERS=acl_broker.address,
        AUTHORIZATION_TOPIC_ACL_CACHE_TTL="50ms",
        AUTHORIZATION_TOPIC_ACL_LOOKUP_TIMEOUT="300ms",
    )
    assert register(proxy.url, "orders-value", user="alice").status_code == 200
    assert register(proxy.url, "orders-v2-value", user="alice").status_code == 200  # PREFIXED write
    assert register(proxy.url, "payments-value", user="alice").status_code == 403
    assert register(proxy.url, "audit-value", user="bob").status_code == 200  # ALL
    assert register(proxy.url, "payments-value", user="root").status_code == 200
    get = lambda user, subject: httpx.get(f"{proxy.url}/subjects/{subject}/versions", headers=basic(user)).status_code  # noqa: E731
    assert get("alice", "orders-value") == 200
    assert get("alice", "orders-v2-value") == 403  # Write does not imply Read
    assert get("alice", "payments-value") == 200  # User:*
    assert get("bob", "payments-value") == 403  # DENY beats the wildcard ALLOW
    assert get("bob", "orders-value") == 403  # missing ACL
    assert get("bob", "audit-value") == 200
    subjects = httpx.get(f"{proxy.url}/subjects", headers=basic("alice")).json()
    assert sorted(subjects) == ["orders-value", "payments-value"]
    # broker error and timeout: deny, never cached
    acl_broker.error = ErrorCode.unknown_server_error
    trio.run(trio.sleep, 0.1)
    assert get("alice", "orders-value") == 403
    acl_broker.error = None
    assert get("alice", "orders-value") == 200
    acl_broker.hang = True
    trio.run(trio.sleep, 0.1)
    assert get("alice", "orders-value") == 403


def test_topic_acl_mode_with_no_reachable_cluster_denies(make_proxy: Callable[..., ProxyThread]) -> None:
    proxy = make_proxy(
        AUTHORIZATION_MODE="topic-acl",
        KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:1",
        AUTHORIZATION_TOPIC_ACL_LOOKUP_TIMEOUT="1s",
    )
    assert httpx.get(f"{proxy.url}/subjects/orders-value/versions", headers=basic("alice")).status_code == 403
    assert httpx.get(f"{proxy.url}/subjects/orders-value/versions", headers=basic("root")).status_code == 404  # bypass


# -- routes, encoding, bodies -----------------------------------------------------------------------------


def test_the_whole_query_string_is_forwarded(proxy: ProxyThread, upstream: TestRegistry) -> None:
    register(proxy.url, "orders-value")
    assert upstream.registry is not None
    for target in (
        "/subjects?deleted=false&deleted_only=false&offset=0&limit=-1&subjectPrefix=%3A%2A%3A",
        "/schemas/ids/1?subject=orders-value&format=resolved&fetchMaxId=true&includeSubjects=true",
        "/subjects/orders-value/versions/latest?deleted=true&referenceFormat=qualified&normalize=False",
    ):
        httpx.get(proxy.url + target, headers=basic("alice"))
        _method, path, query, _, _ = upstream.registry.seen[-1]
        assert path + b"?" + query == target.encode()


def test_subject_names_with_slash_and_percent_are_encoded_both_ways(proxy: ProxyThread, upstream: TestRegistry) -> None:
    store = reactive(
        proxy,
        {"alice": [("LITERAL", "team/orders-value", ["Read", "Write"]), ("LITERAL", "100%-value", ["Read", "Write"])]},
    )
    assert register(proxy.url, "team%2Forders-value", user="alice").status_code == 200
    assert upstream.registry is not None
    assert upstream.registry.seen[-1][1] == b"/subjects/team%2Forders-value/versions"
    assert register(proxy.url, "100%25-value", user="alice").status_code == 200
    assert upstream.registry.seen[-1][1] == b"/subjects/100%25-value/versions"
    assert set(httpx.get(f"{proxy.url}/subjects", headers=basic("alice")).json()) == {"team/orders-value", "100%-value"}
    assert httpx.get(f"{proxy.url}/subjects/team%2Forders-value/versions", headers=basic("alice")).json() == [1]
    # authorized under the decoded name: a grant for "team" does not cover "team/orders-value"
    store.apply(*application_instance("app-alice", "alice", [("LITERAL", "team", ["Read", "Write"])]))
    assert register(proxy.url, "team%2Forders-value", user="alice").status_code == 403


def test_bodies_are_forwarded_unchanged_as_utf8(proxy: ProxyThread, upstream: TestRegistry) -> None:
    schema = json.dumps(
        {
            "type": "record",
            "name": "Caf\u00e9",
            "doc": "r\u00e9sum\u00e9 \u2713 \U0001f680",
            "fields": [{"name": "x", "type": "int"}],
        }
    )
    assert register(proxy.url, "caf\u00e9-value".replace("\u00e9", "%C3%A9"), schema=schema).status_code == 200
    for path in (
        "/subjects",
        "/subjects/caf%C3%A9-value/versions/1",
        "/schemas/ids/1",
        "/schemas",
        "/subjects/caf%C3%A9-value/versions/1/schema",
        "/config",
    ):
        via = httpx.get(proxy.url + path, headers={**basic("alice"), "Accept": VND})
        direct = httpx.get(upstream.url + path, headers={"Accept": VND})
        assert via.status_code == direct.status_code == 200, path
        assert via.content == direct.content, path
        assert via.headers["content-type"] == direct.headers["content-type"]
        via.content.decode("utf-8")
    assert "\u2713" in httpx.get(f"{proxy.url}/schemas/ids/1", headers=basic("alice")).json()["schema"]


def test_content_types(proxy: ProxyThread) -> None:
    register(proxy.url, "orders-value")
    as_json = httpx.get(f"{proxy.url}/subjects", headers={**basic("alice"), "Accept": "application/json"})
    assert as_json.headers["content-type"] == "application/json"
    assert httpx.get(f"{proxy.url}/subjects", headers={**basic("alice"), "Accept": "text/html"}).status_code == 406
    # a POST without Content-Type: the proxy sends the registry's own type (Karapace answers 500 otherwise)
    response = httpx.post(
        f"{proxy.url}/subjects/orders-value", content=json.dumps({"schema": AVRO_ORDER}), headers=basic("alice")
    )
    assert response.status_code == 200 and response.json()["id"] == 1
    for content_type in ("application/json", "application/octet-stream", "application/vnd.schemaregistry+json"):
        response = httpx.post(
            f"{proxy.url}/subjects/orders-value",
            content=json.dumps({"schema": AVRO_ORDER}),
            headers={**basic("alice"), "Content-Type": content_type},
        )
        assert response.status_code == 200, content_type


def test_get_subjects_and_lists_are_filtered_to_readable_subjects(proxy: ProxyThread) -> None:
    for subject in ("orders-value", "orders-key", "payments-value", "secret-value"):
        assert register(proxy.url, subject).status_code == 200
    reactive(proxy, {"alice": [("PREFIXED", "orders-", ["Read"]), ("LITERAL", "payments-value", ["Read"])]})
    get = lambda path: httpx.get(proxy.url + path, headers=basic("alice")).json()  # noqa: E731
    assert get("/subjects") == ["orders-value", "orders-key", "payments-value"]
    assert {item["subject"] for item in get("/schemas")} == {"orders-value", "orders-key", "payments-value"}
    assert get("/schemas/ids/1/versions") == [
        {"subject": "orders-key", "version": 1},
        {"subject": "orders-value", "version": 1},
        {"subject": "payments-value", "version": 1},
    ]
    root = httpx.get(f"{proxy.url}/subjects", headers=basic("root")).json()
    assert root == ["orders-value", "orders-key", "payments-value", "secret-value"]


def test_schema_ids_are_authorized_by_their_subjects(proxy: ProxyThread) -> None:
    assert register(proxy.url, "secret-value").json() == {"id": 1}
    assert register(proxy.url, "orders-value", schema=ORDER_V2).json() == {"id": 2}
    store = reactive(proxy, {"alice": [("LITERAL", "orders-value", ["Read"])]})
    get = lambda path: httpx.get(proxy.url + path, headers=basic("alice"))  # noqa: E731
    assert get("/schemas/ids/2?subject=orders-value").status_code == 200
    denied = get("/schemas/ids/1?subject=orders-value")  # the subject hint is not trusted
    assert denied.status_code == 403
    assert denied.json() == {"error_code": 40301, "message": "User is denied operation Read on Schema: 1"}
    assert get("/schemas/ids/99").json() == {"error_code": 40403, "message": "Schema not found"}
    assert get("/schemas/ids/abc").json() == {"error_code": 404, "message": "HTTP 404 Not Found"}
    # the same schema registered under a readable subject since: the cached list is refreshed before denying
    store.apply(
        *application_instance(
            "app-alice", "alice", [("LITERAL", "orders-value", ["Read"]), ("LITERAL", "copy-value", ["Read"])]
        )
    )
    assert get("/schemas/ids/1").status_code == 403
    assert register(proxy.url, "copy-value", schema=AVRO_ORDER).json() == {"id": 1}
    assert get("/schemas/ids/1").status_code == 200


def test_guid_routes_pass_the_registry_404_through(proxy: ProxyThread) -> None:
    """The test upstream, like Karapace, has no GUIDs: the resolution's 404 is the answer."""
    response = httpx.get(f"{proxy.url}/schemas/guids/5d5f2f2c-1d2c-4a0b-9c8f-0123456789ab", headers=basic("alice"))
    assert response.status_code == 404 and response.json() == "Not Found"
    assert httpx.get(f"{proxy.url}/schemas/guids/not-a-guid", headers=basic("alice")).status_code == 404


def test_the_association_lookup_of_confluent_serializers_keeps_its_404(proxy: ProxyThread) -> None:
    response = httpx.get(
        f"{proxy.url}/associations/resources/-/payments?resourceType=topic&associationType=value",
        headers=basic("alice"),
    )
    assert response.status_code == 404  # what makes confluent-kafka 2.16 fall back to <topic>-value


def test_upstream_unreachable_is_502(make_proxy: Callable[..., ProxyThread]) -> None:
    proxy = make_proxy(SCHEMA_REGISTRY_URL="http://127.0.0.1:1")
    response = httpx.get(f"{proxy.url}/subjects", headers=basic("alice"))
    assert response.status_code == 502 and response.json()["error_code"] == 50201


def test_health_and_metrics_need_no_credentials(proxy: ProxyThread) -> None:
    assert httpx.get(f"{proxy.url}/health/live").text == "LIVE"
    assert httpx.get(f"{proxy.url}/health/ready").text == "READY"
    httpx.get(f"{proxy.url}/subjects", headers=basic("alice"))
    text = httpx.get(f"{proxy.url}/metrics").text
    assert 'srp_http_requests_total{method="GET",route="/subjects",status="200"} 1.0' in text


# -- GUIDs and associations against a registry that has them (in-process, scripted upstream) -------------


class ScriptedUpstream:
    host = "scripted"
    port = 0

    def __init__(self, answers: dict[bytes, tuple[int, Any]]) -> None:
        self.answers = answers
        self.targets: list[bytes] = []

    async def request(self, method: str, target: bytes, headers: Any, body: bytes = b"") -> UpstreamResponse:
        self.targets.append(target)
        status, document = self.answers.get(target, (404, {"error_code": 40403, "message": "Schema not found"}))
        return UpstreamResponse(status, [(b"content-type", VND.encode())], json.dumps(document).encode())


class Principal:
    provider = "test"
    challenge = "Basic"

    async def authenticate(self, header: str | None) -> str | None:
        return header


def scripted_proxy(
    answers: dict[bytes, tuple[int, Any]], grants: dict[str, list[tuple[str, str, list[str]]]]
) -> tuple[RegistryProxy, ScriptedUpstream]:
    store = PermissionStore()
    for account, resources in grants.items():
        store.apply(*application_instance(f"app-{account}", account, resources))
    upstream = ScriptedUpstream(answers)
    metrics = ProxyMetrics()
    proxy = RegistryProxy(upstream, Principal(), Authorization(ReactiveMode(store, None), (), metrics), metrics)  # type: ignore[arg-type]
    return proxy, upstream


def call(proxy: RegistryProxy, principal: str, target: bytes) -> tuple[int, Any]:
    path, _, query = target.partition(b"?")
    request = ProxyRequest("GET", path, query, [(b"authorization", principal.encode())])
    response = trio.run(proxy.handle, request)
    return response.status, json.loads(response.body)


def test_guids_are_resolved_to_subjects() -> None:
    guid = "5d5f2f2c-1d2c-4a0b-9c8f-0123456789ab"
    answers: dict[bytes, tuple[int, Any]] = {
        f"/schemas/guids/{guid}/ids".encode(): (200, [{"context": ".", "id": 7}]),
        b"/schemas/ids/7/versions?deleted=true": (200, [{"subject": "orders-value", "version": 3}]),
        f"/schemas/guids/{guid}".encode(): (200, {"schema": '"int"', "guid": guid}),
    }
    proxy, upstream = scripted_proxy(answers, {"alice": [("LITERAL", "orders-value", ["Read"])]})
    assert call(proxy, "alice", f"/schemas/guids/{guid}".encode()) == (200, {"schema": '"int"', "guid": guid})
    status, body = call(proxy, "bob", f"/schemas/guids/{guid}".encode())
    assert status == 403 and body["error_code"] == 40301
    calls = len(upstream.targets)
    assert call(proxy, "alice", f"/schemas/guids/{guid}".encode())[0] == 200
    assert len(upstream.targets) == calls + 1  # the resolution came from the cache


def test_associations_are_filtered_to_readable_subjects() -> None:
    target = b"/associations/resources/-/payments?resourceType=topic"
    document = {
        "resourceName": "payments",
        "associations": [
            {"subject": "payments-value", "associationType": "value"},
            {"subject": "payments-key", "associationType": "key"},
        ],
    }
    proxy, _ = scripted_proxy({target: (200, document)}, {"alice": [("LITERAL", "payments-value", ["Read"])]})
    status, body = call(proxy, "alice", target)
    assert status == 200
    assert body["associations"] == [{"subject": "payments-value", "associationType": "value"}]
