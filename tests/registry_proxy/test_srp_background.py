"""Blocking work in a low-priority thread of its own (the credential cache's renewals)."""

from __future__ import annotations

import os
import sys
import threading

import pytest
import trio
from kanal_registry_proxy.background import LOWEST_PRIORITY, run_at_low_priority


def test_result_and_errors_come_back_from_the_thread() -> None:
    async def main() -> None:
        assert await run_at_low_priority(lambda: threading.current_thread().name) == "kanal-srp-background"
        with pytest.raises(ValueError, match="boom"):
            await run_at_low_priority(lambda: int("boom"))

    trio.run(main)


@pytest.mark.skipif(sys.platform != "linux", reason="the nice value is per thread on Linux only")
def test_only_the_background_thread_runs_at_the_lowest_priority() -> None:
    def priority() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def main() -> None:
        before = priority()
        assert await run_at_low_priority(priority) == LOWEST_PRIORITY
        assert priority() == before

    trio.run(main)
