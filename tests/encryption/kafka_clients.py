"""Real Kafka clients for the encryption plugin's tests: an in-process gateway with the plugin and
SASL PLAIN logins with gateway tokens (so interceptors can be scoped to a user), and small
produce/consume helpers that fail the test on any delivery or fetch error."""

from __future__ import annotations

import base64
import secrets
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import kanal_encryption.plugin
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kanal.api.interceptor import InterceptorSpec
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from inprocess import bootstrap_of, in_gateway, inprocess_gateway

SECRET = secrets.token_bytes(32)
Record = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]  # key, value, headers


@contextmanager
def encryption_gateway(
    tansu: TansuBroker, interceptors: Sequence[InterceptorSpec], env: Mapping[str, str] = {}, users: Sequence[str] = ()
) -> Iterator[Gateway]:
    """A gateway with the encryption plugin, SASL PLAIN with gateway tokens, and these users."""
    login = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
    }
    with inprocess_gateway(tansu, {"encryption": kanal_encryption.plugin}, interceptors, env={**login, **env}) as gw:
        in_gateway(gw, gw.service_accounts.replace, [ServiceAccount(u, None, AccountType.LOCAL) for u in users])
        yield gw


def login(gw: Gateway, user: str) -> dict[str, Any]:
    """Client properties of ``user`` through the gateway."""
    return {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": mint(user, None, 600, SECRET),
    }


def direct(tansu: TansuBroker) -> dict[str, Any]:
    """Client properties of the broker itself (what is stored)."""
    return {"bootstrap.servers": tansu.bootstrap}


def create_topic(config: dict[str, Any], topic: str) -> None:
    admin = AdminClient(config)
    for future in admin.create_topics([NewTopic(topic, 1)], request_timeout=10).values():
        future.result()


def produce(config: dict[str, Any], topic: str, records: Sequence[Record]) -> None:
    """Produces the records to partition 0; every one must be delivered."""
    producer = Producer(config)
    errors: list[Any] = []
    for key, value, headers in records:
        producer.produce(
            topic, value, key, partition=0, headers=headers, on_delivery=lambda error, message: errors.append(error)
        )
    assert producer.flush(15) == 0 and errors == [None] * len(records), errors


def poll(config: dict[str, Any], topic: str, done: Callable[[list[Any]], bool]) -> list[Any]:
    """Messages and errors (``message.error()``) from the start of partition 0 until ``done``."""
    consumer = Consumer({**config, "group.id": "g", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    polled: list[Any] = []
    deadline = time.monotonic() + 30
    try:
        while not done(polled) and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                polled.append(message)
    finally:
        consumer.close()
    assert done(polled), [m.error() or m.value() for m in polled]
    return polled


def consume(config: dict[str, Any], topic: str, count: int) -> list[Any]:
    """``count`` messages from the start of partition 0, none of them an error."""
    messages = poll(config, topic, lambda polled: len(polled) >= count or any(m.error() for m in polled))
    assert [m.error() for m in messages] == [None] * count
    return messages
