"""Consumer groups on views: who may commit offsets on a view, and where those offsets live.

A view shares the offset axis of its input topic, so its committed offsets are stored by the broker
as offsets of the input topic, under the group's id. Two views of one topic must never share them,
and neither may a view and its input topic: hence the rule of the spec, a group that commits offsets
on a view is named ``<view_name>::<free-form suffix>``.

* OffsetCommit, TxnOffsetCommit and OffsetDelete (and so the admin clients' offset alteration and
  deletion) naming a view: refused with ``INVALID_GROUP_ID`` (InvalidGroupIdException in the Java
  client) unless the group id starts with ``<view_name>::``. A ``<view_name>::`` group may not commit
  on the view's input topic under its own name either (those offsets are the view's), and is
  refused the same way. Allowed commits are stored on the input topic and answered under the view.
* OffsetFetch: a ``<view_name>::`` group reads the view's offsets (stored on the input topic); asking
  for all of the group's offsets lists them under the view's name. A group that may not commit on a
  view has no offsets on it: it is answered -1 (no committed offset) without asking the broker.
* Group membership (JoinGroup, SyncGroup, Heartbeat...) needs no rewriting: the classic protocol's
  subscriptions are opaque to the broker and the leader assigns the view's partitions from Metadata.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Final

from kanal.api import ErrorCode, Reject

from .rewrite import PhysicalId, TopicKey, item_class, make
from .views import View, Views

__all__ = ["INVALID_GROUP_ID", "CommitPlan", "OffsetFetchPlan", "commit_request", "commit_response"]

INVALID_GROUP_ID: Final = int(ErrorCode.invalid_group_id)


@dataclass(slots=True)
class CommitPlan:
    """Input topic key -> the view key the client used."""

    back: dict[TopicKey, TopicKey]


def _key_field(entry: Any) -> str:
    return "topic_id" if not hasattr(entry, "name") else "name"


def _physical_key(view: View, key: TopicKey, physical_id: PhysicalId) -> TopicKey | None:
    return view.physical if isinstance(key, str) else physical_id(view.physical)


def _refusal(group_id: str, view: View | None, group_view: View | None, topic: TopicKey) -> str:
    if view is not None:
        return (
            f"group {group_id!r} cannot commit offsets on topic view {view.name!r}: "
            f"a group committing on a view must be named '{view.name}::<suffix>'"
        )
    assert group_view is not None
    return (
        f"group {group_id!r} belongs to topic view {group_view.name!r}: it cannot commit offsets on the view's "
        f"input topic {group_view.physical!r} directly"
    )


def commit_request(request: Any, views: Views, physical_id: PhysicalId) -> Reject | tuple[Any, CommitPlan] | None:
    """OffsetCommit, TxnOffsetCommit, OffsetDelete: Reject(INVALID_GROUP_ID), or the request on the
    input topics and the plan to answer under the views, or None (nothing to do)."""
    topics = request.topics
    if not topics:
        return None
    group_id = str(request.group_id)
    group_view = views.group_view(group_id)
    key_field = _key_field(topics[0])
    own_input: TopicKey | None = None
    if group_view is not None:
        own_input = group_view.physical if key_field == "name" else physical_id(group_view.physical)
    back: dict[TopicKey, TopicKey] = {}
    entries = []
    for t in topics:
        key = getattr(t, key_field)
        view = views.get(key)
        if view is None:
            if own_input is not None and key == own_input:
                return Reject(INVALID_GROUP_ID, _refusal(group_id, None, group_view, key))
            entries.append(t)
            continue
        if view is not group_view:
            return Reject(INVALID_GROUP_ID, _refusal(group_id, view, group_view, key))
        physical = _physical_key(view, key, physical_id)
        if physical is None:
            entries.append(t)  # input topic id unknown: the broker refuses the unknown id
            continue
        back[physical] = key
        entries.append(replace(t, **{key_field: physical}))
    if not back:
        return None
    return replace(request, topics=tuple(entries)), CommitPlan(back)


def commit_response(topics: Any, plan: CommitPlan) -> tuple[Any, ...]:
    out = []
    for t in topics:
        key_field = _key_field(t)
        key = plan.back.get(getattr(t, key_field))
        out.append(t if key is None else replace(t, **{key_field: key}))
    return tuple(out)


# -- OffsetFetch --------------------------------------------------------------------------------------


@dataclass(slots=True)
class _GroupPlan:
    back: dict[TopicKey, TopicKey] = field(default_factory=dict)
    #: topics answered here: (client key, partitions)
    local: list[tuple[TopicKey, tuple[int, ...]]] = field(default_factory=list)


@dataclass(slots=True)
class OffsetFetchPlan:
    groups: dict[str, _GroupPlan]


def _group_topics(group_id: str, topics: Any, views: Views, physical_id: PhysicalId) -> tuple[Any, _GroupPlan] | None:
    """One group's topics (None: all): the topics to ask the broker and how to answer."""
    group_view = views.group_view(group_id)
    plan = _GroupPlan()
    if topics is None:
        if group_view is None:
            return None
        plan.back[group_view.physical] = group_view.name
        physical_uuid = physical_id(group_view.physical)
        if physical_uuid is not None:
            plan.back[physical_uuid] = group_view.topic_id
        return None, plan
    if not topics:
        return None
    key_field = _key_field(topics[0])
    own_input: TopicKey | None = None
    if group_view is not None:
        own_input = group_view.physical if key_field == "name" else physical_id(group_view.physical)
    entries = []
    changed = False
    for t in topics:
        key = getattr(t, key_field)
        view = views.get(key)
        foreign = view is not None and view is not group_view
        if foreign or (view is None and own_input is not None and key == own_input):
            plan.local.append((key, tuple(int(p) for p in t.partition_indexes)))
            changed = True
            continue
        if view is not None:
            physical = _physical_key(view, key, physical_id)
            if physical is not None:
                plan.back[physical] = key
                entries.append(replace(t, **{key_field: physical}))
                changed = True
                continue
        entries.append(t)
    if not changed:
        return None
    return tuple(entries), plan


