"""Consumer group, client id and traffic-rate policies: the interceptor types of
``client_id``, ``consumer_group`` and ``limits``, collected for ``plugin.py``."""

from __future__ import annotations

from kanal.api import Interceptor

from .client_id import ClientIdPolicy
from .consumer_group import ConsumerGroupPolicy
from .limits import LimitCommitOffset, LimitConnection, LimitJoinGroup

INTERCEPTORS: list[type[Interceptor]] = [
    LimitCommitOffset,
    LimitJoinGroup,
    LimitConnection,
    ConsumerGroupPolicy,
    ClientIdPolicy,
]
