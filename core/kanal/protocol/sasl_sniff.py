"""Following a client's SASL exchange with the broker (KAFKA_MANAGED), sans-I/O.

With GATEWAY_SECURITY_MODE=KAFKA_MANAGED the cluster authenticates each client: the client's
SaslHandshake and SaslAuthenticate requests go to the broker on the client's own upstream
connection and the broker's answers come back. The gateway only watches, to learn who the client
is: the user name is in the client's first message (PLAIN's authzid, else its authcid; SCRAM's
``n=``; the ``sub`` claim of an OAUTHBEARER token, read without checking the token: the broker
checks it), and the broker's answer says whether it holds. Nothing else of the messages is kept:
passwords, tokens and SCRAM proofs are read once, for the name, and dropped.

A SaslHandshake v0 means the mechanism's messages then travel as raw size-delimited tokens,
without Kafka headers (KIP-43). The gateway's upstream connections route answers by correlation id,
which raw tokens lack, so such an exchange goes on to the broker as handshake v1, each raw token
wrapped in a SaslAuthenticate v0 request and each answer unwrapped back into a raw token. A
refusal closes the connection, as a broker does in v0 (which has no error to send).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import enum
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kio.schema.errors import ErrorCode
from kio.serial.errors import DecodeError

from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.entities import build
from kanal.protocol.headers import InvalidHeader, parse_request_header
from kanal.protocol.messages import (
    UnsupportedApi,
    decode_request_body,
    decode_response,
    encode_request,
    encode_response,
    response_type,
)
from kanal.protocol.sasl_mechanisms import Identity, parse_bearer_message

__all__ = [
    "Login",
    "Reply",
    "SaslSniffer",
    "UnrelayableExchange",
    "bearer_principal",
    "mechanism_label",
    "plain_principal",
    "principal_of",
    "scram_principal",
]

# Mechanisms whose user name the gateway can read; others are relayed, the connection stays anonymous.
_SNIFFED = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"})
# Names a metric label may take (anything else a client sends is "other": labels stay few).
_LABELS = _SNIFFED | {"GSSAPI", "AWS_MSK_IAM"}
_MALFORMED = (InvalidHeader, UnsupportedApi, DecodeError, ValueError, IndexError, OverflowError)


class UnrelayableExchange(ValueError):
    """A SASL exchange the gateway cannot carry to the broker (the connection is closed)."""


def mechanism_label(mechanism: str | None) -> str:
    """The mechanism as a metric label: a name Kafka knows, else ``other``."""
    return mechanism if mechanism in _LABELS else "other"


# --- user names, from a client's first message ---------------------------------------------------


def plain_principal(message: bytes) -> str | None:
    """RFC 4616 ``authzid NUL authcid NUL passwd``: the authzid when given, else the authcid."""
    parts = message.split(b"\x00")
    if len(parts) != 3:
        return None
    try:
        authzid, authcid = parts[0].decode("utf-8"), parts[1].decode("utf-8")
    except UnicodeDecodeError:
        return None
    return authzid or authcid or None


def _saslname(text: str) -> str | None:
    """RFC 5802 saslname: ``=2C`` is a comma, ``=3D`` an equals sign, any other ``=`` is malformed."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "=":
            escape = text[i + 1 : i + 3]
            if escape not in ("2C", "3D"):
                return None
            out.append("," if escape == "2C" else "=")
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out) or None


def scram_principal(message: bytes) -> str | None:
    """The ``n=`` of a SCRAM client-first message (``gs2-header,n=name,r=nonce[,...]``)."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = text.split(",", 3)
    if len(parts) < 4 or parts[0] not in ("n", "y") or not parts[2].startswith("n="):
        return None
    return _saslname(parts[2][2:])


def bearer_principal(message: bytes, claim: str = "sub") -> str | None:
    """The ``claim`` of the JWT in an OAUTHBEARER client message, unverified (the broker verifies)."""
    parsed = parse_bearer_message(message)
    if parsed is None:
        return None
    parts = parsed.token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except (binascii.Error, ValueError):
        return None
    value = payload.get(claim) if isinstance(payload, dict) else None
    return value if isinstance(value, str) and value else None


def principal_of(mechanism: str, message: bytes, claim: str = "sub") -> str | None:
    """The user name a client's first message of ``mechanism`` carries, or None."""
    if mechanism == "PLAIN":
        return plain_principal(message)
    if mechanism.startswith("SCRAM-"):
        return scram_principal(message)
    if mechanism == "OAUTHBEARER":
        return bearer_principal(message, claim)
    return None


