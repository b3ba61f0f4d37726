"""The envelope: round trips, tampering, versions, and telling envelopes from clear data."""

from __future__ import annotations

import base64
import json
import os
import struct

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given
from hypothesis import strategies as st
from kanal_encryption.crypto import (
    FORMAT_VERSION,
    MAGIC,
    TEXT_MAGIC,
    Algorithm,
    Codec,
    DecryptError,
    Envelope,
    EnvelopeError,
    Opener,
    Sealer,
    cipher,
    is_envelope,
    is_text_envelope,
    open_envelope,
    parse,
    parse_text,
    to_text,
)
from kanal_encryption.crypto.envelope import header

KEY_REF = "vault-kms://vault:8200/transit/keys/orders"
EDEK = b"vault:v1:" + b"w" * 64

key_refs = st.text(st.characters(codec="utf-8"), min_size=1, max_size=80)
edeks = st.binary(min_size=1, max_size=600)


def sealer(algorithm: Algorithm = Algorithm.AES128_GCM, key_ref: str = KEY_REF, edek: bytes = EDEK) -> Sealer:
    return Sealer(algorithm, os.urandom(algorithm.key_size), key_ref, edek)


def sealed_pair(algorithm: Algorithm, key_ref: str = KEY_REF, edek: bytes = EDEK) -> tuple[Sealer, Opener]:
    """A sealer and an opener of one fresh DEK."""
    dek = os.urandom(algorithm.key_size)
    return Sealer(algorithm, dek, key_ref, edek), Opener(dek)


@given(
    algorithm=st.sampled_from(Algorithm),
    codec=st.sampled_from(Codec),
    plaintext=st.binary(max_size=3000),
    key_ref=key_refs,
    edek=edeks,
    aad=st.binary(max_size=200),
)
def test_round_trip(
    algorithm: Algorithm, codec: Codec, plaintext: bytes, key_ref: str, edek: bytes, aad: bytes
) -> None:
    seal, opener = sealed_pair(algorithm, key_ref=key_ref, edek=edek)
    data = seal.seal(plaintext, aad, codec)
    assert is_envelope(data)
    envelope = parse(data)
    assert envelope is not None
    assert (envelope.version, envelope.algorithm, envelope.codec) == (FORMAT_VERSION, algorithm, codec)
    assert (envelope.key_ref, envelope.edek) == (key_ref, edek)
    assert len(envelope.nonce) == algorithm.nonce_size
    assert data == envelope.header + envelope.nonce + envelope.ciphertext
    assert opener.open(envelope, aad) == plaintext
    text = to_text(data)
    assert text.startswith(TEXT_MAGIC) and is_text_envelope(text)
    again = parse_text(text)
    assert again is not None and opener.open(again, aad) == plaintext


def test_layout_is_fixed() -> None:
    """A known answer: this exact envelope must stay readable by every later version."""
    seal = Sealer(
        Algorithm.AES128_GCM,
        bytes(range(16)),
        "conn:MYVAULT/orders",
        b"vault:v1:abc",
        first_nonce=0x0102030405060708090A0B0C,  # a fixed nonce, for the known answer only
    )
    data = seal.seal(b'{"card":"4111"}', b"orders/value")
    expected = bytes.fromhex(
        "fca34b"
        "01"
        "01"
        "00"  # magic, version 1, AES128_GCM, flags (no compression)
        "0013"
        "636f6e6e3a4d595641554c542f6f7264657273"  # key reference, 19 bytes
        "000c"
        "7661756c743a76313a616263"  # EDEK, 12 bytes
        "0102030405060708090a0b0c"  # nonce
        "7d270b4741917dff1a683c749cfa10b7cfe78e410569bb1d72f0bd5c113389"  # ciphertext and tag
    )
    assert data == expected
    head = expected[:41]
    assert (
        AESGCM(bytes(range(16))).decrypt(expected[41:53], expected[53:], head + b"orders/value") == b'{"card":"4111"}'
    )
    assert to_text(data).startswith("/KNLAQEA")
    envelope = parse(expected)
    assert envelope is not None and envelope.header == head
    assert open_envelope(envelope, bytes(range(16)), b"orders/value") == b'{"card":"4111"}'


