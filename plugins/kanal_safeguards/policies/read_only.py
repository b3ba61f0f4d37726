"""``read-only-topic``: no writes and no destructive admin calls on the matching topics.

Produce fails per topic-partition (the records hook); DeleteTopics, AlterConfigs and
IncrementalAlterConfigs (topic resources), CreatePartitions and DeleteRecords fail per topic: the
read-only entries are taken out of the request, the rest go to the broker, and the response hook
adds an error entry for each one taken out (from ``ctx.notes``). When every entry is read-only the
gateway answers itself. The error is TOPIC_AUTHORIZATION_FAILED (29), which clients report as an
authorization error and do not retry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec

from kanal.api import (
    ApiKey,
    ErrorCode,
    GatewayServices,
    PartitionError,
    RecordsContext,
    RecordsResult,
    RequestContext,
    RequestResult,
    Respond,
    ResponseContext,
    ResponseResult,
    api_name,
    build,
    has_field,
    hookimpl,
    nested,
    response_class,
)
from kanal_safeguards.base import SafeguardInterceptor, TopicMatcher, check_action
from kanal_safeguards.decisions import Action, Decisions, Violation

__all__ = ["ReadOnlyTopic", "ReadOnlyTopicConfig"]

_TOPIC_RESOURCE = 2  # ConfigResource type of a topic
_DENIED = ErrorCode.topic_authorization_failed


class ReadOnlyTopicConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """What operators write under ``config:`` (camelCase keys)."""

    topic: str = ".*"
    action: Action = Action.BLOCK


@dataclass(frozen=True, slots=True)
class _Api:
    """Where an admin API lists its entries in the request and answers them in the response."""

    request_field: str
    response_field: str


_APIS: dict[int, _Api] = {
    ApiKey.DELETE_TOPICS: _Api("topics", "responses"),  # v0-5: ``topic_names`` (see _entries)
    ApiKey.ALTER_CONFIGS: _Api("resources", "responses"),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _Api("resources", "responses"),
    ApiKey.CREATE_PARTITIONS: _Api("topics", "results"),
    ApiKey.DELETE_RECORDS: _Api("topics", "topics"),
}


def _request_field(api_key: int, request: Any) -> str:
    if api_key == ApiKey.DELETE_TOPICS and hasattr(request, "topic_names"):
        return "topic_names"
    return _APIS[api_key].request_field


async def _topic_of(entry: Any, resolve: Callable[[Any], Awaitable[str]]) -> str | None:
    """The topic an entry names, or None for an entry that is no topic (a broker config)."""
    if isinstance(entry, str):
        return entry
    if hasattr(entry, "resource_type"):
        return str(entry.resource_name) if int(entry.resource_type) == _TOPIC_RESOURCE else None
    name = getattr(entry, "name", None)
    if name is None and getattr(entry, "topic_id", None) is not None:
        return await resolve(entry.topic_id)
    return None if name is None else str(name)


def _error_entry(cls: type, entry: Any, topic: str, message: str) -> Any:
    """The response entry refusing ``entry`` (a topic, a config resource, a topic's partitions)."""
    candidates = {
        "name": topic,
        "resource_name": topic,
        "resource_type": getattr(entry, "resource_type", None),
        "topic_id": getattr(entry, "topic_id", None),
        "error_code": _DENIED,
        "error_message": message,
    }
    values = {k: v for k, v in candidates.items() if v is not None and has_field(cls, k)}
    if has_field(cls, "partitions"):
        part_cls = nested(cls, "partitions")
        values["partitions"] = tuple(
            build(part_cls, partition_index=p.partition_index, low_watermark=-1, error_code=_DENIED)
            for p in entry.partitions
        )
    return build(cls, **values)


class ReadOnlyTopic(SafeguardInterceptor):
    """Refuses Produce and the mutating admin APIs on the matching topics."""

    plugin_name: ClassVar[str] = "read-only-topic"
    description: ClassVar[str] = "Makes topics read-only: no produce, delete, config change, partition change."
    config_type: ClassVar[type[ReadOnlyTopicConfig]] = ReadOnlyTopicConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(_APIS)
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset(_APIS)
    responses_on_demand: ClassVar[bool] = True
    config: ReadOnlyTopicConfig

    def __init__(self, config: ReadOnlyTopicConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        check_action(self.plugin_name, "action", config.action, frozenset({Action.BLOCK, Action.INFO}))
        self._matches = TopicMatcher(config.topic)

    def _decisions(self, topics: list[str]) -> Decisions:
        decisions = Decisions()
        for topic in topics:
            decisions.add(Violation(f"Topic '{topic}' is read-only.", self.config.action, "topic", topic))
        return decisions

    def wants_produce_records(self, topic: str) -> bool:
        return self._matches(topic)

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        if not self._matches(ctx.topic):
            return None
        decisions = self._decisions([ctx.topic])
        self.audit(decisions, ctx.connection, topic=ctx.topic, partition=ctx.partition, api="Produce")
        if decisions.blocked:
            return PartitionError(_DENIED, decisions.message)
        return None

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        field = _request_field(ctx.api_key, ctx.request)
        entries = getattr(ctx.request, field)
        kept: list[Any] = []
        refused: list[tuple[Any, str]] = []
        for entry in entries:
            topic = await _topic_of(entry, ctx.topic_names.resolve)
            if topic is not None and self._matches(topic):
                refused.append((entry, topic))
            else:
                kept.append(entry)
        if not refused:
            return None
        decisions = self._decisions([topic for _, topic in refused])
        self.audit(decisions, ctx.connection, topics=[t for _, t in refused], api=api_name(ctx.api_key))
        if not decisions.blocked:
            return None
        answer_field = _APIS[ctx.api_key].response_field
        cls = response_class(ctx.api_key, ctx.api_version)
        assert cls is not None  # the request was decoded: kio knows this version
        entry_cls = nested(cls, answer_field)
        errors = tuple(_error_entry(entry_cls, entry, topic, decisions.message) for entry, topic in refused)
        if not kept:  # nothing left to ask the broker
            return Respond(build(cls, **{answer_field: errors}))
        ctx.request = dataclasses.replace(ctx.request, **{field: tuple(kept)})
        ctx.notes["errors"] = errors
        ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        errors = ctx.notes.get("errors")
        if errors:
            field = _APIS[ctx.api_key].response_field
            answered = getattr(ctx.response, field)
            ctx.response = dataclasses.replace(ctx.response, **{field: (*answered, *errors)})
        return None
