"""``read-only-topic`` on the replica and leadership admin APIs: AlterPartitionReassignments,
ElectLeaders, AlterReplicaLogDirs, and AlterPartition (a broker-to-controller API the gateway still
forwards when a client sends it).

Tansu speaks none of them: it does not list them in ApiVersions and closes a connection that sends
one. So the tests show three things:

* against Tansu, with raw requests: a request of read-only topics only is answered by the gateway
  (29 for every partition) and never reaches the broker, and a request that also names other topics
  gets, for those, exactly what Tansu gives the same request sent to it directly (a closed
  connection);
* with real clients (kafka-python, confluent-kafka), in a gateway whose ApiVersions answer lists the
  three client APIs (as Apache Kafka's brokers do) and whose innermost interceptor stands in for a
  broker that speaks them: what each client reports per partition, and what reached the "broker";
* with ``kanal.testing``'s harness: how requests are cut and answers spliced, version by version.
"""

from __future__ import annotations

import dataclasses
import datetime
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import kafka
import kafka.errors
import kanal_safeguards.plugin
import pytest
import trio
from confluent_kafka import ElectionType, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kanal_safeguards.decisions import PREFIX
from kanal_safeguards.policies.read_only import ReadOnlyTopic
from safeguard_clients import bootstrap_of, create_topics, inprocess_gateway, spec, through
from test_produce_fetch_policies import events_of
from wire import WireClient, api_versions_request, metadata_request

from kanal.api import (
    ApiKey,
    ErrorCode,
    Interceptor,
    RequestContext,
    Respond,
    ResponseContext,
    UpstreamError,
    build,
    hookimpl,
    nested,
    require_request_class,
    response_class,
)
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.pipeline.dispatch import CloseConnection
from kanal.protocol.api import supported_versions
from kanal.testing import Exchange, FakeServices, Harness

ALTER_PARTITION = 56
DENIED = int(ErrorCode.topic_authorization_failed)
CLIENT_APIS = (ApiKey.ALTER_PARTITION_REASSIGNMENTS, ApiKey.ELECT_LEADERS, ApiKey.ALTER_REPLICA_LOG_DIRS)
NODE = 111  # Tansu's node id (the tansu fixture's)

Partitions = Mapping[str, Sequence[int]]  # topic -> partitions


def denied(topic: str) -> str:
    return f"{PREFIX} Topic '{topic}' is read-only."


# -- requests, by API and version


def reassign_request(version: int, topics: Partitions) -> Any:
    cls = require_request_class(ApiKey.ALTER_PARTITION_REASSIGNMENTS, version)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    entries = tuple(
        build(topic_cls, name=t, partitions=tuple(build(part_cls, partition_index=p, replicas=(NODE,)) for p in ps))
        for t, ps in topics.items()
    )
    return build(cls, timeout=datetime.timedelta(seconds=5), topics=entries)


def elect_request(version: int, topics: Partitions | None) -> Any:
    cls = require_request_class(ApiKey.ELECT_LEADERS, version)
    entry_cls = nested(cls, "topic_partitions")
    entries = (
        None if topics is None else tuple(build(entry_cls, topic=t, partitions=tuple(ps)) for t, ps in topics.items())
    )
    return build(cls, election_type=0, timeout=datetime.timedelta(seconds=5), topic_partitions=entries)


def log_dirs_request(version: int, dirs: Mapping[str, Partitions]) -> Any:
    cls = require_request_class(ApiKey.ALTER_REPLICA_LOG_DIRS, version)
    dir_cls = nested(cls, "dirs")
    topic_cls = nested(dir_cls, "topics")
    entries = tuple(
        build(
            dir_cls, path=path, topics=tuple(build(topic_cls, name=t, partitions=tuple(ps)) for t, ps in topics.items())
        )
        for path, topics in dirs.items()
    )
    return build(cls, dirs=entries)


