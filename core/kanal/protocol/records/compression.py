"""Kafka record-batch compression codecs (attributes & 7), all backed by cramjam.

Kafka has two quirks that cramjam does not cover on its own:

* snappy: the Java client writes the *xerial* block framing (16-byte header, then
  ``[int32 length][raw snappy]`` blocks), while some other clients write plain raw snappy.
  We write xerial and read both.
* lz4: Kafka's ``Lz4BlockInputStream`` rejects frames with linked blocks, which is what
  ``cramjam.lz4.compress`` writes, so we compress with ``block_linked=False``. Any frame reads.
"""

from __future__ import annotations

import struct

import cramjam

__all__ = [
    "CODEC_NAMES",
    "GZIP",
    "LZ4",
    "NONE",
    "SNAPPY",
    "ZSTD",
    "BytesLike",
    "UnsupportedCodecError",
    "compress",
    "decompress",
]

BytesLike = bytes | bytearray | memoryview

NONE = 0
GZIP = 1
SNAPPY = 2
LZ4 = 3
ZSTD = 4

CODEC_NAMES: dict[int, str] = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

# gzip's default level compresses 10x slower for a few percent of ratio: a gateway recompresses
# on the hot path, so it uses level 1 (see library-measurements.md section 6).
_DEFAULT_LEVEL: dict[int, int | None] = {GZIP: 1, LZ4: None, ZSTD: None}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, compatible version 1
_XERIAL_BLOCK = 32 * 1024  # block size of the xerial library used by the Java client
_I32 = struct.Struct(">i")


class UnsupportedCodecError(ValueError):
    """The compression code is not one Kafka defines (0-4)."""

    def __init__(self, codec: int) -> None:
        super().__init__(f"unsupported Kafka compression codec {codec} (known: 0 none .. 4 zstd)")
        self.codec = codec


def _xerial_compress(data: BytesLike) -> bytes:
    mv = memoryview(data)
    out: list[bytes] = [_XERIAL_HEADER]
    for i in range(0, len(mv), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(mv[i : i + _XERIAL_BLOCK]))
        out.append(_I32.pack(len(block)))
        out.append(block)
    return b"".join(out)


def _snappy_decompress(data: BytesLike) -> bytes:
    mv = memoryview(data)
    # Only the 8-byte magic is checked: some producers write version/compat little-endian.
    if mv[:8] != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(mv))
    out: list[bytes] = []
    p, n = 16, len(mv)
    while p < n:
        (size,) = _I32.unpack_from(mv, p)
        p += 4
        if size < 0 or p + size > n:
            raise cramjam.DecompressionError("truncated xerial snappy block")
        out.append(bytes(cramjam.snappy.decompress_raw(mv[p : p + size])))
        p += size
    return b"".join(out)


def _gzip_decompress(data: BytesLike) -> bytes:
    # The streaming decompressor also reads multi-member gzip (as Java's GZIPInputStream does);
    # cramjam.gzip.decompress stops after the first member.
    d = cramjam.gzip.Decompressor()
    try:
        d.decompress(data)
    except OSError as e:  # the streaming API reports bad input as OSError
        raise cramjam.DecompressionError(str(e)) from e
    return bytes(d.finish())


def _lz4_compress(data: BytesLike, level: int | None) -> bytes:
    c = cramjam.lz4.Compressor(level=level, block_linked=False)
    c.compress(data if isinstance(data, bytes) else bytes(data))  # takes bytes only
    return bytes(c.finish())


def compress(codec: int, data: BytesLike, level: int | None = None) -> bytes:
    """Compress ``data`` the way Kafka expects for ``codec``; ``NONE`` returns the bytes as they are."""
    if level is None:
        level = _DEFAULT_LEVEL.get(codec)
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data, level=level))
    if codec == SNAPPY:
        return _xerial_compress(data)
    if codec == LZ4:
        return _lz4_compress(data, level)
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
    raise UnsupportedCodecError(codec)


def decompress(codec: int, data: BytesLike) -> bytes:
    """Decompress a batch's records area; raises ``cramjam.DecompressionError`` on bad input."""
    if codec == NONE:
        return bytes(data)
    if codec == GZIP:
        return _gzip_decompress(data)
    if codec == SNAPPY:
        return _snappy_decompress(data)
    if codec == LZ4:
        return bytes(cramjam.lz4.decompress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.decompress(data))
    raise UnsupportedCodecError(codec)
