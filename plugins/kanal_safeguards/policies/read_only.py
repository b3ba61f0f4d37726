"""``read-only-topic``: no writes and no destructive admin calls on the matching topics.

Produce fails per topic-partition (the records hook). The admin APIs fail per entry: DeleteTopics,
AlterConfigs and IncrementalAlterConfigs (topic resources), CreatePartitions and DeleteRecords per
topic; AlterPartitionReassignments, ElectLeaders, AlterReplicaLogDirs and AlterPartition per
topic-partition. The read-only entries are taken out of the request, the rest go to the broker, and
the response hook adds an error entry for each one taken out (from ``ctx.notes``). When every entry
is read-only the gateway answers itself. The error is TOPIC_AUTHORIZATION_FAILED (29), which clients
report as an authorization error and do not retry.

An ElectLeaders request for every partition (``topic_partitions`` null) cannot be split as it is:
the gateway asks the broker which topics exist (Metadata, on the client's upstream connection) and,
when some are read-only, sends the election for the other topics' partitions by name. Forwarding it
would let an unclean election touch a read-only topic; refusing all of it would stop a routine
preferred-leader election of the whole cluster because of one archive topic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
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
from kanal_safeguards.decisions import Action, Decisions, Violation, violation_message

__all__ = ["ReadOnlyTopic", "ReadOnlyTopicConfig"]

_TOPIC_RESOURCE = 2  # ConfigResource type of a topic
_DENIED = ErrorCode.topic_authorization_failed
_ALTER_PARTITION = 56  # broker-to-controller; not in ApiKey (no client sends it) but forwarded if one does


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
    ApiKey.DELETE_TOPICS: _Api("topics", "responses"),  # v0-5: ``topic_names`` (see _request_field)
    ApiKey.ALTER_CONFIGS: _Api("resources", "responses"),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: _Api("resources", "responses"),
    ApiKey.CREATE_PARTITIONS: _Api("topics", "results"),
    ApiKey.DELETE_RECORDS: _Api("topics", "topics"),
    ApiKey.ALTER_PARTITION_REASSIGNMENTS: _Api("topics", "responses"),
    ApiKey.ELECT_LEADERS: _Api("topic_partitions", "replica_election_results"),  # null: every partition
    ApiKey.ALTER_REPLICA_LOG_DIRS: _Api("dirs", "results"),  # topics listed per log dir (see _split_dirs)
    _ALTER_PARTITION: _Api("topics", "topics"),  # topics by id (v2+, the versions kio decodes)
}


@dataclass(slots=True)
class _Split:
    """A request cut in two: what may go to the broker and the (request entry, topic) taken out."""

    request: Any
    refused: list[tuple[Any, str]] = field(default_factory=list)
    empty: bool = False  # nothing is left to ask the broker


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
    name = entry.topic if hasattr(entry, "topic") else getattr(entry, "name", None)  # ElectLeaders: ``topic``
    if name is None and getattr(entry, "topic_id", None) is not None:
        return await resolve(entry.topic_id)
    return None if name is None else str(name)


def _message(topic: str) -> str:
    """An error entry's message names its own topic only: a request may name many topics (an
    election of every partition names them all), and every entry carries its own message."""
    return violation_message([_reason(topic)])


def _reason(topic: str) -> str:
    return f"Topic '{topic}' is read-only."


def _partition_ids(entry: Any) -> tuple[int, ...]:
    """The partitions a request entry lists: plain ints (ElectLeaders, AlterReplicaLogDirs) or
    entries with a ``partition_index``; none for the APIs that act on whole topics."""
    return tuple(p if isinstance(p, int) else int(p.partition_index) for p in getattr(entry, "partitions", ()))


def _partition_error(cls: type, index: int, message: str) -> Any:
    """A partition's refusal; -1 where the response has a watermark, leader or epoch to report."""
    candidates: dict[str, Any] = {
        "partition_index": index,
        "partition_id": index,  # ElectLeaders
        "error_code": _DENIED,
        "error_message": message,
        "low_watermark": -1,
        "leader_id": -1,
        "leader_epoch": -1,
        "partition_epoch": -1,
    }
    return build(cls, **{k: v for k, v in candidates.items() if has_field(cls, k)})


def _error_entry(cls: type, entry: Any, topic: str, message: str) -> Any:
    """The response entry refusing ``entry`` (a topic, a config resource, a topic's partitions)."""
    candidates = {
        "name": topic,
        "topic": topic,  # ElectLeaders
        "topic_name": topic,  # AlterReplicaLogDirs
        "resource_name": topic,
        "resource_type": getattr(entry, "resource_type", None),
        "topic_id": getattr(entry, "topic_id", None),
        "error_code": _DENIED,
        "error_message": message,
    }
    values = {k: v for k, v in candidates.items() if v is not None and has_field(cls, k)}
    for partitions in ("partitions", "partition_result"):
        if has_field(cls, partitions):
            part_cls = nested(cls, partitions)
            values[partitions] = tuple(_partition_error(part_cls, i, message) for i in _partition_ids(entry))
    return build(cls, **values)