def alter_partition_request(version: int, topics: Mapping[uuid.UUID, Sequence[int]]) -> Any:
    cls = require_request_class(ALTER_PARTITION, version)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    isr = (
        {"new_isr": (NODE,)}
        if version < 3
        else {"new_isr_with_epochs": (build(nested(part_cls, "new_isr_with_epochs"), broker_id=NODE),)}
    )
    entries = tuple(
        build(topic_cls, topic_id=i, partitions=tuple(build(part_cls, partition_index=p, **isr) for p in ps))
        for i, ps in topics.items()
    )
    return build(cls, broker_id=NODE, broker_epoch=1, topics=entries)


def request_for(api_key: int, version: int, topics: Partitions) -> Any:
    """A request of one of the three client APIs over ``topics`` (AlterReplicaLogDirs: one dir)."""
    if api_key == ApiKey.ALTER_PARTITION_REASSIGNMENTS:
        return reassign_request(version, topics)
    if api_key == ApiKey.ELECT_LEADERS:
        return elect_request(version, topics)
    return log_dirs_request(version, {"/var/lib/kafka/disk-1": topics})


# -- answers: what each API answers per topic-partition


def outcome(response: Any) -> dict[tuple[str, int], tuple[int, str | None]]:
    """(topic, partition) -> (error code, error message) of a response of the three client APIs."""
    found: dict[tuple[str, int], tuple[int, str | None]] = {}
    if hasattr(response, "replica_election_results"):
        for t in response.replica_election_results:
            for p in t.partition_result:
                found[(str(t.topic), int(p.partition_id))] = (int(p.error_code), p.error_message)
    elif hasattr(response, "responses"):
        for t in response.responses:
            for p in t.partitions:
                found[(str(t.name), int(p.partition_index))] = (int(p.error_code), p.error_message)
    else:
        for t in response.results:
            for p in t.partitions:
                found[(str(t.topic_name), int(p.partition_index))] = (int(p.error_code), None)
    return found


def expected(api_key: int, topics: Partitions, code: int) -> dict[tuple[str, int], tuple[int, str | None]]:
    """What ``outcome`` gives when every partition of ``topics`` got ``code`` (29 names the topic)."""
    has_message = api_key != ApiKey.ALTER_REPLICA_LOG_DIRS
    return {
        (t, p): (code, denied(t) if code == DENIED and has_message else None) for t, ps in topics.items() for p in ps
    }


def asked(request: Any) -> dict[str, list[int]]:
    """The topics and partitions a request of the three client APIs names (all log dirs merged)."""
    found: dict[str, list[int]] = {}
    if hasattr(request, "topic_partitions"):
        for e in request.topic_partitions or ():
            found.setdefault(str(e.topic), []).extend(int(p) for p in e.partitions)
    elif hasattr(request, "dirs"):
        for d in request.dirs:
            for e in d.topics:
                found.setdefault(str(e.name), []).extend(int(p) for p in e.partitions)
    else:
        for e in request.topics:
            found.setdefault(str(e.name), []).extend(int(p.partition_index) for p in e.partitions)
    return found


def broker_answer(request: Any) -> Any:
    """What a broker that speaks these APIs answers when every partition asked succeeds."""
    api_key, version = int(request.__api_key__), int(request.__version__)
    cls = response_class(api_key, version)
    assert cls is not None
    if api_key == ALTER_PARTITION:
        topic_cls = nested(cls, "topics")
        part_cls = nested(topic_cls, "partitions")
        topics = tuple(
            build(
                topic_cls,
                topic_id=t.topic_id,
                partitions=tuple(
                    build(part_cls, partition_index=p.partition_index, leader_id=NODE, leader_epoch=1, isr=(NODE,))
                    for p in t.partitions
                ),
            )
            for t in request.topics
        )
        return build(cls, topics=topics)
    parts = asked(request)
    if api_key == ApiKey.ELECT_LEADERS:
        topic_cls = nested(cls, "replica_election_results")
        part_cls = nested(topic_cls, "partition_result")
        results = tuple(
            build(
                topic_cls,
                topic=t,
                partition_result=tuple(build(part_cls, partition_id=p, error_message=None) for p in ps),
            )
            for t, ps in parts.items()
        )
        return build(cls, replica_election_results=results)
    if api_key == ApiKey.ALTER_PARTITION_REASSIGNMENTS:
        topic_cls = nested(cls, "responses")
        part_cls = nested(topic_cls, "partitions")
        responses = tuple(
            build(
                topic_cls, name=t, partitions=tuple(build(part_cls, partition_index=p, error_message=None) for p in ps)
            )
            for t, ps in parts.items()
        )
        return build(cls, error_message=None, responses=responses)
    topic_cls = nested(cls, "results")
    part_cls = nested(topic_cls, "partitions")
    results = tuple(
        build(topic_cls, topic_name=t, partitions=tuple(build(part_cls, partition_index=p) for p in ps))
        for t, ps in parts.items()
    )
    return build(cls, results=results)


