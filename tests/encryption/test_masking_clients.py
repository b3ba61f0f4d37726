"""Masking on fetch with real clients and a real broker: the principal the masking interceptors are
scoped to reads masked fields, everyone else (and the broker itself) the data as produced; a value
that is not JSON fails that principal's fetch, or is returned unmasked, as the error policy says."""

from __future__ import annotations

import base64
import json
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kanal_encryption.plugin
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType, ServiceAccount
from kanal.identity.tokens import mint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from inprocess import bootstrap_of, in_gateway, inprocess_gateway

SECRET = secrets.token_bytes(32)
CARD = "4111111111111111"
POLICIES = [
    {
        "name": "cards",
        "fields": ["card.number", "wallet[*].number"],
        "rule": {"type": "MASK_FIRST_N", "numberOfChars": 12},
    },
    {"name": "cvv", "fields": ["card.cvv"], "rule": {"type": "MASK_ALL", "maskingChar": "#"}},
    {"name": "email", "fields": ["user.email"], "rule": {"type": "MASK_LAST_N", "numberOfChars": 11}},
]


@pytest.fixture
def gateway(tansu: TansuBroker) -> Iterator[Gateway]:
    env = {
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
    }
    strict = InterceptorSpec(
        "mask-strict",
        "masking",
        scope=Scope(username="analyst"),
        config={"topic": "masked-.*", "policies": POLICIES},
    )
    lenient = InterceptorSpec(
        "mask-lenient",
        "masking",
        scope=Scope(username="analyst"),
        config={"topic": "lenient-.*", "policies": POLICIES, "errorPolicy": "skip_masking"},
    )
    with inprocess_gateway(tansu, {"encryption": kanal_encryption.plugin}, [strict, lenient], env=env) as gw:
        accounts = [ServiceAccount(name, None, AccountType.LOCAL) for name in ("writer", "analyst")]
        in_gateway(gw, gw.service_accounts.replace, accounts)
        yield gw


def _config(gw: Gateway, user: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap_of(gw),
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": mint(user, None, 600, SECRET),
    }


def _direct(tansu: TansuBroker) -> dict[str, Any]:
    return {"bootstrap.servers": tansu.bootstrap}


def _create(config: dict[str, Any], topic: str) -> None:
    admin = AdminClient(config)
    for future in admin.create_topics([NewTopic(topic, 1)], request_timeout=10).values():
        future.result()


def _produce(config: dict[str, Any], topic: str, values: list[bytes]) -> None:
    producer = Producer(config)
    for i, value in enumerate(values):
        producer.produce(topic, value, b"k%d" % i, headers=[("trace", b"t%d" % i)])
    assert producer.flush(15) == 0


def _poll(config: dict[str, Any], topic: str, done: Callable[[list[Any]], bool]) -> list[Any]:
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


def _consume(config: dict[str, Any], topic: str, count: int) -> list[Any]:
    messages = _poll(config, topic, lambda polled: len(polled) >= count or any(m.error() for m in polled))
    assert [m.error() for m in messages] == [None] * count
    return messages


def _document(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "card": {"number": CARD, "cvv": 123, "expiry": "12/30"},
        "wallet": [{"number": "5500000000000004"}, {"number": "340000000000009", "label": "amex"}],
        "user": {"email": f"u{i}@example.com", "name": "Ada"},
    }


def _masked(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "card": {"number": "************1111", "cvv": "###", "expiry": "12/30"},
        "wallet": [{"number": "************0004"}, {"number": "************009", "label": "amex"}],
        "user": {"email": f"u{i}@***********", "name": "Ada"},
    }


def test_the_scoped_principal_reads_masked_fields_and_everyone_else_the_data_as_produced(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = "masked-" + unique_topic()
    writer = _config(gateway, "writer")
    _create(writer, topic)
    documents = [_document(i) for i in range(5)]
    _produce(writer, topic, [json.dumps(d).encode() for d in documents])

    masked = _consume(_config(gateway, "analyst"), topic, 5)
    assert [json.loads(m.value()) for m in masked] == [_masked(i) for i in range(5)]
    assert [(m.offset(), m.key(), m.headers()) for m in masked] == [
        (i, b"k%d" % i, [("trace", b"t%d" % i)]) for i in range(5)
    ]
    assert CARD.encode() not in b"".join(m.value() for m in masked)

    for config in (writer, _direct(tansu)):  # out of the scope, and the broker itself: unmasked
        assert [json.loads(m.value()) for m in _consume(config, topic, 5)] == documents


def test_other_topics_are_not_masked(gateway: Gateway, unique_topic: Callable[..., str]) -> None:
    topic = "plain-" + unique_topic()
    writer = _config(gateway, "writer")
    _create(writer, topic)
    _produce(writer, topic, [json.dumps(_document(0)).encode()])
    assert [json.loads(m.value()) for m in _consume(_config(gateway, "analyst"), topic, 1)] == [_document(0)]


def test_fail_fetch_fails_the_scoped_principals_fetch_on_a_value_that_is_not_json(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = "masked-" + unique_topic()
    writer = _config(gateway, "writer")
    _create(writer, topic)
    values = [json.dumps(_document(0)).encode(), b"not json", json.dumps(_document(2)).encode()]
    _produce(writer, topic, values)

    polled = _poll(_config(gateway, "analyst"), topic, lambda polled: any(m.error() for m in polled))
    assert next(m.error().code() for m in polled if m.error()) == KafkaError.INVALID_MSG  # (code 2: CORRUPT_MESSAGE)
    assert all(CARD.encode() not in (m.value() or b"") for m in polled if not m.error())
    assert [m.value() for m in _consume(writer, topic, 3)] == values  # others read on
    assert [m.value() for m in _consume(_direct(tansu), topic, 3)] == values


def test_skip_masking_returns_a_value_that_is_not_json_unmasked(
    gateway: Gateway, unique_topic: Callable[..., str]
) -> None:
    topic = "lenient-" + unique_topic()
    writer = _config(gateway, "writer")
    _create(writer, topic)
    _produce(writer, topic, [json.dumps(_document(0)).encode(), b"not json", json.dumps(_document(2)).encode()])

    read = _consume(_config(gateway, "analyst"), topic, 3)
    assert json.loads(read[0].value()) == _masked(0)
    assert read[1].value() == b"not json"
    assert json.loads(read[2].value()) == _masked(2)
