"""ACLs enforced by the gateway on the passthrough cluster (GATEWAY_ACL_ENABLED), managed by a super
user with the Kafka Admin API, seen by each client library as its own authorization errors."""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Callable, Iterator

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import TopicAuthorizationFailedError as AioTopicAuthorizationFailed
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from inprocess import bootstrap_of, inprocess_gateway
from kafka import KafkaProducer
from kafka.errors import TopicAuthorizationFailedError

from kanal.audit import AuditQuery
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint

SECRET = secrets.token_bytes(32)
ACCOUNTS = ("admin", "orders-app", "billing-app")


@pytest.fixture
def gateway(tansu: TansuBroker) -> Iterator[Gateway]:
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
        "GATEWAY_ACL_ENABLED": "true",
        "GATEWAY_SUPER_USERS": "admin",
        "GATEWAY_ACLS_TOPIC": f"_kanal_acls_{secrets.token_hex(4)}",
    }
    with inprocess_gateway(tansu, env=env) as gw:
        gw.service_accounts.replace([ServiceAccount(name, None, AccountType.LOCAL) for name in ACCOUNTS])
        yield gw


def _config(gw: Gateway, user: str) -> dict[str, object]:
    return {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": mint(user, None, 600, SECRET),
    }


def _admin(gw: Gateway, user: str = "admin") -> AdminClient:
    return AdminClient(_config(gw, user))


def _acl(
    user: str,
    operation: AclOperation,
    name: str,
    kind: ResourceType = ResourceType.TOPIC,
    pattern: ResourcePatternType = ResourcePatternType.PREFIXED,
) -> AclBinding:
    return AclBinding(kind, name, pattern, f"User:{user}", "*", operation, AclPermissionType.ALLOW)


def _create(gw: Gateway, *acls: AclBinding) -> None:
    admin = _admin(gw)  # (kept: a client destroyed early fails its futures)
    for future in admin.create_acls(list(acls), request_timeout=10).values():
        future.result()


def _delivery(gw: Gateway, user: str, topic: str) -> KafkaError | None:
    producer = Producer({**_config(gw, user), "message.timeout.ms": 10000})
    outcome: list[KafkaError | None] = []
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: outcome.append(err))
    producer.flush(15)
    assert outcome, "no delivery report"
    return outcome[0]


def _make_topics(gw: Gateway, *names: str) -> None:
    admin = _admin(gw)
    for future in admin.create_topics([NewTopic(n, 1) for n in names], request_timeout=10).values():
        future.result()


