"""SCRAM credentials the gateway stores (RFC 5802 §3): salt, iterations, StoredKey, ServerKey.

The password is used once, to derive them, and never kept: a stolen store does not let anyone
log in (the proof needs ClientKey, which StoredKey only hashes). The password is taken as UTF-8
without SASLprep, as Kafka's clients send it. Iterations are bounded as Kafka bounds them (4096 to
16384): fewer makes guessing passwords from a stolen store cheap, more makes each login (and each
failed guess against the gateway) expensive for the gateway.

:class:`ScramCredentials` is what the listener reads on every SCRAM login; the admin API's
``GatewayScramCredential`` kind fills it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from typing import Any

from kanal.protocol.sasl_mechanisms import SCRAM_HASHES, SCRAM_MAX_ITERATIONS, SCRAM_MIN_ITERATIONS, ScramCredential

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
    if not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS:
        raise ValueError(
            f"{mechanism} needs {SCRAM_MIN_ITERATIONS} to {SCRAM_MAX_ITERATIONS} iterations, got {iterations}"
        )
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


def matches(password: str, credential: ScramCredential, mechanism: str) -> bool:
    """Whether ``password`` is the one ``credential`` was derived from (same salt and iterations)."""
    if not password:
        return False
    again = derive(password, mechanism, iterations=credential.iterations, salt=credential.salt)
    return hmac.compare_digest(again.stored_key, credential.stored_key)


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
    if (
        not isinstance(iterations, int)
        or isinstance(iterations, bool)
        or not SCRAM_MIN_ITERATIONS <= iterations <= SCRAM_MAX_ITERATIONS
    ):
        raise ValueError(f"iterations must be an integer from {SCRAM_MIN_ITERATIONS} to {SCRAM_MAX_ITERATIONS}")
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


class ScramCredentials:
    """The SCRAM credentials the admin API applied on this node, by login name, replaced whole on
    each change (one assignment: no trio task sees half a change).

    A SCRAM client sends only a user name, so a login name belongs to one service account: the
    entry also says which virtual cluster that account is in (None: none).
    """

    def __init__(self) -> None:
        self._by_name: dict[str, tuple[str | None, Mapping[str, ScramCredential]]] = {}

    def replace(
        self, entries: Iterable[tuple[str, str | None, Mapping[str, ScramCredential]]]
    ) -> list[tuple[str, str | None, str]]:
        """Makes ``entries`` (name, vCluster, {mechanism: credential}) the whole set. A name given
        twice stays with the first; the others are returned (name, vCluster, reason)."""
        by_name: dict[str, tuple[str | None, Mapping[str, ScramCredential]]] = {}
        refused: list[tuple[str, str | None, str]] = []
        for name, vcluster, credentials in entries:
            if name in by_name:
                owner = by_name[name][0]
                where = f"vCluster {owner}" if owner is not None else "no vCluster"
                refused.append(
                    (name, vcluster, f"the SCRAM user name {name!r} already belongs to the account in {where}")
                )
                continue
            by_name[name] = (vcluster, dict(credentials))
        self._by_name = by_name
        return refused

    def get(self, name: str, mechanism: str) -> tuple[str | None, ScramCredential] | None:
        """(vCluster, credential) of login name ``name`` for ``mechanism``, or None."""
        entry = self._by_name.get(name)
        if entry is None:
            return None
        credential = entry[1].get(mechanism)
        return None if credential is None else (entry[0], credential)

    def __len__(self) -> int:
        return len(self._by_name)