def metadata_answer(request: Any, topics: Mapping[str, int]) -> Any:
    """A Metadata response listing ``topics`` (name -> partition count)."""
    cls = response_class(ApiKey.METADATA, int(request.__version__))
    assert cls is not None
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    entries = tuple(
        build(topic_cls, name=t, partitions=tuple(build(part_cls, partition_index=p, leader_id=NODE) for p in range(n)))
        for t, n in topics.items()
    )
    return build(cls, topics=entries)


# -- a gateway that lets real clients send the client APIs


class OfferAdminApis(Interceptor):
    """Adds the three client APIs to the ApiVersions answer, as Apache Kafka's brokers list them:
    clients check that list and would not send them to a gateway in front of Tansu."""

    plugin_name: ClassVar[str] = "test-offer-admin-apis"
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.API_VERSIONS})

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> None:
        entry_cls = nested(type(ctx.response), "api_keys")
        listed = {int(e.api_key) for e in ctx.response.api_keys}
        extra = []
        for api_key in CLIENT_APIS:
            versions = supported_versions(api_key)
            if api_key not in listed and versions is not None:
                extra.append(build(entry_cls, api_key=api_key, min_version=versions[0], max_version=versions[1]))
        ctx.response = dataclasses.replace(ctx.response, api_keys=(*ctx.response.api_keys, *extra))


class StandInBroker(Interceptor):
    """Innermost: answers the three client APIs as a broker that speaks them (every partition
    succeeds), and keeps what reached it (``received``, cleared by each test)."""

    plugin_name: ClassVar[str] = "test-stand-in-broker"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(CLIENT_APIS)
    received: ClassVar[list[Any]] = []

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> Respond:
        StandInBroker.received.append(ctx.request)
        return Respond(broker_answer(ctx.request))


class Upstream(Interceptor):
    """Innermost: keeps what the gateway sends the broker (``seen``, cleared by each test)."""

    plugin_name: ClassVar[str] = "test-upstream"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({*CLIENT_APIS, ALTER_PARTITION})
    seen: ClassVar[list[Any]] = []

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> None:
        Upstream.seen.append(ctx.request)


class AdminApisPlugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [OfferAdminApis, StandInBroker, Upstream]


@contextmanager
def admin_gateway(tansu: TansuBroker, topic: str, *, stand_in: bool = True) -> Iterator[Gateway]:
    """A gateway whose ApiVersions lists the client APIs, with ``read-only-topic`` on ``topic`` and,
    inside it, the stand-in broker."""
    interceptors = [spec("ro", "read-only-topic", {"topic": topic}), spec("offer", "test-offer-admin-apis", {})]
    if stand_in:
        interceptors.append(spec("broker", "test-stand-in-broker", {}, priority=100))
    StandInBroker.received.clear()
    plugins = {"safeguards": kanal_safeguards.plugin, "admin-apis": AdminApisPlugin()}
    with inprocess_gateway(tansu, plugins, interceptors) as gateway:
        yield gateway


def read_only_gateway(tansu: TansuBroker, topic: str) -> Any:
    """A gateway with ``read-only-topic`` in front of Tansu (its ApiVersions answer as it is), and
    inside it the interceptor that keeps what goes to Tansu."""
    Upstream.seen.clear()
    plugins = {"safeguards": kanal_safeguards.plugin, "admin-apis": AdminApisPlugin()}
    interceptors = [
        spec("ro", "read-only-topic", {"topic": topic}),
        spec("upstream", "test-upstream", {}, priority=100),
    ]
    return inprocess_gateway(tansu, plugins, interceptors)


