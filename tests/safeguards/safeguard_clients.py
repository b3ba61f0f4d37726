"""What the safeguard plugin's tests share: an in-process gateway with the plugin and its
interceptors in front of the test broker, client settings for it and for the broker itself, and
the SAFEGUARD audit events the gateway recorded."""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kanal_safeguards.plugin
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kanal.api.interceptor import InterceptorSpec
from kanal.audit.events import AuditQuery
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from inprocess import bootstrap_of, in_gateway, inprocess_gateway

__all__ = [
    "audit_events",
    "bootstrap_of",
    "create_topics",
    "direct",
    "in_gateway",
    "read_count",
    "read_to_end",
    "safeguards_gateway",
    "spec",
    "through",
    "unique",
    "wait_for",
]


def spec(name: str, plugin: str, config: Mapping[str, Any], priority: int = 10) -> InterceptorSpec:
    """An interceptor of the plugin, as the admin API or the config file would declare it."""
    return InterceptorSpec(name=name, plugin=plugin, priority=priority, config=dict(config))


@contextmanager
def safeguards_gateway(
    tansu: TansuBroker, interceptors: Sequence[InterceptorSpec], env: Mapping[str, str] = {}
) -> Iterator[Gateway]:
    """A gateway (PLAINTEXT) with the safeguards plugin and these interceptors."""
    with inprocess_gateway(tansu, {"safeguards": kanal_safeguards.plugin}, interceptors, env=env) as gateway:
        yield gateway


def through(gateway: Gateway, **extra: Any) -> dict[str, Any]:
    """librdkafka settings of a client of the gateway."""
    return {"bootstrap.servers": bootstrap_of(gateway), **extra}


def direct(tansu: TansuBroker, **extra: Any) -> dict[str, Any]:
    """librdkafka settings of a client of the broker itself (to check what a request did there)."""
    return {"bootstrap.servers": tansu.bootstrap, **extra}


def audit_events(gateway: Gateway) -> list[dict[str, Any]]:
    """The SAFEGUARD audit events so far, oldest first (``eventData`` as the plugin wrote it)."""
    log = gateway.audit_log
    assert log is not None
    events = in_gateway(gateway, log.query, AuditQuery(types=frozenset({"SAFEGUARD"}), limit=10_000))
    return sorted(events, key=lambda e: str(e.get("time")))


def unique(prefix: str) -> str:
    """A topic or group name no other test uses (the broker is shared by the session)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_for(condition: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """``condition()``'s first truthy answer, polled; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        answer = condition()
        if answer:
            return answer
        assert time.monotonic() < deadline, f"{what}: not met within {timeout} s"
        time.sleep(0.05)


def create_topics(tansu: TansuBroker, *topics: str, partitions: int = 1) -> None:
    """Creates the topics on the broker itself (the gateway under test does not see it)."""
    admin = AdminClient(direct(tansu))
    for future in admin.create_topics([NewTopic(t, partitions) for t in topics], request_timeout=15).values():
        future.result(20)


def read_to_end(
    config: dict[str, Any], topic: str, partition: int = 0, *, timeout: float = 30, **extra: Any
) -> list[Message]:
    """Every record of the partition from its start to its end, in the order the consumer got them
    (``extra``: more consumer properties)."""
    consumer = Consumer(
        {**config, "group.id": unique("check"), "enable.auto.commit": False, "enable.partition.eof": True, **extra}
    )
    try:
        consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING)])
        messages: list[Message] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                return messages
            assert error is None, error
            messages.append(message)
        raise AssertionError(f"no end of partition after {len(messages)} records")
    finally:
        consumer.close()


def read_count(config: dict[str, Any], topic: str, count: int) -> list[Message]:
    """The first ``count`` records of partition 0."""
    consumer = Consumer({**config, "group.id": unique("check"), "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        messages: list[Message] = []
        deadline = time.monotonic() + 30
        while len(messages) < count:
            assert time.monotonic() < deadline, f"only {len(messages)} of {count} records"
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                messages.append(message)
        return messages
    finally:
        consumer.close()
