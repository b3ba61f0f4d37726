"""Upstream connections shared by many clients (``GATEWAY_UPSTREAM_CONNECTION_POOL_TYPE``
ROUND_ROBIN): a bounded number of links per broker, opened on first need.

A client is pinned to one link of the pool (given out in turn) for as long as that link lives: a
broker processes one connection's requests in order, so a client's requests on one link keep the
order that idempotent and transactional producers rely on. Requests that may wait at the broker
(long-poll Fetches, group joins) never go here (see :mod:`kanal.net.connection`): on a shared link
they would hold every other client's requests behind them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from kanal.net.upstream_link import UpstreamLink

log = logging.getLogger(__name__)


class UpstreamPool:
    """The shared links to one broker."""

    def __init__(self, size: int, open_link: Callable[[], Awaitable[UpstreamLink]], nursery: trio.Nursery) -> None:
        self._links: list[UpstreamLink | None] = [None] * size
        self._locks = [trio.Lock() for _ in range(size)]
        self._open = open_link
        self._nursery = nursery
        self._next = 0

    async def link(self) -> UpstreamLink:
        """A live link for a client that has none (or whose link closed): the next in turn, opened
        if needed (one opening at a time per link, however many clients wait for it)."""
        index = self._next
        self._next = (index + 1) % len(self._links)
        link = self._links[index]
        if link is not None and not link.closed:
            return link
        async with self._locks[index]:
            link = self._links[index]
            if link is None or link.closed:
                link = await self._open()
                self._links[index] = link
                self._nursery.start_soon(link.run, name=f"upstream link {link.name}")
            return link

    @property
    def open_links(self) -> int:
        return sum(1 for link in self._links if link is not None and not link.closed)