def call(bootstrap: str, request: Any) -> Any:
    """The response to ``request`` on a new connection; ConnectionError when it is closed instead."""
    client = WireClient(bootstrap)
    try:
        return client.call(request)
    finally:
        client.close()


def received() -> dict[str, list[int]]:
    """Every topic-partition that reached the stand-in broker."""
    found: dict[str, list[int]] = {}
    for request in StandInBroker.received:
        for topic, partitions in asked(request).items():
            found.setdefault(topic, []).extend(partitions)
    return found


def kafka_python(gateway: Gateway) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=bootstrap_of(gateway), request_timeout_ms=30_000)


def confluent_codes(results: Mapping[TopicPartition, Any]) -> dict[tuple[str, int], int | None]:
    """confluent-kafka's per-partition results as (topic, partition) -> error code (None: success)."""
    codes: dict[tuple[str, int], int | None] = {}
    for tp, error in results.items():
        if isinstance(error, KafkaException):
            error = error.args[0]
        codes[(tp.topic, tp.partition)] = None if error is None else int(error.code())
    return codes


# -- against Tansu: raw requests


def versions(api_key: int) -> range:
    """The versions of an API the gateway decodes (kio's), hence those it may see."""
    known = supported_versions(api_key)
    assert known is not None
    return range(known[0], known[1] + 1)


CLIENT_API_VERSIONS = [
    pytest.param(api_key, version, id=f"{api_key.name.lower()}-v{version}")
    for api_key in CLIENT_APIS
    for version in versions(api_key)
]


@pytest.mark.integration
def test_tansu_does_not_speak_these_apis(tansu: TansuBroker) -> None:
    offered = {int(e.api_key) for e in call(tansu.bootstrap, api_versions_request()).api_keys}
    assert offered.isdisjoint({*CLIENT_APIS, ALTER_PARTITION})
    with pytest.raises(ConnectionError):
        call(tansu.bootstrap, elect_request(2, {"any": [0]}))


@pytest.mark.integration
@pytest.mark.parametrize(("api_key", "version"), CLIENT_API_VERSIONS)
def test_read_only_partitions_are_refused_by_the_gateway(
    tansu: TansuBroker, unique_topic: Any, api_key: ApiKey, version: int
) -> None:
    """Nothing reaches Tansu (it would close the connection): the gateway answers every partition."""
    frozen, archive = unique_topic("frozen"), unique_topic("frozen")
    create_topics(tansu, frozen, archive, partitions=2)
    topics = {frozen: [0, 1], archive: [1]}
    with read_only_gateway(tansu, ".*-frozen-.*") as gw:
        response = call(bootstrap_of(gw), request_for(api_key, version, topics))
        [event] = events_of(gw, "read-only-topic", 1)
    assert Upstream.seen == []
    assert outcome(response) == expected(api_key, topics, DENIED)
    assert event == {
        "plugin": "read-only-topic",
        "action": "BLOCK",
        "topics": [frozen, archive],
        "api": {45: "AlterPartitionReassignments", 43: "ElectLeaders", 34: "AlterReplicaLogDirs"}[api_key],
        "reasons": [f"Topic '{frozen}' is read-only.", f"Topic '{archive}' is read-only."],
    }


@pytest.mark.integration
@pytest.mark.parametrize("api_key", CLIENT_APIS, ids=lambda k: k.name.lower())
def test_the_other_topics_get_what_tansu_says(tansu: TansuBroker, unique_topic: Any, api_key: ApiKey) -> None:
    """The read-only topic is taken out; the rest goes to Tansu, which closes the connection, as it
    does when the same request (without the read-only topic) is sent to it directly."""
    frozen, free = unique_topic("frozen"), unique_topic("free")
    create_topics(tansu, frozen, free)
    version = versions(api_key)[-1]
    with pytest.raises(ConnectionError):
        call(tansu.bootstrap, request_for(api_key, version, {free: [0]}))
    with read_only_gateway(tansu, ".*-frozen-.*") as gw:
        with pytest.raises(ConnectionError):
            call(bootstrap_of(gw), request_for(api_key, version, {frozen: [0], free: [0]}))
        [event] = events_of(gw, "read-only-topic", 1)
    [forwarded] = Upstream.seen
    assert forwarded == request_for(api_key, version, {free: [0]})
    assert event["topics"] == [frozen]


