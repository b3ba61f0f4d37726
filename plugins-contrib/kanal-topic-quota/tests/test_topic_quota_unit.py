"""Unit tests of the topic-quota interceptor, run by ``kanal.testing.Harness`` as the gateway runs it.

Each test puts the interceptor in a harness (its config validated by Kanal first) in front of a
:class:`FakeCluster`, sends a CreateTopics request as a client would, and checks what the client
gets back, what reached the broker, and the ``kanal_topic_quota_created_total`` counter.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

import pytest
import trio
from kanal.api import ApiKey, ErrorCode
from kanal.testing import Exchange, FakeServices, Harness
from topic_quota_helpers import CREATED, FakeCluster, create_topics

import kanal_topic_quota
from kanal_topic_quota import TopicQuota

PREFIX = "team-a."


def harness(config: Mapping[str, Any], services: FakeServices | None = None) -> Harness:
    h = Harness(services=services)
    h.add(TopicQuota, config, name="quota")
    return h


def send(h: Harness, cluster: FakeCluster, *names: str, validate_only: bool = False) -> Exchange:
    return trio.run(lambda: h.request(create_topics(*names, validate_only=validate_only), cluster))


def errors(exchange: Exchange) -> dict[str, tuple[int, str | None]]:
    """What the client sees per topic: error code and message."""
    return {t.name: (int(t.error_code), t.error_message) for t in exchange.response.topics}


def created_count(h: Harness, prefix: str = PREFIX) -> float | None:
    return h.services.metrics.get_sample_value(CREATED, {"prefix": prefix})


# -- refusing


def test_refused_past_the_limit_with_policy_violation_and_a_message() -> None:
    cluster = FakeCluster([f"{PREFIX}one", f"{PREFIX}two", "other"])
    h = harness({"maxTopics": 3, "prefix": PREFIX})

    exchange = send(h, cluster, f"{PREFIX}three", f"{PREFIX}four")

    assert exchange.forwarded is None, "the broker must not see a refused request"
    message = (
        "topic quota exceeded for topics starting with 'team-a.': 2 exist, this request would create 2 more, "
        "the limit is 3"
    )
    assert errors(exchange) == {
        f"{PREFIX}three": (ErrorCode.policy_violation, message),
        f"{PREFIX}four": (ErrorCode.policy_violation, message),
    }
    assert cluster.topics == [f"{PREFIX}one", f"{PREFIX}two", "other"]
    assert created_count(h) == 0


def test_the_count_comes_from_a_metadata_request_for_every_topic_on_the_clients_upstream() -> None:
    cluster = FakeCluster([f"{PREFIX}one"])
    exchange = send(harness({"maxTopics": 5, "prefix": PREFIX}), cluster, f"{PREFIX}two")
    (metadata,) = exchange.upstream_calls
    assert int(metadata.__api_key__) == ApiKey.METADATA
    assert metadata.topics is None and metadata.allow_auto_topic_creation is False


def test_limit_zero_refuses_every_topic_with_the_prefix() -> None:
    exchange = send(harness({"maxTopics": 0, "prefix": PREFIX}), FakeCluster(), f"{PREFIX}one")
    assert errors(exchange)[f"{PREFIX}one"] == (
        ErrorCode.policy_violation,
        "topic quota exceeded for topics starting with 'team-a.': 0 exist, this request would create 1 more, "
        "the limit is 0",
    )


def test_without_a_prefix_every_topic_counts() -> None:
    cluster = FakeCluster(["a", "b"])
    exchange = send(harness({"maxTopics": 2}), cluster, "c")
    assert errors(exchange)["c"] == (
        ErrorCode.policy_violation,
        "topic quota exceeded for all topics (no prefix): 2 exist, this request would create 1 more, the limit is 2",
    )


def test_a_request_mixing_prefixes_is_refused_as_a_whole() -> None:
    cluster = FakeCluster([f"{PREFIX}one"])
    exchange = send(harness({"maxTopics": 1, "prefix": PREFIX}), cluster, "elsewhere", f"{PREFIX}two")
    assert exchange.forwarded is None
    assert {code for code, _ in errors(exchange).values()} == {ErrorCode.policy_violation}
    assert cluster.topics == [f"{PREFIX}one"]


def test_a_validate_only_request_past_the_limit_is_refused_too() -> None:
    cluster = FakeCluster([f"{PREFIX}one"])
    exchange = send(harness({"maxTopics": 1, "prefix": PREFIX}), cluster, f"{PREFIX}two", validate_only=True)
    assert errors(exchange)[f"{PREFIX}two"][0] == ErrorCode.policy_violation


# -- letting through


def test_below_the_limit_the_request_reaches_the_broker_unchanged() -> None:
    cluster = FakeCluster([f"{PREFIX}one", "other-1", "other-2"])
    h = harness({"maxTopics": 3, "prefix": PREFIX})
    request = create_topics(f"{PREFIX}two", f"{PREFIX}three")

    exchange = trio.run(h.request, request, cluster)

    assert exchange.forwarded is request, "a request let through is forwarded as it arrived"
    assert errors(exchange) == {f"{PREFIX}two": (ErrorCode.none, None), f"{PREFIX}three": (ErrorCode.none, None)}
    assert cluster.topics == [f"{PREFIX}one", "other-1", "other-2", f"{PREFIX}two", f"{PREFIX}three"]


def test_other_prefixes_are_untouched_and_cost_no_metadata_request() -> None:
    cluster = FakeCluster([f"{PREFIX}one"])
    h = harness({"maxTopics": 1, "prefix": PREFIX})
    exchange = send(h, cluster, "team-b.one", "team-b.two")
    assert errors(exchange) == {"team-b.one": (ErrorCode.none, None), "team-b.two": (ErrorCode.none, None)}
    assert exchange.upstream_calls == []
    assert created_count(h) == 0, "only topics with the prefix are counted"


def test_topics_that_exist_are_not_new() -> None:
    """At the limit, asking again for a topic that exists is the broker's business (TOPIC_ALREADY_EXISTS)."""
    cluster = FakeCluster([f"{PREFIX}one", f"{PREFIX}two"])
    h = harness({"maxTopics": 3, "prefix": PREFIX})
    exchange = send(h, cluster, f"{PREFIX}one", f"{PREFIX}three")
    assert errors(exchange) == {
        f"{PREFIX}one": (ErrorCode.topic_already_exists, None),
        f"{PREFIX}three": (ErrorCode.none, None),
    }
    exchange = send(h, cluster, f"{PREFIX}one")  # now over nothing: no topic would be created
    assert errors(exchange) == {f"{PREFIX}one": (ErrorCode.topic_already_exists, None)}


