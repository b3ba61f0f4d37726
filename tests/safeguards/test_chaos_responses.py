"""``chaos-latency`` delaying responses (``applyTo: RESPONSES`` or ``BOTH``), as the reference's
SimulateLatencyPlugin delays requests and responses: the broker's answer is held before it reaches
the client, so the broker has acted while the client still waits.

Where a delay happened is shown by order, not by speed: in the harness, on trio's mock clock, the
broker answers before the clock moves and the client gets the answer ``latencyMs`` later; through
a real gateway, a probe interceptor further in the chain notes when the request reached it and
when the broker's answer did, and only lower bounds follow (the client's answer comes at least
``latencyMs`` after the broker's). Nothing delayed is checked with the injection counter and the
audit log, never with a clock.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import kanal_safeguards.plugin
import pytest
import trio
import trio.testing
from confluent_kafka import Producer
from kanal_safeguards.chaos.common import INJECTIONS_METRIC
from kanal_safeguards.chaos.latency import ApplyTo, Latency
from safeguard_clients import audit_events, bootstrap_of, create_topics, read_to_end, spec, unique
from wire import WireClient, produce_request

from kanal.api import (
    ApiKey,
    Interceptor,
    InterceptorConfigError,
    InterceptorSpec,
    RequestContext,
    ResponseContext,
    build,
    hookimpl,
    nested,
    require_request_class,
    response_class,
)
from kanal.embedded import TansuBroker
from kanal.gateway import Gateway
from kanal.testing import FakeServices, Harness

METRIC = INJECTIONS_METRIC + "_total"
PLUGIN = "chaos-latency"


def injections(registry: Any) -> float:
    return registry.get_sample_value(METRIC, {"plugin": PLUGIN}) or 0.0


# -- in the harness, on trio's clock -----------------------------------------------------------------


def harness_produce(acks: int = -1) -> Any:
    cls = require_request_class(ApiKey.PRODUCE, 9)
    topic_cls = nested(cls, "topic_data")
    partition = build(nested(topic_cls, "partition_data"), index=0, records=None)
    return build(
        cls,
        acks=acks,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(build(topic_cls, name="orders", partition_data=(partition,)),),
    )


def produce_ok(request: Any) -> Any:
    cls = response_class(ApiKey.PRODUCE, int(request.__version__))
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partition_responses")
    topics = tuple(
        build(
            topic_cls, name=t.name, partition_responses=tuple(build(part_cls, index=p.index) for p in t.partition_data)
        )
        for t in request.topic_data
    )
    return build(cls, responses=topics)


def exchange(harness: Harness, request: Any) -> tuple[float | None, float, Any]:
    """(when the broker answered, when the client had the answer, the exchange), in seconds of a
    mock clock started at 0 that jumps ahead whenever every task sleeps; None: never answered."""
    answered: list[float] = []

    def broker(forwarded: Any) -> Any:
        answered.append(trio.current_time())
        return produce_ok(forwarded)

    async def run() -> tuple[float | None, float, Any]:
        start = trio.current_time()
        result = await harness.request(request, broker)
        return (answered[0] - start if answered else None), trio.current_time() - start, result

    return trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


def latency_harness(config: dict[str, Any]) -> tuple[Harness, FakeServices]:
    services = FakeServices()
    harness = Harness(services=services)
    harness.add(Latency, config)
    return harness, services


def test_responses_are_held_after_the_broker_answered() -> None:
    harness, services = latency_harness({"appliedPercentage": 100, "latencyMs": 750, "applyTo": "RESPONSES"})
    answered, received, result = exchange(harness, harness_produce())
    assert answered == 0  # the request went on at once: the broker has acted
    assert received >= 0.75  # and its answer reached the client latencyMs later
    assert [p.error_code for t in result.response.responses for p in t.partition_responses] == [0]
    assert injections(services.metrics) == 1
    [(kind, _, data)] = services.audited
    assert (kind, data["plugin"], data["action"], data["delayed"], data["latencyMs"]) == (
        "SAFEGUARD",
        PLUGIN,
        "CHAOS",
        "RESPONSES",
        750,
    )


def test_requests_are_held_before_the_broker_has_them_by_default() -> None:
    """The contrast: by default (REQUESTS) the broker answers only after the delay."""
    harness, services = latency_harness({"appliedPercentage": 100, "latencyMs": 750})
    answered, received, _ = exchange(harness, harness_produce())
    assert answered is not None and answered >= 0.75
    assert received >= answered
    assert injections(services.metrics) == 1
    assert services.audited[0][2]["delayed"] == "REQUESTS"


def test_both_delays_the_request_and_its_response() -> None:
    harness, services = latency_harness({"appliedPercentage": 100, "latencyMs": 300, "applyTo": "BOTH"})
    answered, received, _ = exchange(harness, harness_produce())
    assert answered is not None and answered >= 0.3
    assert received - answered >= 0.3 - 1e-9
    assert injections(services.metrics) == 2


def test_rate_0_delays_no_response() -> None:
    harness, services = latency_harness({"appliedPercentage": 0, "latencyMs": 750, "applyTo": "BOTH"})
    for _ in range(20):
        answered, received, _ = exchange(harness, harness_produce())
        assert (answered, received) == (0, 0)  # the clock never had to move
    assert injections(services.metrics) == 0
    assert services.audited == []


def test_a_request_without_a_response_delays_nothing() -> None:
    """acks=0: the response delay drawn for it has nothing to hold, and nothing is counted."""
    harness, services = latency_harness({"appliedPercentage": 100, "latencyMs": 750, "applyTo": "RESPONSES"})
    answered, received, result = exchange(harness, harness_produce(acks=0))
    assert (answered, received, result.response) == (None, 0, None)
    assert injections(services.metrics) == 0


def test_responses_are_drawn_apart_from_requests() -> None:
    """BOTH at 50 %: a request and its response are each delayed half the time, independently
    (seeded: the same run every time)."""
    harness, services = latency_harness({"appliedPercentage": 50, "latencyMs": 100, "applyTo": "BOTH", "seed": 11})
    kinds = set()
    for _ in range(100):
        answered, received, _ = exchange(harness, harness_produce())
        assert answered is not None
        kinds.add((answered > 0, received - answered > 0))  # on a mock clock: 0 unless delayed
    assert kinds == {(False, False), (False, True), (True, False), (True, True)}
    assert 60 <= injections(services.metrics) <= 140  # about half of 200 draws


def test_apply_to_is_validated() -> None:
    with pytest.raises(InterceptorConfigError, match="applyTo"):
        Harness().add(Latency, {"appliedPercentage": 10, "latencyMs": 10, "applyTo": "SOMETIMES"})
    policy = Harness().add(Latency, {"appliedPercentage": 10, "latencyMs": 10})
    assert isinstance(policy, Latency) and policy.config.apply_to is ApplyTo.REQUESTS


# -- through a gateway ------------------------------------------------------------------------------


class Probe(Interceptor):
    """Notes, innermost in the chain, when a Produce request reached it (after every delay of the
    request) and when the broker's answer did (before any delay of the response)."""

    plugin_name: ClassVar[str] = "probe"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE})
    moments: ClassVar[list[tuple[str, float]]] = []

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> None:
        self.moments.append(("request", time.monotonic()))

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> None:
        self.moments.append(("answer", time.monotonic()))


