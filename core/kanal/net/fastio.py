"""Socket reads and writes on the forwarding path without trio's per-call scheduling.

trio's ``SocketStream`` goes through the scheduler twice per call (a checkpoint before, one after),
and every pass through the scheduler with work to do polls epoll once more; its ``receive_some``
also tries a read before waiting, which fails when the peer has sent nothing yet. For a gateway
answering one small request at a time that was most of its CPU per request (profiled at 3,000
one-record produces a second: half the time in epoll and socket calls). Here a write is one
``write(2)`` that usually takes everything (the rest goes through trio's ``send_all``), and a read
waits for readiness first when the last read emptied the socket, then makes one ``read(2)``.

Only plain TCP streams take this path; TLS and test streams keep trio's methods. The caller must
not write to a stream from two tasks at once (the connection's writer and a link's reader take
turns, see :mod:`kanal.net.connection`).
"""

from __future__ import annotations

import os

import trio


class FastStream:
    """A trio stream with cheaper reads and writes when it is a plain socket."""

    __slots__ = ("_fd", "_more", "stream")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._fd = stream.socket.fileno() if isinstance(stream, trio.SocketStream) else -1
        self._more = False  # the last read filled the buffer: more may be waiting

    def try_send(self, data: bytes | bytearray | memoryview) -> int:
        """Writes what the socket takes at once, without waiting; how many bytes that was."""
        if self._fd < 0:
            return 0
        try:
            return os.write(self._fd, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"send failed: {exc}") from exc

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        sent = self.try_send(data)
        if sent < len(data):
            await self.stream.send_all(memoryview(data)[sent:])

    async def receive_some(self, max_bytes: int) -> bytes | bytearray:
        """Up to ``max_bytes`` (at least one; empty at end of stream)."""
        fd = self._fd
        if fd < 0:
            return await self.stream.receive_some(max_bytes)
        if self._more:
            await trio.lowlevel.checkpoint()  # a peer that never stops sending must not starve others
        else:
            await trio.lowlevel.wait_readable(fd)
        while True:
            try:
                data = os.read(fd, max_bytes)
                break
            except BlockingIOError:
                await trio.lowlevel.wait_readable(fd)
            except OSError as exc:
                raise trio.BrokenResourceError(f"receive failed: {exc}") from exc
        self._more = len(data) == max_bytes
        return data