def test_a_principal_writes_and_reads_only_what_its_acls_allow(
    gateway: Gateway, unique_topic: Callable[..., str]
) -> None:
    mine, theirs = unique_topic("orders-"), unique_topic("billing-")
    _make_topics(gateway, mine, theirs)  # by the super user
    prefix = mine[: mine.index("orders-") + len("orders-")]
    _create(
        gateway,
        _acl("orders-app", AclOperation.WRITE, prefix),
        _acl("orders-app", AclOperation.READ, prefix),
        _acl("orders-app", AclOperation.READ, "orders-group", ResourceType.GROUP, ResourcePatternType.LITERAL),
    )
    assert _delivery(gateway, "orders-app", mine) is None
    denied = _delivery(gateway, "orders-app", theirs)
    assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # Metadata shows only what the principal may describe.
    seen = set(Producer(_config(gateway, "orders-app")).list_topics(timeout=10).topics)
    assert mine in seen and theirs not in seen
    assert mine not in set(Producer(_config(gateway, "billing-app")).list_topics(timeout=10).topics)

    # Its group works; another group is refused with the group error.
    consumer = Consumer(
        {
            **_config(gateway, "orders-app"),
            "group.id": "orders-group",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumer.subscribe([mine])
    deadline = time.monotonic() + 60
    message = None
    while message is None and time.monotonic() < deadline:
        polled = consumer.poll(0.5)
        if polled is not None and polled.error() is None:
            message = polled
    consumer.close()
    assert message is not None and message.value() == b"v"
    other = Consumer({**_config(gateway, "orders-app"), "group.id": "someone-elses-group"})
    other.subscribe([mine])
    errors: list[int] = []
    deadline = time.monotonic() + 30
    while KafkaError.GROUP_AUTHORIZATION_FAILED not in errors and time.monotonic() < deadline:
        polled = other.poll(0.5)
        if polled is not None and polled.error() is not None:
            errors.append(polled.error().code())
    other.close()
    assert KafkaError.GROUP_AUTHORIZATION_FAILED in errors, errors


def test_each_library_sees_its_authorization_exception(gateway: Gateway, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic()
    _make_topics(gateway, topic)
    token = mint("billing-app", None, 600, SECRET)
    producer = KafkaProducer(
        bootstrap_servers=bootstrap_of(gateway),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="billing-app",
        sasl_plain_password=token,
        max_block_ms=10000,
    )
    with pytest.raises(TopicAuthorizationFailedError):
        producer.send(topic, b"v").get(timeout=15)
    producer.close()

    async def aio() -> None:
        aio_producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap_of(gateway),
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_plain_username="billing-app",
            sasl_plain_password=token,
            request_timeout_ms=10000,
        )
        await aio_producer.start()
        try:
            with pytest.raises(AioTopicAuthorizationFailed):
                await aio_producer.send_and_wait(topic, b"v")
        finally:
            await aio_producer.stop()

    asyncio.run(aio())


def test_only_super_users_manage_acls_and_describe_and_delete_answer_from_the_gateway(gateway: Gateway) -> None:
    acl = _acl("orders-app", AclOperation.READ, "reports-")
    user = _admin(gateway, "orders-app")
    refused = user.create_acls([acl], request_timeout=10)[acl]
    with pytest.raises(KafkaException) as error:
        refused.result()
    assert error.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED

    _create(gateway, acl)
    _create(gateway, acl)  # twice: stored once
    everything = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    admin = _admin(gateway)
    assert admin.describe_acls(everything, request_timeout=10).result() == [acl]
    deleted = admin.delete_acls([everything], request_timeout=10)
    assert next(iter(deleted.values())).result() == [acl]
    assert admin.describe_acls(everything, request_timeout=10).result() == []


def test_every_denial_is_an_authorization_audit_event_with_the_client_connection(
    gateway: Gateway, unique_topic: Callable[..., str]
) -> None:
    hidden, visible = unique_topic("hidden"), unique_topic("visible")
    _make_topics(gateway, hidden, visible)
    _create(gateway, _acl("billing-app", AclOperation.DESCRIBE, visible, pattern=ResourcePatternType.LITERAL))
    for topic, api, operation in ((hidden, "Metadata", "DESCRIBE"), (visible, "Produce", "WRITE")):
        denied = _delivery(gateway, "billing-app", topic)
        assert denied is not None and denied.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        events = gateway.audit_log.query(AuditQuery(types=frozenset({"AUTHORIZATION"})))
        found = [e for e in events if e["eventData"]["resourceName"] == topic]
        assert found and {e["eventData"]["operation"] for e in found} == {operation}, events
        assert {e["eventData"]["apiKey"] for e in found} == {api}
    event = found[0]
    assert event["userName"] == "billing-app"
    assert event["eventData"]["resourceType"] == "TOPIC"
    assert event["connection"]["remoteAddress"].startswith("127.0.0.1:")
    assert event["connection"]["localAddress"] == bootstrap_of(gateway)


def test_a_revoked_acl_stops_a_producer_at_its_next_request(gateway: Gateway, unique_topic: Callable[..., str]) -> None:
    """The gateway remembers a producer's allowed requests on the wire; a revocation ends that."""
    topic = unique_topic("orders-")
    _make_topics(gateway, topic)
    write = _acl("orders-app", AclOperation.WRITE, topic, pattern=ResourcePatternType.LITERAL)
    _create(gateway, write)
    producer = Producer({**_config(gateway, "orders-app"), "message.timeout.ms": 10000, "retries": 0})
    outcomes: list[KafkaError | None] = []
    for _ in range(3):
        producer.produce(topic, b"v", on_delivery=lambda err, _msg: outcomes.append(err))
        producer.flush(15)
    assert outcomes == [None, None, None]
    admin = _admin(gateway)
    revoke = AclBindingFilter(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        "User:orders-app",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    for future in admin.delete_acls([revoke], request_timeout=10).values():
        assert len(future.result()) == 1
    producer.produce(topic, b"v", on_delivery=lambda err, _msg: outcomes.append(err))
    producer.flush(15)
    assert len(outcomes) == 4 and outcomes[3] is not None
    assert outcomes[3].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
