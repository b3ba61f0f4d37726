"""The route table (matching on raw paths) and the topic-ACL rules, lookups, cache and single flight."""

from __future__ import annotations

from typing import Any

import pytest
import trio
from kanal_registry_proxy import routes
from kanal_registry_proxy.acl import (
    OP_ALL,
    OP_READ,
    OP_WRITE,
    PATTERN_LITERAL,
    PATTERN_PREFIXED,
    PERMISSION_ALLOW,
    PERMISSION_DENY,
    AclBinding,
    AclLookup,
    AclLookupError,
    decide,
    topic_of,
)
from kanal_registry_proxy.authorization import Authorization, TopicAclMode

from kanal.api import ErrorCode, UpstreamError, build, nested, require_request_class, response_class


@pytest.mark.parametrize(
    ("method", "path", "template", "params"),
    [
        ("POST", b"/subjects/orders-value/versions", "/subjects/{subject}/versions", {"subject": "orders-value"}),
        ("POST", b"/subjects/team%2Forders/versions", "/subjects/{subject}/versions", {"subject": "team/orders"}),
        (
            "GET",
            b"/subjects/100%25-value/versions/latest",
            "/subjects/{subject}/versions/{version}",
            {"subject": "100%-value", "version": "latest"},
        ),
        ("GET", b"/config/orders-value/", "/config/{subject}", {"subject": "orders-value"}),
        ("GET", b"/subjects", "/subjects", {}),
        ("GET", b"/schemas/ids/7", "/schemas/ids/{id}", {"id": "7"}),
        (
            "GET",
            b"/schemas/guids/5d5f2f2c-1d2c-4a0b-9c8f-0123456789ab",
            "/schemas/guids/{guid}",
            {"guid": "5d5f2f2c-1d2c-4a0b-9c8f-0123456789ab"},
        ),
        ("POST", b"/compatibility/subjects/s/versions", "/compatibility/subjects/{subject}/versions", {"subject": "s"}),
        (
            "GET",
            b"/associations/resources/-/payments",
            "/associations/resources/{namespace}/{name}",
            {"namespace": "-", "name": "payments"},
        ),
        ("GET", b"/subjects/%E2%82%AC-value/versions", "/subjects/{subject}/versions", {"subject": "\u20ac-value"}),
    ],
)
def test_routes_match_on_raw_paths(method: str, path: bytes, template: str, params: dict[str, str]) -> None:
    found = routes.match(method, path)
    assert found is not None
    assert found.route.template == template
    assert found.params == params


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("DELETE", b"/subjects/orders-value"),
        ("DELETE", b"/subjects/orders-value/versions/1"),
        ("PUT", b"/config"),
        ("DELETE", b"/config"),
        ("PUT", b"/config/orders-value"),
        ("DELETE", b"/config/orders-value"),
        ("PUT", b"/mode"),
        ("DELETE", b"/mode"),
        ("PUT", b"/mode/orders-value"),
        ("DELETE", b"/mode/orders-value"),
        ("GET", b"/exporters"),
        ("POST", b"/exporters"),
        ("GET", b"/exporters/x/status"),
    ],
)
def test_administrative_routes_are_blocked(method: str, path: bytes) -> None:
    found = routes.match(method, path)
    assert found is not None and found.route.check == "blocked"


@pytest.mark.parametrize(
    "path",
    [b"/subjects/%2E%2E/versions", b"/subjects/../versions", b"//subjects", b"/nowhere", b"/subjects/%FF/versions"],
)
def test_paths_that_name_no_route(path: bytes) -> None:
    assert routes.match("GET", path) is None or routes.match("POST", path) is None


def test_matches_are_remembered_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(routes, "_MATCHED", {})
    monkeypatch.setattr(routes, "_MATCHED_MAX", 3)
    first = routes.match("GET", b"/schemas/ids/7")
    assert first is not None and first.params == {"id": "7"}
    assert routes.match("GET", b"/schemas/ids/7") is first
    assert routes.match("GET", b"/nowhere") is None and routes.match("GET", b"/nowhere") is None
    for i in range(10):
        assert routes.match("GET", f"/schemas/ids/{i}".encode()).params == {"id": str(i)}  # type: ignore[union-attr]
    assert len(routes._MATCHED) <= 3
    long = b"/subjects/" + b"a" * 300 + b"/versions"
    assert routes.match("GET", long).params == {"subject": "a" * 300}  # type: ignore[union-attr]
    assert ("GET", long) not in routes._MATCHED


