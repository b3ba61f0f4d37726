"""Frames over a trio stream: the I/O half of the sans-I/O frame reader."""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from kanal.net.fastio import FastStream
from kanal.net.forward import RELAY_READ_SIZE, PeerClosed, forward
from kanal.protocol.framing import FrameReader, InvalidFrame
from kanal.protocol.headers import response_correlation_id
from kanal.protocol.messages import decode_response, encode_request
from kanal.protocol.scan import ResponseScan
from kanal.protocol.validate import RequestScan

READ_SIZE = 256 * 1024  # measured: 64 KiB reads cost about 25% of forwarding throughput
# The first read at a frame boundary, where a frame may be streamed: small, so that a large frame's
# body mostly stays in the kernel (spliced) instead of passing through the process.
HEAD_READ_SIZE = 16 * 1024
STREAM_FROM = 256 * 1024  # frames at least this large may be forwarded while they arrive
#: Frames below this size are sent in one write (prefix and body copied together).
SMALL_FRAME = 64 * 1024
_STRUCTURE_READ = 4096  # first read of a scanned frame's structure between two record sets
_FORWARD_FROM = 64 * 1024  # record sets at least this large are forwarded unread
_LEN = struct.Struct(">i")


def next_read_size(reader: FrameReader) -> int:
    """How much to read next where frames may be streamed: a small read at a frame boundary, so
    that a large frame can be forwarded unread after its first bytes; a full one otherwise."""
    return READ_SIZE if reader.buffered else HEAD_READ_SIZE


async def receive_rest(stream: trio.abc.ReceiveStream, size: int, head: bytearray) -> bytearray:
    """The rest of a large frame whose first bytes are ``head``, never reading past its end: kept as
    the chunks received and joined once (no growing buffer copied at each read). Memory follows the
    bytes that arrived, not the length the peer announced."""
    chunks: list[bytes | bytearray] = [head]
    got = len(head)
    while got < size:
        data = await stream.receive_some(min(size - got, RELAY_READ_SIZE))
        if not data:
            raise PeerClosed("connection closed by peer")
        chunks.append(data)
        got += len(data)
    return bytearray().join(chunks)


class KafkaChannel:
    """Sends and receives length-prefixed frames on one stream. Not shared between tasks
    for the same direction."""

    __slots__ = ("_frames", "_io", "_reader", "stream")

    def __init__(self, stream: trio.abc.Stream, max_frame_size: int) -> None:
        self.stream = stream
        self._io = FastStream(stream)
        self._reader = FrameReader(max_frame_size)
        self._frames: deque[bytearray] = deque()

    def try_send_frame(self, frame: bytes | bytearray) -> memoryview | None:
        """Writes a small frame (with its prefix) as far as the socket takes it without waiting:
        None when all of it went, else what is left to send (see :meth:`send_rest`)."""
        data = _LEN.pack(len(frame)) + frame
        sent = self._io.try_send(data)
        return None if sent == len(data) else memoryview(data)[sent:]

    async def send_rest(self, rest: memoryview) -> None:
        await self._io.send_all(rest)

    async def send_frame(self, frame: bytes | bytearray) -> None:
        """Sends one frame (without prefix); small frames in one write, large ones without a copy."""
        if len(frame) < SMALL_FRAME:
            await self._io.send_all(_LEN.pack(len(frame)) + frame)
        else:
            await self._io.send_all(_LEN.pack(len(frame)))
            await self._io.send_all(frame)

    async def receive_frame(self) -> bytearray:
        """The next whole frame; raises PeerClosed at end of stream."""
        frames = self._frames
        while not frames:
            partial = self._reader.peek_partial()
            if partial is not None and partial[0] >= STREAM_FROM:
                self._reader.take_partial()
                return await receive_rest(self.stream, *partial)
            data = await self._io.receive_some(READ_SIZE)
            if not data:
                raise PeerClosed("connection closed by peer")
            frames.extend(self._reader.feed(data))
        return frames.popleft()

    async def receive_head(self) -> bytearray | tuple[int, bytearray]:
        """The next frame if it is already whole, else ``(size, first bytes)`` of a large frame
        still arriving (at least its correlation id); the caller must then :func:`relay` the rest."""
        frames = self._frames
        while not frames:
            partial = self._reader.peek_partial()
            if partial is not None and partial[0] >= STREAM_FROM:
                self._reader.take_partial()
                return partial
            data = await self._io.receive_some(next_read_size(self._reader))
            if not data:
                raise PeerClosed("connection closed by peer")
            frames.extend(self._reader.feed(data))
        return frames.popleft()

    async def aclose(self) -> None:
        await self.stream.aclose()