def test_topics_metadata_lists_with_an_error_do_not_count() -> None:
    cluster = FakeCluster([f"{PREFIX}one"])
    cluster.unreadable = {f"{PREFIX}hidden"}
    exchange = send(harness({"maxTopics": 2, "prefix": PREFIX}), cluster, f"{PREFIX}two")
    assert errors(exchange) == {f"{PREFIX}two": (ErrorCode.none, None)}


# -- notes and the counter


def test_the_response_hook_counts_only_the_topics_the_broker_created() -> None:
    cluster = FakeCluster(["other"], failures={f"{PREFIX}bad": ErrorCode.invalid_replication_factor})
    h = harness({"maxTopics": 10, "prefix": PREFIX})

    exchange = send(h, cluster, f"{PREFIX}one", f"{PREFIX}bad", f"{PREFIX}two", "not-counted")

    assert errors(exchange)[f"{PREFIX}bad"][0] == ErrorCode.invalid_replication_factor
    assert created_count(h) == 2
    send(h, cluster, f"{PREFIX}one", f"{PREFIX}three")  # one exists: only three is new
    assert created_count(h) == 3


def test_validate_only_creates_nothing_and_counts_nothing() -> None:
    cluster = FakeCluster()
    h = harness({"maxTopics": 10, "prefix": PREFIX})
    exchange = send(h, cluster, f"{PREFIX}one", validate_only=True)
    assert errors(exchange) == {f"{PREFIX}one": (ErrorCode.none, None)}
    assert cluster.topics == []
    assert created_count(h) == 0