# --- the exchange ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Login:
    """How an exchange ended, as the broker answered it. ``identity`` on success (None when the user
    name could not be read: the connection stays anonymous); ``failure`` is the broker's reason on
    refusal; ``user`` is the name the client tried (for logs; never a secret)."""

    mechanism: str
    identity: Identity | None
    failure: str | None
    user: str | None


@dataclass(frozen=True, slots=True)
class Reply:
    """What to do with one broker answer. ``frame`` goes to the client as is, except when ``raw``:
    it is then a raw SASL token (handshake v0), sent without a Kafka header; with ``close`` nothing
    is sent and the connection closes. ``login`` is set on the answer that ended an exchange."""

    frame: bytearray
    raw: bool = False
    close: bool = False
    login: Login | None = None


class _Sent(enum.Enum):
    HANDSHAKE = "handshake"
    AUTHENTICATE = "authenticate"


@dataclass(slots=True)
class _Exchange:
    mechanism: str
    raw: bool  # handshake v0: raw tokens
    started: bool = False  # the broker accepted the handshake
    user: str | None = None
    messages: int = 0  # SaslAuthenticate requests (or raw tokens) sent so far
    answered: int = 0  # answers to them without error so far


class SaslSniffer:
    """One client connection's relayed SASL exchanges (the first and any KIP-368 re-authentication).

    Feed it every SaslHandshake and SaslAuthenticate request the gateway forwards
    (:meth:`request`, which also gives the frame to send), and the broker's answer to each
    (:meth:`response`), in order. While :attr:`expects_raw_token`, the client's next frame is a raw
    token: :meth:`wrap` makes it a request to forward. ``sub_claim`` names the OAUTHBEARER claim
    that is the principal; ``clock`` gives epoch seconds.
    """

    def __init__(self, sub_claim: str = "sub", clock: Callable[[], float] = time.time) -> None:
        self._claim = sub_claim
        self._clock = clock
        self._sent: deque[_Sent] = deque()
        self._exchange: _Exchange | None = None
        self.authenticated = False
        """The broker accepted an exchange on this connection."""
        self.failed = False
        """The broker refused the last exchange; it closes such a connection, and so does the gateway."""

    @property
    def expects_raw_token(self) -> bool:
        """True when the client's next frame is a raw SASL token (after an accepted handshake v0)."""
        exchange = self._exchange
        return exchange is not None and exchange.raw and exchange.started

    def wrap(self, token: bytes | bytearray, client_id: str | None) -> bytearray:
        """A raw token from the client as a SaslAuthenticate v0 request (correlation id 0)."""
        body = build(require_request_class(ApiKey.SASL_AUTHENTICATE, 0), auth_bytes=bytes(token))
        return encode_request(body, 0, client_id)

    def request(self, frame: bytearray) -> bytearray:
        """Notes a SaslHandshake or SaslAuthenticate request going to the broker; returns the frame
        to send (a handshake v0 becomes v1 in place: the raw tokens after it are sent wrapped).
        Raises :class:`UnrelayableExchange` for one the gateway cannot carry."""
        try:
            header = parse_request_header(frame)
            body = decode_request_body(header.api_key, header.api_version, frame, header.body_offset)
        except _MALFORMED as exc:
            raise UnrelayableExchange(f"malformed SASL request: {type(exc).__name__}") from exc
        if header.api_key == ApiKey.SASL_HANDSHAKE:
            mechanism = str(body.mechanism)
            raw = header.api_version == 0
            if raw and mechanism not in _SNIFFED:
                raise UnrelayableExchange(
                    f"SaslHandshake v0 with mechanism {mechanism_label(mechanism)}: only PLAIN, SCRAM and"
                    " OAUTHBEARER are relayed with raw tokens (a client sending SaslHandshake v1 can use it)"
                )
            if raw:
                frame[2:4] = (1).to_bytes(2, "big")  # same body, same header: only the version differs
            self._exchange = _Exchange(mechanism, raw)
            self._sent.append(_Sent.HANDSHAKE)
            return frame
        exchange = self._exchange
        if exchange is not None:
            if exchange.messages == 0:
                exchange.user = principal_of(exchange.mechanism, bytes(body.auth_bytes), self._claim)
            exchange.messages += 1
        self._sent.append(_Sent.AUTHENTICATE)
        return frame

    def response(self, api_key: int, version: int, frame: bytearray) -> Reply:
        """The broker's answer to the oldest SASL request not yet answered."""
        sent = self._sent.popleft() if self._sent else None
        expected = _Sent.HANDSHAKE if api_key == ApiKey.SASL_HANDSHAKE else _Sent.AUTHENTICATE
        exchange = self._exchange
        if sent is not expected or exchange is None:  # not an exchange this connection follows
            self._sent.clear()
            self._exchange = None
            return Reply(frame)
        try:
            body = decode_response(api_key, version, frame)
        except _MALFORMED:
            return self._refused(exchange, frame, "the broker's SASL answer does not decode")
        if api_key == ApiKey.SASL_HANDSHAKE:
            if body.error_code != ErrorCode.none:
                offered = ", ".join(str(m) for m in body.mechanisms)
                why = f"{body.error_code.name} (the broker offers {offered})"
                return self._refused(exchange, frame, why, close=False)  # (a Kafka answer, even in v0)
            exchange.started = True
            return Reply(frame)
        if body.error_code != ErrorCode.none:
            return self._refused(exchange, frame, str(body.error_message or body.error_code.name))
        exchange.answered += 1
        data = bytes(body.auth_bytes)
        out = bytearray(data) if exchange.raw else frame
        if not self._complete(exchange, data):
            return Reply(out, raw=exchange.raw)
        if data.startswith(b"e="):  # a SCRAM server-final carrying an error, without a Kafka error code
            why = data.decode("utf-8", "replace")
            return self._refused(exchange, _authentication_failed(version, f"Authentication failed: {why}"), why)
        self._exchange = None
        self.authenticated = True
        self.failed = False
        lifetime = getattr(body, "session_lifetime", None)
        ms = lifetime // datetime.timedelta(milliseconds=1) if isinstance(lifetime, datetime.timedelta) else 0
        identity = None
        if exchange.user is not None:
            identity = Identity(exchange.user, expires_at_ms=int(self._clock() * 1000) + ms if ms > 0 else None)
        login = Login(mechanism_label(exchange.mechanism), identity, None, exchange.user)
        return Reply(out, raw=exchange.raw, login=login)

    @staticmethod
    def _complete(exchange: _Exchange, data: bytes) -> bool:
        """Whether an accepted message ended the exchange (None of an unknown mechanism ever does:
        the gateway cannot tell its last message)."""
        mechanism = exchange.mechanism
        if mechanism == "PLAIN":
            return exchange.answered == 1
        if mechanism.startswith("SCRAM-"):
            return exchange.answered == 2
        if mechanism == "OAUTHBEARER":  # an error challenge (KIP-255) wants one more client message
            return exchange.answered > 1 or not data
        return False

    def _refused(self, exchange: _Exchange, frame: bytearray, why: str, *, close: bool | None = None) -> Reply:
        """The broker refused: the client gets its answer, except in a raw exchange, which has no
        error to send and is closed (``close`` overrides that)."""
        self._exchange = None
        self.failed = True
        login = Login(mechanism_label(exchange.mechanism), None, why, exchange.user)
        return Reply(frame, close=exchange.raw if close is None else close, login=login)


def _authentication_failed(version: int, message: str) -> bytearray:
    """A SaslAuthenticate answer with SASL_AUTHENTICATION_FAILED (KIP-152), which every client
    library reports as an authentication failure (its correlation id is set when it is sent)."""
    extra = {"session_lifetime": datetime.timedelta(0)} if version >= 1 else {}
    body = build(
        response_type(ApiKey.SASL_AUTHENTICATE, version),
        error_code=ErrorCode.sasl_authentication_failed,
        error_message=message,
        auth_bytes=b"",
        **extra,
    )
    return encode_response(body, 0)