def test_plus_is_sent_encoded_so_both_registry_dialects_see_the_authorized_subject() -> None:
    assert routes.match("GET", b"/subjects/a+b/versions").params == {"subject": "a+b"}  # type: ignore[union-attr]
    assert routes.upstream_path(b"/subjects/a+b/versions") == b"/subjects/a%2Bb/versions"
    assert routes.upstream_path(b"/subjects/team%2Forders/versions") == b"/subjects/team%2Forders/versions"


# -- ACL rules --------------------------------------------------------------------------------------


def allow(principal: str, op: int, name: str = "orders", pattern: int = PATTERN_LITERAL, host: str = "*") -> AclBinding:
    return AclBinding(pattern, name, principal, host, op, PERMISSION_ALLOW)


def deny(principal: str, op: int, name: str = "orders", pattern: int = PATTERN_LITERAL, host: str = "*") -> AclBinding:
    return AclBinding(pattern, name, principal, host, op, PERMISSION_DENY)


def test_topic_name_strategy() -> None:
    assert topic_of("orders-value") == "orders"
    assert topic_of("orders-key") == "orders"
    assert topic_of("team.orders-v2-value") == "team.orders-v2"
    assert topic_of("com.acme.Order") is None  # record name strategy: no topic, denied
    assert topic_of("-value") is None


@pytest.mark.parametrize(
    ("bindings", "op", "expected"),
    [
        ([allow("User:alice", OP_READ)], OP_READ, True),
        ([allow("User:alice", OP_READ)], OP_WRITE, False),
        ([allow("User:alice", OP_WRITE)], OP_WRITE, True),
        ([allow("User:alice", OP_WRITE)], OP_READ, False),  # Write does not imply Read
        ([allow("User:alice", OP_ALL)], OP_READ, True),
        ([allow("User:alice", OP_ALL)], OP_WRITE, True),
        ([allow("User:*", OP_READ)], OP_READ, True),
        ([allow("User:bob", OP_READ)], OP_READ, False),
        ([allow("User:alice", OP_READ, "*")], OP_READ, True),
        ([allow("User:alice", OP_READ, "ord", PATTERN_PREFIXED)], OP_READ, True),
        ([allow("User:alice", OP_READ, "orders-v2", PATTERN_PREFIXED)], OP_READ, False),
        ([allow("User:alice", OP_READ, "ord", PATTERN_LITERAL)], OP_READ, False),
        ([allow("User:alice", OP_READ), deny("User:alice", OP_READ)], OP_READ, False),  # DENY beats ALLOW
        ([allow("User:alice", OP_READ), deny("User:*", OP_ALL)], OP_READ, False),
        ([allow("User:alice", OP_READ), deny("User:alice", OP_READ, "o", PATTERN_PREFIXED)], OP_READ, False),
        ([allow("User:alice", OP_READ), deny("User:alice", OP_WRITE)], OP_READ, True),
        ([allow("User:alice", OP_READ), deny("User:alice", OP_READ, host="10.0.0.1")], OP_READ, False),
        ([allow("User:alice", OP_READ, host="10.0.0.1")], OP_READ, False),
        ([], OP_READ, False),  # a missing ACL denies
    ],
)
def test_acl_rules(bindings: list[AclBinding], op: int, expected: bool) -> None:
    assert decide(bindings, "alice", "orders", op) is expected


class FakeKafka:
    """A :class:`kanal.api.KafkaClient` that answers DescribeAcls from a table, counting requests;
    ``error``/``hang`` script failures; ``describe_acls`` False, a broker without DescribeAcls."""

    def __init__(self, bindings: list[AclBinding]) -> None:
        self.bindings = bindings
        self.describe_acls = True
        self.calls = 0
        self.error: ErrorCode | None = None
        self.hang = False
        self.gate: trio.Event | None = None

    def request_class(self, api_key: int) -> Any:
        if api_key == 29 and not self.describe_acls:
            raise UpstreamError("the upstream does not support api key 29 at versions 1-3")
        return require_request_class(api_key, 3)

    async def call(self, body: Any, *, node_id: int | None = None, timeout: float | None = None) -> Any:
        if int(body.__api_key__) == 18:
            return None
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if self.hang:
            await trio.sleep_forever()
        return describe_acls_response(self.bindings, body.resource_name_filter, self.error)

    async def metadata(self, topics: Any = None) -> Any:
        raise UpstreamError("not scripted")

    async def aclose(self) -> None:
        pass


