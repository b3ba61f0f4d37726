"""A helper process: CPU-bound work that a plugin splits off the request path, run on another core.

The gateway serves every connection from one thread, so per-record work (a topic view's SQL, data
quality rules) runs on one core. A plugin whose work on a large piece of data divides (the records
of a fetched chunk, of a produced batch) hands one part to a :class:`HelperProcess` and does the
other part meanwhile::

    helper = HelperProcess("kanal-example-helper", handle, services.start_soon)  # handle: module level

    mine, reply = await helper.run(job, data[cut:], lambda: work(data[:cut]))
    if reply is None:                                           # the helper could not do its part
        reply = handle(job, data[cut:])                         # so do it here

``handle(job, part) -> bytes`` runs in the helper process: ``job`` is any JSON value, ``part`` the
bytes handed over, and its answer must be non-empty. State it builds (compiled rules, say) it keeps
in its own module, keyed by what the job names. The first job starts the process (``spawn``) in the
background, as a task of the gateway (``start_soon``, the plugin's ``services.start_soon``):
starting and importing the handler's module take about half a second, and until the process says
it is ready ``run`` answers None at once, so no request waits for it (``ready()`` waits, for those
who want to). Without ``start_soon`` (a script, a test) the first ``run`` waits for the start. It
serves one job at a time (a second caller waits its turn, so the split stays what the plugin chose)
and exits when the gateway closes its pipe. The part goes through
memory both processes map (an anonymous memfd, grown in steps; the pipe where memfd is missing):
through the pipe, a few MB cost each side about 3 ms.

When the handler raises, ``run`` logs it and answers None for that job; when the process is gone,
it answers None and the helper is not used again (``usable`` turns False). Either way the caller
does the part itself: a helper failure costs time, never results.
"""

from __future__ import annotations

import json
import logging
import mmap
import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle, send_handle
from typing import Any, Final, TypeVar

import trio

__all__ = ["Handler", "HelperProcess"]

log = logging.getLogger(__name__)

Handler = Callable[[Any, bytes], bytes]
T = TypeVar("T")

_SHARED_MEMORY: Final = hasattr(os, "memfd_create")
_READY: Final = b"ready"
#: The shared memory grows in steps of this size (and by a quarter more than the part asking for it).
_MAP_STEP = 1 << 20