def topic_id(tansu: TansuBroker, topic: str) -> uuid.UUID:
    [described] = call(tansu.bootstrap, metadata_request([topic])).topics
    assert described.error_code == ErrorCode.none
    return uuid.UUID(str(described.topic_id))


@pytest.mark.integration
@pytest.mark.parametrize("version", versions(ALTER_PARTITION))
def test_alter_partition_by_topic_id(tansu: TansuBroker, unique_topic: Any, version: int) -> None:
    """A broker-to-controller API: no client sends it, but the gateway would forward it; the
    read-only topics are refused by their id, the others get Tansu's answer (a closed connection)."""
    frozen, free = unique_topic("frozen"), unique_topic("free")
    create_topics(tansu, frozen, free, partitions=2)
    frozen_id, free_id = topic_id(tansu, frozen), topic_id(tansu, free)
    with read_only_gateway(tansu, ".*-frozen-.*") as gw:
        response = call(bootstrap_of(gw), alter_partition_request(version, {frozen_id: [0, 1]}))
        assert Upstream.seen == []
        with pytest.raises(ConnectionError):
            call(bootstrap_of(gw), alter_partition_request(version, {frozen_id: [0], free_id: [0]}))
        events = events_of(gw, "read-only-topic", 2)
    with pytest.raises(ConnectionError):
        call(tansu.bootstrap, alter_partition_request(version, {free_id: [0]}))
    assert Upstream.seen == [alter_partition_request(version, {free_id: [0]})]
    assert response.error_code == ErrorCode.none
    [answered] = response.topics
    assert answered.topic_id == frozen_id
    assert [(p.partition_index, p.error_code, p.leader_id, p.leader_epoch) for p in answered.partitions] == [
        (0, DENIED, -1, -1),
        (1, DENIED, -1, -1),
    ]
    assert [(e["api"], e["topics"]) for e in events] == [("AlterPartition", [frozen]), ("AlterPartition", [frozen])]


# -- real clients (the gateway lists the APIs; a stand-in broker answers what gets through)


@pytest.mark.integration
def test_kafka_python_reassignments_fail_only_for_read_only_partitions(tansu: TansuBroker, unique_topic: Any) -> None:
    frozen, free = unique_topic("frozen"), unique_topic("free")
    create_topics(tansu, frozen, free, partitions=2)
    with admin_gateway(tansu, ".*-frozen-.*") as gw:
        admin = kafka_python(gw)
        try:
            results = admin.alter_partition_reassignments(
                {
                    kafka.TopicPartition(frozen, 0): [NODE],
                    kafka.TopicPartition(frozen, 1): [NODE],
                    kafka.TopicPartition(free, 1): [NODE],
                }
            )
        finally:
            admin.close()
    assert results == {
        kafka.TopicPartition(frozen, 0): kafka.errors.TopicAuthorizationFailedError,
        kafka.TopicPartition(frozen, 1): kafka.errors.TopicAuthorizationFailedError,
        kafka.TopicPartition(free, 1): None,
    }
    assert received() == {free: [1]}


