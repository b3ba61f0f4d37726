"""The AEAD algorithms a DEK can be used with, and one key's cipher built once for the hot path.

Each :class:`Algorithm` has a one-byte id (written in the envelope), a key size and a nonce size;
every one has a 16-byte tag. :func:`cipher` builds a :class:`Cipher` once per DEK, so encrypting a
record is one call into C:

- AES-GCM and ChaCha20-Poly1305, compiled (``_aead.c``, built with the package when OpenSSL's
  headers are there): OpenSSL's AEADs with the key schedule set up once, about 0.25 us a call for a
  short field where ``cryptography``'s ``AESGCM.encrypt`` costs 0.5 us (argument checks and a
  cipher context made per call). The module also seals a batch's JSON fields in one call
  (``seal_json_fields``, used by :mod:`..encrypt`).
- AES-GCM otherwise: ``cryptography``'s ``AESGCM`` (OpenSSL, AES-NI): its bound ``encrypt`` as is.
- ChaCha20-Poly1305 otherwise, and XChaCha20-Poly1305 (which OpenSSL lacks): libsodium (the copy
  ``pynacl`` ships), called directly through its cffi library. ``cryptography``'s
  ChaCha20Poly1305 costs about 1.9 us a call even for 20 bytes, libsodium about 1.2 us, and
  pynacl's public wrappers add about 3 us of argument checks (formatted messages built on every
  call); the construction is RFC 8439's either way, and the tests check every path against
  ``cryptography`` and pynacl's public functions.

Nonces: a counter, never a random draw per record (``os.urandom`` is a syscall, about 0.4 us, a
counter about 0.1 us). Each user of a key (a Sealer) starts at a random point of the nonce space
(:func:`nonce_start`: 96 bits, or XChaCha's 192), at least 2**64 below its top, and counts up by one,
so one user never repeats a nonce, and two users of the same DEK (two processes, a sealer rebuilt)
overlap only with probability about n / 2**96 for n seals.
"""

from __future__ import annotations

import enum
import secrets
from collections.abc import Callable
from typing import Any, Final

import nacl.bindings  # noqa: F401  (imported for its side effect: sodium_init)
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from nacl._sodium import ffi, lib

try:
    from . import _aead as _COMPILED
    from ._aead import Aead, open_json_fields, seal_json_fields
except ImportError:  # built without a C compiler or OpenSSL's headers: cryptography and libsodium
    _COMPILED = None  # type: ignore[assignment]
    Aead = Any  # type: ignore[misc,assignment]
    seal_json_fields = open_json_fields = None  # type: ignore[assignment]

#: Whether the compiled AEADs (and field sealing) are built.
COMPILED: Final = _COMPILED is not None

__all__ = [
    "COMPILED",
    "TAG_SIZE",
    "Aead",
    "Algorithm",
    "Cipher",
    "DecryptError",
    "cipher",
    "compiled_aead",
    "nonce_start",
    "open_json_fields",
    "python_cipher",
    "seal_json_fields",
]

#: Every algorithm's authentication tag, appended to the ciphertext.
TAG_SIZE: Final = 16

BytesLike = bytes | bytearray | memoryview
#: ``(nonce, data, aad) -> bytes``: any bytes-like arguments (bytes is the fast path).
Encrypt = Callable[[BytesLike, BytesLike, BytesLike], bytes]


class DecryptError(Exception):
    """The ciphertext does not authenticate under this key, nonce and associated data (a wrong key,
    a tampered byte, another record's AAD), or its decompression failed. Nothing is returned."""


class Algorithm(enum.IntEnum):
    """An AEAD algorithm; the value is its id in the envelope (never reuse a retired one)."""

    AES128_GCM = 1
    AES256_GCM = 2
    CHACHA20_POLY1305 = 3
    XCHACHA20_POLY1305 = 4

    @classmethod
    def parse(cls, name: str) -> Algorithm:
        """The algorithm called ``name`` (any case, ``-`` for ``_`` accepted); ValueError otherwise."""
        try:
            return cls[name.strip().upper().replace("-", "_")]
        except KeyError:
            known = ", ".join(a.name for a in cls)
            raise ValueError(f"unknown encryption algorithm {name!r} (known: {known})") from None

    @property
    def key_size(self) -> int:
        """Bytes of a DEK for this algorithm."""
        return _KEY_SIZES[self]

    @property
    def nonce_size(self) -> int:
        """Bytes of a nonce (written in each envelope)."""
        return _NONCE_SIZES[self]


_KEY_SIZES: Final = {
    Algorithm.AES128_GCM: 16,
    Algorithm.AES256_GCM: 32,
    Algorithm.CHACHA20_POLY1305: 32,
    Algorithm.XCHACHA20_POLY1305: 32,
}
_NONCE_SIZES: Final = {
    Algorithm.AES128_GCM: 12,
    Algorithm.AES256_GCM: 12,
    Algorithm.CHACHA20_POLY1305: 12,
    Algorithm.XCHACHA20_POLY1305: 24,
}


