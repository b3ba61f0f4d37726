"""The built-ins' wire stages against their decoded hooks: the ACL enforcer lets on the bytes only
what its hook would let through unchanged, and a virtual cluster's splice gives the broker and the
client exactly what the decoded renaming gives them."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Mapping
from functools import partial
from typing import Any

import pytest
import trio
from kio.schema.errors import ErrorCode

import kanal.pipeline.wire as wire_module
import kanal.tenancy.interceptor as interceptor_module
from kanal.api import GatewayServices
from kanal.api.context import Connection
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor, InterceptorSpec, Scope
from kanal.authz.enforcer import AclEnforcer
from kanal.authz.store import AclDirectory, acl_from_json
from kanal.pipeline.chain import Pipeline
from kanal.pipeline.registry import PluginRegistry
from kanal.pipeline.wire import WirePath, WireRequest
from kanal.protocol.api import ApiKey, require_request_class, response_class
from kanal.protocol.entities import build, nested
from kanal.protocol.headers import parse_request_header, response_correlation_id
from kanal.protocol.messages import decode_request_body, decode_response, encode_request, encode_response
from kanal.protocol.records import Record, encode_batch
from kanal.tenancy.interceptor import PassthroughAliases, VirtualClusterNames
from kanal.tenancy.names import VirtualNames
from kanal.tenancy.rewrite import UNCHANGED, to_logical, to_physical
from kanal.tenancy.topic_ids import VirtualTopicIds
from kanal.testing import FakeServices, Harness

PREFIX = "team-a."
NAMES = VirtualNames(PREFIX)
BATCH = encode_batch([Record(0, 0, b"k", b"v", [])], base_timestamp=1)
PRODUCE_VERSIONS = [v for v in range(3, 14) if response_class(0, v) is not None]
ORDERS_ID = uuid.UUID(int=1)


def produce(version: int, topics: tuple[str, ...] = ("orders", "payments"), txn: str | None = "tx-1") -> Any:
    cls = require_request_class(ApiKey.PRODUCE, version)
    topic_cls = nested(cls, "topic_data")
    part_cls = nested(topic_cls, "partition_data")
    parts = (build(part_cls, index=0, records=BATCH), build(part_cls, index=1, records=BATCH))
    key = (lambda name: {"topic_id": ORDERS_ID}) if version >= 13 else (lambda name: {"name": name})
    return build(
        cls,
        transactional_id=txn,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=tuple(build(topic_cls, **key(name), partition_data=parts) for name in topics),
    )


def produce_response(version: int, topics: tuple[str, ...]) -> Any:
    cls = response_class(ApiKey.PRODUCE, version)
    assert cls is not None
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partition_responses")
    parts = (build(part_cls, index=0, error_code=ErrorCode.none, base_offset=42),)
    return build(cls, responses=tuple(build(topic_cls, name=name, partition_responses=parts) for name in topics))


def fetch(version: int, topic_id: uuid.UUID = ORDERS_ID, replica_id: int = -1) -> Any:
    cls = require_request_class(ApiKey.FETCH, version)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    topic = build(topic_cls, topic_id=topic_id, partitions=(build(part_cls, partition=0, fetch_offset=0),))
    return build(cls, replica_id=replica_id, max_wait=datetime.timedelta(milliseconds=500), topics=(topic,))


def wire(request: Any, principal: str | None = "alice") -> WireRequest:
    frame = encode_request(request, 7, "client")
    info = Connection(
        id=1,
        client_address="10.0.0.1:5000",
        listener_address="gw:9092",
        node_id=0,
        principal=principal,
        vcluster=PREFIX,
    )
    return WireRequest(info, parse_request_header(frame), frame)


def decoded(request: WireRequest) -> Any:
    header = parse_request_header(request.frame)
    return decode_request_body(header.api_key, header.api_version, request.frame, header.body_offset)


# -- virtual-cluster names -------------------------------------------------------------------------


def names_stage() -> VirtualClusterNames:
    return VirtualClusterNames(NAMES, FakeServices(), PREFIX)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@pytest.mark.parametrize("txn", ["tx-1", None, ""])
def test_a_produce_request_is_renamed_as_the_decoded_path_renames_it(version: int, txn: str | None) -> None:
    request = produce(version, txn=txn)
    stage_request = wire(request)
    assert names_stage().wire_request(stage_request)
    physical, _ = to_physical(ApiKey.PRODUCE, request, NAMES)
    assert decoded(stage_request) == physical


@pytest.mark.parametrize("version", [v for v in PRODUCE_VERSIONS if v < 13])
def test_a_produce_response_is_renamed_back_as_the_decoded_path_renames_it(version: int) -> None:
    stage_request = wire(produce(version))
    assert names_stage().wire_request(stage_request)
    (fix,) = stage_request.fixes
    for topics in [(PREFIX + "orders", PREFIX + "payments"), (PREFIX + "orders", "someone-else")]:
        upstream = produce_response(version, topics)
        answer = fix(encode_response(upstream, 7))
        assert decode_response(ApiKey.PRODUCE, version, answer) == to_logical(
            ApiKey.PRODUCE, upstream, UNCHANGED, NAMES
        )


def test_fetch_by_topic_id_passes_unchanged_and_fetch_by_name_is_left_to_the_decoded_path() -> None:
    by_id = wire(fetch(13))
    assert names_stage().wire_request(by_id) and by_id.fixes == []
    assert by_id.frame == encode_request(fetch(13), 7, "client")
    cls = require_request_class(ApiKey.FETCH, 12)
    by_name = build(cls, max_wait=datetime.timedelta(milliseconds=500), topics=())
    assert not names_stage().wire_request(wire(by_name))  # its responses carry names


# -- ACLs ------------------------------------------------------------------------------------------


def acl(resource_type: str, name: str, operation: str, permission: str = "ALLOW", pattern: str = "LITERAL") -> Any:
    return acl_from_json(
        {
            "resourcePattern": {"resourceType": resource_type, "name": name, "patternType": pattern},
            "principal": "User:alice",
            "operation": operation,
            "permissionType": permission,
        }
    )


def enforcer(*acls: Any, topic_names: Mapping[uuid.UUID, str] | None = None) -> AclEnforcer:
    directory = AclDirectory()
    directory.configure({}, {PREFIX: list(acls)})
    services = FakeServices(topic_names=topic_names)
    return AclEnforcer(directory, services, PREFIX, NAMES.logical_topic)


ALLOWED = (
    acl("TOPIC", "orders", "WRITE"),
    acl("TOPIC", "pay", "ALL", pattern="PREFIXED"),
    acl("TRANSACTIONAL_ID", "tx-1", "WRITE"),
)


def test_acls_let_on_the_bytes_only_what_is_wholly_allowed() -> None:
    assert enforcer(*ALLOWED).wire_request(wire(produce(9)))
    assert enforcer(*ALLOWED).wire_request(wire(produce(9, txn=None)))
    # a denial of any part is the decoded path's, which answers exactly the denied part and audits it
    assert not enforcer(*ALLOWED[:2]).wire_request(wire(produce(9)))
    assert not enforcer(*ALLOWED).wire_request(wire(produce(9, topics=("orders", "refunds"))))
    assert not enforcer(*ALLOWED, acl("TOPIC", "orders", "WRITE", "DENY")).wire_request(wire(produce(9)))
    assert not enforcer(*ALLOWED).wire_request(wire(produce(9), principal=None))  # User:ANONYMOUS


def test_a_fetch_by_topic_id_is_checked_under_the_tenants_name_for_it() -> None:
    read = acl("TOPIC", "orders", "READ")
    assert enforcer(read, topic_names={ORDERS_ID: PREFIX + "orders"}).wire_request(wire(fetch(13)))
    assert not enforcer(read, topic_names={ORDERS_ID: "team-b.orders"}).wire_request(wire(fetch(13)))
    assert not enforcer(read).wire_request(wire(fetch(13)))  # an id not yet named: decoded, resolved there
    assert not enforcer(acl("TOPIC", "orders", "WRITE"), topic_names={ORDERS_ID: PREFIX + "orders"}).wire_request(
        wire(fetch(13))
    )
    follower = wire(fetch(13, replica_id=2))
    assert not enforcer(read, topic_names={ORDERS_ID: PREFIX + "orders"}).wire_request(follower)


# -- when the stages run ---------------------------------------------------------------------------


class ProduceWatcher(Interceptor):
    plugin_name = "produce-watcher"
    request_api_keys = frozenset({ApiKey.PRODUCE})

    @hookimpl
    def kanal_request(self, ctx: Any) -> None:
        return None


class Plugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [ProduceWatcher]


def test_the_stages_run_only_when_no_configured_interceptor_hooks_the_request() -> None:
    registry = PluginRegistry()
    registry.register(Plugin(), "test-plugin")
    services: GatewayServices = FakeServices()
    pipeline = Pipeline(registry, lambda plugin: services)
    acls = enforcer(*ALLOWED)
    names = names_stage()
    pipeline.builtins = lambda vcluster: [
        (InterceptorSpec("kanal-acls", AclEnforcer.plugin_name, -1000, Scope(vcluster=PREFIX)), acls),
        (InterceptorSpec("kanal-virtual-cluster", names.plugin_name, 1000, Scope(vcluster=PREFIX)), names),
    ]
    chain = pipeline.resolve("alice", (), PREFIX)
    assert chain.wire_for(ApiKey.PRODUCE) == (acls, names)  # outermost first
    assert not chain.decode_request(ApiKey.PRODUCE) and not chain.decode_produce(["orders"])
    assert chain.wire_for(ApiKey.METADATA) == () and chain.decode_request(ApiKey.METADATA)
    pipeline.configure([InterceptorSpec("watch", "produce-watcher", scope=Scope(vcluster=PREFIX))])
    chain = pipeline.resolve("alice", (), PREFIX)
    assert chain.wire_for(ApiKey.PRODUCE) == () and chain.decode_produce(["orders"])


# -- the remembered outcome ------------------------------------------------------------------------


def one_topic(topic: str = "orders", value: bytes = b"v", corr: int = 7, client_id: str = "client") -> bytearray:
    cls = require_request_class(ApiKey.PRODUCE, 9)
    topic_cls = nested(cls, "topic_data")
    batch = encode_batch([Record(0, 0, None, value, [])], base_timestamp=1)
    part = build(nested(topic_cls, "partition_data"), index=0, records=batch)
    request = build(
        cls,
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(build(topic_cls, name=topic, partition_data=(part,)),),
    )
    return encode_request(request, corr, client_id)


def physical(frame: bytearray) -> Any:
    header = parse_request_header(frame)
    request = decode_request_body(ApiKey.PRODUCE, 9, frame, header.body_offset)
    return header.correlation_id, header.client_id, to_physical(ApiKey.PRODUCE, request, NAMES)[0]


def test_a_producers_repeated_request_is_renamed_from_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    acls = enforcer(*ALLOWED)
    stages = (acls, names_stage())
    path = WirePath(wire(produce(9)).info)
    version = 1

    def run(frame: bytearray) -> bytearray | None:
        outcome = path.run(stages, version, parse_request_header(frame), frame)
        return None if outcome is None else outcome[0]

    first = one_topic()
    out = run(first)
    assert out is not None and decode(out) == physical(first)
    with monkeypatch.context() as patched:
        patched.setattr(wire_module, "request_names", lambda *a: pytest.fail("walked a remembered request"))
        again = one_topic(value=b"another value, longer", corr=8)
        out = run(again)
        assert out is not None and decode(out) == physical(again)
    for other in [one_topic("payments"), one_topic(client_id="another client")]:  # walked, and right
        out = run(other)
        assert out is not None and decode(out) == physical(other)
    out = run(one_topic())
    assert out is not None and decode(out) == physical(one_topic())
    assert run(one_topic("refunds")) is None  # denied: decoded, answered there
    changed: list[str] = []
    acls.directory.on_change = lambda: changed.append("acls")
    acls.directory.configure({}, {PREFIX: [ALLOWED[1]]})  # WRITE on orders revoked
    assert changed == ["acls"]  # the gateway moves the pipeline's version on
    version = 2
    assert run(one_topic()) is None


def decode(frame: bytearray) -> Any:
    header = parse_request_header(frame)
    return header.correlation_id, header.client_id, decode_request_body(0, 9, frame, header.body_offset)


def test_repeated_produce_responses_are_renamed_from_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    request = wire(produce(9))
    assert names_stage().wire_request(request)
    (fix,) = request.fixes

    def check(topics: tuple[str, ...], corr: int) -> None:
        upstream = produce_response(9, topics)
        answer = fix(encode_response(upstream, corr))
        assert response_correlation_id(answer) == corr
        assert decode_response(ApiKey.PRODUCE, 9, answer) == to_logical(ApiKey.PRODUCE, upstream, UNCHANGED, NAMES)

    check((PREFIX + "orders",), 1)
    with monkeypatch.context() as patched:
        patched.setattr(interceptor_module, "produce_response_names", lambda *a: pytest.fail("walked"))
        check((PREFIX + "orders",), 2)
    check((PREFIX + "orders", PREFIX + "payments"), 3)
    check((PREFIX + "payments",), 4)
    check((PREFIX + "orders",), 5)


# -- aliases ---------------------------------------------------------------------------------------


def test_a_fetch_naming_an_alias_leaves_its_fetch_session_and_its_answer_keeps_the_alias() -> None:
    """Outside a session the broker answers for exactly what each request names, so each answer is
    renamed from its own request; in one, the alias's partitions would come back later unnamed."""
    harness = Harness()
    harness.append(PassthroughAliases({"orders-v2": "orders"}, FakeServices()))
    cls = require_request_class(ApiKey.FETCH, 12)
    topic_cls = nested(cls, "topics")
    part = build(nested(topic_cls, "partitions"), partition=0, fetch_offset=0)

    def fetch(*topics: str) -> Any:
        entries = tuple(build(topic_cls, topic=t, partitions=(part,)) for t in topics)
        return build(cls, session_id=0, session_epoch=0, topics=entries)

    def broker(forwarded: Any) -> Any:
        response_cls = response_class(ApiKey.FETCH, 12)
        r_topic = nested(response_cls, "responses")
        r_part = build(nested(r_topic, "partitions"), partition_index=0, error_code=ErrorCode.none, records=b"")
        entries = tuple(build(r_topic, topic=t.topic, partitions=(r_part,)) for t in forwarded.topics)
        return build(response_cls, error_code=ErrorCode.none, session_id=0, responses=entries)

    exchange = trio.run(partial(harness.request, fetch("orders-v2"), upstream=broker))
    assert [t.topic for t in exchange.forwarded.topics] == ["orders"]
    assert (exchange.forwarded.session_id, exchange.forwarded.session_epoch) == (0, -1)
    assert [t.topic for t in exchange.response.responses] == ["orders-v2"]
    plain = trio.run(partial(harness.request, fetch("orders"), upstream=broker))
    assert (plain.forwarded.session_epoch, [t.topic for t in plain.response.responses]) == (0, ["orders"])


