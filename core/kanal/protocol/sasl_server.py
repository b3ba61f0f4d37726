"""The server side of Kafka's SASL exchange on a client connection, sans-I/O.

Kafka's broker authenticates a SASL connection before it serves anything (KIP-43): the client may
ask ApiVersions, then sends SaslHandshake naming a mechanism, then the mechanism's messages, each
in a SaslAuthenticate request (handshake v1) or as raw size-delimited tokens (handshake v0). Any
other request before that succeeds closes the connection. A failure is answered with
SASL_AUTHENTICATION_FAILED (KIP-152) and the connection is closed. A success may carry a session
lifetime (KIP-368): the client must re-authenticate (SaslHandshake + SaslAuthenticate again, same
principal) before it ends, and a connection whose session has ended is closed at its next request.

:class:`Authenticator` follows that state machine on whole frames (without the 4-byte size
prefix): the I/O layer feeds each frame it reads and does what the answer says.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from kio.schema.errors import ErrorCode
from kio.serial.errors import DecodeError

from kanal.protocol.api import ApiKey
from kanal.protocol.headers import InvalidHeader, RequestHeader, parse_request_header, peek_request
from kanal.protocol.messages import UnsupportedApi
from kanal.protocol.sasl_mechanisms import (
    Failure,
    Identity,
    OAuthBearerServer,
    Outcome,
    ServerMechanism,
    Success,
    parse_bearer_message,
)
from kanal.protocol.sasl_messages import (
    authenticate_bytes,
    authenticate_response,
    handshake_mechanism,
    handshake_response,
)

__all__ = ["Action", "Authenticator", "State", "Step"]

MechanismFactory = Callable[[], ServerMechanism]
"""Makes a fresh mechanism for one exchange."""


class State(enum.Enum):
    """Where the connection is in the exchange."""

    HANDSHAKE = "handshake"  # expecting ApiVersions or SaslHandshake
    AUTHENTICATING = "authenticating"  # expecting SaslAuthenticate (or a raw token after handshake v0)
    AUTHENTICATED = "authenticated"
    REAUTHENTICATING = "reauthenticating"  # authenticated, a KIP-368 exchange under way
    FAILED = "failed"


class Action(enum.Enum):
    """What the I/O layer does with a frame it fed."""

    SEND = "send"  # send ``response``; the exchange goes on
    API_VERSIONS = "api_versions"  # an ApiVersions request, allowed here: answer it as usual
    FORWARD = "forward"  # ordinary traffic of an authenticated connection
    CLOSE = "close"  # send ``response`` when there is one, then close the connection


@dataclass(frozen=True, slots=True)
class Step:
    """The answer to one frame.

    ``response`` is a whole frame without size prefix. ``authenticated`` is true on the step that
    completed an authentication or re-authentication (the identity is then
    :attr:`Authenticator.identity`). ``failure`` says why a step closes or refuses, for logs,
    metrics and audit (never for the client: it may tell an unknown user from a wrong password).
    """

    action: Action
    response: bytearray | bytes | None = None
    authenticated: bool = False
    failure: str | None = None


_FORWARD = Step(Action.FORWARD)
# What decoding a frame that is not a well-formed request raises.
_MALFORMED = (InvalidHeader, UnsupportedApi, DecodeError, ValueError, IndexError, OverflowError)


class _BadFrame(Exception):
    """A client frame that does not decode (the mechanisms' own callbacks are not covered: their
    errors are the gateway's bugs and propagate)."""


def _header(frame: bytes | bytearray | memoryview) -> RequestHeader:
    try:
        return parse_request_header(frame)
    except _MALFORMED as exc:
        raise _BadFrame(type(exc).__name__) from exc


def _mechanism(frame: bytes | bytearray | memoryview, header: RequestHeader) -> str:
    try:
        return handshake_mechanism(frame, header.body_offset)
    except ValueError as exc:  # (UnicodeDecodeError too)
        raise _BadFrame(type(exc).__name__) from exc


def _auth_bytes(frame: bytes | bytearray | memoryview, header: RequestHeader) -> bytes:
    try:
        return authenticate_bytes(frame, header.body_offset, header.api_version)
    except ValueError as exc:
        raise _BadFrame(type(exc).__name__) from exc


_API_VERSIONS = Step(Action.API_VERSIONS)


class Authenticator:
    """One client connection's SASL state machine.

    ``mechanisms`` maps each enabled mechanism name (in the order the handshake lists them) to a
    factory of fresh mechanism objects. ``max_reauth_ms`` is Kafka's
    ``connections.max.reauth.ms`` (0: no limit); the session lifetime given to the client is the
    smaller of it and the time left on the credential, 0 when neither applies. ``clock`` gives
    epoch seconds (credential expiries are epoch times).

    After authentication the I/O layer need not feed every frame: only SaslHandshake and
    SaslAuthenticate requests, plus a check of :meth:`session_expired` before serving others.
    Feeding everything also works (ordinary frames are answered ``FORWARD``, or ``CLOSE`` once the
    session has ended).
    """

    def __init__(
        self,
        mechanisms: Mapping[str, MechanismFactory],
        *,
        max_reauth_ms: int = 0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if max_reauth_ms < 0:
            raise ValueError("max_reauth_ms must be 0 (no limit) or positive")
        self._factories = dict(mechanisms)
        self._names = tuple(self._factories)
        self._max_reauth_ms = max_reauth_ms
        self._clock = clock
        self.state = State.HANDSHAKE
        self.identity: Identity | None = None
        """Who authenticated (kept during a re-authentication until it succeeds)."""
        self.mechanism: str | None = None
        """The mechanism of the current (or last successful) exchange."""
        self.claimed_user: str | None = None
        """The user name the client claimed in the last exchange (for the record of a failure)."""
        self.session_lifetime_ms = 0
        """The lifetime of the current session as told to the client; 0 when it does not end."""
        self.session_expires_at_ms: int | None = None
        """Epoch milliseconds when the session ends (None: never)."""
        self.prepare_bearer: Callable[[str], Awaitable[None]] | None = None
        """Set by the I/O layer's factory when it has work to do before an OAUTHBEARER token is fed
        (fetching signing keys it lacks): awaited with the token :meth:`bearer_token` finds."""
        self._exchange: ServerMechanism | None = None
        self._started = False
        self._raw_tokens = False  # handshake v0: the mechanism's messages come without Kafka headers
        self._auth_version = 0

    # --- queries -----------------------------------------------------------------------------

    @property
    def authenticated(self) -> bool:
        """True once authenticated, including while a re-authentication is under way."""
        return self.state in (State.AUTHENTICATED, State.REAUTHENTICATING)

    @property
    def expects_raw_token(self) -> bool:
        """True after a SaslHandshake v0: the next frame is a raw SASL token, not a Kafka request."""
        return self._raw_tokens and self.state is State.AUTHENTICATING

    def session_expired(self, now_ms: int | None = None) -> bool:
        """True when the session has ended: the next request other than SaslHandshake closes it."""
        if self.session_expires_at_ms is None:
            return False
        return (self._now_ms() if now_ms is None else now_ms) >= self.session_expires_at_ms

    def bearer_token(self, frame: bytes | bytearray | memoryview) -> str | None:
        """The OAUTHBEARER token ``frame`` carries, if it is the next message of such an exchange.

        Lets the I/O layer make sure it has the token's signing key (fetching a JWKS it lacks)
        before feeding the frame; the validator itself is synchronous.
        """
        if self._exchange is None or self._exchange.name != OAuthBearerServer.name or self._started:
            return None
        token = self._auth_bytes(frame) if not self.expects_raw_token else bytes(frame)
        if token is None:
            return None
        parsed = parse_bearer_message(token)
        return parsed.token if parsed is not None else None

    # --- the state machine -------------------------------------------------------------------

    def feed(self, frame: bytes | bytearray | memoryview) -> Step:
        """Answers one frame read from the client."""
        try:
            return self._feed(frame)
        except _BadFrame as exc:
            return self._fail(f"malformed frame: {exc}")

    def _feed(self, frame: bytes | bytearray | memoryview) -> Step:
        state = self.state
        if state is State.FAILED:
            return Step(Action.CLOSE, failure="the connection failed authentication")
        if self.expects_raw_token:
            return self._raw_token(bytes(frame))
        try:
            api_key, version, _ = peek_request(frame)
        except InvalidHeader as exc:
            raise _BadFrame(type(exc).__name__) from exc
        if state is State.AUTHENTICATED:
            if api_key == ApiKey.SASL_HANDSHAKE:
                return self._handshake(frame, reauth=True)
            if self.session_expired():
                return self._fail("request after the session expired")
            if api_key == ApiKey.SASL_AUTHENTICATE:
                return self._authenticate_out_of_turn(frame)
            return _FORWARD
        if state is State.HANDSHAKE:
            if api_key == ApiKey.API_VERSIONS:
                return _API_VERSIONS
            if api_key == ApiKey.SASL_HANDSHAKE:
                return self._handshake(frame, reauth=False)
            return self._fail(f"api key {api_key} v{version} before authentication")
        # AUTHENTICATING or REAUTHENTICATING
        if api_key == ApiKey.SASL_AUTHENTICATE:
            return self._authenticate(frame)
        return self._fail(f"api key {api_key} v{version} during the SASL exchange")

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def _fail(self, why: str, response: bytearray | None = None) -> Step:
        self.state = State.FAILED
        self._exchange = None
        return Step(Action.CLOSE, response, failure=why)

    def _handshake(self, frame: bytes | bytearray | memoryview, *, reauth: bool) -> Step:
        header = _header(frame)
        if header.api_version > 1 or (reauth and header.api_version < 1):
            return self._fail(f"SaslHandshake v{header.api_version} {'to re-authenticate' if reauth else ''}".strip())
        mechanism = _mechanism(frame, header)
        factory = self._factories.get(mechanism)
        if factory is None or (reauth and mechanism != self.mechanism):
            # On re-authentication only the mechanism of the session is acceptable (KIP-368).
            offered = (self.mechanism,) if reauth and self.mechanism else self._names
            refused = handshake_response(
                header.api_version, header.correlation_id, ErrorCode.unsupported_sasl_mechanism, offered
            )
            why = "mechanism changed on re-authentication" if factory else f"unsupported mechanism {mechanism!r}"
            return self._fail(why, refused)
        self._exchange = factory()
        self._started = False
        self.mechanism = mechanism
        self._raw_tokens = header.api_version == 0
        self.state = State.REAUTHENTICATING if reauth else State.AUTHENTICATING
        accepted = handshake_response(header.api_version, header.correlation_id, ErrorCode.none, self._names)
        return Step(Action.SEND, accepted)

    def _auth_bytes(self, frame: bytes | bytearray | memoryview) -> bytes | None:
        try:
            header = _header(frame)
            if header.api_key != ApiKey.SASL_AUTHENTICATE or header.api_version > 2:
                return None
            return _auth_bytes(frame, header)
        except _BadFrame:
            return None

    def _advance(self, message: bytes) -> Outcome:
        exchange = self._exchange
        assert exchange is not None
        first, self._started = not self._started, True
        outcome = exchange.start(message) if first else exchange.step(message)
        self.claimed_user = exchange.user
        return outcome

    def _authenticate(self, frame: bytes | bytearray | memoryview) -> Step:
        header = _header(frame)
        if header.api_version > 2:
            return self._fail(f"SaslAuthenticate v{header.api_version}")
        self._auth_version = header.api_version
        outcome = self._advance(_auth_bytes(frame, header))
        corr = header.correlation_id
        if isinstance(outcome, Success):
            refusal = self._complete(outcome)
            if refusal is not None:
                return self._fail(refusal, self._auth_response(corr, ErrorCode.sasl_authentication_failed, refusal))
            lifetime = self.session_lifetime_ms
            response = self._auth_response(corr, ErrorCode.none, None, outcome.data, lifetime)
            return Step(Action.SEND, response, authenticated=True)
        if isinstance(outcome, Failure):
            message = outcome.message or self._generic_failure()
            return self._fail(
                f"{self.mechanism}: {outcome.reason}",
                self._auth_response(corr, ErrorCode.sasl_authentication_failed, message),
            )
        return Step(Action.SEND, self._auth_response(corr, ErrorCode.none, None, outcome.data))

    def _raw_token(self, token: bytes) -> Step:
        """Handshake v0: a raw token in, a raw token out; a failure just closes (v0 has no error)."""
        outcome = self._advance(token)
        if isinstance(outcome, Success):
            refusal = self._complete(outcome)
            if refusal is not None:
                return self._fail(refusal)
            self._raw_tokens = False
            return Step(Action.SEND, outcome.data, authenticated=True)
        if isinstance(outcome, Failure):
            return self._fail(f"{self.mechanism}: {outcome.reason}")
        return Step(Action.SEND, outcome.data)

    def _complete(self, outcome: Success) -> str | None:
        """Records a successful exchange; the reason it must still be refused, if any."""
        identity = outcome.identity
        now = self._now_ms()
        expiry = identity.expires_at_ms
        previous = self.identity
        if self.state is State.REAUTHENTICATING and previous is not None and identity.principal != previous.principal:
            return "Cannot change principals during re-authentication"
        left = [self._max_reauth_ms] if self._max_reauth_ms > 0 else []
        if expiry is not None:  # a credential the validator let through at its very end still ends the session
            left.append(max(expiry - now, 1))
        lifetime = min(left) if left else 0
        self.session_lifetime_ms = lifetime
        self.session_expires_at_ms = now + lifetime if lifetime else None
        self.identity = identity
        self.state = State.AUTHENTICATED
        self._exchange = None
        return None

    def _generic_failure(self) -> str:
        during = "re-authentication" if self.state is State.REAUTHENTICATING else "authentication"
        return f"Authentication failed during {during} due to invalid credentials with SASL mechanism {self.mechanism}"

    def _authenticate_out_of_turn(self, frame: bytes | bytearray | memoryview) -> Step:
        """SaslAuthenticate on an authenticated connection, without a new handshake: Kafka answers
        ILLEGAL_SASL_STATE and keeps the connection."""
        header = _header(frame)
        if header.api_version > 2:
            return self._fail(f"SaslAuthenticate v{header.api_version}")
        message = "SaslAuthenticate request received after successful authentication"
        answer = authenticate_response(
            header.api_version, header.correlation_id, ErrorCode.illegal_sasl_state, message, b"", 0
        )
        return Step(Action.SEND, answer)

    def _auth_response(
        self, correlation_id: int, error: ErrorCode, message: str | None, data: bytes = b"", lifetime_ms: int = 0
    ) -> bytearray:
        return authenticate_response(self._auth_version, correlation_id, error, message, data, lifetime_ms)