class ProbePlugin:
    @hookimpl
    def kanal_interceptor_types(self) -> list[type[Interceptor]]:
        return [Probe]


@contextmanager
def probed_gateway(tansu: TansuBroker, config: dict[str, Any]) -> Iterator[Gateway]:
    """A gateway with ``chaos-latency`` outermost and the probe innermost."""
    from inprocess import inprocess_gateway  # on the path once safeguard_clients is imported

    Probe.moments.clear()
    specs = [spec("latency", PLUGIN, config, priority=1), InterceptorSpec("probe", "probe", priority=1000)]
    plugins = {"safeguards": kanal_safeguards.plugin, "probe": ProbePlugin()}
    with inprocess_gateway(tansu, plugins, specs) as gateway:
        yield gateway


def timed_produces(gateway: Gateway, topic: str, count: int) -> list[tuple[float, float, float, float]]:
    """``count`` Produce requests, one at a time, on one raw connection: for each, (sent, reached
    the probe, answered at the probe, received by the client), on the monotonic clock."""
    client = WireClient(bootstrap_of(gateway), timeout=30)
    moments = []
    try:
        for n in range(1, count + 1):
            sent = time.monotonic()
            response = client.call(produce_request(topic, -1, [b"v-%d" % n]), correlation_id=n)
            received = time.monotonic()
            assert response.responses[0].partition_responses[0].error_code == 0
            (_, reached), (_, answered) = Probe.moments[-2:]
            moments.append((sent, reached, answered, received))
    finally:
        client.close()
    return moments


