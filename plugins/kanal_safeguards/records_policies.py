"""The interceptor types that act on produced and fetched traffic: produce and fetch policies,
read-only topics, required schema ids and header removal (one module each)."""

from __future__ import annotations

from kanal.api import Interceptor

from .fetch_policy import FetchPolicy
from .header_removal import HeaderRemoval
from .produce_policy import ProducePolicy
from .read_only import ReadOnlyTopic
from .schema_id import TopicRequiredSchemaId

__all__ = ["INTERCEPTORS"]

INTERCEPTORS: list[type[Interceptor]] = [
    ProducePolicy,
    FetchPolicy,
    ReadOnlyTopic,
    TopicRequiredSchemaId,
    HeaderRemoval,
]
