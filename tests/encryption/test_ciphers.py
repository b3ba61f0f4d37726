"""The AEAD ciphers: published vectors, interop with cryptography and pynacl, and refusals."""

from __future__ import annotations

import os
from collections.abc import Callable

import nacl.bindings
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from hypothesis import given
from hypothesis import strategies as st
from kanal_encryption.crypto.ciphers import (
    COMPILED,
    TAG_SIZE,
    Algorithm,
    Cipher,
    DecryptError,
    cipher,
    nonce_start,
    python_cipher,
)
from kanal_encryption.crypto.compression import Codec, compress, decompress

from kanal import api

SUNSCREEN = (
    b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, "
    b"sunscreen would be it."
)
KEY = bytes(range(0x80, 0xA0))
AAD = bytes.fromhex("50515253c0c1c2c3c4c5c6c7")
#: Each test runs with the compiled AEADs (OpenSSL, built with the package) and the Python reference.
MAKERS = pytest.mark.parametrize(
    "make", [pytest.param(cipher, id="compiled"), pytest.param(python_cipher, id="python")]
)
Make = Callable[[Algorithm, bytes | bytearray], Cipher]


def test_the_compiled_aeads_are_built() -> None:
    """The install built ``_aead.c`` (the fast path the benchmarks measure is the one tested)."""
    assert COMPILED


def test_algorithm_ids_and_sizes_are_fixed() -> None:
    # The ids are written in envelopes: changing one makes stored data unreadable.
    assert {a.name: (a.value, a.key_size, a.nonce_size) for a in Algorithm} == {
        "AES128_GCM": (1, 16, 12),
        "AES256_GCM": (2, 32, 12),
        "CHACHA20_POLY1305": (3, 32, 12),
        "XCHACHA20_POLY1305": (4, 32, 24),
    }


@pytest.mark.parametrize("name", ["AES128_GCM", "aes128_gcm", " Aes128-Gcm "])
def test_algorithm_parse_ignores_case(name: str) -> None:
    assert Algorithm.parse(name) is Algorithm.AES128_GCM


