"""Length-prefixed Kafka frames, sans-I/O.

The reader is fed whatever bytes the socket gave and hands back whole frames. It checks the
declared length against a maximum *before* buffering the body, so a hostile or broken length
prefix costs nothing but the connection.
"""

from __future__ import annotations

import struct

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024

_LEN = struct.Struct(">i")


class FrameTooLarge(ValueError):
    """The peer announced a frame above the configured maximum."""


class InvalidFrame(ValueError):
    """The peer sent bytes that cannot be a Kafka frame."""


class FrameReader:
    """Splits a byte stream into frames (each returned without its 4-byte length prefix).

    Frames are returned as ``bytearray`` so that the caller may patch the correlation id in
    place before forwarding.
    """

    __slots__ = ("_buf", "_max", "_need")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._max = max_frame_size
        self._need = -1  # body length of the frame being read, -1 while reading a prefix

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytearray]:
        """Adds received bytes; returns the frames completed by them, in order."""
        buf = self._buf
        buf += data
        frames: list[bytearray] = []
        pos = 0
        end = len(buf)
        while True:
            if self._need < 0:
                if end - pos < 4:
                    break
                (size,) = _LEN.unpack_from(buf, pos)
                if size < 0:
                    raise InvalidFrame(f"negative frame length {size}")
                if size > self._max:
                    raise FrameTooLarge(f"frame of {size} bytes exceeds the maximum of {self._max}")
                pos += 4
                self._need = size
            if end - pos < self._need:
                break
            frames.append(buf[pos : pos + self._need])
            pos += self._need
            self._need = -1
        if pos:
            del buf[:pos]
        return frames

    def peek_partial(self) -> tuple[int, bytearray] | None:
        """Like :meth:`take_partial`, without handing the frame over."""
        if self._need < 0 or len(self._buf) < 4:
            return None
        return self._need, self._buf

    def take_partial(self) -> tuple[int, bytearray] | None:
        """Hands over a frame still arriving, for cut-through forwarding: its body size and the
        body bytes received so far (at least 4, the correlation id). The reader then expects a new
        frame: the caller must consume the rest of this one from the stream itself."""
        if self._need < 0 or len(self._buf) < 4:
            return None
        size, head = self._need, self._buf
        self._buf = bytearray()
        self._need = -1
        return size, head

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """Prefixes a payload with its length."""
    return _LEN.pack(len(payload)) + bytes(payload)