@pytest.mark.integration
def test_kafka_python_log_dir_moves_fail_only_for_read_only_partitions(tansu: TansuBroker, unique_topic: Any) -> None:
    frozen, free = unique_topic("frozen"), unique_topic("free")
    create_topics(tansu, frozen, free, partitions=2)
    moves = {
        kafka.TopicPartitionReplica(frozen, 0, NODE): "/data/a",
        kafka.TopicPartitionReplica(frozen, 1, NODE): "/data/b",
        kafka.TopicPartitionReplica(free, 0, NODE): "/data/a",
    }
    with admin_gateway(tansu, ".*-frozen-.*") as gw:
        admin = kafka_python(gw)
        try:
            results = admin.alter_replica_log_dirs(moves)
        finally:
            admin.close()
    assert results == {
        kafka.TopicPartitionReplica(frozen, 0, NODE): kafka.errors.TopicAuthorizationFailedError,
        kafka.TopicPartitionReplica(frozen, 1, NODE): kafka.errors.TopicAuthorizationFailedError,
        kafka.TopicPartitionReplica(free, 0, NODE): kafka.errors.NoError,
    }
    assert received() == {free: [0]}


@pytest.mark.integration
def test_kafka_python_election_raises_an_authorization_error(tansu: TansuBroker, unique_topic: Any) -> None:
    frozen, free = unique_topic("frozen"), unique_topic("free")
    create_topics(tansu, frozen, free, partitions=2)
    with admin_gateway(tansu, ".*-frozen-.*") as gw:
        admin = kafka_python(gw)
        try:
            with pytest.raises(kafka.errors.TopicAuthorizationFailedError, match=f"Topic '{frozen}' is read-only."):
                admin.elect_leaders(0, {frozen: [0, 1], free: [0]})
            response = admin.elect_leaders(0, {frozen: [1], free: [0, 1]}, raise_errors=False)
        finally:
            admin.close()
    assert outcome(response) == {**expected(43, {frozen: [1]}, DENIED), **expected(43, {free: [0, 1]}, 0)}
    assert received() == {free: [0, 0, 1]}


@pytest.mark.integration
def test_confluent_kafka_election_fails_only_for_read_only_partitions(tansu: TansuBroker, unique_topic: Any) -> None:
    frozen, free = unique_topic("frozen"), unique_topic("free")
    create_topics(tansu, frozen, free, partitions=2)
    with admin_gateway(tansu, ".*-frozen-.*") as gw:
        admin = AdminClient(through(gw))
        future = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(frozen, 1), TopicPartition(free, 0)])
        results = future.result(30)
        [event] = events_of(gw, "read-only-topic", 1)
    assert confluent_codes(results) == {(frozen, 1): KafkaError.TOPIC_AUTHORIZATION_FAILED, (free, 0): None}
    assert received() == {free: [0]}
    assert event["api"] == "ElectLeaders" and event["topics"] == [frozen]


@pytest.mark.integration
def test_an_election_of_every_partition_spares_the_read_only_topics(tansu: TansuBroker, unique_topic: Any) -> None:
    """``elect_leaders(None)``: the gateway reads the topics from Tansu and elects the others by name."""
    frozen, free = unique_topic("frozen"), unique_topic("free")
    create_topics(tansu, frozen, free, partitions=2)
    with admin_gateway(tansu, frozen) as gw:  # (other tests' topics are on the broker too)
        admin = AdminClient(through(gw))
        results = confluent_codes(admin.elect_leaders(ElectionType.PREFERRED, None).result(30))
        [event] = events_of(gw, "read-only-topic", 1)
    assert {tp: results[tp] for tp in [(frozen, 0), (frozen, 1), (free, 0), (free, 1)]} == {
        (frozen, 0): KafkaError.TOPIC_AUTHORIZATION_FAILED,
        (frozen, 1): KafkaError.TOPIC_AUTHORIZATION_FAILED,
        (free, 0): None,
        (free, 1): None,
    }
    [election] = StandInBroker.received
    assert election.topic_partitions is not None  # named, not "every partition"
    elected = asked(election)
    assert elected[free] == [0, 1] and frozen not in elected
    assert {tp for tp, code in results.items() if code is not None} == {(frozen, 0), (frozen, 1)}
    assert event["topics"] == [frozen]


