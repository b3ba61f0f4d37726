"""Error responses a Kafka client understands, built from the request they answer.

A policy decision must reach the client as an error code where its library looks for one: per
partition for Produce, Fetch, ListOffsets and offset commits, per topic for topic admin calls,
and at the top level elsewhere. Closing the connection instead would look like a retriable
network fault and hide the cause.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from kio.schema.errors import ErrorCode

from kanal.protocol.api import ApiKey, response_class
from kanal.protocol.entities import build, has_field
from kanal.protocol.entities import nested as _nested


def _has(cls: type, name: str) -> bool:
    return has_field(cls, name)


def _common(cls: type, error_code: int, message: str | None) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if _has(cls, "error_code"):
        values["error_code"] = ErrorCode(error_code)
    if _has(cls, "error_message"):
        values["error_message"] = message
    return values


def _partitions(
    topic_cls: type,
    topic: Any,
    topic_key: str,
    parts_field: str,
    part_key: str,
    req_parts: str,
    req_part_key: str,
    error_code: int,
    message: str | None,
    extra: dict[str, Any] | None = None,
) -> Any:
    part_cls = _nested(topic_cls, parts_field)
    parts = tuple(
        build(
            part_cls, **{part_key: getattr(p, req_part_key)}, **_common(part_cls, error_code, message), **(extra or {})
        )
        for p in getattr(topic, req_parts)
    )
    values = {parts_field: parts}
    for key in ("name", "topic", "topic_id"):
        if _has(topic_cls, key) and hasattr(topic, key if key != "topic" else topic_key):
            values[key] = getattr(topic, key)
    return build(topic_cls, **values)


_NAME_FIELDS = ("name", "topic", "topic_id", "group_id", "transactional_id", "key", "resource_type", "resource_name")
_STRING_TARGETS = ("group_id", "transactional_id", "key", "name")
_INDEX_FIELDS = ("partition_index", "index", "partition")
_UNKNOWN = -1
_MINUS_ONE = frozenset(
    {
        "base_offset",
        "log_start_offset",
        "high_watermark",
        "last_stable_offset",
        "committed_offset",
        "committed_leader_epoch",
        "leader_epoch",
        "end_offset",
        "low_watermark",
        "offset",
        "timestamp",
        "node_id",
        "port",
        "leader_id",
        "preferred_read_replica",
    }
)


def _index(source: Any) -> Any:
    if isinstance(source, int):
        return source
    return next((getattr(source, name) for name in _INDEX_FIELDS if hasattr(source, name)), 0)


def _parts(source: Any) -> tuple[Any, ...]:
    """The sub-entries (partitions) of a request entry: its first tuple field."""
    for f in fields(source):
        value = getattr(source, f.name)
        if isinstance(value, tuple):
            return value
    return ()


def error_entry(cls: type, source: Any, error_code: ErrorCode, message: str | None = None) -> Any:
    """A response entry of ``cls`` answering the request entry ``source`` (an entity, or a bare name
    such as a group id) with ``error_code``: the same name, and one errored sub-entry per partition."""
    values: dict[str, Any] = {}
    for f in fields(cls):
        name = f.name
        if name in ("error_code", "partition_error_code"):
            values[name] = error_code
        elif name == "error_message":
            values[name] = message
        elif name in _INDEX_FIELDS:
            values[name] = _index(source)
        elif name in _MINUS_ONE:
            values[name] = _UNKNOWN
        elif isinstance(source, str):
            continue
        elif name in _NAME_FIELDS and hasattr(source, name):
            values[name] = getattr(source, name)
        elif name == "name" and hasattr(source, "topic"):
            values[name] = source.topic
        elif name == "topic" and hasattr(source, "name"):
            values[name] = source.name
        elif not isinstance(source, int) and _entity_tuple(cls, name):
            part_cls = _nested(cls, name)
            values[name] = tuple(error_entry(part_cls, part, error_code, message) for part in _parts(source))
    if isinstance(source, str):
        target = next(name for name in _STRING_TARGETS if has_field(cls, name))
        values[target] = source
    return build(cls, **values)


def _entity_tuple(cls: type, name: str) -> bool:
    try:
        entity = _nested(cls, name)
    except (IndexError, TypeError, StopIteration):
        return False
    return isinstance(entity, type) and hasattr(entity, "__dataclass_fields__")


def _mirrored(cls: type, request: Any, error_code: int, message: str | None) -> dict[str, Any] | None:
    """For an API whose errors are per entry only: its one list of response entries, each answering an
    entry of the request's list (the field of the same name, else the request's first list)."""
    lists = [f.name for f in fields(cls) if _entity_tuple(cls, f.name)]
    if len(lists) != 1 or request is None:
        return None
    source = (
        lists[0]
        if hasattr(request, lists[0])
        else next((f.name for f in fields(request) if isinstance(getattr(request, f.name), tuple)), None)
    )
    if source is None:
        return None
    entry_cls = _nested(cls, lists[0])
    code = ErrorCode(error_code)
    return {lists[0]: tuple(error_entry(entry_cls, entry, code, message) for entry in getattr(request, source))}


def error_response(api_key: int, version: int, request: Any, error_code: int, message: str | None = None) -> Any:
    """The response to ``request`` that reports ``error_code`` on every entity it names."""
    cls = response_class(api_key, version)
    if cls is None:
        raise ValueError(f"no response schema for api key {api_key} version {version}")
    top = _common(cls, error_code, message)

    if api_key == ApiKey.PRODUCE:
        topic_cls = _nested(cls, "responses")
        top["responses"] = tuple(
            _partitions(
                topic_cls,
                t,
                "name",
                "partition_responses",
                "index",
                "partition_data",
                "index",
                error_code,
                message,
                {"base_offset": -1, "log_start_offset": -1}
                if _has(_nested(topic_cls, "partition_responses"), "log_start_offset")
                else {"base_offset": -1},
            )
            for t in request.topic_data
        )
        top.pop("error_code", None)
    elif api_key == ApiKey.FETCH:
        topic_cls = _nested(cls, "responses")
        part_cls = _nested(topic_cls, "partitions")
        extra = {k: -1 for k in ("high_watermark", "last_stable_offset", "log_start_offset") if _has(part_cls, k)}
        top["responses"] = tuple(
            _partitions(
                topic_cls,
                t,
                "topic",
                "partitions",
                "partition_index",
                "partitions",
                "partition",
                error_code,
                message,
                extra,
            )
            for t in request.topics
        )
        top.pop("error_message", None)
    elif api_key in (ApiKey.LIST_OFFSETS, ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT, ApiKey.OFFSET_DELETE):
        topic_cls = _nested(cls, "topics")
        top["topics"] = tuple(
            _partitions(
                topic_cls,
                t,
                "name",
                "partitions",
                "partition_index",
                "partitions",
                "partition_index",
                error_code,
                message,
            )
            for t in request.topics
        )
    elif api_key == ApiKey.CREATE_TOPICS:
        topic_cls = _nested(cls, "topics")
        top["topics"] = tuple(
            build(topic_cls, name=t.name, **_common(topic_cls, error_code, message)) for t in request.topics
        )
    elif api_key == ApiKey.DELETE_TOPICS:
        topic_cls = _nested(cls, "responses")
        names = [t.name for t in request.topics] if hasattr(request, "topics") else list(request.topic_names)
        top["responses"] = tuple(build(topic_cls, name=n, **_common(topic_cls, error_code, message)) for n in names)
    elif api_key == ApiKey.METADATA and request.topics is not None:
        topic_cls = _nested(cls, "topics")
        top["topics"] = tuple(
            build(topic_cls, name=t.name, **_common(topic_cls, error_code, message)) for t in request.topics
        )
    elif api_key == ApiKey.FIND_COORDINATOR and _has(cls, "coordinators"):
        coord_cls = _nested(cls, "coordinators")
        top["coordinators"] = tuple(
            build(coord_cls, key=k, node_id=-1, port=-1, **_common(coord_cls, error_code, message))
            for k in request.coordinator_keys
        )
    elif api_key == ApiKey.OFFSET_FETCH and _has(cls, "groups"):
        group_cls = _nested(cls, "groups")
        top["groups"] = tuple(
            build(group_cls, group_id=g.group_id, **_common(group_cls, error_code, message)) for g in request.groups
        )
    elif "error_code" not in top:
        entries = _mirrored(cls, request, error_code, message)
        if entries is None:
            raise ValueError(f"cannot build an error response for api key {api_key} version {version}")
        top.update(entries)
    return build(cls, **top)
