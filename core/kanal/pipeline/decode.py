"""The one decode policy: which requests and responses are decoded, from the chain and the core rules.

What no hook and no core rule needs stays bytes (forwarded with only its correlation id changed, a
large one while it arrives). A Produce request is decoded for a records hook only when one of its
topics is wanted (``Interceptor.wants_produce_records``), read from the request's first bytes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from kanal.pipeline.chain import ResolvedChain
from kanal.pipeline.core_rules import CORE_RESPONSES
from kanal.protocol.api import ApiKey
from kanal.protocol.headers import RequestHeader, produce_topics

__all__ = ["decodes_request", "decodes_response"]


def decodes_request(
    chain: ResolvedChain, header: RequestHeader, frame: bytearray, name_of: Callable[[uuid.UUID], str | None]
) -> bool:
    """Whether a hook needs this request decoded (``frame``: the request, or its first bytes);
    ``name_of`` names a topic id without I/O (None when unknown)."""
    api_key = header.api_key
    if api_key != ApiKey.PRODUCE or not chain.produce_records:
        return chain.decode_request(api_key)
    topics = produce_topics(frame, header)
    names: list[str] | None = None
    if topics is not None:
        names = []
        for topic in topics:
            name = topic if isinstance(topic, str) else name_of(topic)
            if name is None:  # an id this gateway has not seen named: decode, the hooks decide
                return True
            names.append(name)
    return chain.decode_produce(names)


def decodes_response(chain: ResolvedChain, api_key: int) -> bool:
    """Whether every response of this API is decoded: for a core rule or a response hook. (Produce
    and Fetch responses are decoded for the core only when a scan finds leader hints; responses a
    request hook asked for come on top.)"""
    return api_key in CORE_RESPONSES or chain.decode_response(api_key)
