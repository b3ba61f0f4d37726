"""The byte-rate limits ``producer-rate-limiting`` and ``consumer-rate-limiting``, without a network:
the token buckets and the interceptors in the harness, with an injected clock and an injected
sleep that only moves that clock (so holds are counted, never timed). Through the gateway, with
real clients: ``test_rl_gateway.py``."""

from __future__ import annotations

import datetime
import textwrap
import time
from pathlib import Path
from typing import Any

import kanal_safeguards.plugin
import pytest
import trio
from kanal_safeguards.limits.buckets import TokenBuckets
from kanal_safeguards.limits.rate_limits import ConsumerRateLimiting, ProducerRateLimiting

from kanal.api import (
    ApiKey,
    Connection,
    InterceptorConfigError,
    Record,
    build,
    encode_batch,
    nested,
    require_request_class,
    response_class,
)
from kanal.config.loader import load_settings
from kanal.testing import FakeServices, Harness


class Clock:
    """A clock the test moves by hand (and the injected sleep moves)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# -- the buckets -----------------------------------------------------------------------------------


def test_a_bucket_starts_full_with_one_seconds_worth() -> None:
    clock = Clock()
    buckets = TokenBuckets(1000, clock=clock)
    assert buckets.level("k") == 1000
    assert buckets.take("k", 600) == 0.0
    assert buckets.take("k", 400) == 0.0  # exactly the burst: no debt
    assert buckets.level("k") == 0
    assert buckets.take("k", 250) == pytest.approx(0.25)  # bytes past zero are debt, in seconds
    assert buckets.debt("k") == pytest.approx(0.25)
    assert buckets.level("k") == pytest.approx(-250)


def test_debt_is_paid_at_the_rate_and_the_bucket_refills_to_the_burst_only() -> None:
    clock = Clock()
    buckets = TokenBuckets(1000, clock=clock)
    buckets.take("k", 1500)
    assert buckets.debt("k") == pytest.approx(0.5)
    clock.now += 0.2
    assert buckets.debt("k") == pytest.approx(0.3)
    clock.now += 0.3
    assert buckets.debt("k") == 0.0
    clock.now += 0.25
    assert buckets.level("k") == pytest.approx(250)
    clock.now += 60  # idle for a minute: still one second's worth, not sixty
    assert buckets.level("k") == 1000
    assert buckets.take("k", 1000) == 0.0
    assert buckets.take("k", 1) > 0


def test_a_burst_other_than_one_second() -> None:
    clock = Clock()
    buckets = TokenBuckets(1000, burst=3000, clock=clock)
    assert buckets.take("k", 3000) == 0.0
    assert buckets.take("k", 500) == pytest.approx(0.5)


def test_each_key_has_its_own_bucket() -> None:
    """The keys are what ``limitBy`` picks: None (the rule), a principal or a virtual cluster."""
    clock = Clock()
    buckets = TokenBuckets(100, clock=clock)
    assert buckets.take("alice", 300) == pytest.approx(2.0)
    assert buckets.take("bob", 100) == 0.0
    assert buckets.take(None, 100) == 0.0
    assert buckets.debt("alice") == pytest.approx(2.0)
    assert buckets.debt("bob") == 0.0


def test_full_buckets_are_swept() -> None:
    clock = Clock()
    buckets = TokenBuckets(100, clock=clock)
    for n in range(50):
        buckets.take(f"principal-{n}", 10)
    buckets.take("busy", 500)
    assert len(buckets) == 51
    clock.now += 1.5  # the 50 are full again; "busy" is still paying its 4 s debt
    buckets.take("new", 1)
    assert len(buckets) == 2
    assert buckets.debt("busy") == pytest.approx(2.5)


def test_a_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rate"):
        TokenBuckets(0)


# -- configs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({}, "maximumBytesPerSecond"),
        ({"maximumBytesPerSecond": 0}, "maximumBytesPerSecond"),
        ({"maximumBytesPerSecond": "10MB"}, "maximumBytesPerSecond"),
        ({"maximumBytesPerSecond": 10, "limitBy": "CLIENT_ID"}, "limitBy"),
        ({"maximumBytesPerSecond": 10, "action": "THROTTLE"}, "action"),
        ({"maximumBytesPerSecond": 10, "action": "OVERRIDE"}, "action"),
        ({"maximumBytesPerSecond": 10, "topic": "(["}, "topic"),
        ({"maximumBytesPerSecond": 10, "maximumBytesPerSec": 10}, "maximumBytesPerSec"),
    ],
)
@pytest.mark.parametrize("cls", [ProducerRateLimiting, ConsumerRateLimiting])
def test_config_errors_name_the_field(cls: type[Any], config: dict[str, Any], field: str) -> None:
    with pytest.raises(InterceptorConfigError, match=field):
        Harness().add(cls, config)


def test_the_types_are_registered_and_configured_from_yaml(tmp_path: Path) -> None:
    """What an operator (and a later benchmark: 4 producers under a 10 MB/s limit) writes."""
    names = {cls.plugin_name for cls in kanal_safeguards.plugin.kanal_interceptor_types()}
    assert {"producer-rate-limiting", "consumer-rate-limiting"} <= names
    path = tmp_path / "kanal.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            interceptors:
              - name: produce-10mb
                plugin: producer-rate-limiting
                priority: 1
                config:
                  maximumBytesPerSecond: 10485760
                  topic: "bench-.*"
                  limitBy: RULE
                  action: BLOCK
              - name: fetch-per-principal
                plugin: consumer-rate-limiting
                priority: 1
                config:
                  maximumBytesPerSecond: 5242880
                  limitBy: PRINCIPAL
            """
        )
    )
    settings = load_settings(path, {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092"})
    produce, fetch = settings.interceptors
    harness = Harness()
    producer = harness.add(ProducerRateLimiting, produce.config)
    consumer = harness.add(ConsumerRateLimiting, fetch.config)
    assert isinstance(producer, ProducerRateLimiting) and isinstance(consumer, ConsumerRateLimiting)
    assert producer.buckets.rate == 10485760 and producer.buckets.burst == 10485760
    assert consumer.config.limit_by.value == "PRINCIPAL"
    assert consumer.config.action.value == "BLOCK" and consumer.config.topic == ".*"


# -- producer-rate-limiting in the harness ----------------------------------------------------------


def records(count: int, size: int) -> bytes:
    return encode_batch([Record(i, 0, None, b"x" * size, []) for i in range(count)], base_timestamp=1)


BATCH = records(4, 500)  # one Produce request's records field
SIZE = len(BATCH)


def produce(topic: str = "t", acks: int = 1, data: bytes = BATCH, version: int = 9) -> Any:
    cls = require_request_class(ApiKey.PRODUCE, version)
    topic_cls = nested(cls, "topic_data")
    part = build(nested(topic_cls, "partition_data"), index=0, records=data)
    return build(
        cls,
        acks=acks,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(build(topic_cls, name=topic, partition_data=(part,)),),
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


class Limited:
    """A harness with one rate-limit interceptor on a hand-moved clock; ``holds`` are the waits the
    interceptor asked for (each moves the clock, as a real sleep would)."""

    def __init__(self, cls: type[Any], config: dict[str, Any], principal: str | None = None) -> None:
        self.services = FakeServices()
        self.harness = Harness(services=self.services)
        self.login(principal)
        self.policy = self.harness.add(cls, config)
        self.clock = Clock()
        self.policy.use_clock(self.clock)
        self.holds: list[float] = []
        self.policy.sleep = self.sleep

    async def sleep(self, seconds: float) -> None:
        self.holds.append(seconds)
        self.clock.now += seconds

    def login(self, principal: str | None, vcluster: str | None = None) -> None:
        self.harness.connection = Connection(1, "127.0.0.1:50000", "127.0.0.1:6969", 0, principal, (), vcluster)

    def send(self, request: Any, answer: Any) -> Any:
        return trio.run(self.harness.request, request, answer)

    def throttle_ms(self, request: Any) -> int | None:
        """The throttle time of the response (None for acks=0)."""
        response = self.send(request, produce_ok).response
        return None if response is None else int(response.throttle_time.total_seconds() * 1000)

    @property
    def audited(self) -> list[dict[str, Any]]:
        return [data for _, _, data in self.services.audited]


def test_a_producer_over_the_limit_gets_throttle_time_and_its_next_request_is_held() -> None:
    limited = Limited(ProducerRateLimiting, {"maximumBytesPerSecond": 4 * SIZE})
    assert [limited.throttle_ms(produce()) for _ in range(4)] == [0, 0, 0, 0]  # the burst
    assert limited.holds == []
    assert limited.throttle_ms(produce()) == 250  # SIZE past zero, at 4 * SIZE bytes per second
    # a client that does not wait (librdkafka) is held until the debt is paid, then throttled again
    assert [limited.throttle_ms(produce()) for _ in range(3)] == [250, 250, 250]
    assert limited.holds == pytest.approx([0.25, 0.25, 0.25])
    [event] = limited.audited  # 4 throttled requests in 0.75 s: one event per bucket per second
    assert (event["plugin"], event["action"], event["level"], event["limitBy"]) == (
        "producer-rate-limiting",
        "BLOCK",
        "ERROR",
        "RULE",
    )
    assert event["reasons"] == [f"Produce rate over {4 * SIZE} bytes per second."]
    assert event["throttleTimeMs"] == 250
    # a client that waits its throttle time is not held (and a second later, audited again)
    limited.clock.now += 0.25
    assert limited.throttle_ms(produce()) == 250
    assert len(limited.holds) == 3
    assert len(limited.audited) == 2


def test_a_producer_below_the_limit_is_never_held_nor_throttled() -> None:
    limited = Limited(ProducerRateLimiting, {"maximumBytesPerSecond": 4 * SIZE})
    throttles = []
    for _ in range(40):
        throttles.append(limited.throttle_ms(produce()))
        limited.clock.now += 0.3  # 3.33 requests a second where 4 fit
    assert throttles == [0] * 40
    assert limited.holds == [] and limited.audited == []
    counted = limited.services.metrics.get_sample_value(
        "kanal_rate_limit_bytes_total", {"plugin": "producer-rate-limiting"}
    )
    assert counted == 40 * SIZE  # what the limiter counted, for operators and the rate-limit benchmark


def test_only_topics_matching_the_regex_count() -> None:
    limited = Limited(ProducerRateLimiting, {"maximumBytesPerSecond": SIZE, "topic": "orders-.*"})
    assert [limited.throttle_ms(produce("audit")) for _ in range(5)] == [0] * 5
    assert [limited.throttle_ms(produce("orders-eu")) for _ in range(2)] == [0, 1000]


def test_acks_0_bytes_count_and_hold_the_next_request() -> None:
    limited = Limited(ProducerRateLimiting, {"maximumBytesPerSecond": 2 * SIZE})
    assert [limited.throttle_ms(produce(acks=0)) for _ in range(4)] == [None] * 4  # no response to carry it
    assert limited.holds == pytest.approx([0.5])  # the 4th waited for the 3rd's debt
    assert limited.throttle_ms(produce()) == 500
    assert limited.holds == pytest.approx([0.5, 0.5])


def test_info_audits_but_never_throttles_nor_holds() -> None:
    limited = Limited(ProducerRateLimiting, {"maximumBytesPerSecond": SIZE, "action": "INFO"})
    assert [limited.throttle_ms(produce()) for _ in range(10)] == [0] * 10
    assert limited.holds == []
    [event] = limited.audited
    assert (event["action"], event["level"], event["throttleTimeMs"]) == ("INFO", "WARNING", 0)


def test_principals_have_their_own_buckets() -> None:
    limited = Limited(ProducerRateLimiting, {"maximumBytesPerSecond": SIZE, "limitBy": "PRINCIPAL"}, "alice")
    assert [limited.throttle_ms(produce()) for _ in range(3)] == [0, 1000, 1000]
    limited.login("bob")  # bob's bucket is full whatever alice did
    assert limited.throttle_ms(produce()) == 0
    limited.login("alice")
    assert limited.throttle_ms(produce()) == 1000
    assert limited.holds == pytest.approx([1.0, 1.0])  # alice's 3rd and 4th, never bob's
    assert [e["bucket"] for e in limited.audited] == ["alice"] * 3  # one a second: the holds moved the clock
    assert limited.audited[0]["reasons"] == [f"Produce rate over {SIZE} bytes per second for principal 'alice'."]


def test_virtual_clusters_have_their_own_buckets_and_rule_shares_one() -> None:
    by_vcluster = Limited(ProducerRateLimiting, {"maximumBytesPerSecond": SIZE, "limitBy": "VCLUSTER"})
    by_vcluster.login("alice", "blue")
    assert by_vcluster.throttle_ms(produce()) == 0
    by_vcluster.login("bob", "blue")  # same virtual cluster: same bucket
    assert by_vcluster.throttle_ms(produce()) == 1000
    by_vcluster.login("carol", "green")
    assert by_vcluster.throttle_ms(produce()) == 0
    shared = Limited(ProducerRateLimiting, {"maximumBytesPerSecond": SIZE})
    shared.login("alice", "blue")
    assert shared.throttle_ms(produce()) == 0
    shared.login("carol", "green")  # RULE: everyone in the interceptor's scope shares one bucket
    assert shared.throttle_ms(produce()) == 1000


def test_holds_stop_under_the_hook_deadline() -> None:
    """A debt longer than the hook deadline would close the connection: holds and throttle times
    stop at 80% of it."""
    services = FakeServices(hook_timeout=2.0)
    harness = Harness(services=services)
    policy = harness.add(ProducerRateLimiting, {"maximumBytesPerSecond": 100})
    assert isinstance(policy, ProducerRateLimiting)
    assert policy.max_hold == pytest.approx(1.6)
    assert policy.throttle_ms(30.0) == 1600


# -- consumer-rate-limiting in the harness ----------------------------------------------------------


def fetch(topic: str = "t", version: int = 12) -> Any:
    cls = require_request_class(ApiKey.FETCH, version)
    topic_cls = nested(cls, "topics")
    part = build(nested(topic_cls, "partitions"), partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    return build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=100),
        max_bytes=1 << 20,
        topics=(build(topic_cls, topic=topic, partitions=(part,)),),
    )


def fetched(data: bytes) -> Any:
    """The broker's answer to a fetch: ``data`` as partition 0's records."""

    def answer(request: Any) -> Any:
        cls = response_class(ApiKey.FETCH, int(request.__version__))
        topic_cls = nested(cls, "responses")
        part = build(nested(topic_cls, "partitions"), partition_index=0, high_watermark=100, records=data)
        return build(cls, responses=(build(topic_cls, topic=request.topics[0].topic, partitions=(part,)),))

    return answer


def fetch_throttle_ms(limited: Limited, request: Any, data: bytes = BATCH) -> int:
    response = limited.send(request, fetched(data)).response
    return int(response.throttle_time.total_seconds() * 1000)


def test_a_consumer_over_the_limit_is_held_and_told_its_debt() -> None:
    limited = Limited(ConsumerRateLimiting, {"maximumBytesPerSecond": 2 * SIZE})
    assert [fetch_throttle_ms(limited, fetch()) for _ in range(3)] == [0, 0, 0]  # the 3rd went over
    assert limited.holds == []
    # the next fetch is held for the debt the 3rd left; its own bytes leave 500 ms more
    assert [fetch_throttle_ms(limited, fetch()) for _ in range(3)] == [500, 500, 500]
    assert limited.holds == pytest.approx([0.5, 0.5, 0.5])
    event, _ = limited.audited  # 4 fetches over the limit in 1.5 s: two events
    assert (event["plugin"], event["action"], event["level"]) == ("consumer-rate-limiting", "BLOCK", "ERROR")
    assert event["reasons"] == [f"Fetch rate over {2 * SIZE} bytes per second."]


def test_empty_fetches_and_other_topics_cost_nothing() -> None:
    limited = Limited(ConsumerRateLimiting, {"maximumBytesPerSecond": SIZE, "topic": "orders"})
    assert [fetch_throttle_ms(limited, fetch("orders"), b"") for _ in range(5)] == [0] * 5
    assert [fetch_throttle_ms(limited, fetch("other")) for _ in range(5)] == [0] * 5
    assert limited.holds == [] and limited.audited == []


def test_consumer_info_only_audits() -> None:
    limited = Limited(ConsumerRateLimiting, {"maximumBytesPerSecond": SIZE, "action": "INFO"})
    assert [fetch_throttle_ms(limited, fetch()) for _ in range(6)] == [0] * 6
    assert limited.holds == []
    assert [e["action"] for e in limited.audited] == ["INFO"]


def test_the_default_clock_is_monotonic() -> None:
    policy = Harness().add(ProducerRateLimiting, {"maximumBytesPerSecond": 10})
    assert isinstance(policy, ProducerRateLimiting)
    assert policy.buckets.clock is time.monotonic
