"""The encryption plugin's crypto core: algorithms, the envelope format, and the DEK manager.

Encrypting a value: ``sealer = deks.sealer_now(kms, key_id, alg, n, key_ref=ref) or await
deks.sealer(kms, key_id, alg, n, key_ref=ref)``, then ``sealer.seal(value, aad)`` per record.
Decrypting: ``env = parse(value)`` (None: clear data), find the KMS and key id named by
``env.key_ref``, ``opener = deks.opener_now(kms, key_id, env.edek) or await deks.opener(...)``,
then ``opener.open(env, aad)``. The format is described in docs/encryption-format.md.
"""

from .ciphers import TAG_SIZE, Algorithm, Cipher, DecryptError, cipher
from .compression import Codec
from .deks import DekManager, DekStats, KmsObserver
from .envelope import (
    FORMAT_VERSION,
    MAGIC,
    TEXT_MAGIC,
    Envelope,
    EnvelopeError,
    Opener,
    Sealer,
    is_envelope,
    is_text_envelope,
    open_envelope,
    parse,
    parse_text,
    to_text,
)

__all__ = [
    "FORMAT_VERSION",
    "MAGIC",
    "TAG_SIZE",
    "TEXT_MAGIC",
    "Algorithm",
    "Cipher",
    "Codec",
    "DecryptError",
    "DekManager",
    "DekStats",
    "Envelope",
    "EnvelopeError",
    "KmsObserver",
    "Opener",
    "Sealer",
    "cipher",
    "is_envelope",
    "is_text_envelope",
    "open_envelope",
    "parse",
    "parse_text",
    "to_text",
]
