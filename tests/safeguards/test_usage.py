"""``header-injection`` (safeguards plugin) in a gateway in front of Tansu: a producer writes through
the gateway with confluent-kafka, a consumer reads the broker itself and sees the injected headers
with their rendered values; ``overrideIfExists`` keeps or replaces a header the producer set; bad
templates are refused when applied, naming them. (``chargeback``: test_usage_chargeback.py.)"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from importlib.metadata import version
from typing import Any

import kanal_safeguards.plugin
import pytest
from confluent_kafka import KafkaError, Message, Producer
from safeguard_clients import create_topics, direct, read_count, safeguards_gateway, spec, through

from kanal.api import InterceptorConfigError
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.pipeline.chain import Pipeline
from kanal.pipeline.registry import PluginRegistry
from kanal.testing import FakeServices

Headers = list[tuple[str, bytes | None]]

TEMPLATES = {
    "x-id": "{{uuid}}",
    "x-id-again": "id={{ uuid }}",  # a record's headers share one uuid
    "x-user": "{{user}}",
    "x-vcluster": "[{{vcluster}}]",
    "x-client": "{{clientId}}",
    "x-from": "{{userIp}}",
    "x-gateway": "{{gatewayIp}} {{gatewayHost}} {{gatewayVersion}}",
    "x-api": "{{apiKey}} v{{apiKeyVersion}}",
    "x-at": "{{timestampMillis}}",
    "x-literal": "{not a template} }}",
}

INTERCEPTORS = [
    spec("stamp", "header-injection", {"topic": "hi-.*", "headers": TEMPLATES}),
    spec("keep-env", "header-injection", {"topic": "keep-.*", "headers": {"x-env": "gateway", "x-new": "1"}}),
    spec(
        "force-env",
        "header-injection",
        {"topic": "force-.*", "headers": {"x-env": "gateway"}, "overrideIfExists": True},
    ),
]


@pytest.fixture(scope="module")
def gateway(tansu: TansuBroker) -> Iterator[Gateway]:
    with safeguards_gateway(tansu, INTERCEPTORS) as gw:
        yield gw


def produce(gateway: Gateway, topic: str, records: Sequence[tuple[bytes, Headers | None]], client_id: str) -> None:
    producer = Producer(through(gateway, **{"client.id": client_id, "linger.ms": 0}))
    errors: list[KafkaError | None] = []
    for value, headers in records:
        producer.produce(topic, value, partition=0, headers=headers, on_delivery=lambda e, _: errors.append(e))
    assert producer.flush(30) == 0
    assert errors == [None] * len(records)


def headers_of(message: Message) -> dict[str, str]:
    return {k: (v or b"").decode() for k, v in message.headers() or []}


def test_templates_are_rendered_for_each_record(tansu: TansuBroker, gateway: Gateway) -> None:
    topic = "hi-templates"
    create_topics(tansu, topic)
    before = int(time.time() * 1000)
    produce(gateway, topic, [(b"a", None), (b"b", [("x-app", b"mine")]), (b"c", None)], "usage-producer")
    after = int(time.time() * 1000)

    messages = read_count(direct(tansu), topic, 3)
    assert [m.value() for m in messages] == [b"a", b"b", b"c"]
    ids = []
    for message in messages:
        headers = headers_of(message)
        ids.append(uuid.UUID(headers["x-id"]))
        assert str(ids[-1]) == headers["x-id"] and ids[-1].version == 4
        assert headers["x-id-again"] == f"id={headers['x-id']}"
        assert headers["x-user"] == "anonymous"  # a PLAINTEXT client: no principal
        assert headers["x-vcluster"] == "[]"  # and no virtual cluster
        assert headers["x-client"] == "usage-producer"
        assert headers["x-from"] == "127.0.0.1"
        assert headers["x-gateway"] == f"127.0.0.1 {socket.gethostname()} {version('kanal')}"
        api, _, api_version = headers["x-api"].partition(" v")
        assert api == "Produce" and int(api_version) >= 3
        assert before <= int(headers["x-at"]) <= after
        assert headers["x-literal"] == "{not a template} }}"
    assert len(set(ids)) == 3  # a uuid per record
    assert messages[1].headers()[0] == ("x-app", b"mine")  # the producer's headers first, kept


def test_other_topics_are_untouched(tansu: TansuBroker, gateway: Gateway) -> None:
    topic = "no-hi-templates"  # "hi-.*" must match the whole name
    create_topics(tansu, topic)
    produce(gateway, topic, [(b"a", None), (b"b", [("x-app", b"mine")])], "usage-producer")
    assert [m.headers() for m in read_count(direct(tansu), topic, 2)] == [None, [("x-app", b"mine")]]


def test_override_if_exists_false_keeps_the_producers_header(tansu: TansuBroker, gateway: Gateway) -> None:
    topic = "keep-env"
    create_topics(tansu, topic)
    produce(gateway, topic, [(b"a", [("x-env", b"app")]), (b"b", None)], "usage-producer")
    first, second = read_count(direct(tansu), topic, 2)
    assert first.headers() == [("x-env", b"app"), ("x-new", b"1")]
    assert second.headers() == [("x-env", b"gateway"), ("x-new", b"1")]


def test_override_if_exists_true_replaces_it(tansu: TansuBroker, gateway: Gateway) -> None:
    topic = "force-env"
    create_topics(tansu, topic)
    produce(gateway, topic, [(b"a", [("x-env", b"app"), ("x-app", b"1"), ("x-env", b"again")]), (b"b", None)], "p")
    first, second = read_count(direct(tansu), topic, 2)
    assert first.headers() == [("x-app", b"1"), ("x-env", b"gateway")]
    assert second.headers() == [("x-env", b"gateway")]


# -- config errors: refused when applied, naming the key and the variables


def configure(config: dict[str, Any]) -> Callable[[], None]:
    registry = PluginRegistry()
    registry.register(kanal_safeguards.plugin, "safeguards")
    pipeline = Pipeline(registry, lambda plugin: FakeServices())
    return lambda: pipeline.configure([spec("stamp", "header-injection", config)])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"headers": {"x-ok": "{{user}}", "x-bad": "{{nope}}-{{clientID}}-{{nope}}"}},
            r"headers\.x-bad: unknown template variables \{\{nope\}\}, \{\{clientID\}\} \(known: \{\{uuid\}\}, ",
        ),
        ({"headers": {"x-bad": "{{ user_ip }}"}}, r"headers\.x-bad: unknown template variable \{\{user_ip\}\} "),
        ({"headers": {}}, r"headers: Expected `object` of length >= 1"),
        ({"topic": "("}, r"headers: required"),
        ({"headers": {"x": "v"}, "topic": "("}, r"topic: '\(' is not a valid regex"),
        ({"headers": {"x": "v"}, "overrideIfExist": True}, r"config: Object contains unknown field `overrideIfExist`"),
        ({"headers": {"x": 1}}, r"headers\[\.\.\.\]: Expected `str`, got `int`"),
    ],
)
def test_bad_configs_are_refused_naming_the_key(config: dict[str, Any], message: str) -> None:
    with pytest.raises(InterceptorConfigError, match=r"interceptor 'stamp' \(header-injection\): " + message):
        configure(config)()


def test_good_config_is_accepted() -> None:
    configure({"headers": {"x": "{{user}}@{{vcluster}}", "y": "plain"}, "topic": "a|b"})()
