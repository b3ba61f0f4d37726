"""Sans-I/O rewriting of the requests and responses that name a view (kio messages in, kio messages out).

A view is a topic only the gateway knows. Every request naming one is rewritten to name its input
topic before it goes upstream, and every response is rewritten back, so the client sees the view as a
topic of its own (own name, own topic id) sharing the offset axis of its input topic:

* Metadata: the view is asked as its input topic and answered as a copy of it (same partitions and
  leaders) under the view's name and id; an input topic the client did not ask for is not shown.
* ListOffsets, OffsetForLeaderEpoch: asked on the input topic, answered under the view.
* Fetch: asked on the input topic; the response's records go through the view (see
  :mod:`kanal_topicviews.transform`), under the view's name or id. A fetch naming a view does not use
  a fetch session (KIP-227): the request is sent session-less (session id 0, epoch -1), which every
  client handles by sending full fetches. When one fetch asks for the same input partition under two
  names (a view and its input topic, or two views of one topic), one of them is served per fetch, in
  turn, and the others get an empty answer for that fetch.
* Offset commits (OffsetCommit, TxnOffsetCommit, OffsetDelete) and OffsetFetch: see
  :mod:`kanal_topicviews.groups`.

Each ``*_request`` function returns None when the request names no view (forward it as it is), or the
rewritten request and a *plan*, which the matching ``*_response`` function uses to rewrite the answer.
"""

from __future__ import annotations

import dataclasses
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final

from kanal.api import ErrorCode

from .views import View, Views

__all__ = [
    "CORRUPT_MESSAGE",
    "FetchPlan",
    "MetadataPlan",
    "RenamePlan",
    "fetch_request",
    "fetch_response",
    "has_field",
    "item_class",
    "make",
    "metadata_request",
    "metadata_response",
    "rename_request",
    "rename_response",
]

ZERO_ID: Final = uuid.UUID(int=0)
#: The error a FAIL_FETCH view answers for a partition holding a record it cannot transform: Java
#: clients raise a KafkaException naming the offset, kafka-python CorruptRecordError, librdkafka
#: reports a consumer error; aiokafka logs it and retries.
CORRUPT_MESSAGE: Final = ErrorCode.corrupt_message

TopicKey = str | uuid.UUID
PhysicalId = Callable[[str], uuid.UUID | None]


# -- kio helpers --------------------------------------------------------------------------------------


_FIELDS: dict[type, frozenset[str]] = {}