def test_a_refused_request_leaves_no_notes_for_the_next_one() -> None:
    """Notes are per request: the counter of a later request sees only that request's topics."""
    cluster = FakeCluster([f"{PREFIX}one"])
    h = harness({"maxTopics": 2, "prefix": PREFIX})
    send(h, cluster, f"{PREFIX}two", f"{PREFIX}three")  # refused
    send(h, cluster, "elsewhere")  # let through without a note
    send(h, cluster, f"{PREFIX}two")
    assert created_count(h) == 1


# -- closing: the counter is given back


def test_close_unregisters_the_counter_so_the_interceptor_can_be_added_again() -> None:
    services = FakeServices()
    cluster = FakeCluster()
    first = harness({"maxTopics": 5, "prefix": PREFIX}, services)
    send(first, cluster, f"{PREFIX}one")
    assert created_count(first) == 1

    trio.run(first.close)
    assert services.metrics.get_sample_value(CREATED, {"prefix": PREFIX}) is None
    assert not any(m.name.startswith("kanal_topic_quota") for m in services.metrics.collect())
    assert services.shared == {}

    again = harness({"maxTopics": 5, "prefix": PREFIX}, services)  # same registry: no duplicate name
    send(again, cluster, f"{PREFIX}two")
    assert created_count(again) == 1


def test_a_replacement_is_built_before_the_old_one_closes_and_keeps_counting() -> None:
    """The gateway constructs the new interceptor first, then closes the one it replaces."""
    services = FakeServices()
    cluster = FakeCluster()
    old = harness({"maxTopics": 1, "prefix": PREFIX}, services)
    send(old, cluster, f"{PREFIX}one")
    new = harness({"maxTopics": 5, "prefix": PREFIX}, services)
    trio.run(old.close)
    send(new, cluster, f"{PREFIX}two")
    assert created_count(new) == 2


def test_interceptors_for_different_prefixes_count_apart() -> None:
    services = FakeServices()
    cluster = FakeCluster()
    a = harness({"maxTopics": 5, "prefix": "a."}, services)
    b = harness({"maxTopics": 5, "prefix": "b."}, services)
    send(a, cluster, "a.1", "a.2")
    send(b, cluster, "b.1")
    assert (created_count(a, "a."), created_count(b, "b.")) == (2, 1)
    trio.run(a.close)
    assert created_count(b, "a.") is None, "a closed prefix's series is removed"
    send(b, cluster, "b.2")
    assert created_count(b, "b.") == 2


def test_close_twice_is_harmless() -> None:
    services = FakeServices()
    h = Harness(services=services)
    interceptor = h.add(TopicQuota, {"maxTopics": 5})
    other = harness({"maxTopics": 5}, services)
    trio.run(h.close)
    trio.run(interceptor.aclose)
    assert created_count(other, "") == 0, "the second close must not take the other interceptor's reference"


# -- how Kanal sees the plugin


def test_only_create_topics_is_decoded() -> None:
    chain = harness({"maxTopics": 1}).dispatcher.chain
    assert chain.decode_request(ApiKey.CREATE_TOPICS) and chain.decode_response(ApiKey.CREATE_TOPICS)
    assert not any(chain.decode_request(key) for key in ApiKey if key != ApiKey.CREATE_TOPICS)
    assert not any(chain.decode_response(key) for key in ApiKey if key != ApiKey.CREATE_TOPICS)


def test_plugin_declares_the_interceptor_type_and_is_installed_under_its_entry_point() -> None:
    """Needs the distribution installed (``pip install -e plugins-contrib/kanal-topic-quota``)."""
    assert kanal_topic_quota.kanal_interceptor_types() == [TopicQuota]
    assert TopicQuota.plugin_name == "topic-quota"
    found = [e for e in entry_points(group="kanal.plugins") if e.name == "topic-quota"]
    assert [e.load() for e in found] == [kanal_topic_quota], "kanal-topic-quota is not installed"


@pytest.mark.parametrize("limit", [1, 3])
def test_exactly_at_the_limit_is_allowed(limit: int) -> None:
    cluster = FakeCluster([f"{PREFIX}{i}" for i in range(limit - 1)])
    exchange = send(harness({"maxTopics": limit, "prefix": PREFIX}), cluster, f"{PREFIX}last")
    assert errors(exchange) == {f"{PREFIX}last": (ErrorCode.none, None)}
