"""Blocking work that must not compete with request handling: a thread of its own at the lowest CPU priority.

Used for the credential cache's renewals (a bcrypt check of a few hundred milliseconds of CPU): at
normal priority such a check takes one of a small machine's cores away from the proxy, its registry
and their clients for its whole run, which shows in their tail latency; at the lowest priority it
runs on time the machine leaves idle. A new thread each time, not trio's thread cache, so that the
lowered priority never sticks to a thread that later runs a check a client is waiting for.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

import trio

T = TypeVar("T")

LOWEST_PRIORITY = 19


def _lower_this_thread() -> None:
    # on Linux the nice value belongs to the thread; elsewhere setpriority would lower the whole process
    if sys.platform == "linux":
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)


async def run_at_low_priority(fn: Callable[[], T]) -> T:
    """``fn()`` in a new low-priority thread; its result or exception. If the caller is cancelled,
    the thread still finishes and its result is dropped."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    results: list[T] = []
    errors: list[Exception] = []

    def work() -> None:
        _lower_this_thread()
        try:
            results.append(fn())
        except Exception as exc:
            errors.append(exc)
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(done.set)

    threading.Thread(target=work, name="kanal-srp-background", daemon=True).start()
    await done.wait()
    if errors:
        raise errors[0]
    return results[0]