def _field_names(cls: type) -> frozenset[str]:
    names = _FIELDS.get(cls)
    if names is None:
        names = _FIELDS[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names


def has_field(obj_or_cls: Any, name: str) -> bool:
    cls = obj_or_cls if isinstance(obj_or_cls, type) else type(obj_or_cls)
    return name in _field_names(cls)


_ITEMS: dict[tuple[type, str], Any] = {}


def item_class(cls: type, name: str) -> Any:
    """The entity class of the items of tuple field ``name`` of kio class ``cls``."""
    found = _ITEMS.get((cls, name))
    if found is None:
        found = _ITEMS[(cls, name)] = _item_class(cls, name)
    return found


def _item_class(cls: type, name: str) -> Any:
    hint = typing.get_type_hints(cls)[name]
    for arg in (hint, *typing.get_args(hint)):
        for inner in (arg, *typing.get_args(arg)):
            if isinstance(inner, type) and dataclasses.is_dataclass(inner):
                return inner
    raise TypeError(f"{cls.__name__}.{name} holds no entities")


def make(cls: type, **values: Any) -> Any:
    """An instance of kio class ``cls`` from the given values, ignoring those it has no field for
    (versions differ); fields not given keep their defaults."""
    names = _field_names(cls)
    return cls(**{k: v for k, v in values.items() if k in names})


# -- Metadata -----------------------------------------------------------------------------------------


@dataclass(slots=True)
class MetadataPlan:
    """What the client asked: every topic, or these views (and these input topics itself)."""

    all_topics: bool
    views: list[View] = field(default_factory=list)
    asked_physical: set[str] = field(default_factory=set)


def metadata_request(request: Any, version: int, views: Views) -> tuple[Any, MetadataPlan] | None:
    topics = request.topics
    if topics is None or (version == 0 and not topics):
        return request, MetadataPlan(True, list(views.by_name.values()))
    plan = MetadataPlan(False)
    seen: set[str] = set()
    entries = []
    substituted = False
    for t in topics:
        name = t.name
        view = views.by_name.get(name) if name else None
        if view is None and has_field(t, "topic_id") and t.topic_id and t.topic_id != ZERO_ID:
            view = views.by_id.get(t.topic_id)
        if view is None:
            if name:
                plan.asked_physical.add(name)
                if name in seen:
                    continue
                seen.add(name)
            entries.append(t)
            continue
        substituted = True
        plan.views.append(view)
        if view.physical in seen:
            continue
        seen.add(view.physical)
        entries.append(replace(t, name=view.physical, **({"topic_id": ZERO_ID} if has_field(t, "topic_id") else {})))
    if not substituted:
        return None
    changes: dict[str, Any] = {"topics": tuple(entries)}
    if has_field(request, "allow_auto_topic_creation"):
        changes["allow_auto_topic_creation"] = False  # a view never creates its input topic
    return replace(request, **changes), plan


def _view_entry(physical: Any, view: View) -> Any:
    values: dict[str, Any] = {"name": view.name}
    if has_field(physical, "topic_id"):
        values["topic_id"] = view.topic_id if physical.error_code == ErrorCode.none else ZERO_ID
    if has_field(physical, "is_internal"):
        values["is_internal"] = False
    return replace(physical, **values)


def metadata_response(response: Any, plan: MetadataPlan) -> Any:
    by_name = {t.name: t for t in response.topics}
    out: list[Any] = []
    if plan.all_topics:
        out.extend(response.topics)
        names = set(by_name)
        for view in plan.views:
            if view.physical in by_name and view.name not in names:
                out.append(_view_entry(by_name[view.physical], view))
        return replace(response, topics=tuple(out))
    substituted = {v.physical for v in plan.views}
    for t in response.topics:
        if t.name not in substituted or t.name in plan.asked_physical:
            out.append(t)
    added: set[str] = set()
    for view in plan.views:
        if view.name in added:
            continue
        added.add(view.name)
        physical = by_name.get(view.physical)
        if physical is None:
            physical = _unknown_topic(response, view.physical)
        out.append(_view_entry(physical, view))
    return replace(response, topics=tuple(out))


def _unknown_topic(response: Any, name: str) -> Any:
    cls = item_class(type(response), "topics")
    return make(
        cls,
        error_code=ErrorCode.unknown_topic_or_partition,
        name=name,
        topic_id=ZERO_ID,
        is_internal=False,
        partitions=(),
    )


# -- ListOffsets, OffsetForLeaderEpoch: rename ---------------------------------------------------------


@dataclass(slots=True)
class RenamePlan:
    """Input topic -> the names the client asked it under, each with the partitions asked."""

    back: dict[TopicKey, list[tuple[TopicKey, frozenset[int] | None]]]


def rename_request(
    topics: Any, key_field: str, parts_field: str, part_field: str, views: Views, physical_id: PhysicalId
) -> tuple[tuple[Any, ...], RenamePlan] | None:
    """Renames views to their input topics in a list of topic entries; one entry per input topic
    (partitions merged) when the client named an input topic under several names."""
    if not any(views.get(getattr(t, key_field)) is not None for t in topics):
        return None
    groups: dict[TopicKey, list[Any]] = {}
    asked: dict[TopicKey, list[tuple[TopicKey, frozenset[int] | None]]] = {}
    involved: set[TopicKey] = set()
    for t in topics:
        key = getattr(t, key_field)
        view = views.get(key)
        physical: TopicKey = key
        if view is not None:
            target = view.physical if isinstance(key, str) else physical_id(view.physical)
            if target is not None:
                physical = target
                involved.add(physical)
        parts = None if parts_field == "" else frozenset(int(getattr(p, part_field)) for p in getattr(t, parts_field))
        groups.setdefault(physical, []).append(t)
        asked.setdefault(physical, []).append((key, parts))
    entries = []
    for physical, items in groups.items():
        first = items[0]
        if parts_field and len(items) > 1:
            merged: dict[int, Any] = {}
            for item in items:
                for p in getattr(item, parts_field):
                    merged.setdefault(int(getattr(p, part_field)), p)
            first = replace(first, **{parts_field: tuple(merged.values())})
        entries.append(replace(first, **{key_field: physical}) if getattr(first, key_field) != physical else first)
    return tuple(entries), RenamePlan({k: v for k, v in asked.items() if k in involved})


def rename_response(
    topics: Any, key_field: str, parts_field: str, part_field: str, plan: RenamePlan
) -> tuple[Any, ...]:
    out = []
    for t in topics:
        names = plan.back.get(getattr(t, key_field))
        if names is None:
            out.append(t)
            continue
        for key, parts in names:
            if parts is None or not parts_field:
                out.append(replace(t, **{key_field: key}))
            else:
                kept = tuple(p for p in getattr(t, parts_field) if int(getattr(p, part_field)) in parts)
                out.append(replace(t, **{key_field: key, parts_field: kept}))
    return tuple(out)


# -- Fetch --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class FetchPlan:
    """Which name each input partition was fetched for, and the names answered empty this time."""

    by_id: bool
    #: (input topic, partition) -> (client's topic key, view or None, fetch offset)
    served: dict[tuple[TopicKey, int], tuple[TopicKey, View | None, int]] = field(default_factory=dict)
    #: (client's topic key, partition, input topic key) answered without records this time
    deferred: list[tuple[TopicKey, int, TopicKey]] = field(default_factory=list)
    #: the request sent upstream (read-aheads copy it)
    upstream: Any = None


def fetch_request(
    request: Any, version: int, views: Views, physical_id: PhysicalId, turn: int
) -> tuple[Any, FetchPlan] | None:
    by_id = version >= 13
    key_field = "topic_id" if by_id else "topic"
    topics = request.topics
    if not any(views.get(getattr(t, key_field)) is not None for t in topics):
        return None
    plan = FetchPlan(by_id)
    wanted: dict[tuple[TopicKey, int], list[tuple[TopicKey, View | None, Any]]] = {}
    templates: dict[TopicKey, Any] = {}
    for t in topics:
        key = getattr(t, key_field)
        view = views.get(key)
        physical: TopicKey = key
        if view is not None:
            target = physical_id(view.physical) if by_id else view.physical
            if target is None:  # input topic id unknown: the broker answers UNKNOWN_TOPIC_ID for the view
                view = None
            else:
                physical = target
        templates.setdefault(physical, t)
        for p in t.partitions:
            wanted.setdefault((physical, int(p.partition)), []).append((key, view, p))
    chosen: dict[TopicKey, list[Any]] = {}
    for (physical, index), askers in wanted.items():
        key, view, p = askers[turn % len(askers)] if len(askers) > 1 else askers[0]
        plan.served[(physical, index)] = (key, view, int(p.fetch_offset))
        for other in askers:
            if other[0] != key:
                plan.deferred.append((other[0], index, physical))
        chosen.setdefault(physical, []).append(p)
    entries = tuple(
        replace(templates[physical], **{key_field: physical, "partitions": tuple(parts)})
        for physical, parts in chosen.items()
    )
    changes: dict[str, Any] = {"topics": entries}
    if version >= 7:  # no fetch session: the broker's session would hold input topics under their own names
        changes.update(session_id=0, session_epoch=-1, forgotten_topics_data=())
    plan.upstream = replace(request, **changes)
    return plan.upstream, plan


class PartitionRecords(typing.Protocol):
    def __call__(self, view: View, partition: Any, fetch_offset: int) -> Any: ...


def fetch_response(response: Any, plan: FetchPlan, rewrite: PartitionRecords) -> Any:
    """The response under the client's names; ``rewrite(view, partition, fetch_offset)`` returns the
    partition entry a view's consumer gets."""
    key_field = "topic_id" if plan.by_id else "topic"
    out: dict[TopicKey, list[Any]] = {}
    templates: dict[TopicKey, Any] = {}
    answered: dict[tuple[TopicKey, int], Any] = {}
    for t in response.responses:
        physical = getattr(t, key_field)
        for p in t.partitions:
            index = int(p.partition_index)
            answered[(physical, index)] = p
            served = plan.served.get((physical, index))
            if served is None:
                key: TopicKey = physical
            else:
                key, view, fetch_offset = served
                if view is not None:
                    p = rewrite(view, p, fetch_offset)
            templates.setdefault(key, t)
            out.setdefault(key, []).append(p)
    for key, index, physical in plan.deferred:
        source = answered.get((physical, index))
        if source is None:
            continue
        templates.setdefault(key, source_topic(response, key_field, physical))
        out.setdefault(key, []).append(_empty_partition(source))
    topics = tuple(
        replace(templates[key], **{key_field: key, "partitions": tuple(parts)}) for key, parts in out.items()
    )
    return replace(response, responses=topics)


def source_topic(response: Any, key_field: str, physical: TopicKey) -> Any:
    for t in response.responses:
        if getattr(t, key_field) == physical:
            return t
    raise KeyError(physical)


def _empty_partition(source: Any) -> Any:
    """An answer without records (and without error) for a partition fetched under another name."""
    return make(
        type(source),
        partition_index=source.partition_index,
        error_code=ErrorCode.none,
        high_watermark=source.high_watermark,
        last_stable_offset=getattr(source, "last_stable_offset", -1),
        log_start_offset=getattr(source, "log_start_offset", -1),
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=b"",
    )
