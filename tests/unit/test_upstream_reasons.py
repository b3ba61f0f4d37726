"""Failures reaching the cluster keep their reason in the message (a timeout has no text of its own)."""

from __future__ import annotations

import pytest
import trio

from kanal.api import UpstreamError
from kanal.net.upstream import Address, Bootstrap


def test_a_bootstrap_that_times_out_says_so() -> None:
    async def times_out(address: Address) -> None:
        raise trio.TooSlowError

    with pytest.raises(UpstreamError, match=r"^timed out$"):
        trio.run(Bootstrap([("127.0.0.1", 9)]).connect, times_out)


def test_a_bootstrap_keeps_the_last_servers_error() -> None:
    async def refused(address: Address) -> None:
        raise ConnectionRefusedError(111, f"refused by {address[1]}")

    with pytest.raises(UpstreamError, match="refused by 10"):
        trio.run(Bootstrap([("127.0.0.1", 9), ("127.0.0.1", 10)]).connect, refused)
