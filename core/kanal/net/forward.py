"""Moving bytes the gateway does not look at from one stream to another.

Between two plain TCP sockets on Linux the bytes go through a pipe with ``splice(2)`` and never
enter the process: measured here, that takes a third to a half off the CPU that moving a GB costs
when it is read and written (``bench/relay_micro.py``; figures in ``docs/benchmarks.md``). Anything
else (TLS, test streams, other systems) is copied in 1 MiB reads.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os

import trio

RELAY_READ_SIZE = 1024 * 1024  # the copy path: fewer, larger reads (measured faster)
_PIPE_SIZE = 1024 * 1024  # asked of the kernel; the default maximum for unprivileged processes
_FLAGS = getattr(os, "SPLICE_F_MOVE", 0) | getattr(os, "SPLICE_F_NONBLOCK", 0)
_YIELD_EVERY = 4 * 1024 * 1024  # let other tasks run at least this often on a busy stream
_IDLE_PIPES = 16


class PeerClosed(ConnectionError):
    """The other side closed the connection."""


class _Splice:
    """Whether splice works here, and the idle pipes kept for it (one per relay in progress)."""

    enabled = hasattr(os, "splice")
    idle: list[tuple[int, int, int]] = []  # (read end, write end, capacity)


def _pipe() -> tuple[int, int, int]:
    if _Splice.idle:
        return _Splice.idle.pop()
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # a smaller pipe only means more calls
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    return r, w, fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)


def _release(pipe: tuple[int, int, int], empty: bool) -> None:
    if empty and len(_Splice.idle) < _IDLE_PIPES:
        _Splice.idle.append(pipe)
    else:
        os.close(pipe[0])
        os.close(pipe[1])


async def forward(source: trio.abc.ReceiveStream, out: trio.abc.SendStream, size: int) -> None:
    """Moves exactly ``size`` bytes from ``source`` to ``out``; raises PeerClosed if the source
    ends first."""
    if size <= 0:
        return
    if _Splice.enabled and isinstance(source, trio.SocketStream) and isinstance(out, trio.SocketStream):
        moved = await _splice(source.socket.fileno(), out.socket.fileno(), size)
        size -= moved
    while size:
        data = await source.receive_some(min(RELAY_READ_SIZE, size))
        if not data:
            raise PeerClosed("connection closed by peer")
        size -= len(data)
        await out.send_all(data)


async def _splice(src: int, dst: int, size: int) -> int:
    """Splices up to ``size`` bytes from socket ``src`` to socket ``dst`` through a pipe; returns
    how many it moved (fewer only when splice turns out not to work here, before any moved)."""
    pipe = _pipe()
    r, w, capacity = pipe
    moved = since_yield = 0
    empty = False
    try:
        while moved < size:
            try:
                n = os.splice(src, w, min(size - moved, capacity), flags=_FLAGS)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(src)
                since_yield = 0
                continue
            except OSError as exc:
                if moved == 0 and exc.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    _Splice.enabled = False  # e.g. a socket type without splice support
                    empty = True
                    return 0
                raise trio.BrokenResourceError(str(exc)) from exc
            if n == 0:
                raise PeerClosed("connection closed by peer")
            moved += n
            since_yield += n
            while n:
                try:
                    n -= os.splice(r, dst, n, flags=_FLAGS)
                except BlockingIOError:
                    await trio.lowlevel.wait_writable(dst)
                    since_yield = 0
                except OSError as exc:
                    raise trio.BrokenResourceError(str(exc)) from exc
            if since_yield >= _YIELD_EVERY:
                await trio.lowlevel.checkpoint()
                since_yield = 0
        empty = True
        return moved
    finally:
        _release(pipe, empty)