def offset_fetch_request(request: Any, views: Views, physical_id: PhysicalId) -> tuple[Any, OffsetFetchPlan] | None:
    if hasattr(request, "groups"):  # v8+: several groups
        plans: dict[str, _GroupPlan] = {}
        groups = []
        for g in request.groups:
            result = _group_topics(str(g.group_id), g.topics, views, physical_id)
            if result is None:
                groups.append(g)
                continue
            topics, plans[str(g.group_id)] = result
            groups.append(g if topics is None else replace(g, topics=topics))
        if not plans:
            return None
        return replace(request, groups=tuple(groups)), OffsetFetchPlan(plans)
    result = _group_topics(str(request.group_id), request.topics, views, physical_id)
    if result is None:
        return None
    topics, plan = result
    new = request if topics is None else replace(request, topics=topics)
    return new, OffsetFetchPlan({str(request.group_id): plan})


def _answer_topics(holder_cls: type, topics: Any, plan: _GroupPlan) -> tuple[Any, ...]:
    out = []
    for t in topics:
        key_field = _key_field(t)
        key = plan.back.get(getattr(t, key_field))
        out.append(t if key is None else replace(t, **{key_field: key}))
    if plan.local:
        topic_cls = item_class(holder_cls, "topics")
        part_cls = item_class(topic_cls, "partitions")
        key_field = "name" if "name" in topic_cls.__dataclass_fields__ else "topic_id"
        for key, parts in plan.local:
            partitions = tuple(
                make(
                    part_cls,
                    partition_index=p,
                    committed_offset=-1,
                    committed_leader_epoch=-1,
                    metadata="",
                    error_code=ErrorCode.none,
                )
                for p in parts
            )
            out.append(make(topic_cls, **{key_field: key}, partitions=partitions))
    return tuple(out)


def offset_fetch_response(response: Any, plan: OffsetFetchPlan) -> Any:
    if hasattr(response, "groups"):
        groups = []
        for g in response.groups:
            group_plan = plan.groups.get(str(g.group_id))
            if group_plan is None or g.error_code != ErrorCode.none:
                groups.append(g)
                continue
            groups.append(replace(g, topics=_answer_topics(type(g), g.topics, group_plan)))
        return replace(response, groups=tuple(groups))
    group_plan = next(iter(plan.groups.values()))
    if getattr(response, "error_code", ErrorCode.none) != ErrorCode.none:
        return response
    return replace(response, topics=_answer_topics(type(response), response.topics, group_plan))
