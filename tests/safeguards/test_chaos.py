"""The chaos interceptors without a network: configs, and what each injects, through the harness.

Delays are measured on trio's clock (a ``MockClock`` that jumps ahead when every task sleeps): the
response must not arrive before the clock moved ``latencyMs``, and nothing real is waited for.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import yaml
from kanal_safeguards import chaos
from kanal_safeguards.chaos.common import INJECTIONS_METRIC
from kanal_safeguards.chaos.errors import LEGAL_ERRORS, BrokenBrokers, LeaderElectionErrors
from kanal_safeguards.chaos.latency import Latency, SlowBroker, SlowProducersConsumers
from kanal_safeguards.chaos.records import DuplicateMessages, InvalidSchemaId, MessageCorruption

from kanal.api import (
    ApiKey,
    ErrorCode,
    Interceptor,
    InterceptorConfigError,
    Record,
    RecordSet,
    build,
    encode_batch,
    nested,
    require_request_class,
    response_class,
)
from kanal.testing import FakeServices, Harness

METRIC = INJECTIONS_METRIC + "_total"
VALUES = [b"alpha", b"beta", None, b"\x00\x00\x00\x00\x07avro-payload", b"gamma"]


def produce_request(topic: str, values: tuple[bytes | None, ...] = (b"a", b"b")) -> Any:
    cls = require_request_class(ApiKey.PRODUCE, 9)
    topic_cls = nested(cls, "topic_data")
    part_cls = nested(topic_cls, "partition_data")
    batch = encode_batch([Record(i, 0, None, v, []) for i, v in enumerate(values)], base_timestamp=1_700_000_000_000)
    partition = build(part_cls, index=0, records=batch)
    return build(
        cls,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(build(topic_cls, name=topic, partition_data=(partition,)),),
    )


def fetch_request(topic: str) -> Any:
    cls = require_request_class(ApiKey.FETCH, 12)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    partition = build(part_cls, partition=0, current_leader_epoch=-1, fetch_offset=0, partition_max_bytes=1 << 20)
    return build(
        cls,
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=1,
        max_bytes=1 << 20,
        session_epoch=-1,
        topics=(build(topic_cls, topic=topic, partitions=(partition,)),),
    )


def response_of(api_key: int, request: Any) -> Any:
    cls = response_class(api_key, int(request.__version__))
    assert cls is not None
    return cls


def produce_ok(request: Any) -> Any:
    cls = response_of(ApiKey.PRODUCE, request)
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partition_responses")
    topics = tuple(
        build(
            topic_cls, name=t.name, partition_responses=tuple(build(part_cls, index=p.index) for p in t.partition_data)
        )
        for t in request.topic_data
    )
    return build(cls, responses=topics)


def fetch_ok(request: Any) -> Any:
    return build(response_of(ApiKey.FETCH, request))


def metadata_ok(request: Any) -> Any:
    return build(response_of(ApiKey.METADATA, request))


def metadata_request() -> Any:
    return build(require_request_class(ApiKey.METADATA, 12), topics=None, allow_auto_topic_creation=False)


def partition_codes(response: Any) -> list[int]:
    if hasattr(response, "topic_data") or hasattr(response.responses[0], "partition_responses"):
        return [int(p.error_code) for t in response.responses for p in t.partition_responses]
    return [int(p.error_code) for t in response.responses for p in t.partitions]


def timed(harness: Harness, request: Any, upstream: Callable[[Any], Any]) -> tuple[float, Any]:
    """(seconds of trio's clock the request took, the exchange), on a clock that jumps ahead."""

    async def run() -> tuple[float, Any]:
        start = trio.current_time()
        exchange = await harness.request(request, upstream)
        return trio.current_time() - start, exchange

    return trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))


def run_records(harness: Harness, topic: str, data: bytes, fetch: bool) -> tuple[RecordSet, Any]:
    return trio.run(functools.partial(harness.records, topic, 0, data, fetch=fetch))


def records_through(
    harness: Harness, values: list[bytes | None], *, fetch: bool, topic: str = "orders"
) -> tuple[bytes, list[Any]]:
    """The partition's bytes and (offset, value) of its records after the records hooks."""
    data = encode_batch(
        [Record(i, i, b"k%d" % i, v, [("h", b"1")]) for i, v in enumerate(values)], base_timestamp=1_700_000_000_000
    )
    records, error = run_records(harness, topic, data, fetch)
    assert error is None
    out = records.to_bytes()
    assert out is not None
    again = RecordSet.parse(out)
    return out, [(batch.offset_of(r), r.value) for batch, r in again]


