"""Sans-I/O renaming for a virtual cluster: requests to physical names, responses back to logical.

``to_physical`` takes a decoded kio request of a renamed API (see :mod:`kanal.tenancy.scope`) and
returns the request to forward plus a :class:`Rewrite`, which ``to_logical`` needs to turn the
broker's response into the client's. Both return the message they were given when nothing in it
changed, so the caller can forward the original bytes.

Beyond the table of :mod:`kanal.tenancy.apis`, a few APIs need the request to answer the response:

* CreateTopics: topics whose physical name Kafka would refuse are answered by the gateway
  (:mod:`kanal.tenancy.create_topics`); when all are, :attr:`Rewrite.answer` is the whole answer.
* FindCoordinator v4+: the response's keys are mapped back with the request's key type.
* DescribeTopicPartitions for all topics: the broker lists every topic in name order from the
  cursor on, so a request without a cursor starts at the prefix, where the tenant's names begin;
  a next cursor past them (not the tenant's) is cleared, which tells the client it has seen all.
* A regex that does not parse (ConsumerGroupHeartbeat, ListTransactions) is answered by the
  gateway with INVALID_REGULAR_EXPRESSION, as the broker would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, is_dataclass, replace
from functools import cache
from typing import Any, Final, get_args, get_origin

from kio.schema.errors import ErrorCode

from kanal.protocol.api import api_name, response_class
from kanal.protocol.entities import build, has_field, hints
from kanal.protocol.error_responses import error_response
from kanal.tenancy import create_topics
from kanal.tenancy.apis import NAMES, api_key
from kanal.tenancy.names import VirtualNames
from kanal.tenancy.regex import InvalidRegex
from kanal.tenancy.scope import PASSED_APIS, disposition
from kanal.tenancy.walk import DROP, Each, Kind, One, Spec, ToLogical, ToPhysical, each, walk

__all__ = ["UNCHANGED", "Rewrite", "renames_response", "to_logical", "to_physical"]

_CREATE_TOPICS: Final = create_topics.CREATE_TOPICS
_FIND_COORDINATOR: Final = api_key("find_coordinator")
_DESCRIBE_TOPIC_PARTITIONS: Final = api_key("describe_topic_partitions")
_METADATA: Final = api_key("metadata")
_COORDINATOR_KINDS: Final = {0: Kind.GROUP, 1: Kind.TRANSACTIONAL_ID}
_INVALID_REGEX: Final = ErrorCode.invalid_regular_expression


@dataclass(frozen=True, slots=True)
class Rewrite:
    """What the response side needs from the request it answers."""

    #: Response entries the gateway answered itself (CreateTopics topics refused by name).
    local: tuple[Any, ...] = ()
    #: The client's logical names in its order, to put :attr:`local` where the client expects it.
    order: tuple[str, ...] = ()
    #: FindCoordinator: what the request's keys name (None: no names, e.g. share-group state keys).
    coordinator_kind: Kind | None = None
    #: The whole response, when the gateway answers the request itself: forward nothing.
    answer: Any = None
    #: The aliases the request named: physical name -> alias (the response names them so).
    aliased: Mapping[str, str] = field(default_factory=dict)
    #: Metadata for all topics: the virtual cluster's aliases are listed beside its own topics.
    lists_aliases: bool = False


#: The Rewrite of most requests: the response needs nothing from them.
UNCHANGED: Final = Rewrite()
_COORDINATOR_REWRITES: Final = {kind: Rewrite(coordinator_kind=kind) for kind in Kind}
_COORDINATOR_SPECS: Final[dict[Kind, Spec]] = {kind: {"coordinators": each(key=kind)} for kind in Kind}


def _not_renamed(api_key: int) -> ValueError:
    return ValueError(f"{api_name(api_key)} is not renamed in a virtual cluster ({disposition(api_key).value})")


def to_physical(api_key: int, request: Any, names: VirtualNames) -> tuple[Any, Rewrite]:
    """The request with physical names, and what :func:`to_logical` needs for its response.

    When :attr:`Rewrite.answer` is set, the gateway answers the client with it and sends nothing
    upstream. Raises ValueError for an API that is neither renamed nor passed.
    """
    where = NAMES.get(api_key)
    if where is None:
        if api_key in PASSED_APIS:
            return request, UNCHANGED
        raise _not_renamed(api_key)
    rewrite = UNCHANGED
    if api_key == _CREATE_TOPICS:
        kept, refused = create_topics.refused_topics(request, names)
        if refused:
            if not kept.topics:
                return request, Rewrite(answer=create_topics.answer_alone(int(request.__version__), refused))
            rewrite = Rewrite(local=refused, order=tuple(t.name for t in request.topics))
            request = kept
    elif api_key == _FIND_COORDINATOR:
        kind = _COORDINATOR_KINDS.get(int(getattr(request, "key_type", 0)))
        rewrite = UNCHANGED if kind is None else _COORDINATOR_REWRITES[kind]
    elif api_key == _DESCRIBE_TOPIC_PARTITIONS:
        request = _from_the_prefix(request)
    namer = ToPhysical(names)
    try:
        physical = walk(request, where.request, namer)
    except InvalidRegex as e:
        refusal = error_response(api_key, int(request.__version__), request, _INVALID_REGEX, str(e))
        return request, Rewrite(answer=refusal)
    if namer.aliased:
        rewrite = replace(rewrite, aliased=namer.aliased)
    if names.aliases and api_key == _METADATA and request.topics is None:
        rewrite = replace(rewrite, lists_aliases=True)
    return physical, rewrite


def to_logical(api_key: int, response: Any, rewrite: Rewrite, names: VirtualNames) -> Any:
    """The response with logical names and without anything that is not the tenant's."""
    if rewrite.answer is not None:
        return rewrite.answer
    where = NAMES.get(api_key)
    if where is None:
        if api_key in PASSED_APIS:
            return response
        raise _not_renamed(api_key)
    namer = ToLogical(names, rewrite.aliased)
    logical = walk(response, where.response, namer)
    if rewrite.lists_aliases:
        logical = _with_aliases(response, logical, names)
    if logical is DROP:  # no response spec names anything at its top level
        raise ValueError(f"{api_name(api_key)} response has a top-level name that is not the tenant's")
    if api_key == _FIND_COORDINATOR and rewrite.coordinator_kind is not None:
        logical = walk(logical, _COORDINATOR_SPECS[rewrite.coordinator_kind], namer)
    elif rewrite.local:
        logical = replace(logical, topics=create_topics.merged(logical.topics, rewrite.local, rewrite.order))
    return logical