def describe_acls_response(bindings: list[AclBinding], topic: str | None, error: ErrorCode | None = None) -> Any:
    cls = response_class(29, 3)
    assert cls is not None
    resource_cls = nested(cls, "resources")
    acl_cls = nested(resource_cls, "acls")
    resources = []
    for b in bindings:
        if topic is not None and not b.applies_to(topic):
            continue
        acl = build(acl_cls, principal=b.principal, host=b.host, operation=b.operation, permission_type=b.permission)
        resources.append(
            build(
                resource_cls, resource_type=2, resource_name=b.resource_name, pattern_type=b.pattern_type, acls=(acl,)
            )
        )
    return build(
        cls,
        error_code=error if error is not None else ErrorCode.none,
        error_message="scripted failure" if error is not None else None,
        resources=tuple(resources) if error is None else (),
    )


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lookups_are_cached_and_failures_are_not() -> None:
    kafka = FakeKafka([allow("User:alice", OP_READ)])
    clock = Clock()
    lookup = AclLookup(kafka, cache_ttl=0.5, timeout=5, clock=clock)
    mode = Authorization(TopicAclMode(lookup))

    async def main() -> None:
        assert await mode.check("alice", "Read", "orders-value")
        assert await mode.check("alice", "Read", "orders-key")
        assert kafka.calls == 1  # cached for the TTL
        clock.now += 0.6
        assert await mode.check("alice", "Read", "orders-value")
        assert kafka.calls == 2
        kafka.error = ErrorCode.cluster_authorization_failed
        clock.now += 0.6
        assert not await mode.check("alice", "Read", "orders-value")  # broker error: deny
        assert not await mode.check("alice", "Read", "orders-value")
        assert kafka.calls == 4  # the failure was not cached
        kafka.error = None
        assert await mode.check("alice", "Read", "orders-value")
        assert not await mode.check("alice", "Read", "com.acme.Order")  # no topic: denied
        assert kafka.calls == 5

    trio.run(main)


def test_lookup_timeout_denies() -> None:
    kafka = FakeKafka([allow("User:alice", OP_READ)])
    kafka.hang = True
    lookup = AclLookup(kafka, cache_ttl=0.5, timeout=0.2)
    mode = Authorization(TopicAclMode(lookup))

    async def main() -> None:
        assert not await mode.check("alice", "Read", "orders-value")
        with pytest.raises(AclLookupError, match="timed out"):
            await lookup.bindings("orders")

    trio.run(main)


def test_a_cluster_without_describe_acls_denies() -> None:
    kafka = FakeKafka([allow("User:alice", OP_READ)])
    kafka.describe_acls = False
    lookup = AclLookup(kafka, cache_ttl=0.5, timeout=5)

    async def main() -> None:
        assert not await Authorization(TopicAclMode(lookup)).check("alice", "Read", "orders-value")
        with pytest.raises(AclLookupError, match="does not support api key 29"):
            await lookup.bindings("orders")

    trio.run(main)
    assert kafka.calls == 0


def test_concurrent_lookups_of_one_topic_are_deduplicated() -> None:
    kafka = FakeKafka([allow("User:alice", OP_READ), allow("User:bob", OP_WRITE)])
    kafka.gate = trio.Event()
    lookup = AclLookup(kafka, cache_ttl=0.5, timeout=5)
    mode = Authorization(TopicAclMode(lookup))
    results: list[bool] = []

    async def one(principal: str, permission: Any) -> None:
        results.append(await mode.check(principal, permission, "orders-value"))

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(one, "alice", "Read")
                nursery.start_soon(one, "bob", "Read")
            await trio.sleep(0.05)
            assert kafka.gate is not None
            kafka.gate.set()

    trio.run(main)
    assert kafka.calls == 1
    assert sorted(results) == [False] * 10 + [True] * 10


def test_filtering_many_subjects_looks_each_topic_up_once() -> None:
    kafka = FakeKafka([allow("User:alice", OP_READ, "a", PATTERN_PREFIXED)])
    lookup = AclLookup(kafka, cache_ttl=0.5, timeout=5)
    authorization = Authorization(TopicAclMode(lookup))

    async def main() -> set[str]:
        return await authorization.readable("alice", ["a1-value", "a1-key", "a2-value", "b-value", "plain"])

    assert trio.run(main) == {"a1-value", "a1-key", "a2-value"}
    assert kafka.calls == 3  # topics a1, a2, b
