"""The gateway's own rules on responses, run innermost (before any interceptor's response hook), so
every plugin sees the gateway's view: the ApiVersions a client may use (what both the gateway and
the cluster speak), broker addresses that are the gateway's, and topic ids learnt for naming."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kanal.protocol.api import ApiKey
from kanal.protocol.api_versions import intersect
from kanal.protocol.rewrite import Address, AddressOf, broker_addresses, carries_addresses, rewrite_addresses
from kanal.protocol.topic_names import TopicNames

__all__ = ["CORE_RESPONSES", "CoreRules"]

# Responses the core itself must see: address rewriting, version negotiation, topic-id learning.
CORE_RESPONSES = frozenset({ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER, ApiKey.FIND_COORDINATOR})


class CoreRules:
    """Applies the core rules to a decoded response; the gateway supplies what they learn from and
    answer with."""

    def __init__(
        self,
        learn_brokers: Callable[[dict[int, Address]], None],
        topic_names: TopicNames,
        advertised_address: AddressOf,
    ) -> None:
        self.learn_brokers = learn_brokers
        self.topic_names = topic_names
        self.advertised_address = advertised_address
        #: APIs the gateway answers itself whatever the broker supports (ApiVersions offers them).
        self.answered_here: frozenset[int] = frozenset()

    def response(self, api_key: int, version: int, body: Any) -> Any:
        """The response as the client is to see it (``body`` itself when nothing changed)."""
        if api_key == ApiKey.API_VERSIONS:
            body = intersect(body, self.answered_here) or body
        elif api_key in (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER):
            self.learn_brokers(broker_addresses(api_key, body))
            self.topic_names.learn(api_key, body)
        if carries_addresses(api_key, version):
            body = rewrite_addresses(api_key, body, self.advertised_address) or body
        return body