class Cipher:
    """One key's AEAD: ``encrypt(nonce, plaintext, aad) -> ciphertext + tag`` and
    ``decrypt(nonce, ciphertext + tag, aad) -> plaintext`` (raises :class:`DecryptError`).

    Both are plain callables stored on the object (no method binding on each call)."""

    __slots__ = ("aead", "algorithm", "decrypt", "encrypt")

    def __init__(self, algorithm: Algorithm, encrypt: Encrypt, decrypt: Encrypt, aead: Aead | None = None) -> None:
        self.algorithm = algorithm
        self.encrypt = encrypt
        self.decrypt = decrypt
        #: The compiled AEAD behind both (what the compiled field pass opens with), if compiled.
        self.aead = aead


def cipher(algorithm: Algorithm, key: BytesLike) -> Cipher:
    """The cipher of ``key`` (exactly ``algorithm.key_size`` bytes, else ValueError)."""
    aead = compiled_aead(algorithm, bytes(key), bytes(12))
    if aead is not None:
        return Cipher(algorithm, aead.encrypt, aead.decrypt, aead)
    return python_cipher(algorithm, key)


def python_cipher(algorithm: Algorithm, key: BytesLike) -> Cipher:
    """:func:`cipher` without the compiled module (``cryptography`` and libsodium): the reference."""
    raw = _key(algorithm, key)
    if algorithm is Algorithm.AES128_GCM or algorithm is Algorithm.AES256_GCM:
        return _aes_gcm(algorithm, raw)
    if algorithm is Algorithm.CHACHA20_POLY1305:
        return _sodium(
            algorithm, raw, lib.crypto_aead_chacha20poly1305_ietf_encrypt, lib.crypto_aead_chacha20poly1305_ietf_decrypt
        )
    return _sodium(
        algorithm, raw, lib.crypto_aead_xchacha20poly1305_ietf_encrypt, lib.crypto_aead_xchacha20poly1305_ietf_decrypt
    )


def _key(algorithm: Algorithm, key: BytesLike) -> bytes:
    raw = bytes(key)
    if len(raw) != algorithm.key_size:
        raise ValueError(f"{algorithm.name} needs a {algorithm.key_size}-byte key, not {len(raw)} bytes")
    return raw


def compiled_aead(algorithm: Algorithm, key: bytes, first_nonce: bytes) -> Aead | None:
    """The compiled AEAD of ``key``, counting nonces up from ``first_nonce`` (12 bytes) when it
    seals; None when the module is not built or has no such algorithm (XChaCha20-Poly1305)."""
    raw = _key(algorithm, key)
    if _COMPILED is None or algorithm is Algorithm.XCHACHA20_POLY1305:
        return None
    return _COMPILED.Aead(algorithm.value, raw, first_nonce, DecryptError)


def nonce_start(algorithm: Algorithm) -> int:
    """A random first nonce (as a big-endian integer) for one user of a key, at least 2**64 below
    the top of the nonce space so counting up from it never wraps (see the module's docstring)."""
    return secrets.randbelow((1 << (8 * algorithm.nonce_size)) - (1 << 64))


def _aes_gcm(algorithm: Algorithm, key: bytes) -> Cipher:
    aead = AESGCM(key)
    decrypt_raw = aead.decrypt

    def decrypt(nonce: BytesLike, data: BytesLike, aad: BytesLike) -> bytes:
        try:
            return decrypt_raw(nonce, data, aad)
        except InvalidTag:
            raise DecryptError(f"{algorithm.name}: the data does not authenticate") from None

    return Cipher(algorithm, aead.encrypt, decrypt)


def _sodium(algorithm: Algorithm, key: bytes, encrypt_c: Callable[..., int], decrypt_c: Callable[..., int]) -> Cipher:
    """Closures over libsodium's combined-mode AEAD calls. The C side reads ``nonce_size`` bytes of
    the nonce and ``key_size`` of the key, so both lengths are checked here (the key once)."""
    nonce_size = algorithm.nonce_size
    new = ffi.new
    buffer = ffi.buffer
    null = ffi.NULL
    name = algorithm.name

    def encrypt(nonce: BytesLike, data: BytesLike, aad: BytesLike) -> bytes:
        if len(nonce) != nonce_size:
            raise ValueError(f"{name} needs a {nonce_size}-byte nonce")
        if type(data) is not bytes or type(aad) is not bytes or type(nonce) is not bytes:
            nonce, data, aad = bytes(nonce), bytes(data), bytes(aad)  # cffi passes bytes as pointers
        size = len(data)
        out = new("unsigned char[]", size + TAG_SIZE)
        encrypt_c(out, null, data, size, aad, len(aad), null, nonce, key)
        made: bytes = buffer(out)[:]
        return made

    def decrypt(nonce: BytesLike, data: BytesLike, aad: BytesLike) -> bytes:
        size = len(data) - TAG_SIZE
        if size < 0 or len(nonce) != nonce_size:
            raise DecryptError(f"{name}: the data is shorter than a tag, or the nonce has the wrong size")
        if type(data) is not bytes or type(aad) is not bytes or type(nonce) is not bytes:
            nonce, data, aad = bytes(nonce), bytes(data), bytes(aad)
        out = new("unsigned char[]", size or 1)
        if decrypt_c(out, null, null, data, len(data), aad, len(aad), nonce, key) != 0:
            raise DecryptError(f"{name}: the data does not authenticate")
        opened: bytes = buffer(out, size)[:]
        return opened

    return Cipher(algorithm, encrypt, decrypt)