@pytest.mark.integration
def test_an_election_of_every_partition_with_every_topic_read_only_stays_in_the_gateway(
    tansu: TansuBroker, unique_topic: Any
) -> None:
    """Nothing stands in for the broker here: Tansu would close the connection if it got the election."""
    topic = unique_topic()
    create_topics(tansu, topic, partitions=2)
    with admin_gateway(tansu, ".*", stand_in=False) as gw:
        admin = AdminClient(through(gw))
        results = confluent_codes(admin.elect_leaders(ElectionType.PREFERRED, None).result(30))
    known = {
        (str(t.name), int(p.partition_index))
        for t in call(tansu.bootstrap, metadata_request(None)).topics
        for p in t.partitions
    }
    assert {(topic, 0), (topic, 1)} <= set(results) <= known
    assert set(results.values()) == {KafkaError.TOPIC_AUTHORIZATION_FAILED}


# -- the harness: cutting requests and splicing answers, per version


def run(harness: Harness, request: Any, upstream: Any = broker_answer) -> Exchange:
    return trio.run(harness.request, request, upstream)


def harness(topic: str = "frozen.*", action: str = "BLOCK", services: FakeServices | None = None) -> Harness:
    h = Harness(services=services or FakeServices())
    h.add(ReadOnlyTopic, {"topic": topic, "action": action})
    return h


@pytest.mark.parametrize(("api_key", "version"), CLIENT_API_VERSIONS)
def test_harness_only_the_other_topics_are_forwarded(api_key: ApiKey, version: int) -> None:
    topics = {"frozen-a": [0, 2], "orders": [1], "frozen-b": [0], "payments": [0, 1]}
    exchange = run(harness(), request_for(api_key, version, topics))
    assert exchange.forwarded is not None
    assert asked(exchange.forwarded) == {"orders": [1], "payments": [0, 1]}
    assert outcome(exchange.response) == {
        **expected(api_key, {"orders": [1], "payments": [0, 1]}, 0),
        **expected(api_key, {"frozen-a": [0, 2], "frozen-b": [0]}, DENIED),
    }


@pytest.mark.parametrize(("api_key", "version"), CLIENT_API_VERSIONS)
def test_harness_read_only_topics_only_are_answered_by_the_gateway(api_key: ApiKey, version: int) -> None:
    exchange = run(harness(), request_for(api_key, version, {"frozen-a": [0, 1]}), upstream=None)
    assert exchange.forwarded is None
    assert outcome(exchange.response) == expected(api_key, {"frozen-a": [0, 1]}, DENIED)
    assert getattr(exchange.response, "error_code", ErrorCode.none) == ErrorCode.none


@pytest.mark.parametrize(("api_key", "version"), CLIENT_API_VERSIONS)
def test_harness_info_forwards_everything_and_audits(api_key: ApiKey, version: int) -> None:
    services = FakeServices()
    request = request_for(api_key, version, {"frozen-a": [0], "orders": [0]})
    exchange = run(harness(action="INFO", services=services), request)
    assert exchange.forwarded == request
    assert outcome(exchange.response) == expected(api_key, {"frozen-a": [0], "orders": [0]}, 0)
    [(_, _, event)] = services.audited
    assert event["action"] == "INFO" and event["topics"] == ["frozen-a"]


@pytest.mark.parametrize("version", versions(ApiKey.ALTER_REPLICA_LOG_DIRS))
def test_harness_log_dirs_a_topic_moved_to_several_dirs_gets_one_answer(version: int) -> None:
    request = log_dirs_request(
        version,
        {"/d1": {"frozen-a": [0], "orders": [0]}, "/d2": {"frozen-a": [1]}, "/d3": {"payments": [2], "frozen-a": [0]}},
    )
    exchange = run(harness(), request)
    assert [(d.path, [(t.name, t.partitions) for t in d.topics]) for d in exchange.forwarded.dirs] == [
        ("/d1", [("orders", (0,))]),
        ("/d3", [("payments", (2,))]),
    ]  # /d2 held only the read-only topic
    [refused] = [t for t in exchange.response.results if t.topic_name == "frozen-a"]
    assert [(p.partition_index, p.error_code) for p in refused.partitions] == [(0, DENIED), (1, DENIED)]


