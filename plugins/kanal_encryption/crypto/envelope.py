"""The envelope: the bytes that replace an encrypted value (base64 text for a JSON field).

Format version 1 (docs/encryption-format.md has the table)::

    magic FC A3 4B | version 01 | algorithm id | flags | u16 len + key reference (UTF-8)
    | u16 len + EDEK | nonce (12 or 24 bytes) | ciphertext + 16-byte tag

Everything before the nonce is the *header*; the AEAD's associated data is ``header + aad`` with the
caller's ``aad`` (topic, record, field path), so changing the algorithm, codec, key reference or EDEK,
or moving the envelope to another record or field, makes it fail to decrypt. The magic is three bytes
no UTF-8 text, JSON or Confluent-framed Avro/Protobuf (first byte 0) starts with, and base64 turns
it into the fixed text prefix ``/KNL``. A clear value that happens to start with it is still only
"encrypted" if it decrypts: :func:`parse` can say "not an envelope" (None) or "malformed"
(:class:`EnvelopeError`), never "authentic".

A :class:`Sealer` (one per DEK) precomputes the header of each codec, so sealing a record is a
counter-made nonce, one AEAD call and two concatenations. An :class:`Opener` (one per DEK) builds the
cipher of each algorithm once.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import struct
from typing import Any, Final, NamedTuple

from .ciphers import TAG_SIZE, Algorithm, Cipher, DecryptError, cipher, compiled_aead, nonce_start
from .compression import Codec, compress, decompress

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "TEXT_MAGIC",
    "Envelope",
    "EnvelopeError",
    "Opener",
    "Sealer",
    "header",
    "is_envelope",
    "is_text_envelope",
    "open_envelope",
    "parse",
    "parse_text",
    "to_text",
]

#: First bytes of every envelope (never valid UTF-8: 0xFC cannot start a character).
MAGIC: Final = b"\xfc\xa3\x4b"
#: How an envelope's base64 text (standard alphabet, padded) starts.
TEXT_MAGIC: Final = "/KNL"
#: The format version this module writes; it reads versions 1 .. FORMAT_VERSION.
FORMAT_VERSION: Final = 1
#: Largest key reference (UTF-8 bytes) and EDEK: their lengths are 16-bit.
MAX_FIELD: Final = 0xFFFF

_FIXED: Final = struct.Struct(">3sBBBH")  # magic, version, algorithm, flags, key reference length
_U16: Final = struct.Struct(">H")
_ALGORITHMS: Final = {a.value: (a, a.nonce_size) for a in Algorithm}
_CODECS: Final = tuple(Codec)
#: The flags byte of version 1: the codec in its low 3 bits, the other bits reserved (zero).
_FLAGS: Final = {c.value: c for c in Codec}
_b64: Final = binascii.b2a_base64


class EnvelopeError(ValueError):
    """Bytes that start with the magic but are not an envelope this gateway reads: truncated,
    inconsistent, or of a newer format version."""


class Envelope(NamedTuple):
    """A parsed envelope. ``header`` is the bytes bound as associated data (everything before the
    nonce); ``ciphertext`` includes the tag. (A named tuple: :func:`parse` makes one in 0.15 us.)"""

    version: int
    algorithm: Algorithm
    codec: Codec
    key_ref: str
    edek: bytes
    nonce: bytes
    ciphertext: bytes
    header: bytes

    def __repr__(self) -> str:
        return (
            f"Envelope(v{self.version}, {self.algorithm.name}, {self.codec.name}, key_ref={self.key_ref!r}, "
            f"edek={len(self.edek)} B, ciphertext={len(self.ciphertext)} B)"
        )


_new_envelope: Final = tuple.__new__


def is_envelope(data: bytes | bytearray | memoryview | None) -> bool:
    """Whether ``data`` starts with the magic (cheap; :func:`parse` says whether it is one)."""
    return data is not None and data[:3] == MAGIC


def parse(data: bytes | bytearray | memoryview) -> Envelope | None:
    """The envelope in ``data``; None when ``data`` does not start with the magic (clear data).

    Raises :class:`EnvelopeError` for bytes with the magic that do not parse: a truncated or
    inconsistent envelope, an unknown algorithm or flag, or a format version this gateway does not
    read (a newer gateway wrote it).

    The header last parsed is remembered: the records of a batch mostly share a DEK, so the next
    envelope usually starts with the same bytes and only its nonce and ciphertext are cut out."""
    if data[:3] != MAGIC:
        return None
    if type(data) is not bytes:
        data = bytes(data)
    global _last
    fields, head, least, nonce_end = _last
    if len(data) >= least and data.startswith(head):
        return _new_envelope(Envelope, (*fields, data[len(head) : nonce_end], data[nonce_end:], head))
    envelope = _parse(data)
    head = envelope.header
    nonce_end = len(head) + envelope.algorithm.nonce_size
    _last = (envelope[:5], head, nonce_end + TAG_SIZE, nonce_end)
    return envelope


def _parse(data: bytes) -> Envelope:
    size = len(data)
    if size < _FIXED.size:
        raise EnvelopeError(f"truncated envelope: {size} bytes, shorter than its fixed header")
    _, version, algorithm_id, flags, ref_len = _FIXED.unpack_from(data)
    if version != 1:
        if version > FORMAT_VERSION:
            raise EnvelopeError(
                f"envelope format version {version} is newer than this gateway reads "
                f"(1 to {FORMAT_VERSION}): upgrade the gateway to decrypt it"
            )
        raise EnvelopeError(f"invalid envelope format version {version}")
    found = _ALGORITHMS.get(algorithm_id)
    if found is None:
        raise EnvelopeError(f"unknown algorithm id {algorithm_id} in a version 1 envelope")
    algorithm, nonce_size = found
    codec = _FLAGS.get(flags)
    if codec is None:
        raise EnvelopeError(f"unknown flags 0x{flags:02x} in a version 1 envelope")
    p = _FIXED.size + ref_len
    if ref_len == 0 or p + 2 > size:
        raise EnvelopeError("truncated or empty key reference in an envelope")
    try:
        key_ref = data[_FIXED.size : p].decode()
    except UnicodeDecodeError:
        raise EnvelopeError("the key reference of an envelope is not UTF-8") from None
    (edek_len,) = _U16.unpack_from(data, p)
    p += 2
    header_end = p + edek_len
    nonce_end = header_end + nonce_size
    if edek_len == 0 or nonce_end + TAG_SIZE > size:
        raise EnvelopeError(f"truncated envelope: {size} bytes, too short for its EDEK, nonce and tag")
    return _new_envelope(
        Envelope,
        (
            1,
            algorithm,
            codec,
            key_ref,
            data[p:header_end],
            data[header_end:nonce_end],
            data[nonce_end:],
            data[:header_end],
        ),
    )


#: The header :func:`parse` saw last, replaced as one tuple (so a reader never sees a mix): the
#: envelope's first five fields, the header, the least size of an envelope with it, and where its
#: nonce ends. The initial one matches nothing (its least size is out of reach).
_last: tuple[tuple[Any, ...], bytes, int, int] = ((), MAGIC, 1 << 62, 0)


def header(algorithm: Algorithm, codec: int, key_ref: str, edek: bytes) -> bytes:
    """The header of a version 1 envelope (validates the key reference and the EDEK)."""
    ref = key_ref.encode()
    if not 0 < len(ref) <= MAX_FIELD:
        raise ValueError(f"a key reference must have 1 to {MAX_FIELD} UTF-8 bytes, not {len(ref)}")
    if not 0 < len(edek) <= MAX_FIELD:
        raise ValueError(f"an EDEK must have 1 to {MAX_FIELD} bytes, not {len(edek)}")
    return b"".join(
        (_FIXED.pack(MAGIC, FORMAT_VERSION, algorithm.value, codec, len(ref)), ref, _U16.pack(len(edek)), bytes(edek))
    )


class Sealer:
    """Seals plaintexts with one DEK into envelopes naming ``key_ref`` and carrying ``edek``.

    Each Sealer has its own nonce counter (see :mod:`.ciphers`), so two Sealers of one DEK are safe;
    ``count`` is the number of seals done. Thread-safe: the counter is one atomic ``next`` (the
    compiled AEAD's, advanced under the GIL)."""

    __slots__ = (
        "_encrypt",
        "_headers",
        "_nonce_size",
        "_nonce_start",
        "_nonces",
        "aead",
        "algorithm",
        "edek",
        "key_ref",
    )

    def __init__(
        self, algorithm: Algorithm, dek: bytes, key_ref: str, edek: bytes, *, first_nonce: int | None = None
    ) -> None:
        """``first_nonce``: where the counter starts (a known-answer test's); random by default."""
        self.algorithm = algorithm
        self.key_ref = key_ref
        self.edek = bytes(edek)
        self._headers = tuple(header(algorithm, codec, key_ref, self.edek) for codec in _CODECS)
        self._nonce_size = algorithm.nonce_size
        self._nonce_start = nonce_start(algorithm) if first_nonce is None else first_nonce
        self._nonces = itertools.count(self._nonce_start)
        #: The compiled AEAD, which keeps the nonce counter itself (None: the Python path below).
        self.aead = compiled_aead(algorithm, dek, self._nonce_start.to_bytes(self._nonce_size))
        self._encrypt = cipher(algorithm, dek).encrypt if self.aead is None else None

    @property
    def text_header(self) -> bytes:
        """The header of an envelope without compression (a JSON field's)."""
        return self._headers[0]

    def seal(self, plaintext: bytes, aad: bytes, codec: int = Codec.NONE) -> bytes:
        """The envelope of ``plaintext`` (compressed first with ``codec``, a Kafka codec id),
        bound to ``aad``."""
        try:
            head = self._headers[codec]
        except IndexError:
            raise ValueError(f"no compression codec {codec} (known: 0 none .. 4 zstd)") from None
        if codec:
            plaintext = compress(codec, plaintext)  # ValueError for a negative codec
        if self.aead is not None:
            return self.aead.seal(head, plaintext, aad)
        nonce = next(self._nonces).to_bytes(self._nonce_size)  # big-endian
        return head + nonce + self._encrypt(nonce, plaintext, head + aad)  # type: ignore[misc]

    def seal_text(self, plaintext: bytes, aad: bytes) -> str:
        """:meth:`seal` (no compression) as the text of a JSON field: :func:`to_text` of it."""
        head = self._headers[0]
        if self.aead is not None:
            return self.aead.seal_text(head, plaintext, aad)
        nonce = next(self._nonces).to_bytes(self._nonce_size)
        return _b64(head + nonce + self._encrypt(nonce, plaintext, head + aad), newline=False).decode("ascii")  # type: ignore[misc]

    @property
    def count(self) -> int:
        """Seals done so far (read without advancing the counter: ``repr`` is ``count(N)``)."""
        if self.aead is not None:
            return self.aead.count
        return int(repr(self._nonces)[6:-1]) - self._nonce_start

    def __repr__(self) -> str:
        return f"Sealer({self.algorithm.name}, key_ref={self.key_ref!r}, edek={len(self.edek)} B)"


class Opener:
    """Opens envelopes whose EDEK unwraps to ``dek``, whatever their algorithm (the cipher of each
    is built on first use; an algorithm whose key size ``dek`` does not have never decrypts)."""

    __slots__ = ("_ciphers", "dek")

    def __init__(self, dek: bytes) -> None:
        self.dek = bytes(dek)
        self._ciphers: dict[Algorithm, Cipher] = {}

    def open(self, envelope: Envelope, aad: bytes) -> bytes:
        """The plaintext sealed in ``envelope`` with associated data ``aad``, decompressed.
        Raises :class:`DecryptError`: a wrong key, a tampered envelope, another ``aad``."""
        fn = self._ciphers.get(envelope.algorithm)
        if fn is None:
            fn = self._cipher(envelope.algorithm)
        plaintext = fn.decrypt(envelope.nonce, envelope.ciphertext, envelope.header + aad)
        if envelope.codec:
            try:
                return decompress(envelope.codec, plaintext)
            except ValueError as exc:
                raise DecryptError(f"the envelope authenticated but does not decompress: {exc}") from None
        return plaintext

    def cipher_for(self, algorithm: Algorithm) -> Cipher:
        """The AEAD of this DEK for ``algorithm`` (for a caller that cuts envelopes sharing one
        header itself: ``decrypt(nonce, ciphertext, header + aad)``). Raises DecryptError."""
        return self._ciphers.get(algorithm) or self._cipher(algorithm)

    def _cipher(self, algorithm: Algorithm) -> Cipher:
        if len(self.dek) != algorithm.key_size:
            raise DecryptError(
                f"the DEK has {len(self.dek)} bytes, not the {algorithm.key_size} of the envelope's {algorithm.name}"
            )
        made = self._ciphers[algorithm] = cipher(algorithm, self.dek)
        return made

    def __repr__(self) -> str:
        return f"Opener({len(self.dek) * 8}-bit DEK)"


def open_envelope(envelope: Envelope, dek: bytes, aad: bytes) -> bytes:
    """One-off :meth:`Opener.open` (builds the cipher: keep an :class:`Opener` per DEK instead)."""
    return Opener(dek).open(envelope, aad)


def to_text(envelope: bytes) -> str:
    """An envelope as the text of a JSON field: standard base64, starting with :data:`TEXT_MAGIC`."""
    return _b64(envelope, newline=False).decode("ascii")


def is_text_envelope(text: object) -> bool:
    """Whether ``text`` is a string starting with :data:`TEXT_MAGIC` (cheap)."""
    return isinstance(text, str) and text.startswith(TEXT_MAGIC)


def parse_text(text: str) -> Envelope | None:
    """The envelope in a JSON field's text; None when it does not start with :data:`TEXT_MAGIC`.
    Raises :class:`EnvelopeError` when it does but is not valid base64 or not an envelope."""
    if not text.startswith(TEXT_MAGIC):
        return None
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise EnvelopeError("a text envelope that is not valid base64") from None
    return parse(data)