# -- configs ---------------------------------------------------------------------------------------


def test_every_type_is_registered_under_its_name() -> None:
    assert sorted(t.plugin_name for t in chaos.INTERCEPTORS) == [
        "chaos-broken-brokers",
        "chaos-duplicate-messages",
        "chaos-invalid-schema-id",
        "chaos-latency",
        "chaos-leader-election-errors",
        "chaos-message-corruption",
        "chaos-slow-broker",
        "chaos-slow-producers-consumers",
    ]


@pytest.mark.parametrize(
    ("cls", "config", "field"),
    [
        (BrokenBrokers, {}, "rateInPercent"),
        (BrokenBrokers, {"rateInPercent": 101}, "rateInPercent"),
        (BrokenBrokers, {"rateInPercent": -1}, "rateInPercent"),
        (BrokenBrokers, {"rateInPercent": 50, "errorMap": {"PRODUCE": "NOT_AN_ERROR"}}, "errorMap.PRODUCE"),
        (BrokenBrokers, {"rateInPercent": 50, "errorMap": {"FETCH": "INVALID_RECORD"}}, "errorMap.FETCH"),
        (BrokenBrokers, {"rateInPercent": 50, "errorMap": {"PRODUCE": "OFFSET_OUT_OF_RANGE"}}, "errorMap.PRODUCE"),
        (BrokenBrokers, {"rateInPercent": 50, "errorMap": {"METADATA": "UNKNOWN_SERVER_ERROR"}}, "errorMap.METADATA"),
        (BrokenBrokers, {"rateInPercent": 50, "ratePercent": 3}, "ratePercent"),
        (LeaderElectionErrors, {"rateInPercent": 100.5}, "rateInPercent"),
        (Latency, {"appliedPercentage": 200, "latencyMs": 10}, "appliedPercentage"),
        (Latency, {"appliedPercentage": 20, "latencyMs": -10}, "latencyMs"),
        (Latency, {"appliedPercentage": 20}, "latencyMs"),
        (SlowBroker, {"rateInPercent": 10, "minLatencyMs": 500, "maxLatencyMs": 100}, "maxLatencyMs"),
        (SlowBroker, {"rateInPercent": 10, "minLatencyMs": -1, "maxLatencyMs": 100}, "minLatencyMs"),
        (
            SlowProducersConsumers,
            {"rateInPercent": 10, "minLatencyMs": 1, "maxLatencyMs": 2, "topic": "(["},
            "topic",
        ),
        (SlowProducersConsumers, {"rateInPercent": 10, "minLatencyMs": 9, "maxLatencyMs": 2}, "maxLatencyMs"),
        (DuplicateMessages, {"rateInPercent": 101}, "rateInPercent"),
        (DuplicateMessages, {"target": "BOTH"}, "target"),
        (MessageCorruption, {"sizeInBytes": 0}, "sizeInBytes"),
        (MessageCorruption, {"rateInPercent": -5}, "rateInPercent"),
        (InvalidSchemaId, {"invalidSchemaId": -1}, "invalidSchemaId"),
        (InvalidSchemaId, {"invalidSchemaId": "12"}, "invalidSchemaId"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(cls: type[Interceptor], config: dict[str, Any], field: str) -> None:
    with pytest.raises(InterceptorConfigError) as refused:
        Harness().add(cls, config)
    message = str(refused.value)
    assert message.startswith(field) or f"unknown field `{field}`" in message, message


def test_defaults_and_error_names() -> None:
    harness = Harness()
    broken = harness.add(BrokenBrokers, {"rateInPercent": 10, "errorMap": {"PRODUCE": "invalid_record"}})
    assert isinstance(broken, BrokenBrokers)
    assert broken._codes == {ApiKey.PRODUCE: ErrorCode.invalid_record, ApiKey.FETCH: ErrorCode.unknown_server_error}
    duplicate = harness.add(DuplicateMessages, {})
    assert isinstance(duplicate, DuplicateMessages)
    assert (duplicate.config.rate_in_percent, duplicate.config.target.value, duplicate.config.topic) == (
        100,
        "CONSUME",
        ".*",
    )
    corruption = harness.add(MessageCorruption, {})
    assert isinstance(corruption, MessageCorruption)
    assert corruption.config.size_in_bytes == 10
    for names in LEGAL_ERRORS.values():
        for name in names:
            assert ErrorCode[name.lower()].name.upper() == name  # every listed name is a Kafka error


# -- error codes -----------------------------------------------------------------------------------


def test_broken_brokers_answer_every_request_at_100_percent_and_none_at_0() -> None:
    services = FakeServices()
    harness = Harness(services=services)
    harness.add(BrokenBrokers, {"rateInPercent": 100, "seed": 1})
    for _ in range(3):
        exchange = trio.run(harness.request, produce_request("t"), produce_ok)
        assert exchange.forwarded is None  # the broker never saw it
        assert partition_codes(exchange.response) == [int(ErrorCode.corrupt_message)]
    fetch = trio.run(harness.request, fetch_request("t"), fetch_ok)
    assert fetch.forwarded is None
    assert partition_codes(fetch.response) == [int(ErrorCode.unknown_server_error)]
    assert services.metrics.get_sample_value(METRIC, {"plugin": "chaos-broken-brokers"}) == 4
    [(kind, _, data)] = services.audited  # one event, at the first injection
    assert (kind, data["plugin"], data["action"], data["api"], data["error"]) == (
        "SAFEGUARD",
        "chaos-broken-brokers",
        "CHAOS",
        "Produce",
        "CORRUPT_MESSAGE",
    )

    quiet = Harness(services=FakeServices())
    quiet.add(BrokenBrokers, {"rateInPercent": 0})
    exchange = trio.run(quiet.request, produce_request("t"), produce_ok)
    assert exchange.forwarded is not None
    assert partition_codes(exchange.response) == [0]
    assert quiet.services.audited == []


def test_a_rate_injects_about_that_share_reproducibly_with_a_seed() -> None:
    def codes(seed: int) -> list[int]:
        harness = Harness()
        harness.add(LeaderElectionErrors, {"rateInPercent": 30, "seed": seed})
        return [
            partition_codes(trio.run(harness.request, produce_request("t"), produce_ok).response)[0] for _ in range(200)
        ]

    first = codes(7)
    assert first == codes(7)
    failed = [c for c in first if c]
    assert 30 <= len(failed) <= 90  # about 30 % of 200
    leader_errors = {int(ErrorCode.leader_not_available), int(ErrorCode.not_leader_or_follower)}
    assert set(failed) == leader_errors | {int(ErrorCode.broker_not_available)}


# -- latency on trio's clock -----------------------------------------------------------------------


def test_latency_holds_the_request_back_latency_ms_of_trios_clock() -> None:
    harness = Harness(services=FakeServices())
    harness.add(Latency, {"appliedPercentage": 100, "latencyMs": 750})
    elapsed, exchange = timed(harness, metadata_request(), metadata_ok)
    assert exchange.forwarded is not None
    assert elapsed >= 0.75

    none = Harness()
    none.add(Latency, {"appliedPercentage": 0, "latencyMs": 750})
    elapsed, _ = timed(none, metadata_request(), metadata_ok)
    assert elapsed == 0  # the clock never had to move


def test_slow_broker_delays_within_the_range() -> None:
    services = FakeServices()
    harness = Harness(services=services)
    harness.add(SlowBroker, {"rateInPercent": 100, "minLatencyMs": 200, "maxLatencyMs": 400, "seed": 3})
    delays = [timed(harness, metadata_request(), metadata_ok)[0] for _ in range(20)]
    assert all(0.2 <= d <= 0.4 + 1e-6 for d in delays), delays
    assert len({round(d, 3) for d in delays}) > 1  # random within the range, not a constant
    assert services.metrics.get_sample_value(METRIC, {"plugin": "chaos-slow-broker"}) == 20


def test_slow_producers_consumers_delay_only_produce_and_fetch_of_matching_topics() -> None:
    harness = Harness()
    config = {"rateInPercent": 100, "minLatencyMs": 300, "maxLatencyMs": 300, "topic": "slow-.*"}
    harness.add(SlowProducersConsumers, config)
    assert timed(harness, produce_request("slow-orders"), produce_ok)[0] >= 0.3
    assert timed(harness, fetch_request("slow-orders"), fetch_ok)[0] >= 0.3
    assert timed(harness, produce_request("fast-orders"), produce_ok)[0] == 0
    assert timed(harness, metadata_request(), metadata_ok)[0] == 0


# -- records ---------------------------------------------------------------------------------------


def test_duplicates_in_fetched_records_keep_their_offsets() -> None:
    harness = Harness()
    harness.add(DuplicateMessages, {"topic": "orders"})
    _, records = records_through(harness, [b"a", b"b", None], fetch=True)
    assert records == [(0, b"a"), (0, b"a"), (1, b"b"), (1, b"b"), (2, None), (2, None)]
    _, other = records_through(harness, [b"a"], fetch=True, topic="payments")
    assert other == [(0, b"a")]


def test_duplicates_on_produce_are_renumbered_and_not_on_fetch() -> None:
    harness = Harness()
    harness.add(DuplicateMessages, {"target": "PRODUCE"})
    _, records = records_through(harness, [b"a", b"b"], fetch=False)
    assert records == [(0, b"a"), (1, b"a"), (2, b"b"), (3, b"b")]
    _, fetched = records_through(harness, [b"a", b"b"], fetch=True)
    assert fetched == [(0, b"a"), (1, b"b")]


def test_corruption_appends_size_in_bytes_random_bytes_to_values() -> None:
    services = FakeServices()
    harness = Harness(services=services)
    harness.add(MessageCorruption, {"sizeInBytes": 7, "target": "PRODUCE", "seed": 5})
    _, records = records_through(harness, VALUES, fetch=False)
    for (_, got), want in zip(records, VALUES, strict=True):
        if want is None:
            assert got is None  # a tombstone stays one
        else:
            assert got is not None and got[: len(want)] == want and len(got) == len(want) + 7
    assert services.metrics.get_sample_value(METRIC, {"plugin": "chaos-message-corruption"}) == 4
    assert len(services.audited) == 1


def test_nothing_changes_at_rate_0() -> None:
    original = encode_batch([Record(i, 0, None, v, []) for i, v in enumerate(VALUES)], base_timestamp=1)
    for cls, config in (
        (MessageCorruption, {"rateInPercent": 0}),
        (DuplicateMessages, {"rateInPercent": 0}),
        (DuplicateMessages, {"rateInPercent": 0, "target": "PRODUCE"}),
    ):
        harness = Harness()
        harness.add(cls, config)
        for fetch in (True, False):
            records, _ = run_records(harness, "t", original, fetch)
            assert not any(batch._dirty for batch in records.batches)  # forwarded as the original bytes


def test_invalid_schema_id_replaces_the_four_id_bytes_only() -> None:
    harness = Harness()
    harness.add(InvalidSchemaId, {"invalidSchemaId": 4242, "target": "PRODUCE"})
    _, records = records_through(harness, VALUES, fetch=False)
    assert [v for _, v in records] == [
        b"alpha",
        b"beta",
        None,
        b"\x00" + (4242).to_bytes(4, "big") + b"avro-payload",
        b"gamma",
    ]
    randomly = Harness()
    randomly.add(InvalidSchemaId, {"seed": 9})  # CONSUME, a random id
    _, fetched = records_through(randomly, VALUES, fetch=True)
    value = fetched[3][1]
    assert value[0] == 0 and value[5:] == b"avro-payload"
    assert int.from_bytes(value[1:5], "big") not in (0, 7)


def test_the_counter_is_unregistered_when_the_last_chaos_interceptor_closes() -> None:
    services = FakeServices()
    harness = Harness(services=services)
    harness.add(BrokenBrokers, {"rateInPercent": 100})
    harness.add(MessageCorruption, {})
    trio.run(harness.request, produce_request("t"), produce_ok)
    assert services.metrics.get_sample_value(METRIC, {"plugin": "chaos-broken-brokers"}) == 1
    trio.run(harness.close)
    assert services.metrics.get_sample_value(METRIC, {"plugin": "chaos-broken-brokers"}) is None
    assert services.shared == {}


def test_every_yaml_example_of_the_doc_is_a_valid_config() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "safeguards-chaos.md").read_text()
    types = {t.plugin_name: t for t in chaos.INTERCEPTORS}
    examples = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", doc, re.S)]
    seen = set()
    for example in examples:
        for entry in example["interceptors"]:
            Harness().add(types[entry["plugin"]], entry["config"])
            seen.add(entry["plugin"])
    assert seen == set(types)  # a section per type
