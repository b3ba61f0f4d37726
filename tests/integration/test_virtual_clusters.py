"""Two tenants in two virtual clusters use the same topic, group and transactional id names on one
physical cluster without seeing each other, with each client library."""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from inprocess import bootstrap_of, in_gateway, inprocess_gateway
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kio.schema.errors import ErrorCode

from kanal.api.context import RecordsContext
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor, InterceptorSpec, Scope
from kanal.api.results import PartitionError
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint
from kanal.tenancy.aliases import AliasTopic
from kanal.tenancy.clusters import VirtualCluster

SECRET = secrets.token_bytes(32)
TENANTS = ("team-a.", "team-b.")


@pytest.fixture
def gateway(tansu: TansuBroker) -> Iterator[Gateway]:
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
    }
    with inprocess_gateway(tansu, env=env) as gw:
        gw.virtual_clusters.replace([VirtualCluster(name) for name in TENANTS])
        gw.service_accounts.replace(
            [ServiceAccount("app", tenant, AccountType.LOCAL) for tenant in TENANTS]
            + [ServiceAccount("ops", None, AccountType.LOCAL)]
        )
        yield gw


def _config(gw: Gateway, tenant: str | None, user: str = "app") -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": mint(user, tenant, 600, SECRET),
    }


def _consume(config: dict[str, Any], topic: str, group: str, count: int) -> list[bytes]:
    consumer = Consumer(
        {
            **config,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.commit(asynchronous=False)
    consumer.close()
    return values


def test_two_tenants_share_names_but_nothing_else(gateway: Gateway, unique_topic: Callable[..., str]) -> None:
    topic = unique_topic()
    for tenant in TENANTS:
        admin = AdminClient(_config(gateway, tenant))
        for future in admin.create_topics([NewTopic(topic, 1)], request_timeout=10).values():
            future.result()
        producer = Producer({**_config(gateway, tenant), "transactional.id": "tx", "message.timeout.ms": 10000})
        producer.init_transactions(15)
        producer.begin_transaction()
        producer.produce(topic, f"from {tenant}".encode())
        producer.commit_transaction(15)

    for tenant in TENANTS:
        assert _consume(_config(gateway, tenant), topic, "readers", 1) == [f"from {tenant}".encode()]
        seen = Producer(_config(gateway, tenant)).list_topics(timeout=10).topics
        assert topic in seen and not any(name.startswith(TENANTS) for name in seen), sorted(seen)
        assert not any(name.startswith("_kanal") or name.startswith("__") for name in seen), sorted(seen)
        admin = AdminClient(_config(gateway, tenant))
        groups = admin.list_consumer_groups(request_timeout=10).result()
        assert [g.group_id for g in groups.valid] == ["readers"]
        reader = Consumer({**_config(gateway, tenant), "group.id": "readers"})
        committed = reader.committed([TopicPartition(topic, 0)], timeout=10)
        reader.close()
        # past the record (and, once the consumer read that far, the transaction's marker)
        assert committed[0].offset in (1, 2) and committed[0].error is None

    # The physical cluster holds each tenant's topic, group and transactional id under its prefix.
    ops = Producer(_config(gateway, None, "ops")).list_topics(timeout=10).topics
    assert {f"{tenant}{topic}" for tenant in TENANTS} <= set(ops)
    ops_admin = AdminClient(_config(gateway, None, "ops"))
    physical_groups = ops_admin.list_consumer_groups(request_timeout=10).result()
    assert {f"{tenant}readers" for tenant in TENANTS} <= {g.group_id for g in physical_groups.valid}


def test_kafka_python_and_aiokafka_clients_stay_in_their_virtual_cluster(
    gateway: Gateway, unique_topic: Callable[..., str]
) -> None:
    topic = unique_topic()

    def sasl(tenant: str) -> dict[str, Any]:
        return {
            "bootstrap_servers": bootstrap_of(gateway),
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "app",
            "sasl_plain_password": mint("app", tenant, 600, SECRET),
        }

    producer = KafkaProducer(**sasl("team-a."))
    producer.send(topic, b"kafka-python in a").get(timeout=15)
    producer.close()

    async def aio() -> list[bytes]:
        aio_producer = AIOKafkaProducer(**sasl("team-b."))
        await aio_producer.start()
        try:
            await aio_producer.send_and_wait(topic, b"aiokafka in b")
        finally:
            await aio_producer.stop()
        consumer = AIOKafkaConsumer(topic, auto_offset_reset="earliest", **sasl("team-b."))
        await consumer.start()
        try:
            batch = await consumer.getmany(timeout_ms=10000)
            return [record.value for records in batch.values() for record in records]
        finally:
            await consumer.stop()

    assert asyncio.run(aio()) == [b"aiokafka in b"]
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=5000, **sasl("team-a."))
    assert [record.value for record in consumer] == [b"kafka-python in a"]
    consumer.close()


def test_a_topic_name_too_long_with_the_prefix_is_refused_naming_the_limit(gateway: Gateway) -> None:
    admin = AdminClient(_config(gateway, "team-a."))
    futures = admin.create_topics([NewTopic("x" * 245, 1)], request_timeout=10)
    error = next(iter(futures.values())).exception()
    assert error is not None and error.args[0].code() == KafkaError.TOPIC_EXCEPTION
    assert "249" in error.args[0].str()


def test_apis_on_the_whole_cluster_are_refused_in_a_virtual_cluster(gateway: Gateway) -> None:
    admin = AdminClient(_config(gateway, "team-a."))
    entry = ConfigEntry("log.retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)
    future = admin.incremental_alter_configs([ConfigResource(ResourceType.BROKER, "111", incremental_configs=[entry])])
    error = next(iter(future.values())).exception()
    assert error is not None and error.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def test_a_tenant_super_user_manages_the_tenant_acls_on_logical_names(
    tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
        "GATEWAY_ACLS_TOPIC": f"_kanal_acls_{secrets.token_hex(4)}",
    }
    allowed, other = unique_topic("allowed"), unique_topic("other")
    with inprocess_gateway(tansu, env=env) as gw:
        gw.virtual_clusters.replace(
            [VirtualCluster("team-a.", acl_enabled=True, super_users=("boss",)), VirtualCluster("team-b.")]
        )
        gw.service_accounts.replace(
            [ServiceAccount(name, "team-a.", AccountType.LOCAL) for name in ("app", "boss")]
            + [ServiceAccount("app", "team-b.", AccountType.LOCAL)]
        )
        boss = AdminClient(_config(gw, "team-a.", "boss"))
        for future in boss.create_topics([NewTopic(t, 1) for t in (allowed, other)], request_timeout=10).values():
            future.result()
        acl = AclBinding(
            ResourceType.TOPIC,
            allowed,
            ResourcePatternType.LITERAL,
            "User:app",
            "*",
            AclOperation.WRITE,
            AclPermissionType.ALLOW,
        )
        reads = [
            AclBinding(
                kind, name, ResourcePatternType.LITERAL, "User:app", "*", AclOperation.READ, AclPermissionType.ALLOW
            )
            for kind, name in ((ResourceType.TOPIC, allowed), (ResourceType.GROUP, "readers"))
        ]
        for future in boss.create_acls([acl, *reads], request_timeout=10).values():
            future.result()

        def delivered(tenant: str, topic: str) -> KafkaError | None:
            producer = Producer({**_config(gw, tenant), "message.timeout.ms": 10000})
            outcome: list[KafkaError | None] = []
            producer.produce(topic, b"v", on_delivery=lambda err, _msg: outcome.append(err))
            producer.flush(15)
            return outcome[0]

        assert delivered("team-a.", allowed) is None
        refused = delivered("team-a.", other)
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert delivered("team-b.", other) is None  # another tenant, no ACLs enforced
        # A consumer fetches by topic id (Fetch v13+): checked under the tenant's name for that id.
        assert _consume(_config(gw, "team-a."), allowed, "readers", 1) == [b"v"]
        # The ACL is on the logical name, and only the tenant sees it.
        assert {acl.resource_name for acl in gw.acls.acls("team-a.").bindings} == {allowed, "readers"}
        assert gw.acls.acls(None).bindings == ()
        team_b = AdminClient(_config(gw, "team-b."))  # ACLs are not enforced there: the ACL APIs are refused
        refused_acl = team_b.create_acls([acl], request_timeout=10)[acl].exception()
        assert refused_acl is not None and refused_acl.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


class BadValues(Interceptor):
    """Fails the partitions whose records hold the value ``bad``, and remembers the topics it saw."""

    plugin_name = "bad-values"
    seen: ClassVar[set[str]] = set()

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> PartitionError | None:
        self.seen.add(ctx.topic)
        if any(record.value == b"bad" for _batch, record in ctx.records):
            return PartitionError(ErrorCode.invalid_record, "bad value")
        return None


class BadValuesPlugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [BadValues]


def test_a_tenants_records_interceptor_sees_and_fails_its_logical_topics(
    tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    """Records hooks run in the onion: inside the tenant's view, outside the renaming."""
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
    }
    topic = unique_topic()
    spec = InterceptorSpec("bad", "bad-values", scope=Scope(vcluster="team-a."))
    with inprocess_gateway(tansu, {"bad": BadValuesPlugin()}, [spec], env=env) as gw:
        gw.service_accounts.replace([ServiceAccount("app", "team-a.", AccountType.LOCAL)])
        admin = AdminClient(_config(gw, "team-a."))
        for future in admin.create_topics([NewTopic(topic, 1)], request_timeout=10).values():
            future.result()
        producer = Producer({**_config(gw, "team-a."), "retries": 0, "message.timeout.ms": 10000})
        outcomes: dict[bytes, KafkaError | None] = {}
        for value in (b"good", b"bad"):
            producer.produce(topic, value, on_delivery=lambda err, msg: outcomes.__setitem__(msg.value(), err))
            producer.flush(15)
    assert outcomes[b"good"] is None
    bad = outcomes[b"bad"]
    assert bad is not None and bad.code() == KafkaError.INVALID_RECORD  # the error found its logical topic
    assert BadValues.seen == {topic}


def test_an_alias_topic_reads_and_writes_its_physical_topic_and_shares_its_offsets(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    shared = unique_topic("shared-")  # outside every virtual cluster's prefix
    ops = AdminClient(_config(gateway, None, "ops"))
    for future in ops.create_topics([NewTopic(shared, 1)], request_timeout=10).values():
        future.result()
    in_gateway(gateway, gateway.aliases.replace, [AliasTopic("orders", "team-a.", shared)])
    tenant = _config(gateway, "team-a.")
    producer = Producer(tenant)
    producer.produce("orders", b"through the alias")
    assert producer.flush(15) == 0
    assert _consume(tenant, "orders", "alias-readers", 1) == [b"through the alias"]
    listed = Producer(tenant).list_topics(timeout=10).topics
    assert "orders" in listed and shared not in listed
    assert "orders" not in Producer(_config(gateway, "team-b.")).list_topics(timeout=10).topics

    # The cluster holds the record in the physical topic, and the group's offset on it.
    direct = Consumer(
        {"bootstrap.servers": tansu.bootstrap, "group.id": "team-a.alias-readers", "enable.auto.commit": False}
    )
    committed = direct.committed([TopicPartition(shared, 0)], timeout=10)
    direct.assign([TopicPartition(shared, 0, 0)])
    message = None
    deadline = time.monotonic() + 30
    while message is None and time.monotonic() < deadline:
        polled = direct.poll(0.5)
        if polled is not None and polled.error() is None:
            message = polled
    direct.close()
    assert message is not None and message.value() == b"through the alias"
    assert committed[0].offset == 1

    # kafka-python reads on through the alias from the group's shared offset: nothing new yet.
    producer.produce("orders", b"second")
    assert producer.flush(15) == 0
    consumer = KafkaConsumer(
        "orders",
        group_id="alias-readers",
        auto_offset_reset="earliest",
        consumer_timeout_ms=15000,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="app",
        sasl_plain_password=tenant["sasl.password"],
        bootstrap_servers=bootstrap_of(gateway),
    )
    first = next(iter(consumer))
    consumer.close()
    assert (first.topic, first.value) == ("orders", b"second")


def test_an_alias_of_the_passthrough_cluster_renames_only_itself(
    tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    """On a plain listener: the alias reaches its topic, the topic keeps its own name, and a
    consumer of the alias keeps reading it fetch after fetch (its fetches stay out of sessions)."""
    topic = unique_topic("orders-")
    alias = topic.replace("orders-", "renamed-")
    with inprocess_gateway(tansu) as gw:
        config = {"bootstrap.servers": bootstrap_of(gw)}
        admin = AdminClient(config)
        for future in admin.create_topics([NewTopic(topic, 1)], request_timeout=10).values():
            future.result()
        in_gateway(gw, gw.aliases.replace, [AliasTopic(alias, None, topic)])
        listed = Producer(config).list_topics(timeout=10).topics
        assert {topic, alias} <= set(listed)
        producer = Producer(config)
        producer.produce(alias, b"one")
        producer.produce(topic, b"two")
        assert producer.flush(15) == 0
        consumer = KafkaConsumer(consumer_timeout_ms=15000, bootstrap_servers=bootstrap_of(gw))
        consumer.assign([KafkaTopicPartition(alias, 0)])
        consumer.seek_to_beginning()
        seen = []
        for message in consumer:
            seen.append((message.topic, message.value))
            if len(seen) == 1:
                producer.produce(topic, b"three")  # arrives in a later fetch
                producer.flush(15)
            if len(seen) == 3:
                break
        consumer.close()
    assert seen == [(alias, b"one"), (alias, b"two"), (alias, b"three")]