class HelperProcess:
    """One helper process running ``handler``, one job at a time."""

    def __init__(self, name: str, handler: Handler, start_soon: Callable[..., None] | None = None) -> None:
        self.name = name
        self._handler = handler
        self._start_soon = start_soon
        self._conn: Connection | None = None  # set once the process is ready
        self._process: Any = None
        self._lock = trio.Lock()
        self._broken = False
        self._booting: trio.Event | None = None
        self._shared: mmap.mmap | None = None

    @property
    def usable(self) -> bool:
        """False once the process is gone (or closed): jobs are then the caller's alone."""
        return not self._broken

    @property
    def started(self) -> bool:
        """Whether the process is ready for jobs (it starts with the first one)."""
        return self._conn is not None

    def start(self) -> None:
        """Starts the process in the background unless it runs, is starting, or is gone (without
        ``start_soon``, the next ``run`` or ``ready`` starts it)."""
        if self._conn is None and not self._broken and self._start_soon is not None:
            self._start()

    async def ready(self) -> bool:
        """Starts the process if need be and waits until it is ready; False when it cannot run."""
        if self._conn is None and not self._broken:
            booting = self._start()
            if self._start_soon is None and not booting.is_set():
                await self._boot()  # no gateway to start it in the background: here, now
            await booting.wait()
        return self._conn is not None

    async def run(self, job: Any, part: bytes | memoryview, local: Callable[[], T]) -> tuple[T, bytes | None]:
        """``local()``, called while the helper runs ``handler(job, part)``; returns both answers, the
        helper's None when it could not do the job (or is not ready yet). An exception from ``local``
        propagates once the helper's answer is read (left unread, it would be taken for the next job's)."""
        if self._conn is None and self._start_soon is None and not self._broken:
            await self.ready()  # no gateway to start it in the background
        if self._conn is None:
            self.start()
            return local(), None
        async with self._lock:
            conn: Connection | None = self._conn  # (another job may have found the process gone)
            if conn is not None:
                try:
                    self._send(conn, job, memoryview(part))
                except (OSError, EOFError, ValueError) as exc:
                    self._fail(exc)
                    conn = None
            if conn is None:
                return local(), None
            try:
                mine = local()
            except Exception:
                await self._receive(conn)
                raise
            return mine, await self._receive(conn)

    def _start(self) -> trio.Event:
        """Starts the process in the background (once); the event is set when that has ended."""
        if self._booting is None:
            self._booting = trio.Event()
            if self._start_soon is not None:
                self._start_soon(self._boot, name=f"{self.name} start")
        return self._booting

    async def _boot(self) -> None:
        assert self._booting is not None
        parent: Connection | None = None
        try:
            context = multiprocessing.get_context("spawn")
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(child, self._handler), name=self.name, daemon=True)
            await trio.to_thread.run_sync(process.start)
            child.close()
            self._process = process
            # The process says so once it has the handler (its module imported): jobs need not wait.
            if await trio.to_thread.run_sync(parent.recv_bytes, abandon_on_cancel=True) != _READY:
                raise EOFError("the helper process did not start")
            if not self._broken:  # (else closed meanwhile)
                self._conn = parent
                log.info("%s: helper process %d started", self.name, process.pid)
        except Exception as exc:  # (a background task: nothing may escape it)
            self._fail(exc)
        finally:
            if parent is not None and self._conn is not parent:
                parent.close()  # the process, if any, then exits
            self._booting.set()

    def _send(self, conn: Connection, job: Any, part: memoryview) -> None:
        """Hands ``part`` over: through the shared memory (grown, and its new handle sent, when ``part``
        does not fit), else on the pipe."""
        size = len(part)
        if not _SHARED_MEMORY:
            conn.send_bytes(json.dumps([job, -1, 0]).encode())
            conn.send_bytes(part)
            return
        if self._shared is not None and len(self._shared) >= size:
            self._shared[:size] = part
            conn.send_bytes(json.dumps([job, size, 0]).encode())
            return
        capacity = -(-(size + size // 4) // _MAP_STEP) * _MAP_STEP
        fd = os.memfd_create(self.name, os.MFD_CLOEXEC)
        grown = None
        try:
            os.ftruncate(fd, capacity)
            grown = mmap.mmap(fd, capacity)
            grown[:size] = part  # written before the helper hears of it
            conn.send_bytes(json.dumps([job, size, capacity]).encode())
            send_handle(conn, fd, self._process.pid)
        except BaseException:
            if grown is not None:
                grown.close()
            raise
        finally:
            os.close(fd)
        if self._shared is not None:
            self._shared.close()
        self._shared = grown

    async def _receive(self, conn: Connection) -> bytes | None:
        try:
            reply: bytes = await trio.to_thread.run_sync(conn.recv_bytes)
            if reply:
                return reply
            error = (await trio.to_thread.run_sync(conn.recv_bytes)).decode(errors="replace")
        except (OSError, EOFError) as exc:
            self._fail(exc)
            return None
        log.warning("%s: a job failed in the helper process (done in the gateway instead): %s", self.name, error)
        return None

    def _fail(self, exc: BaseException) -> None:
        log.warning("%s: the helper process is gone (%s); the gateway does all the work", self.name, exc)
        self.close(wait=False)

    def close(self, wait: bool = True) -> None:
        """Closes the pipe (the process then exits) for good; with ``wait``, waits for it a little."""
        self._broken = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._shared is not None:
            self._shared.close()
            self._shared = None
        if self._process is not None and wait:
            self._process.join(2)
            if self._process.is_alive():
                self._process.terminate()
            self._process = None


def _serve(conn: Connection, handler: Handler) -> None:
    """The helper process: run the jobs the gateway sends until the pipe closes. A handler's answer
    goes back as it is; a failure as an empty message followed by its text."""
    try:
        conn.send_bytes(_READY)
    except (EOFError, OSError):
        return
    shared: mmap.mmap | None = None
    while True:
        try:
            job, size, capacity = json.loads(conn.recv_bytes())
            if capacity:
                fd = recv_handle(conn)
                try:
                    grown = mmap.mmap(fd, capacity)
                finally:
                    os.close(fd)
                if shared is not None:
                    shared.close()
                shared = grown
            if size < 0:
                part = conn.recv_bytes()
            elif shared is not None:
                part = shared[:size]
            else:  # cannot happen: the first part in shared memory brings its handle
                return
        except (EOFError, OSError):
            return
        error = None
        try:
            reply = handler(job, part)
            if not reply:
                raise ValueError("the handler answered nothing")
        except Exception as exc:  # report, keep serving
            reply, error = b"", f"{type(exc).__name__}: {exc}"
        try:
            conn.send_bytes(reply)
            if error is not None:
                conn.send_bytes(error.encode())
        except (EOFError, OSError):
            return
        # Freed before the next part arrives: its buffer then reuses this memory.
        part = reply = b""