def _with_aliases(physical: Any, logical: Any, names: VirtualNames) -> Any:
    """A Metadata response for all topics with the virtual cluster's aliases listed: each alias is
    a copy of its physical topic's entry under the alias (when the cluster listed that topic)."""
    by_name = {t.name: t for t in physical.topics}
    listed = {t.name for t in logical.topics}
    extra = [
        replace(by_name[target], name=alias)
        for alias, target in names.aliases.items()
        if target in by_name and alias not in listed
    ]
    return replace(logical, topics=(*logical.topics, *extra)) if extra else logical


def _from_the_prefix(request: Any) -> Any:
    """An all-topics request without a cursor, starting at the tenant's first name.

    The logical cursor ``""`` is the physical prefix itself: every physical name of the tenant sorts
    at or after it, and every name before it is someone else's.
    """
    if request.topics or request.cursor is not None:
        return request
    request_cls: type = type(request)
    cursor_cls = next(a for a in get_args(hints(request_cls)["cursor"]) if a is not type(None))
    return replace(request, cursor=build(cursor_cls, topic_name="", partition_index=0))


@cache
def renames_response(api_key: int, version: int) -> bool:
    """Whether a response of this version can carry a name :func:`to_logical` changes. Fetch v13+
    names topics by id only: its responses, the bulk of a consumer's bytes, then stay opaque."""
    where = NAMES.get(api_key)
    if where is None:
        return False
    if api_key == _FIND_COORDINATOR:
        return True  # the keys, mapped with the request's key type
    cls = response_class(api_key, version)
    return cls is None or _names_in(cls, where.response)


def _names_in(cls: type, spec: Spec) -> bool:
    for name, rule in spec.items():
        if not has_field(cls, name):
            continue
        if not isinstance(rule, Each | One):
            return True
        entity = _entity(hints(cls)[name])
        if entity is None or _names_in(entity, rule.fields):
            return True
    return False


def _entity(hint: Any) -> type | None:
    """The entity class of a field: ``Entity``, ``tuple[Entity, ...]``, either optional."""
    for arg in (hint, *get_args(hint)):
        if get_origin(arg) is tuple:
            arg = get_args(arg)[0]
        if isinstance(arg, type) and is_dataclass(arg):
            return arg
    return None