@pytest.mark.parametrize("algorithm", list(Algorithm))
@pytest.mark.parametrize("codec", [Codec.NONE, Codec.ZSTD])
def test_flipping_any_byte_never_decrypts(algorithm: Algorithm, codec: Codec) -> None:
    seal, opener = sealed_pair(algorithm, key_ref="conn:VAULT/k", edek=b"edek-bytes")
    data = seal.seal(b"a secret value " * 4, b"topic/0/value", codec)
    for i in range(len(data)):
        for mask in (0x01, 0x80, 0xFF):
            flipped = bytearray(data)
            flipped[i] ^= mask
            assert_never_opens(opener, bytes(flipped), b"topic/0/value")


@given(data=st.data(), algorithm=st.sampled_from(Algorithm), codec=st.sampled_from(Codec))
def test_random_single_byte_changes_never_decrypt(data: st.DataObject, algorithm: Algorithm, codec: Codec) -> None:
    seal, opener = sealed_pair(algorithm, key_ref=data.draw(key_refs), edek=data.draw(edeks))
    sealed = seal.seal(data.draw(st.binary(max_size=300)), b"aad", codec)
    i = data.draw(st.integers(0, len(sealed) - 1))
    changed = bytearray(sealed)
    changed[i] ^= data.draw(st.integers(1, 255))
    assert_never_opens(opener, bytes(changed), b"aad")


def assert_never_opens(opener: Opener, data: bytes, aad: bytes) -> None:
    """``data`` is not an envelope, or a malformed one, or one that does not decrypt."""
    try:
        envelope = parse(data)
    except EnvelopeError:
        return
    if envelope is None:
        return
    with pytest.raises(DecryptError):
        opener.open(envelope, aad)


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_truncations_never_decrypt(algorithm: Algorithm) -> None:
    seal, opener = sealed_pair(algorithm, key_ref=KEY_REF, edek=EDEK)
    data = seal.seal(b"value", b"aad")
    for end in range(len(data)):
        assert_never_opens(opener, data[:end], b"aad")
        assert_never_opens(opener, data + data[:end] if end else data + b"x", b"aad")


@given(algorithm=st.sampled_from(Algorithm), aad=st.binary(max_size=40), other=st.binary(max_size=40))
def test_another_aad_never_decrypts(algorithm: Algorithm, aad: bytes, other: bytes) -> None:
    if aad == other:
        return
    seal, opener = sealed_pair(algorithm, key_ref=KEY_REF, edek=EDEK)
    envelope = parse(seal.seal(b"value", aad))
    assert envelope is not None
    with pytest.raises(DecryptError):
        opener.open(envelope, other)


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_another_dek_never_decrypts(algorithm: Algorithm) -> None:
    envelope = parse(sealer(algorithm).seal(b"value", b"aad"))
    assert envelope is not None
    with pytest.raises(DecryptError):
        open_envelope(envelope, os.urandom(algorithm.key_size), b"aad")
    with pytest.raises(DecryptError, match="not the"):
        open_envelope(envelope, os.urandom(24), b"aad")


def test_algorithm_swapped_in_the_header_never_decrypts() -> None:
    # AES256_GCM, ChaCha20 and XChaCha20 share a key size: the header is in the AAD.
    seal, opener = sealed_pair(Algorithm.AES256_GCM, key_ref=KEY_REF, edek=EDEK)
    data = bytearray(seal.seal(b"value", b"aad"))
    data[4] = Algorithm.CHACHA20_POLY1305
    envelope = parse(bytes(data))
    assert envelope is not None and envelope.algorithm is Algorithm.CHACHA20_POLY1305
    with pytest.raises(DecryptError):
        opener.open(envelope, b"aad")


def test_authentic_but_undecompressable_is_a_decrypt_error() -> None:
    dek = os.urandom(16)
    head = header(Algorithm.AES128_GCM, Codec.GZIP, KEY_REF, EDEK)
    nonce = bytes(12)
    data = head + nonce + cipher(Algorithm.AES128_GCM, dek).encrypt(nonce, b"not gzip", head + b"aad")
    envelope = parse(data)
    assert envelope is not None and envelope.codec is Codec.GZIP
    with pytest.raises(DecryptError, match="does not decompress"):
        Opener(dek).open(envelope, b"aad")


