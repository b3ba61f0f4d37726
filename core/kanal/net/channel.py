"""Frames over a trio stream: the I/O half of the sans-I/O frame reader."""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from kanal.protocol.framing import FrameReader
from kanal.protocol.headers import response_correlation_id
from kanal.protocol.messages import decode_response, encode_request

READ_SIZE = 256 * 1024  # measured: 64 KiB reads cost about 25% of forwarding throughput
RELAY_READ_SIZE = 1024 * 1024  # the rest of a large frame: fewer, larger reads (measured faster)
_SMALL = 64 * 1024
_LEN = struct.Struct(">i")


class PeerClosed(ConnectionError):
    """The other side closed the connection."""


class KafkaChannel:
    """Sends and receives length-prefixed frames on one stream. Not shared between tasks
    for the same direction."""

    __slots__ = ("_frames", "_reader", "stream")

    def __init__(self, stream: trio.abc.Stream, max_frame_size: int) -> None:
        self.stream = stream
        self._reader = FrameReader(max_frame_size)
        self._frames: deque[bytearray] = deque()

    async def send_frame(self, frame: bytes | bytearray) -> None:
        """Sends one frame (without prefix); small frames in one write, large ones without a copy."""
        if len(frame) < _SMALL:
            await self.stream.send_all(_LEN.pack(len(frame)) + frame)
        else:
            await self.stream.send_all(_LEN.pack(len(frame)))
            await self.stream.send_all(frame)

    async def receive_frame(self) -> bytearray:
        """The next whole frame; raises PeerClosed at end of stream."""
        frames = self._frames
        while not frames:
            data = await self.stream.receive_some(READ_SIZE)
            if not data:
                raise PeerClosed("connection closed by peer")
            frames.extend(self._reader.feed(data))
        return frames.popleft()

    async def receive_head(self) -> bytearray | tuple[int, bytearray]:
        """The next frame if it is already whole, else ``(size, first bytes)`` of a frame still
        arriving (at least its correlation id); the caller must then :meth:`relay` the rest."""
        frames = self._frames
        while not frames:
            partial = self._reader.take_partial()
            if partial is not None:
                return partial
            data = await self.stream.receive_some(READ_SIZE)
            if not data:
                raise PeerClosed("connection closed by peer")
            frames.extend(self._reader.feed(data))
        return frames.popleft()

    async def relay(
        self,
        out: trio.abc.SendStream,
        size: int,
        head: bytearray,
        hold: int = 0,
        finish: Callable[[list[bytes | bytearray], int], bytes] | None = None,
    ) -> None:
        """Forwards the rest of a frame from this channel to ``out`` (see :func:`relay`)."""
        await relay(self.stream, out, size, head, hold, finish)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def relay(
    source: trio.abc.ReceiveStream,
    out: trio.abc.SendStream,
    size: int,
    head: bytearray,
    hold: int = 0,
    finish: Callable[[list[bytes | bytearray], int], bytes] | None = None,
) -> None:
    """Forwards a frame while it arrives (cut-through): the length prefix and ``head`` (the first
    bytes of the body, already read) at once, then each chunk read from ``source`` as it comes,
    never reading past the frame.

    With ``hold``, the last ``hold`` bytes are kept back until the whole frame is in; then
    ``finish(chunks, held_from)`` gets every chunk of the frame (length prefix included) and the
    wire offset where the held bytes start, and returns the bytes to send in their place (the same
    length: the prefix is already gone).
    """
    total = 4 + size
    chunks: list[bytes | bytearray] = [_LEN.pack(size) + bytes(head)]
    received = len(chunks[0])
    held_from = total - hold
    sent = 0

    async def send_up_to(limit: int) -> None:
        nonlocal sent
        offset = 0
        for chunk in chunks:
            end = offset + len(chunk)
            if end > sent and offset < limit:
                await out.send_all(memoryview(chunk)[max(sent - offset, 0) : min(limit, end) - offset])
            offset = end
        sent = max(sent, limit)

    await send_up_to(min(received, held_from))
    while received < total:
        data = await source.receive_some(min(RELAY_READ_SIZE, total - received))
        if not data:
            raise PeerClosed("connection closed by peer")
        received += len(data)
        if hold:
            chunks.append(data)
            await send_up_to(min(received, held_from))
        else:
            await out.send_all(data)
            sent = received
    if hold:
        assert finish is not None
        tail = finish(chunks, held_from)
        assert len(tail) == total - held_from
        await out.send_all(tail)


class RequestChannel:
    """One request at a time over a channel, for the gateway's own calls (not client traffic)."""

    def __init__(self, channel: KafkaChannel, client_id: str = "kanal") -> None:
        self.channel = channel
        self.client_id = client_id
        self._next = 0

    async def call(self, body: Any) -> Any:
        """Sends a kio request body and returns the decoded response body."""
        self._next += 1
        corr = self._next
        await self.channel.send_frame(encode_request(body, corr, self.client_id))
        frame = await self.channel.receive_frame()
        if response_correlation_id(frame) != corr:
            raise ConnectionError(f"upstream answered correlation id {response_correlation_id(frame)}, expected {corr}")
        return decode_response(int(body.__api_key__), int(body.__version__), frame)
