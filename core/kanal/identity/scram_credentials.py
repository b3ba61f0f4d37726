"""SCRAM credentials the gateway stores (RFC 5802 §3): salt, iterations, StoredKey, ServerKey.

The password is used once, to derive them, and never kept: a stolen store does not let anyone
log in (the proof needs ClientKey, which StoredKey only hashes). The password is taken as UTF-8
without SASLprep, as Kafka's clients send it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from typing import Any

from kanal.protocol.sasl_mechanisms import SCRAM_HASHES, SCRAM_MIN_ITERATIONS, ScramCredential

DEFAULT_ITERATIONS = 4096  # Kafka's default for kafka-configs --add-config SCRAM-SHA-*
SALT_BYTES = 32


def derive(
    password: str,
    mechanism: str = "SCRAM-SHA-512",
    *,
    iterations: int = DEFAULT_ITERATIONS,
    salt: bytes | None = None,
) -> ScramCredential:
    """The stored credential for ``password`` (a fresh random salt unless one is given)."""
    algorithm = _algorithm(mechanism)
    if iterations < SCRAM_MIN_ITERATIONS:
        raise ValueError(f"{mechanism} needs at least {SCRAM_MIN_ITERATIONS} iterations, got {iterations}")
    if not password:
        raise ValueError("the password is empty")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    if not salt:
        raise ValueError("the salt is empty")
    salted = hashlib.pbkdf2_hmac(algorithm, password.encode("utf-8"), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", algorithm).digest()
    return ScramCredential(
        salt=salt,
        iterations=iterations,
        stored_key=hashlib.new(algorithm, client_key).digest(),
        server_key=hmac.new(salted, b"Server Key", algorithm).digest(),
    )


def to_dict(credential: ScramCredential, mechanism: str) -> dict[str, Any]:
    """A JSON-ready form (binary fields in base64), as the admin API stores and shows it."""
    _algorithm(mechanism)
    return {
        "mechanism": mechanism,
        "salt": base64.b64encode(credential.salt).decode(),
        "iterations": credential.iterations,
        "storedKey": base64.b64encode(credential.stored_key).decode(),
        "serverKey": base64.b64encode(credential.server_key).decode(),
    }


def from_dict(data: Any) -> tuple[str, ScramCredential]:
    """(mechanism, credential) from :func:`to_dict`'s form; ValueError naming what is wrong."""
    if not isinstance(data, dict):
        raise ValueError("a SCRAM credential is an object")
    missing = [k for k in ("mechanism", "salt", "iterations", "storedKey", "serverKey") if k not in data]
    if missing:
        raise ValueError(f"a SCRAM credential needs {', '.join(missing)}")
    mechanism = data["mechanism"]
    if not isinstance(mechanism, str):
        raise ValueError("mechanism must be a string")
    algorithm = _algorithm(mechanism)
    iterations = data["iterations"]
    if not isinstance(iterations, int) or isinstance(iterations, bool) or iterations < SCRAM_MIN_ITERATIONS:
        raise ValueError(f"iterations must be an integer of at least {SCRAM_MIN_ITERATIONS}")
    size = hashlib.new(algorithm).digest_size
    salt = _b64(data, "salt")
    stored_key, server_key = _b64(data, "storedKey"), _b64(data, "serverKey")
    if not salt:
        raise ValueError("salt is empty")
    for name, key in (("storedKey", stored_key), ("serverKey", server_key)):
        if len(key) != size:
            raise ValueError(f"{name} must be {size} bytes for {mechanism}, got {len(key)}")
    return mechanism, ScramCredential(salt, iterations, stored_key, server_key)


def _b64(data: dict[str, Any], key: str) -> bytes:
    value = data[key]
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{key} is not valid base64") from None


def _algorithm(mechanism: str) -> str:
    algorithm = SCRAM_HASHES.get(mechanism)
    if algorithm is None:
        raise ValueError(f"unknown SCRAM mechanism {mechanism!r} (expected one of {', '.join(SCRAM_HASHES)})")
    return algorithm