def test_newer_version_refused_clearly() -> None:
    data = bytearray(sealer().seal(b"value", b"aad"))
    data[3] = FORMAT_VERSION + 1
    with pytest.raises(EnvelopeError, match=r"format version 2 is newer than this gateway reads \(1 to 1\): upgrade"):
        parse(bytes(data))
    data[3] = 0
    with pytest.raises(EnvelopeError, match="invalid envelope format version 0"):
        parse(bytes(data))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d[:7], "truncated envelope: 7 bytes"),
        (lambda d: d[:4] + b"\x09" + d[5:], "unknown algorithm id 9"),
        (lambda d: d[:5] + b"\x08" + d[6:], r"unknown flags 0x08"),
        (lambda d: d[:5] + b"\x05" + d[6:], r"unknown flags 0x05"),
        (lambda d: d[:6] + b"\x00\x00" + d[8:], "empty key reference"),
        (lambda d: d[:6] + b"\xff\xff" + d[8:], "truncated or empty key reference"),
        (lambda d: d[:8] + b"\xff" + d[9:], "not UTF-8"),
        (lambda d: d[:-20], "too short for its EDEK, nonce and tag"),
    ],
)
def test_malformed_envelopes_say_why(change: object, message: str) -> None:
    data = sealer(key_ref="k" * 5, edek=b"e" * 5).seal(b"", b"aad")
    with pytest.raises(EnvelopeError, match=message):
        parse(change(data))  # type: ignore[operator]


def test_empty_edek_refused() -> None:
    data = sealer(key_ref="k", edek=b"e").seal(b"value", b"aad")
    data = data[:9] + b"\x00\x00" + data[12:]
    with pytest.raises(EnvelopeError, match="too short for its EDEK"):
        parse(data)


CLEAR = [
    b"",
    b"{",
    b'{"card": "4111"}',
    b"[1, 2]",
    b'"text"',
    b"null",
    b"\x00\x00\x00\x00\x01\x02hello",  # Confluent framing: magic byte 0, schema id
    b"\x1f\x8b\x08\x00",  # gzip
    "caf\u00e9 \u2603".encode(),
    "\ufeffwith a BOM".encode(),
    b"\xff\xfeu\x00t\x00f\x00",  # UTF-16 with a BOM
    MAGIC[:2],
]


@pytest.mark.parametrize("value", CLEAR)
def test_clear_values_are_not_envelopes(value: bytes) -> None:
    assert parse(value) is None
    assert not is_envelope(value)


def test_none_is_not_an_envelope() -> None:
    assert not is_envelope(None)


@given(st.text())
def test_no_utf8_text_starts_with_the_magic(text: str) -> None:
    data = text.encode("utf-8", "surrogatepass")
    assert parse(data) is None
    assert parse(json.dumps(text).encode()) is None


@given(st.binary(max_size=64).filter(lambda b: not b.startswith(MAGIC)))
def test_bytes_without_the_magic_are_clear(data: bytes) -> None:
    assert parse(data) is None


@given(st.binary(max_size=200))
def test_bytes_with_the_magic_parse_or_are_refused(rest: bytes) -> None:
    try:
        envelope = parse(MAGIC + rest)
    except EnvelopeError:
        return
    assert isinstance(envelope, Envelope)


def test_parse_accepts_bytes_like() -> None:
    data = sealer().seal(b"value", b"aad")
    for view in (bytearray(data), memoryview(data)):
        envelope = parse(view)
        assert envelope is not None and type(envelope.ciphertext) is bytes and envelope.key_ref == KEY_REF
    assert is_envelope(memoryview(data)) and is_envelope(bytearray(data))


@pytest.mark.parametrize("algorithm", list(Algorithm))
def test_text_envelopes(algorithm: Algorithm) -> None:
    seal, opener = sealed_pair(algorithm, key_ref=KEY_REF, edek=EDEK)
    for text in (to_text(seal.seal(b"4111", b"card")), seal.seal_text(b"4111", b"card")):
        assert text.startswith(TEXT_MAGIC) and text.isascii()
        envelope = parse_text(text)
        assert envelope is not None and opener.open(envelope, b"card") == b"4111"
    assert seal.count == 2
    assert base64.b64decode(TEXT_MAGIC) == MAGIC
    assert parse_text("4111 1111") is None
    assert not is_text_envelope(b"/KNL") and not is_text_envelope(42) and not is_text_envelope("hello")
    with pytest.raises(EnvelopeError, match="not valid base64"):
        parse_text(TEXT_MAGIC + "!!")


