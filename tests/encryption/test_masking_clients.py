"""Masking on fetch with real clients and a real broker: the principal the masking interceptors are
scoped to reads masked fields, everyone else (and the broker itself) the data as produced; a value
that is not JSON fails that principal's fetch, or is returned unmasked, as the error policy says."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import KafkaError
from kafka_clients import consume, create_topic, direct, encryption_gateway, login, poll, produce

from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway

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
    with encryption_gateway(tansu, [strict, lenient], users=("writer", "analyst")) as gw:
        yield gw


def _produce(config: dict[str, Any], topic: str, values: list[bytes]) -> None:
    produce(config, topic, [(b"k%d" % i, value, [("trace", b"t%d" % i)]) for i, value in enumerate(values)])


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
    writer = login(gateway, "writer")
    create_topic(writer, topic)
    documents = [_document(i) for i in range(5)]
    _produce(writer, topic, [json.dumps(d).encode() for d in documents])

    masked = consume(login(gateway, "analyst"), topic, 5)
    assert [json.loads(m.value()) for m in masked] == [_masked(i) for i in range(5)]
    assert [(m.offset(), m.key(), m.headers()) for m in masked] == [
        (i, b"k%d" % i, [("trace", b"t%d" % i)]) for i in range(5)
    ]
    assert CARD.encode() not in b"".join(m.value() for m in masked)

    for config in (writer, direct(tansu)):  # out of the scope, and the broker itself: unmasked
        assert [json.loads(m.value()) for m in consume(config, topic, 5)] == documents


def test_other_topics_are_not_masked(gateway: Gateway, unique_topic: Callable[..., str]) -> None:
    topic = "plain-" + unique_topic()
    writer = login(gateway, "writer")
    create_topic(writer, topic)
    _produce(writer, topic, [json.dumps(_document(0)).encode()])
    assert [json.loads(m.value()) for m in consume(login(gateway, "analyst"), topic, 1)] == [_document(0)]


def test_fail_fetch_fails_the_scoped_principals_fetch_on_a_value_that_is_not_json(
    gateway: Gateway, tansu: TansuBroker, unique_topic: Callable[..., str]
) -> None:
    topic = "masked-" + unique_topic()
    writer = login(gateway, "writer")
    create_topic(writer, topic)
    values = [json.dumps(_document(0)).encode(), b"not json", json.dumps(_document(2)).encode()]
    _produce(writer, topic, values)

    polled = poll(login(gateway, "analyst"), topic, lambda polled: any(m.error() for m in polled))
    assert next(m.error().code() for m in polled if m.error()) == KafkaError.INVALID_MSG  # (code 2: CORRUPT_MESSAGE)
    assert all(CARD.encode() not in (m.value() or b"") for m in polled if not m.error())
    assert [m.value() for m in consume(writer, topic, 3)] == values  # others read on
    assert [m.value() for m in consume(direct(tansu), topic, 3)] == values


def test_skip_masking_returns_a_value_that_is_not_json_unmasked(
    gateway: Gateway, unique_topic: Callable[..., str]
) -> None:
    topic = "lenient-" + unique_topic()
    writer = login(gateway, "writer")
    create_topic(writer, topic)
    _produce(writer, topic, [json.dumps(_document(0)).encode(), b"not json", json.dumps(_document(2)).encode()])

    read = consume(login(gateway, "analyst"), topic, 3)
    assert json.loads(read[0].value()) == _masked(0)
    assert read[1].value() == b"not json"
    assert json.loads(read[2].value()) == _masked(2)