class ReadOnlyTopic(SafeguardInterceptor):
    """Refuses Produce and the mutating admin APIs on the matching topics."""

    plugin_name: ClassVar[str] = "read-only-topic"
    description: ClassVar[str] = (
        "Makes topics read-only: no produce, delete, config change, partition or replica change."
    )
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
            decisions.add(Violation(_reason(topic), self.config.action, "topic", topic))
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

    async def _split_entries(self, ctx: RequestContext, entries: Sequence[Any], field_name: str) -> _Split:
        """Takes the entries naming read-only topics out of a request's list of entries."""
        kept: list[Any] = []
        refused: list[tuple[Any, str]] = []
        for entry in entries:
            topic = await _topic_of(entry, ctx.topic_names.resolve)
            if topic is not None and self._matches(topic):
                refused.append((entry, topic))
            else:
                kept.append(entry)
        request = dataclasses.replace(ctx.request, **{field_name: tuple(kept)}) if refused else ctx.request
        return _Split(request, refused, empty=not kept)

    def _split_dirs(self, ctx: RequestContext) -> _Split:
        """AlterReplicaLogDirs lists topics per target log dir, and answers per topic: the read-only
        topics are taken out of every dir (a dir left with none is dropped), and each gets one error
        entry for all its partitions, whatever dirs they were to move to."""
        dirs: list[Any] = []
        refused: dict[str, Any] = {}
        for log_dir in ctx.request.dirs:
            kept: list[Any] = []
            for entry in log_dir.topics:
                topic = str(entry.name)
                if not self._matches(topic):
                    kept.append(entry)
                    continue
                before = refused.get(topic)
                if before is not None:
                    merged = dict.fromkeys((*before.partitions, *entry.partitions))
                    entry = dataclasses.replace(before, partitions=tuple(merged))
                refused[topic] = entry
            if kept or not log_dir.topics:
                dirs.append(dataclasses.replace(log_dir, topics=tuple(kept)))
        if not refused:
            return _Split(ctx.request)
        request = dataclasses.replace(ctx.request, dirs=tuple(dirs))
        empty = not any(log_dir.topics for log_dir in dirs)
        return _Split(request, [(entry, topic) for topic, entry in refused.items()], empty)

    async def _every_partition(self, ctx: RequestContext) -> tuple[Any, ...]:
        """ElectLeaders entries naming every partition of every topic the broker knows, from a
        Metadata request on the client's upstream connection (the same broker and credentials). A
        failure raises: the core then closes the client's connection, and nothing is elected."""
        metadata = self.services.kafka.request_class(ApiKey.METADATA)
        response = await ctx.send_request(build(metadata, topics=None, allow_auto_topic_creation=False))
        entry_cls = nested(type(ctx.request), "topic_partitions")
        return tuple(
            build(entry_cls, topic=str(t.name), partitions=tuple(int(p.partition_index) for p in t.partitions))
            for t in response.topics
            if t.name is not None and t.error_code == ErrorCode.none
        )

    async def _split(self, ctx: RequestContext) -> _Split:
        if ctx.api_key == ApiKey.ALTER_REPLICA_LOG_DIRS:
            return self._split_dirs(ctx)
        field_name = _request_field(ctx.api_key, ctx.request)
        entries = getattr(ctx.request, field_name)
        if entries is None:  # ElectLeaders of every partition (INFO too: its audit names the topics)
            split = await self._split_entries(ctx, await self._every_partition(ctx), field_name)
            return split if split.refused else _Split(ctx.request)
        return await self._split_entries(ctx, entries, field_name)

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        split = await self._split(ctx)
        if not split.refused:
            return None
        topics = [topic for _, topic in split.refused]
        decisions = self._decisions(topics)
        self.audit(decisions, ctx.connection, topics=topics, api=api_name(ctx.api_key))
        if not decisions.blocked:
            return None
        answer_field = _APIS[ctx.api_key].response_field
        cls = response_class(ctx.api_key, ctx.api_version)
        assert cls is not None  # the request was decoded: kio knows this version
        entry_cls = nested(cls, answer_field)
        errors = tuple(_error_entry(entry_cls, entry, topic, _message(topic)) for entry, topic in split.refused)
        if split.empty:  # nothing left to ask the broker
            return Respond(build(cls, **{answer_field: errors}))
        ctx.request = split.request
        ctx.notes["errors"] = errors
        ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        errors = ctx.notes.get("errors")
        if errors:
            field_name = _APIS[ctx.api_key].response_field
            answered = getattr(ctx.response, field_name)
            ctx.response = dataclasses.replace(ctx.response, **{field_name: (*answered, *errors)})
        return None
