"""The chain's semantics (kanal.pipeline.dispatch), through kanal.testing's harness: no broker, no socket.

Onion order, a short-circuit going back through the earlier interceptors' response hooks, per-request
notes, the hook deadline, requests of an interceptor's own, and how records hooks fail partitions.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from typing import Any, ClassVar

import pytest
import trio

from kanal.api import (
    ApiKey,
    Close,
    ErrorCode,
    GatewayServices,
    Interceptor,
    InterceptorConfigError,
    PartitionError,
    RecordsContext,
    Reject,
    RequestContext,
    Respond,
    ResponseContext,
    build,
    hookimpl,
    nested,
    require_request_class,
    response_class,
)
from kanal.pipeline.dispatch import CloseConnection
from kanal.protocol.records import Record, encode_batch
from kanal.testing import FakeServices, Harness

METADATA_VERSION = 12


def metadata_request(*topics: str) -> Any:
    cls = require_request_class(ApiKey.METADATA, METADATA_VERSION)
    return build(cls, topics=tuple(build(nested(cls, "topics"), name=t) for t in topics))


def metadata_response(*topics: str) -> Any:
    cls = response_class(ApiKey.METADATA, METADATA_VERSION)
    return build(cls, topics=tuple(build(nested(cls, "topics"), name=t) for t in topics))


def names(response: Any) -> list[str]:
    return [t.name for t in response.topics]


class Tracer(Interceptor):
    """Logs its hooks into ``services.shared["trace"]``; answers as its config says."""

    plugin_name: ClassVar[str] = "tracer"
    config_schema: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"answer": {"enum": ["respond", "reject", "close"]}, "tag": {"type": "string"}},
        "additionalProperties": False,
    }
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.METADATA})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.METADATA})

    def __init__(self, config: dict[str, Any], services: GatewayServices) -> None:
        super().__init__(config, services)
        self.tag = config.get("tag", "?")
        self.trace: list[str] = services.shared.setdefault("trace", [])

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> Any:
        self.trace.append(f"{self.tag}.request")
        answer = self.config.get("answer")
        if answer == "respond":
            return Respond(metadata_response(f"answered-by-{self.tag}"))
        if answer == "reject":
            return Reject(ErrorCode.policy_violation, f"refused by {self.tag}")
        if answer == "close":
            return Close(f"{self.tag} closes")
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> Any:
        self.trace.append(f"{self.tag}.response")
        # each sees what the interceptors further in left, and marks it
        ctx.response = build(type(ctx.response), topics=(*ctx.response.topics, *metadata_response(self.tag).topics))
        return None


def run(harness: Harness, request: Any, upstream: Any = None) -> Any:
    return trio.run(partial(harness.request, request, upstream=upstream))


def chain(*configs: dict[str, Any]) -> tuple[Harness, list[str]]:
    services = FakeServices()
    harness = Harness(services=services)
    for config in configs:
        harness.add(Tracer, config)
    return harness, services.shared["trace"]


def test_request_hooks_run_outermost_first_and_response_hooks_innermost_first() -> None:
    harness, trace = chain({"tag": "a"}, {"tag": "b"}, {"tag": "c"})
    exchange = run(harness, metadata_request("t"), lambda forwarded: metadata_response("broker"))
    assert trace == ["a.request", "b.request", "c.request", "c.response", "b.response", "a.response"]
    assert names(exchange.response) == ["broker", "c", "b", "a"]


@pytest.mark.parametrize("answer", ["respond", "reject"])
def test_an_answer_goes_back_through_the_earlier_interceptors_only(answer: str) -> None:
    harness, trace = chain({"tag": "a"}, {"tag": "b", "answer": answer}, {"tag": "c"})
    exchange = run(harness, metadata_request("t"), lambda forwarded: pytest.fail("the broker must not be asked"))
    assert exchange.forwarded is None
    # c never sees the request; b's own response hook does not run; a sees the answer
    assert trace == ["a.request", "b.request", "a.response"]
    if answer == "respond":
        assert names(exchange.response) == ["answered-by-b", "a"]
    else:
        assert [(t.name, t.error_code) for t in exchange.response.topics][:1] == [("t", ErrorCode.policy_violation)]
        assert names(exchange.response)[-1] == "a"


def test_the_outermost_answer_reaches_the_client_untouched() -> None:
    harness, trace = chain({"tag": "a", "answer": "respond"}, {"tag": "b"})
    exchange = run(harness, metadata_request("t"))
    assert trace == ["a.request"]
    assert names(exchange.response) == ["answered-by-a"]


def test_close_closes_the_connection() -> None:
    harness, _ = chain({"tag": "a"}, {"tag": "b", "answer": "close"})
    with pytest.raises(CloseConnection, match="b closes"):
        run(harness, metadata_request("t"))


class Noter(Interceptor):
    """Keeps the time a request arrived in its notes; its response hook reads them back."""

    plugin_name: ClassVar[str] = "noter"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.METADATA})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.METADATA})
    seen: ClassVar[list[tuple[str, Any]]] = []

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> None:
        assert ctx.notes == {}  # fresh for every request
        ctx.notes["topics"] = [t.name for t in ctx.request.topics]
        ctx.notes["owner"] = self.config["name"]

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> None:
        Noter.seen.append((self.config["name"], dict(ctx.notes)))


def test_notes_go_from_an_interceptors_request_hook_to_its_response_hook_for_that_request() -> None:
    Noter.seen.clear()
    harness = Harness()
    harness.add(Noter, {"name": "outer"})
    harness.add(Noter, {"name": "inner"})
    run(harness, metadata_request("first"), lambda forwarded: metadata_response())
    run(harness, metadata_request("second"), lambda forwarded: metadata_response())
    assert Noter.seen == [
        ("inner", {"topics": ["first"], "owner": "inner"}),
        ("outer", {"topics": ["first"], "owner": "outer"}),
        ("inner", {"topics": ["second"], "owner": "inner"}),
        ("outer", {"topics": ["second"], "owner": "outer"}),
    ]


class Slow(Interceptor):
    plugin_name: ClassVar[str] = "slow"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.METADATA})

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> None:
        if self.config.get("sync"):
            time.sleep(0.2)  # the behaviour under test: a hook that blocks past its deadline
        else:
            await trio.sleep_forever()


@pytest.mark.parametrize("sync", [False, True])
def test_a_hook_past_its_deadline_closes_the_connection_naming_the_interceptor(sync: bool) -> None:
    harness = Harness(hook_timeout=0.05)
    harness.add(Slow, {"sync": sync}, name="the-slow-one")
    with pytest.raises(CloseConnection, match="interceptor 'the-slow-one': request hook"):
        run(harness, metadata_request("t"))


class Failing(Interceptor):
    plugin_name: ClassVar[str] = "failing"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.METADATA})

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> None:
        raise KeyError("bug")


def test_a_hook_that_raises_closes_the_connection_naming_the_interceptor() -> None:
    harness = Harness()
    harness.add(Failing, name="buggy")
    with pytest.raises(CloseConnection, match="interceptor 'buggy': request hook failed: KeyError") as info:
        run(harness, metadata_request("t"))
    assert isinstance(info.value.__cause__, KeyError)


class Asker(Interceptor):
    """Asks the broker about the topics of a Metadata request before letting it through."""

    plugin_name: ClassVar[str] = "asker"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.METADATA})

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> Any:
        own = await ctx.send_request(metadata_request("probe"))
        if names(own) != ["probe-known"]:
            return Reject(ErrorCode.unknown_topic_or_partition)
        return None


def test_an_interceptor_sends_a_request_of_its_own_upstream() -> None:
    harness = Harness()
    harness.add(Asker)

    def broker(request: Any) -> Any:
        if names(request) == ["probe"]:
            return metadata_response("probe-known")
        return metadata_response("client-answer")

    exchange = run(harness, metadata_request("t"), broker)
    assert [names(call) for call in exchange.upstream_calls] == [["probe"]]
    assert names(exchange.forwarded) == ["t"] and names(exchange.response) == ["client-answer"]


class FailOdd(Interceptor):
    plugin_name: ClassVar[str] = "fail-odd"

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> PartitionError | None:
        if ctx.partition % 2:
            return PartitionError(ErrorCode.invalid_record, "odd")
        return None


def test_records_hooks_fail_one_partition() -> None:
    harness = Harness()
    harness.add(FailOdd)
    data = encode_batch([Record(value=b"v")], base_timestamp=1)
    assert trio.run(partial(harness.records, "t", 0, data))[1] is None
    assert trio.run(partial(harness.records, "t", 1, data))[1] == PartitionError(ErrorCode.invalid_record, "odd")


def test_configs_are_validated_before_the_constructor_runs() -> None:
    with pytest.raises(InterceptorConfigError, match=r"^answer: 'maybe' is not one of"):
        Harness().add(Tracer, {"answer": "maybe"})
    with pytest.raises(InterceptorConfigError, match=r"^colour: unknown key \(expected answer, tag\)"):
        Harness().add(Tracer, {"colour": "red"})


def test_close_calls_aclose() -> None:
    closed: list[str] = []

    class Holder(Interceptor):
        plugin_name: ClassVar[str] = "holder"

        async def aclose(self) -> None:
            closed.append("holder")

    harness = Harness()
    harness.add(Holder)
    trio.run(harness.close)
    assert closed == ["holder"]


class Prefixer(Interceptor):
    """Renames Produce topics: adds its prefix on the way in, strips it on the way out."""

    plugin_name: ClassVar[str] = "prefixer"
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE})

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> None:
        prefix = self.config["prefix"]
        topics = tuple(replace(t, name=prefix + t.name) for t in ctx.request.topic_data)
        ctx.request = replace(ctx.request, topic_data=topics)

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> None:
        prefix = self.config["prefix"]
        topics = tuple(replace(t, name=t.name.removeprefix(prefix)) for t in ctx.response.responses)
        ctx.response = replace(ctx.response, responses=topics)


class SeesTopics(FailOdd):
    plugin_name: ClassVar[str] = "sees-topics"

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> PartitionError | None:
        self.services.shared.setdefault("seen", []).append(ctx.topic)
        return super().kanal_produce_records(ctx)


def test_records_hooks_run_in_the_onion_and_their_failures_join_the_response_where_they_are() -> None:
    """Between an outer and an inner renaming, a records hook sees the outer interceptor's names,
    and the partition it fails reaches the client under the client's name."""
    services = FakeServices()
    harness = Harness(services=services)
    harness.add(Prefixer, {"prefix": "a."})
    harness.add(SeesTopics)
    harness.add(Prefixer, {"prefix": "c."})
    cls = require_request_class(ApiKey.PRODUCE, 9)
    topic_cls = nested(cls, "topic_data")
    data = encode_batch([Record(value=b"v")], base_timestamp=1)
    parts = tuple(build(nested(topic_cls, "partition_data"), index=i, records=data) for i in (0, 1))
    request = build(cls, acks=1, topic_data=(build(topic_cls, name="t", partition_data=parts),))

    def broker(forwarded: Any) -> Any:
        assert [(t.name, [p.index for p in t.partition_data]) for t in forwarded.topic_data] == [("c.a.t", [0])]
        response_cls = response_class(ApiKey.PRODUCE, 9)
        r_topic = nested(response_cls, "responses")
        ok = build(nested(r_topic, "partition_responses"), index=0, error_code=ErrorCode.none, base_offset=5)
        return build(response_cls, responses=(build(r_topic, name="c.a.t", partition_responses=(ok,)),))

    exchange = run(harness, request, broker)
    assert services.shared["seen"] == ["a.t", "a.t"]  # (once per partition)
    answered = [(t.name, p.index, p.error_code) for t in exchange.response.responses for p in t.partition_responses]
    assert sorted(answered) == [("t", 0, ErrorCode.none), ("t", 1, ErrorCode.invalid_record)]
