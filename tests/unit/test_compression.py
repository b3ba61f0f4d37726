"""Kafka compression codecs: round trips, Kafka's framing quirks, and other libraries as oracles."""

from __future__ import annotations

import gzip
import io
import os
import struct
import warnings

import cramjam
import lz4.frame
import pytest
import snappy
import zstandard

from kanal.protocol.records.compression import (
    CODEC_NAMES,
    GZIP,
    LZ4,
    NONE,
    SNAPPY,
    ZSTD,
    UnsupportedCodecError,
    compress,
    decompress,
)

with warnings.catch_warnings():  # kafka-python's import emits importlib.resources deprecations
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka import codec as kcodec

CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]
TEXT = b"".join(b'{"id":"ord-%08d","amount":%d,"currency":"EUR"}' % (i, i * 7) for i in range(3000))
SAMPLES = [b"", b"x", TEXT, os.urandom(70_000), TEXT[: 32 * 1024], TEXT[: 32 * 1024 + 1]]


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: CODEC_NAMES[c])
@pytest.mark.parametrize("data", SAMPLES, ids=lambda d: f"{len(d)}B")
def test_round_trip(codec: int, data: bytes) -> None:
    packed = compress(codec, data)
    assert isinstance(packed, bytes)
    assert decompress(codec, packed) == data
    assert decompress(codec, memoryview(packed)) == data
    assert decompress(codec, compress(codec, memoryview(data))) == data


def test_compresses_repetitive_data() -> None:
    for codec in (GZIP, SNAPPY, LZ4, ZSTD):
        assert len(compress(codec, TEXT)) < len(TEXT) // 3


def test_none_is_identity() -> None:
    assert compress(NONE, TEXT) == TEXT
    assert decompress(NONE, TEXT) == TEXT


@pytest.mark.parametrize("code", [5, 6, 7, 8, -1])
def test_unknown_codec_is_a_clear_error(code: int) -> None:
    with pytest.raises(UnsupportedCodecError, match="unsupported Kafka compression codec"):
        compress(code, b"abc")
    with pytest.raises(ValueError):
        decompress(code, b"abc")


# ---------------------------------------------------------------- gzip


def test_gzip_defaults_to_level_1() -> None:
    assert compress(GZIP, TEXT) == compress(GZIP, TEXT, level=1)
    assert len(compress(GZIP, TEXT, level=9)) <= len(compress(GZIP, TEXT))


def test_gzip_interop_and_multi_member() -> None:
    assert gzip.decompress(compress(GZIP, TEXT)) == TEXT
    assert decompress(GZIP, gzip.compress(TEXT)) == TEXT
    two_members = gzip.compress(TEXT[:1000]) + gzip.compress(TEXT[1000:2000])
    assert decompress(GZIP, two_members) == TEXT[:2000]


# ---------------------------------------------------------------- snappy


def test_snappy_writes_xerial_framing_in_32k_blocks() -> None:
    packed = compress(SNAPPY, TEXT)
    assert packed[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    p, blocks, out = 16, 0, b""
    while p < len(packed):
        (n,) = struct.unpack_from(">i", packed, p)
        out += snappy.uncompress(packed[p + 4 : p + 4 + n])
        p += 4 + n
        blocks += 1
    assert out == TEXT
    assert blocks == -(-len(TEXT) // (32 * 1024))


def test_snappy_reads_raw_snappy() -> None:
    assert decompress(SNAPPY, snappy.compress(TEXT)) == TEXT
    assert decompress(SNAPPY, bytes(cramjam.snappy.compress_raw(b"hello"))) == b"hello"


def test_snappy_reads_xerial_with_little_endian_version() -> None:
    # Some producers (redpanda) write version/compat little-endian: only the magic matters.
    block = snappy.compress(TEXT)
    framed = b"\x82SNAPPY\x00" + struct.pack("<ii", 1, 1) + struct.pack(">i", len(block)) + block
    assert decompress(SNAPPY, framed) == TEXT


def test_snappy_interop_with_kafka_python() -> None:
    assert kcodec.snappy_decode(compress(SNAPPY, TEXT)) == TEXT
    assert decompress(SNAPPY, kcodec.snappy_encode(TEXT)) == TEXT
    assert decompress(SNAPPY, kcodec.snappy_encode(TEXT, xerial_compatible=False)) == TEXT


def test_snappy_truncated_xerial_raises() -> None:
    packed = compress(SNAPPY, TEXT)
    with pytest.raises(cramjam.DecompressionError):
        decompress(SNAPPY, packed[:-10])


# ---------------------------------------------------------------- lz4


def test_lz4_writes_independent_blocks() -> None:
    packed = compress(LZ4, TEXT)
    assert packed[:4] == b"\x04\x22\x4d\x18"  # LZ4 frame magic
    flg = packed[4]
    assert flg >> 6 == 1  # version 01
    assert flg & 0x20  # block independence: Kafka's Lz4BlockInputStream requires it


def test_lz4_interop() -> None:
    assert lz4.frame.decompress(compress(LZ4, TEXT)) == TEXT
    assert kcodec.lz4_decode(compress(LZ4, TEXT)) == TEXT
    linked = lz4.frame.compress(TEXT, block_linked=True, content_checksum=True)
    assert decompress(LZ4, linked) == TEXT
    assert decompress(LZ4, kcodec.lz4_encode(TEXT)) == TEXT


# ---------------------------------------------------------------- zstd


def test_zstd_interop_including_streamed_frames() -> None:
    assert zstandard.ZstdDecompressor().decompress(compress(ZSTD, TEXT)) == TEXT
    assert kcodec.zstd_decode(compress(ZSTD, TEXT)) == TEXT
    assert decompress(ZSTD, kcodec.zstd_encode(TEXT)) == TEXT
    # The Java client streams: no content size in the frame header.
    buf = io.BytesIO()
    with zstandard.ZstdCompressor().stream_writer(buf, closefd=False) as w:
        w.write(TEXT)
    assert decompress(ZSTD, buf.getvalue()) == TEXT


@pytest.mark.parametrize("codec", [GZIP, LZ4, ZSTD], ids=lambda c: CODEC_NAMES[c])
def test_garbage_raises_decompression_error(codec: int) -> None:
    with pytest.raises(cramjam.DecompressionError):
        decompress(codec, b"definitely not compressed data")