async def relay(
    source: trio.abc.ReceiveStream,
    out: trio.abc.SendStream,
    size: int,
    head: bytearray,
    scan: ResponseScan | None = None,
    finish: Callable[[bytearray], bytes | bytearray] | None = None,
) -> None:
    """Forwards a frame while it arrives (cut-through): the length prefix and ``head`` (the first
    bytes of the body, already read) at once, then the rest as it comes, never reading past the
    frame.

    With a ``scan``, the frame's structure is followed as it passes: the bytes it calls opaque
    (records) are forwarded unread, the structure goes on as the scan leaves it (topic ids mapped),
    and the frame's last part (its top-level tagged fields) is kept back until it is whole, then
    sent as ``finish(tail)`` returns it (the same length: the prefix is already gone).
    """
    prefix = _LEN.pack(size)
    if scan is None:
        await out.send_all(prefix + head)
        await forward(source, out, size - len(head))
        return
    taken = scan.feed(head)
    await out.send_all(prefix + memoryview(head)[:taken])
    kept = head[taken:]  # the tail so far, or the start of a topic id the scan waits to see whole
    received = len(head)
    step = _STRUCTURE_READ
    while received < size:
        left = size - received
        opaque = 0 if kept and not scan.at_tail else min(scan.opaque, left)
        if opaque >= _FORWARD_FROM:
            await forward(source, out, opaque)
            scan.skip(opaque)
            received += opaque
            step = _STRUCTURE_READ
            continue
        data = await source.receive_some(min(max(opaque, step), left))
        if not data:
            raise PeerClosed("connection closed by peer")
        received += len(data)
        if scan.at_tail:
            kept += data
            continue
        if kept:
            data = kept + data
        elif scan.maps_ids and not isinstance(data, bytearray):
            data = bytearray(data)
        taken = scan.feed(data)
        if taken:
            await out.send_all(memoryview(data)[:taken])
        kept = bytearray(memoryview(data)[taken:])
        step = min(step * 2, READ_SIZE)  # a long run of structure (many partitions): larger reads
    if not scan.at_tail:
        raise InvalidFrame("response frame ends inside its structure")
    last = finish(kept) if finish is not None else kept
    assert len(last) == len(kept)
    await out.send_all(last)


async def relay_checked(
    source: trio.abc.ReceiveStream, out: trio.abc.SendStream, size: int, head: bytearray, check: RequestScan
) -> None:
    """Forwards a request frame while it arrives, like :func:`relay`, each part checked against the
    request's schema before it goes on (the bytes the check calls opaque, record bodies, pass
    unread). Raises MalformedRequest at the first part that breaks it: the parts before it went on,
    so the caller must give up ``out``."""
    check.feed(head)
    await out.send_all(_LEN.pack(size) + head)
    received = len(head)
    while received < size:
        left = size - received
        opaque = min(check.opaque, left)
        if opaque >= _FORWARD_FROM:
            await forward(source, out, opaque)
            check.skip(opaque)
            received += opaque
            continue
        data = await source.receive_some(min(max(opaque, _STRUCTURE_READ), left))
        if not data:
            raise PeerClosed("connection closed by peer")
        check.feed(data)
        await out.send_all(data)
        received += len(data)
    check.finish()


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
