"""The ``topic-quota`` interceptor: at most ``maxTopics`` topics whose names start with ``prefix``.

Config (Kanal converts it into :class:`TopicQuotaConfig` before ``__init__``, refusing unknown keys,
wrong types and a negative limit with a message naming the key)::

    maxTopics: 50        # required: how many topics starting with the prefix may exist
    prefix: "team-a."    # optional, default "": every topic

On a CreateTopics request naming topics with the prefix, the interceptor asks the broker for the
topics that exist (a Metadata request for all topics, sent on the client's own upstream connection
with ``ctx.send_request``) and refuses the whole request with ``POLICY_VIOLATION`` when the topics
that exist plus the new ones would exceed the limit. The topics it lets through are kept in the
request's notes; the response hook counts those the broker did create. Nothing is remembered
between requests: the broker's Metadata is the only source of truth.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

import msgspec
from kanal.api import (
    ApiKey,
    ErrorCode,
    GatewayServices,
    Interceptor,
    Reject,
    RequestContext,
    RequestResult,
    ResponseContext,
    ResponseResult,
    build,
    hookimpl,
)
from prometheus_client import CollectorRegistry, Counter

__all__ = ["CREATED_METRIC", "TopicQuota", "TopicQuotaConfig"]

#: The counter of topics created through the gateway, by prefix (Prometheus adds ``_total``).
CREATED_METRIC = "kanal_topic_quota_created"

_SHARED_KEY = "created-topics"  # where the plugin's counter lives in ``services.shared``
_LET_THROUGH = "let-through"  # the note the request hook leaves for the response hook


@dataclass(frozen=True, slots=True)
class TopicQuotaConfig:
    """The interceptor's config, as Kanal validates it (field names are the operator's keys)."""

    maxTopics: Annotated[int, msgspec.Meta(ge=0, description="How many topics starting with prefix may exist")]
    prefix: Annotated[str, msgspec.Meta(description="The topic name prefix counted; '' counts every topic")] = ""


class _CreatedTopics:
    """``kanal_topic_quota_created_total{prefix=...}``, one counter for all topic-quota interceptors
    of a gateway, kept in ``services.shared``.

    Why not one counter per interceptor: the gateway builds a replacement interceptor before it
    closes the one it replaces, and several topic-quota interceptors may run at once, so a metric
    registered by each instance would clash by name in the gateway's registry. Instead each
    interceptor takes a reference on its prefix's series (which thus keeps counting across a config
    change); the last one to close a prefix removes its series, and the last one of all unregisters
    the counter, leaving the registry as the plugin found it.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.counter = Counter(
            CREATED_METRIC,
            "Topics created through the gateway by CreateTopics requests the topic-quota interceptor let through",
            ["prefix"],
            registry=registry,
        )
        self.users: collections.Counter[str] = collections.Counter()

    def acquire(self, prefix: str) -> Counter:
        self.users[prefix] += 1
        return self.counter.labels(prefix=prefix)

    def release(self, prefix: str) -> bool:
        """Drops a reference on ``prefix``; True when no interceptor uses the counter any more."""
        self.users[prefix] -= 1
        if self.users[prefix] <= 0:
            del self.users[prefix]
            self.counter.remove(prefix)
        if self.users:
            return False
        self.registry.unregister(self.counter)
        return True


class TopicQuota(Interceptor):
    """Refuses CreateTopics requests that would take the topics with ``prefix`` past ``maxTopics``."""

    plugin_name: ClassVar[str] = "topic-quota"
    description: ClassVar[str] = "Limits how many topics whose names start with a prefix may exist."
    config_type: ClassVar[type[Any] | None] = TopicQuotaConfig
    # Only CreateTopics is decoded for this interceptor; every other request stays opaque bytes.
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.CREATE_TOPICS})
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.CREATE_TOPICS})

    config: TopicQuotaConfig

    def __init__(self, config: TopicQuotaConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        metrics = services.shared.get(_SHARED_KEY)
        if metrics is None:
            metrics = services.shared[_SHARED_KEY] = _CreatedTopics(services.metrics)
        self._metrics: _CreatedTopics = metrics
        self._created = metrics.acquire(config.prefix)
        self._closed = False

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        """Checks the quota against the broker's topics now, and notes what it let through."""
        prefix, limit = self.config.prefix, self.config.maxTopics
        wanted = list(dict.fromkeys(str(t.name) for t in ctx.request.topics if t.name.startswith(prefix)))
        if not wanted:
            return None  # no Metadata round trip for requests the quota does not concern
        existing = await self._existing(ctx)
        new = [name for name in wanted if name not in existing]
        if not new:
            return None  # nothing would be created: the broker answers TOPIC_ALREADY_EXISTS itself
        if len(existing) + len(new) > limit:
            return Reject(
                ErrorCode.policy_violation,
                f"topic quota exceeded for {_topics(prefix)}: {len(existing)} exist, this request would create "
                f"{len(new)} more, the limit is {limit}",
            )
        if not getattr(ctx.request, "validate_only", False):  # a validation creates nothing to count
            ctx.notes[_LET_THROUGH] = frozenset(new)
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        """Counts the noted topics the broker created: only the response says which ones were."""
        let_through: frozenset[str] | None = ctx.notes.get(_LET_THROUGH)
        if not let_through:
            return None
        created = sum(1 for t in ctx.response.topics if t.name in let_through and t.error_code == ErrorCode.none)
        if created:
            self._created.inc(created)
        return None

    async def aclose(self) -> None:
        """Gives the prefix's metric series back (see :class:`_CreatedTopics`)."""
        if self._closed:
            return
        self._closed = True
        if self._metrics.release(self.config.prefix):
            self.services.shared.pop(_SHARED_KEY, None)

    async def _existing(self, ctx: RequestContext) -> set[str]:
        """The names of the topics with the prefix the broker knows, from a Metadata request for all
        topics on the client's upstream connection (so the same broker and credentials as the client).
        A failure raises: the core then closes the client's connection, and nothing is created
        unchecked."""
        metadata = self.services.kafka.request_class(ApiKey.METADATA)
        response = await ctx.send_request(build(metadata, topics=None, allow_auto_topic_creation=False))
        prefix = self.config.prefix
        return {
            str(t.name)
            for t in response.topics
            if t.name is not None and t.name.startswith(prefix) and t.error_code == ErrorCode.none
        }


def _topics(prefix: str) -> str:
    return f"topics starting with {prefix!r}" if prefix else "all topics (no prefix)"