@pytest.mark.parametrize("apply_to", ["RESPONSES", "BOTH"])
def test_the_gateway_holds_the_brokers_answer(tansu: TansuBroker, apply_to: str) -> None:
    """Every answer reaches the client at least latencyMs after it reached the gateway from the
    broker; with BOTH, the request also reached the broker at least latencyMs after it was sent."""
    topic = unique("chaos-responses")
    create_topics(tansu, topic)
    config = {"appliedPercentage": 100, "latencyMs": 300, "applyTo": apply_to}
    with probed_gateway(tansu, config) as gateway:
        moments = timed_produces(gateway, topic, 3)
        for sent, reached, answered, received in moments:
            assert sent <= reached <= answered <= received
            assert received - answered >= 0.3
            if apply_to == "BOTH":
                assert reached - sent >= 0.3
        assert [m for m, _ in Probe.moments] == ["request", "answer"] * 3
        # one delay per response (and per request with BOTH): the raw client sent nothing else
        assert injections(gateway.metrics.registry) == (3 if apply_to == "RESPONSES" else 6)
        [event] = [e["eventData"] for e in audit_events(gateway)]
        assert (event["plugin"], event["action"], event["delayed"]) == (
            PLUGIN,
            "CHAOS",
            "REQUESTS" if apply_to == "BOTH" else "RESPONSES",  # the first delay of the first exchange
        )
    assert [m.value() for m in read_to_end({"bootstrap.servers": tansu.bootstrap}, topic)] == [
        b"v-1",
        b"v-2",
        b"v-3",
    ]


def test_at_rate_0_no_answer_is_held(tansu: TansuBroker) -> None:
    topic = unique("chaos-responses-off")
    create_topics(tansu, topic)
    with probed_gateway(tansu, {"appliedPercentage": 0, "latencyMs": 5000, "applyTo": "BOTH"}) as gateway:
        assert len(timed_produces(gateway, topic, 5)) == 5
        assert injections(gateway.metrics.registry) == 0
        assert audit_events(gateway) == []


def test_a_librdkafka_producer_gets_every_delayed_answer(tansu: TansuBroker) -> None:
    """A real client whose every response is held: its records are delivered, once each, and
    every request it sent (Metadata, ApiVersions, Produce...) had its answer delayed."""
    topic = unique("chaos-responses-rdkafka")
    create_topics(tansu, topic)
    config = {"appliedPercentage": 100, "latencyMs": 200, "applyTo": "RESPONSES"}
    with probed_gateway(tansu, config) as gateway:
        reports: list[Any] = []
        producer = Producer({"bootstrap.servers": bootstrap_of(gateway), "linger.ms": 0})
        for n in range(5):
            producer.produce(topic, b"r-%d" % n, on_delivery=lambda err, _msg: reports.append(err))
            assert producer.flush(30) == 0
        assert reports == [None] * 5
        answers = len([m for m, _ in Probe.moments if m == "answer"])
        assert answers >= 5  # at least one Produce per record
        assert injections(gateway.metrics.registry) > answers  # and every other answer too
    stored = [m.value() for m in read_to_end({"bootstrap.servers": tansu.bootstrap}, topic)]
    assert stored == [b"r-%d" % n for n in range(5)]