def test_harness_an_explicitly_empty_election_is_forwarded_as_it_is() -> None:
    request = elect_request(2, {})
    exchange = run(harness(), request)
    assert exchange.forwarded == request and exchange.upstream_calls == []


ELECTION_VERSIONS = list(versions(ApiKey.ELECT_LEADERS))


def cluster(topics: Mapping[str, int]) -> Any:
    """The upstream of a harness: Metadata lists ``topics``, the rest is ``broker_answer``."""

    def answer(request: Any) -> Any:
        if int(request.__api_key__) == ApiKey.METADATA:
            return metadata_answer(request, topics)
        return broker_answer(request)

    return answer


@pytest.mark.parametrize("version", ELECTION_VERSIONS)
def test_harness_every_partition_without_read_only_topics_is_forwarded_as_it_is(version: int) -> None:
    request = elect_request(version, None)
    exchange = run(harness(), request, cluster({"orders": 2}))
    assert exchange.forwarded == request  # topic_partitions still null
    assert [int(r.__api_key__) for r in exchange.upstream_calls] == [ApiKey.METADATA]


@pytest.mark.parametrize("version", ELECTION_VERSIONS)
def test_harness_every_partition_becomes_every_other_topic(version: int) -> None:
    services = FakeServices()
    exchange = run(harness(services=services), elect_request(version, None), cluster({"orders": 2, "frozen-a": 3}))
    assert exchange.forwarded is not None and asked(exchange.forwarded) == {"orders": [0, 1]}
    assert outcome(exchange.response) == {
        **expected(43, {"orders": [0, 1]}, 0),
        **expected(43, {"frozen-a": [0, 1, 2]}, DENIED),
    }
    [(_, _, event)] = services.audited
    assert event["topics"] == ["frozen-a"]


@pytest.mark.parametrize("version", ELECTION_VERSIONS)
def test_harness_every_partition_of_read_only_topics_only_is_answered_by_the_gateway(version: int) -> None:
    exchange = run(harness(), elect_request(version, None), cluster({"frozen-a": 1, "frozen-b": 2}))
    assert exchange.forwarded is None
    assert outcome(exchange.response) == expected(43, {"frozen-a": [0], "frozen-b": [0, 1]}, DENIED)


def test_harness_every_partition_with_info_is_forwarded_as_it_is_and_audited() -> None:
    services = FakeServices()
    request = elect_request(2, None)
    exchange = run(harness(action="INFO", services=services), request, cluster({"frozen-a": 1, "orders": 1}))
    assert exchange.forwarded == request
    [(_, _, event)] = services.audited
    assert event["action"] == "INFO" and event["topics"] == ["frozen-a"]


def test_harness_every_partition_when_the_topics_cannot_be_read_closes_the_connection() -> None:
    """Fail closed: without the broker's topics nothing can be spared, so nothing is elected."""

    def broken(request: Any) -> Any:
        raise UpstreamError("broker gone")

    with pytest.raises(CloseConnection, match="broker gone"):
        run(harness(), elect_request(2, None), broken)


@pytest.mark.parametrize("version", versions(ALTER_PARTITION))
def test_harness_alter_partition_names_topics_by_id(version: int) -> None:
    frozen, orders, unknown = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    services = FakeServices(topic_names={frozen: "frozen-a", orders: "orders"})
    request = alter_partition_request(version, {frozen: [0, 1], orders: [0], unknown: [3]})
    exchange = run(harness(services=services), request)
    assert [(t.topic_id, [p.partition_index for p in t.partitions]) for t in exchange.forwarded.topics] == [
        (orders, [0]),
        (unknown, [3]),  # an id nobody knows names no read-only topic: the broker answers it
    ]
    refused = {t.topic_id: t for t in exchange.response.topics}[frozen]
    assert [(p.partition_index, p.error_code, p.leader_id, p.partition_epoch) for p in refused.partitions] == [
        (0, DENIED, -1, -1),
        (1, DENIED, -1, -1),
    ]
    [(_, _, event)] = services.audited
    assert event["api"] == "AlterPartition" and event["topics"] == ["frozen-a"]
