"""Topic-id support, a preview feature off by default (``GATEWAY_FEATURE_FLAGS_TOPIC_IDS``).

While it is off, describing a topic by id (Metadata v10+) or deleting one by id (DeleteTopics v6+)
is answered by the gateway with UNSUPPORTED_VERSION, which client libraries raise as their
UnsupportedVersionException, instead of going to the cluster: topic views, aliases and virtual
clusters have names of their own but no ids of their own yet, so an answer by id could name a topic
the client does not know, or another tenant's. Produce and Fetch by id are not affected (their ids
come from the client's own Metadata).
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

from kio.schema.errors import ErrorCode

from kanal.api.context import RequestContext
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor
from kanal.api.results import Reject
from kanal.protocol.api import ApiKey, api_name

__all__ = ["TOPIC_IDS_FLAG", "TopicIdsOff"]

TOPIC_IDS_FLAG = "TOPIC_IDS"
_ZERO = uuid.UUID(int=0)


def _by_id(request: Any) -> bool:
    return any(
        getattr(topic, "topic_id", None) not in (None, _ZERO) and not getattr(topic, "name", None)
        for topic in getattr(request, "topics", None) or ()
    )


class TopicIdsOff(Interceptor):
    """Refuses requests that name topics by id only, while topic-id support is off."""

    plugin_name: ClassVar[str] = "kanal.topic-ids-off"
    description: ClassVar[str] = "Topic ids are a preview feature (GATEWAY_FEATURE_FLAGS_TOPIC_IDS); built in."
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.METADATA, ApiKey.DELETE_TOPICS})

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> Reject | None:
        if not _by_id(ctx.request):
            return None
        return Reject(
            ErrorCode.unsupported_version,
            f"{api_name(ctx.api_key)} by topic id: topic ids are a preview feature of this gateway, off"
            " (GATEWAY_FEATURE_FLAGS_TOPIC_IDS=true turns them on); name the topics instead",
        )
