"""SASL client mechanisms for the upstream connection (PLAIN, SCRAM-SHA-256/512), sans-I/O.

Each mechanism is a small state machine: ``start()`` gives the first client message,
``step(server_message)`` the next one (or None when done). The I/O layer wraps each message in
SaslAuthenticate requests.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import unicodedata


class SaslError(ValueError):
    """Authentication failed or the server answered out of protocol."""


class PlainMechanism:
    """RFC 4616: one message, authzid empty."""

    def __init__(self, username: str, password: str) -> None:
        self._message = b"\x00" + username.encode() + b"\x00" + password.encode()

    def start(self) -> bytes:
        return self._message

    def step(self, server_message: bytes) -> bytes | None:
        return None


def _saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _normalize(password: str) -> bytes:
    return unicodedata.normalize("NFKC", password).encode()


class ScramMechanism:
    """RFC 5802 SCRAM (no channel binding), as Kafka speaks it."""

    def __init__(self, mechanism: str, username: str, password: str, nonce: str | None = None) -> None:
        algorithm = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}.get(mechanism)
        if algorithm is None:
            raise SaslError(f"unsupported SCRAM mechanism {mechanism}")
        self._hash = algorithm
        self._password = _normalize(password)
        self._nonce = nonce or secrets.token_urlsafe(24)
        self._first_bare = f"n={_saslname(username)},r={self._nonce}"
        self._server_signature: bytes | None = None
        self._done = False

    def _hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self._hash).digest()

    def start(self) -> bytes:
        return ("n,," + self._first_bare).encode()

    def step(self, server_message: bytes) -> bytes | None:
        if self._server_signature is None:
            return self._client_final(server_message)
        self._verify(server_message)
        return None

    def _client_final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        fields = dict(part.split("=", 1) for part in text.split(",") if "=" in part)
        if "e" in fields:
            raise SaslError(f"server refused: {fields['e']}")
        nonce, salt, iterations = fields.get("r", ""), fields.get("s"), fields.get("i")
        if not nonce.startswith(self._nonce) or salt is None or iterations is None:
            raise SaslError("invalid SCRAM server-first message")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password, base64.b64decode(salt), int(iterations))
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        final_without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._first_bare},{text},{final_without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{final_without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _verify(self, server_final: bytes) -> None:
        fields = dict(part.split("=", 1) for part in server_final.decode().split(",") if "=" in part)
        if "e" in fields:
            raise SaslError(f"server refused: {fields['e']}")
        expected = self._server_signature or b""
        if not hmac.compare_digest(base64.b64decode(fields.get("v", "")), expected):
            raise SaslError("the server's SCRAM signature does not verify")
        self._done = True


def mechanism_for(name: str, username: str, password: str) -> PlainMechanism | ScramMechanism:
    if name == "PLAIN":
        return PlainMechanism(username, password)
    return ScramMechanism(name, username, password)