def test_sealer_counts_and_never_repeats_a_nonce() -> None:
    seal = sealer(Algorithm.XCHACHA20_POLY1305)
    assert seal.count == 0
    seen = set()
    for _ in range(1000):
        envelope = parse(seal.seal(b"v", b""))
        assert envelope is not None
        seen.add(envelope.nonce)
    assert len(seen) == 1000
    assert seal.count == 1000
    assert seal.count == 1000  # reading it does not advance it


def test_two_sealers_of_one_dek_start_apart() -> None:
    dek = os.urandom(16)
    one, two = (Sealer(Algorithm.AES128_GCM, dek, KEY_REF, EDEK) for _ in range(2))
    first = parse(one.seal(b"v", b""))
    second = parse(two.seal(b"v", b""))
    assert first is not None and second is not None
    assert first.nonce != second.nonce


def test_sealer_nonces_count_up_big_endian() -> None:
    seal = sealer()
    nonces = []
    for _ in range(3):
        envelope = parse(seal.seal(b"v", b""))
        assert envelope is not None
        nonces.append(int.from_bytes(envelope.nonce, "big"))
    assert nonces[1] == nonces[0] + 1 and nonces[2] == nonces[0] + 2


@pytest.mark.parametrize("codec", [-1, 5, 8])
def test_sealer_refuses_unknown_codecs(codec: int) -> None:
    with pytest.raises(ValueError, match=f"no compression codec {codec}"):
        sealer().seal(b"v", b"", codec)


def test_sealer_accepts_kafka_codec_ints() -> None:
    seal, opener = sealed_pair(Algorithm.AES128_GCM, key_ref=KEY_REF, edek=EDEK)
    envelope = parse(seal.seal(b"x" * 1000, b"", 4))
    assert envelope is not None and envelope.codec is Codec.ZSTD and len(envelope.ciphertext) < 100
    assert opener.open(envelope, b"") == b"x" * 1000


@pytest.mark.parametrize(
    ("key_ref", "edek", "message"),
    [
        ("", EDEK, "key reference must have 1 to 65535 UTF-8 bytes, not 0"),
        ("\u00e9" * 40000, EDEK, "not 80000"),
        (KEY_REF, b"", "an EDEK must have 1 to 65535 bytes, not 0"),
        (KEY_REF, bytes(65536), "not 65536"),
    ],
)
def test_sealer_refuses_fields_the_header_cannot_hold(key_ref: str, edek: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sealer(Algorithm.AES128_GCM, bytes(16), key_ref, edek)


def test_sealer_refuses_a_dek_of_the_wrong_size() -> None:
    with pytest.raises(ValueError, match="AES256_GCM needs a 32-byte key"):
        Sealer(Algorithm.AES256_GCM, bytes(16), KEY_REF, EDEK)


def test_largest_fields_fit() -> None:
    key_ref, edek = "r" * 65535, b"e" * 65535
    seal, opener = sealed_pair(Algorithm.AES128_GCM, key_ref=key_ref, edek=edek)
    envelope = parse(seal.seal(b"v", b""))
    assert envelope is not None and envelope.key_ref == key_ref and envelope.edek == edek
    assert struct.unpack_from(">H", envelope.header, 6) == (65535,)
    assert opener.open(envelope, b"") == b"v"


def test_reprs_hold_no_key_material() -> None:
    dek = bytes(range(16))
    seal = Sealer(Algorithm.AES128_GCM, dek, KEY_REF, EDEK)
    envelope = parse(seal.seal(b"secret", b""))
    for text in (repr(seal), repr(Opener(dek)), repr(envelope)):
        assert dek.hex() not in text and "secret" not in text


def test_parse_remembers_headers_without_mixing_them() -> None:
    one, opener_one = sealed_pair(Algorithm.AES128_GCM, key_ref="conn:A/k", edek=b"edek-one")
    two, opener_two = sealed_pair(Algorithm.XCHACHA20_POLY1305, key_ref="conn:B/k", edek=b"edek-two")
    for i in range(6):
        seal, opener, ref = (one, opener_one, "conn:A/k") if i % 3 else (two, opener_two, "conn:B/k")
        data = seal.seal(b"value %d" % i, b"aad")
        for _ in range(2):  # the second parse takes the remembered header
            envelope = parse(data)
            assert envelope is not None and envelope.key_ref == ref
            assert opener.open(envelope, b"aad") == b"value %d" % i
        assert envelope is not None
        with pytest.raises(EnvelopeError, match="truncated"):
            parse(data[: len(envelope.header) + len(envelope.nonce) + 15])