def test_algorithm_parse_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown encryption algorithm 'AES128_EAX' \(known: AES128_GCM, "):
        Algorithm.parse("AES128_EAX")


@MAKERS
def test_xchacha20_poly1305_published_vector(make: Make) -> None:
    """draft-irtf-cfrg-xchacha-03, appendix A.3.1."""
    nonce = bytes.fromhex("404142434445464748494a4b4c4d4e4f5051525354555657")
    expected = bytes.fromhex(
        "bd6d179d3e83d43b9576579493c0e939572a1700252bfaccbed2902c21396cbb"
        "731c7f1b0b4aa6440bf3a82f4eda7e39ae64c6708c54c216cb96b72e1213b452"
        "2f8c9ba40db5d945b11b69b982c1bb9e3f3fac2bc369488f76b2383565d3fff9"
        "21f9664c97637da9768812f615c68b13b52e"
        "c0875924c1c7987947deafd8780acf49"  # the tag
    )
    xchacha = make(Algorithm.XCHACHA20_POLY1305, KEY)
    assert xchacha.encrypt(nonce, SUNSCREEN, AAD) == expected
    assert xchacha.decrypt(nonce, expected, AAD) == SUNSCREEN


@MAKERS
def test_chacha20_poly1305_published_vector(make: Make) -> None:
    """RFC 8439, section 2.8.2."""
    nonce = bytes.fromhex("070000004041424344454647")
    sealed = make(Algorithm.CHACHA20_POLY1305, KEY).encrypt(nonce, SUNSCREEN, AAD)
    assert sealed[-TAG_SIZE:].hex() == "1ae10b594f09e26a7e902ecbd0600691"
    assert sealed[:16].hex() == "d31a8d34648e60db7b86afbc53ef7ec2"


@given(
    key=st.binary(min_size=32, max_size=32),
    nonce=st.binary(min_size=24, max_size=24),
    data=st.binary(),
    aad=st.binary(),
)
@MAKERS
def test_xchacha_interoperates_with_pynacl(make: Make, key: bytes, nonce: bytes, data: bytes, aad: bytes) -> None:
    ours = make(Algorithm.XCHACHA20_POLY1305, key)
    sealed = ours.encrypt(nonce, data, aad)
    assert sealed == nacl.bindings.crypto_aead_xchacha20poly1305_ietf_encrypt(data, aad, nonce, key)
    assert nacl.bindings.crypto_aead_xchacha20poly1305_ietf_decrypt(sealed, aad, nonce, key) == data
    assert ours.decrypt(nonce, sealed, aad) == data


@given(
    key=st.binary(min_size=32, max_size=32),
    nonce=st.binary(min_size=12, max_size=12),
    data=st.binary(),
    aad=st.binary(),
)
@MAKERS
def test_chacha_interoperates_with_cryptography_and_pynacl(
    make: Make, key: bytes, nonce: bytes, data: bytes, aad: bytes
) -> None:
    ours = make(Algorithm.CHACHA20_POLY1305, key)
    sealed = ours.encrypt(nonce, data, aad)
    assert sealed == ChaCha20Poly1305(key).encrypt(nonce, data, aad)
    assert sealed == nacl.bindings.crypto_aead_chacha20poly1305_ietf_encrypt(data, aad, nonce, key)
    assert ours.decrypt(nonce, sealed, aad) == data


@pytest.mark.parametrize("algorithm", [Algorithm.AES128_GCM, Algorithm.AES256_GCM])
@MAKERS
def test_aes_gcm_is_cryptographys(make: Make, algorithm: Algorithm) -> None:
    key, nonce = os.urandom(algorithm.key_size), os.urandom(12)
    sealed = make(algorithm, key).encrypt(nonce, b"data", b"aad")
    assert AESGCM(key).decrypt(nonce, sealed, b"aad") == b"data"


@pytest.mark.parametrize("algorithm", list(Algorithm))
@MAKERS
def test_tampering_wrong_key_or_aad_never_decrypts(make: Make, algorithm: Algorithm) -> None:
    key = os.urandom(algorithm.key_size)
    nonce = os.urandom(algorithm.nonce_size)
    ours = make(algorithm, key)
    sealed = ours.encrypt(nonce, b"some data", b"aad")
    for i in range(len(sealed)):
        flipped = bytearray(sealed)
        flipped[i] ^= 0x01
        with pytest.raises(DecryptError):
            ours.decrypt(nonce, bytes(flipped), b"aad")
    with pytest.raises(DecryptError):
        ours.decrypt(nonce, sealed, b"aae")
    with pytest.raises(DecryptError):
        make(algorithm, os.urandom(algorithm.key_size)).decrypt(nonce, sealed, b"aad")
    with pytest.raises(DecryptError):
        ours.decrypt(nonce, sealed[: TAG_SIZE - 1], b"aad")
    with pytest.raises(DecryptError):
        ours.decrypt(nonce[:-1], sealed, b"aad")


@pytest.mark.parametrize("algorithm", list(Algorithm))
@MAKERS
def test_accepts_any_bytes_like_input(make: Make, algorithm: Algorithm) -> None:
    ours = make(algorithm, bytearray(algorithm.key_size))
    nonce = bytes(algorithm.nonce_size)
    sealed = ours.encrypt(nonce, bytearray(b"data"), memoryview(b"aad"))
    assert ours.decrypt(nonce, memoryview(sealed), bytearray(b"aad")) == b"data"
    assert ours.encrypt(nonce, b"", b"") == ours.encrypt(nonce, bytearray(), b"")
    assert ours.decrypt(nonce, ours.encrypt(nonce, b"", b""), b"") == b""
    assert ours.decrypt(bytearray(nonce), sealed, b"aad") == b"data"
    assert ours.encrypt(memoryview(nonce), b"data", b"aad") == sealed


@pytest.mark.parametrize("algorithm", list(Algorithm))
@MAKERS
def test_refuses_a_key_of_the_wrong_size(make: Make, algorithm: Algorithm) -> None:
    with pytest.raises(ValueError, match=f"{algorithm.name} needs a {algorithm.key_size}-byte key, not 24 bytes"):
        make(algorithm, bytes(24))


@MAKERS
def test_sodium_refuses_a_short_nonce_to_encrypt(make: Make) -> None:
    with pytest.raises(ValueError, match="24-byte nonce"):
        make(Algorithm.XCHACHA20_POLY1305, KEY).encrypt(bytes(12), b"data", b"")


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_nonce_start_leaves_room_for_2_to_the_64_seals(algorithm: Algorithm) -> None:
    top = 1 << (8 * algorithm.nonce_size)
    starts = {nonce_start(algorithm) for _ in range(100)}
    assert len(starts) == 100
    assert all(0 <= s <= top - (1 << 64) for s in starts)


def test_codec_ids_are_kafkas() -> None:
    assert (Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD) == (
        api.NONE,
        api.GZIP,
        api.SNAPPY,
        api.LZ4,
        api.ZSTD,
    )
    assert Codec.parse(" Zstd") is Codec.ZSTD
    with pytest.raises(ValueError, match="unknown compression codec 'brotli'"):
        Codec.parse("brotli")


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
@given(data=st.binary(max_size=5000))
def test_compression_round_trip(codec: Codec, data: bytes) -> None:
    packed = compress(codec, data)
    assert type(packed) is bytes
    assert decompress(codec, packed) == data


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_decompress_refuses_garbage(codec: Codec) -> None:
    with pytest.raises(ValueError, match="corrupt"):
        decompress(codec, b"\xff" * 40)


def test_unknown_codec_refused() -> None:
    with pytest.raises(ValueError, match="no compression codec 7"):
        compress(7, b"x")
    with pytest.raises(ValueError, match="no compression codec 0"):
        decompress(0, b"x")


def test_compressed_formats_are_the_plain_ones() -> None:
    import gzip
    import struct

    data = b"a compressible value, " * 20
    assert gzip.decompress(compress(Codec.GZIP, data)) == data
    lz4 = compress(Codec.LZ4, data)
    assert struct.unpack_from("<I", lz4) == (len(data),)  # an LZ4 block after its size
    assert compress(Codec.ZSTD, data)[:4] == b"\x28\xb5\x2f\xfd"  # a zstd frame
    assert decompress(Codec.SNAPPY, compress(Codec.SNAPPY, data)) == data