def test_a_fetch_by_a_virtual_clusters_own_id_is_patched_in_place_both_ways() -> None:
    ids = VirtualTopicIds(PREFIX, {"shared": "shared.orders"}, {ORDERS_ID: "shared.orders"}.get)
    stage = VirtualClusterNames(NAMES, FakeServices(), PREFIX, ids)
    own = uuid.UUID(int=77)
    request = wire(fetch(13, topic_id=ids.virtual(own)))
    assert stage.wire_request(request)
    assert [t.topic_id for t in decoded(request).topics] == [own]
    (fix,) = request.fixes
    response_cls = response_class(ApiKey.FETCH, 13)
    r_topic = nested(response_cls, "responses")
    r_part = build(nested(r_topic, "partitions"), partition_index=0, error_code=ErrorCode.none, records=BATCH)
    upstream = build(
        response_cls, error_code=ErrorCode.none, responses=(build(r_topic, topic_id=own, partitions=(r_part,)),)
    )
    frame = encode_response(upstream, 7)
    answer = decode_response(ApiKey.FETCH, 13, fix(frame))
    assert [t.topic_id for t in answer.responses] == [ids.virtual(own)] and answer.responses[0].partitions == (r_part,)
    assert decode_response(ApiKey.FETCH, 13, frame) == upstream  # the broker's frame is left as it came
    assert not stage.wire_request(wire(fetch(13, topic_id=ids.virtual(ORDERS_ID, "shared"))))  # an alias's id
