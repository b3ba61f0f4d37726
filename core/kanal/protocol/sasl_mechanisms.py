"""Server-side SASL mechanisms (PLAIN, SCRAM-SHA-256/512, OAUTHBEARER), sans-I/O.

Each mechanism checks the client's messages and answers with bytes; where the credentials live is
not its business: PLAIN and OAUTHBEARER call a validator, SCRAM a lookup of stored credentials.
The first client message goes to ``start``, later ones to ``step``; each answers a ``Challenge``
(send it, expect another message), a ``Success`` or a ``Failure``. Nothing here raises on bad
input: whatever a client sends ends in a clean ``Failure``.

``Failure.reason`` is for the gateway's logs and metrics; the client sees ``Failure.message``,
which never tells an unknown user from a wrong password.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_MIN_ITERATIONS = 4096  # Kafka's minimum (and default) for both SCRAM mechanisms
SCRAM_MAX_ITERATIONS = 16384  # Kafka's maximum (AlterUserScramCredentials refuses more)


@dataclass(frozen=True, slots=True)
class Identity:
    """Who authenticated: the principal, the groups and virtual cluster a credential may carry, and
    when the credential expires (epoch milliseconds; None when it does not)."""

    principal: str
    groups: tuple[str, ...] = ()
    vcluster: str | None = None
    expires_at_ms: int | None = None
    #: A LOCAL service account's own login (gateway token, SCRAM): its name is the account's, which
    #: no EXTERNAL account's external names may rename.
    local: bool = False


@dataclass(frozen=True, slots=True)
class Challenge:
    """Send ``data`` to the client and expect another message."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Success:
    """Authenticated; ``data`` is the mechanism's last word to the client (SCRAM's server-final)."""

    identity: Identity
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Failure:
    """Refused. ``reason`` is for logs and metrics only; ``message`` is what the client is told
    (None: the authenticator's generic message)."""

    reason: str
    message: str | None = None


Outcome = Challenge | Success | Failure


class ServerMechanism(Protocol):
    """One exchange of one SASL mechanism, server side."""

    name: str

    @property
    def user(self) -> str | None:
        """The user name the client claimed, once read (None until then, or when the mechanism
        carries none it could trust, as an unverified token): for logs and audit events of failures."""

    def start(self, message: bytes) -> Outcome:
        """Answers the client's first message."""
        ...

    def step(self, message: bytes) -> Outcome:
        """Answers each later message."""
        ...


def _over(reason: str) -> Failure:
    return Failure(f"message after the exchange ended ({reason})")


# --- PLAIN ---------------------------------------------------------------------------------------

PlainValidator = Callable[[str, str], Identity | None]
"""(username, password) -> the identity, or None when refused (for whatever reason)."""


class PlainServer:
    """RFC 4616 PLAIN: ``authzid NUL authcid NUL passwd``; an authzid must name the user itself."""

    name = "PLAIN"

    def __init__(self, validate: PlainValidator) -> None:
        self._validate = validate
        self.user: str | None = None

    def start(self, message: bytes) -> Outcome:
        parts = message.split(b"\x00")
        if len(parts) != 3:
            return Failure("malformed PLAIN message", "Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, username, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError:
            return Failure("malformed PLAIN message", "Invalid SASL/PLAIN response: not UTF-8")
        if not username:
            return Failure("empty username", "Authentication failed: username not specified")
        self.user = username
        if not password:
            return Failure("empty password", "Authentication failed: password not specified")
        if authzid and authzid != username:
            return Failure(
                "authzid differs from username",
                "Authentication failed: Client requested an authorization id that is different from username",
            )
        identity = self._validate(username, password)
        if identity is None:
            return Failure("invalid credentials")
        return Success(identity)

    def step(self, message: bytes) -> Outcome:
        return _over("PLAIN")


# --- SCRAM ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the server stores for one user and mechanism (RFC 5802 §3): never the password."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True, slots=True)
class ScramUser:
    """A stored credential and who proving it makes the client (when that is more than the user
    name, e.g. the user's virtual cluster)."""

    credential: ScramCredential
    identity: Identity


ScramLookup = Callable[[str], ScramCredential | ScramUser | None]
"""username -> the stored credential for this mechanism (with the identity it gives, or the user
name alone), or None when the user has none."""

_PRINTABLE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")  # RFC 5802 "printable": no comma
_SASLNAME_ESCAPE = re.compile(r"=(?!2C|3D)")


def _decode_saslname(text: str) -> str | None:
    if not text or _SASLNAME_ESCAPE.search(text):
        return None
    return text.replace("=2C", ",").replace("=3D", "=")


def _fields(text: str) -> list[tuple[str, str]] | None:
    out = []
    for part in text.split(","):
        if len(part) < 2 or part[1] != "=":
            return None
        out.append((part[0], part[2:]))
    return out


@dataclass(slots=True)
class _ScramState:
    gs2_header: str
    username: str
    client_first_bare: str
    server_first: str
    nonce: str
    credential: ScramCredential | None  # None: a user without credentials, answered with a fake exchange
    identity: Identity


class ScramServer:
    """RFC 5802 / 7677 SCRAM-SHA-256 and SCRAM-SHA-512 without channel binding, as Kafka speaks it.

    A user without credentials gets a server-first message like any other, with a salt derived
    from ``fake_salt_key`` and the name (the same on every attempt) and the default iteration
    count, and fails only at the proof: the exchange does not reveal who exists.
    """

    def __init__(
        self,
        mechanism: str,
        lookup: ScramLookup,
        *,
        fake_salt_key: bytes,
        nonce_factory: Callable[[], str] | None = None,
        min_iterations: int = SCRAM_MIN_ITERATIONS,
    ) -> None:
        algorithm = SCRAM_HASHES.get(mechanism)
        if algorithm is None:
            raise ValueError(f"unsupported SCRAM mechanism {mechanism!r}")
        self.name = mechanism
        self._hash = algorithm
        self._digest_size = hashlib.new(algorithm).digest_size
        self._lookup = lookup
        self._fake_salt_key = fake_salt_key
        self._nonce_factory = nonce_factory or (lambda: secrets.token_urlsafe(24))
        self._min_iterations = min_iterations
        self._state: _ScramState | None = None
        self._done = False
        self.user: str | None = None

    def _hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.digest(key, data, self._hash)  # (one call into OpenSSL, no HMAC object)

    def start(self, message: bytes) -> Outcome:
        if self._state is not None or self._done:
            return _over(self.name)
        try:
            text = message.decode("utf-8")
        except UnicodeDecodeError:
            return Failure("client-first is not UTF-8")
        parsed = self._parse_client_first(text)
        if isinstance(parsed, Failure):
            return parsed
        gs2_header, username, bare, client_nonce = parsed
        self.user = username
        found = self._lookup(username)
        credential, identity = (
            (found.credential, found.identity) if isinstance(found, ScramUser) else (found, Identity(username))
        )
        if credential is not None and credential.iterations < self._min_iterations:
            return Failure(f"stored credential has {credential.iterations} iterations, below {self._min_iterations}")
        salt, iterations = (
            (credential.salt, credential.iterations)
            if credential is not None
            else (self._fake_salt(username), SCRAM_MIN_ITERATIONS)
        )
        nonce = client_nonce + self._nonce_factory()
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={iterations}"
        self._state = _ScramState(gs2_header, username, bare, server_first, nonce, credential, identity)
        return Challenge(server_first.encode())

    def _parse_client_first(self, text: str) -> tuple[str, str, str, str] | Failure:
        bad = Failure("malformed client-first message")
        # gs2-header: "n" (no channel binding) or "y" (client could, thinks we cannot); "p=" needs -PLUS.
        flag, sep, rest = text.partition(",")
        if not sep or flag not in ("n", "y"):
            return bad
        authz, sep, bare = rest.partition(",")
        if not sep:
            return bad
        fields = _fields(bare)
        if fields is None or len(fields) < 2 or fields[0][0] != "n" or fields[1][0] != "r":
            return bad
        username = _decode_saslname(fields[0][1])
        client_nonce = fields[1][1]
        if username is None or not _PRINTABLE.fullmatch(client_nonce):
            return bad
        if any(key == "m" for key, _ in fields[2:]):  # mandatory extension we do not know (RFC 5802 §5.1)
            return bad
        if authz and (not authz.startswith("a=") or _decode_saslname(authz[2:]) != username):
            return Failure(
                "authzid differs from username",
                "Authentication failed: Client requested an authorization id that is different from username",
            )
        return f"{flag},{authz},", username, bare, client_nonce

    def _fake_salt(self, username: str) -> bytes:
        return hmac.new(self._fake_salt_key, f"{self.name}:{username}".encode(), hashlib.sha256).digest()[:16]

    def step(self, message: bytes) -> Outcome:
        state = self._state
        if state is None or self._done:
            return _over(self.name)
        self._done = True
        try:
            text = message.decode("ascii")
        except UnicodeDecodeError:
            return Failure("client-final is not ASCII")
        fields = _fields(text)
        if fields is None or len(fields) < 3 or fields[0][0] != "c" or fields[1][0] != "r" or fields[-1][0] != "p":
            return Failure("malformed client-final message")
        if fields[0][1] != base64.b64encode(state.gs2_header.encode()).decode():
            return Failure("channel binding does not match the gs2 header")
        if not hmac.compare_digest(fields[1][1].encode(), state.nonce.encode()):
            return Failure("nonce mismatch")
        try:
            proof = base64.b64decode(fields[-1][1], validate=True)
        except (binascii.Error, ValueError):
            return Failure("proof is not base64")
        without_proof = text[: text.rindex(",p=")]
        auth_message = f"{state.client_first_bare},{state.server_first},{without_proof}".encode()
        credential = state.credential
        # A user without credentials runs the same computation against a random key, then fails.
        stored_key = credential.stored_key if credential is not None else secrets.token_bytes(self._digest_size)
        signature = self._hmac(stored_key, auth_message)
        if len(proof) != len(signature):
            return Failure("invalid proof" if credential is not None else "unknown user")
        client_key = (int.from_bytes(proof) ^ int.from_bytes(signature)).to_bytes(len(signature))
        valid = hmac.compare_digest(hashlib.new(self._hash, client_key).digest(), stored_key)
        if credential is None:
            return Failure("unknown user")
        if not valid:
            return Failure("invalid proof")
        server_signature = self._hmac(credential.server_key, auth_message)
        return Success(state.identity, b"v=" + base64.b64encode(server_signature))


# --- OAUTHBEARER ---------------------------------------------------------------------------------

BearerValidator = Callable[[str], Identity | None]
"""token -> the identity (with its expiry), or None when the token is refused."""

_KEY = re.compile(r"[A-Za-z]+")
_VALUE = re.compile(r"[\x21-\x7e \t\r\n]+")
_AUTH = re.compile(r"([A-Za-z0-9_]+) +([-_.a-zA-Z0-9]+)")
INVALID_TOKEN = json.dumps({"status": "invalid_token"}, separators=(",", ":"))


@dataclass(frozen=True, slots=True)
class BearerMessage:
    """A parsed OAUTHBEARER client message (RFC 7628 §3.1, KIP-255 / KIP-342)."""

    token: str
    authzid: str
    extensions: dict[str, str] = field(default_factory=dict)


def parse_bearer_message(message: bytes) -> BearerMessage | None:
    """The token and extensions of ``n,[a=authzid],\\x01auth=Bearer <token>\\x01[k=v\\x01]*\\x01``."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        return None
    head, sep, kvpart = text.partition("\x01")
    if not sep or not kvpart.endswith("\x01\x01") or not head.endswith(","):
        return None
    flag, sep, authz = head[:-1].partition(",")
    if flag != "n" or not sep or (authz and not authz.startswith("a=")):
        return None
    pairs: dict[str, str] = {}
    body = kvpart[:-2]
    for item in body.split("\x01") if body else []:
        key, sep, value = item.partition("=")
        if not sep or not _KEY.fullmatch(key) or not _VALUE.fullmatch(value) or key in pairs:
            return None
        pairs[key] = value
    auth = _AUTH.fullmatch(pairs.pop("auth", ""))
    if auth is None or auth.group(1).lower() != "bearer":
        return None
    return BearerMessage(auth.group(2), authz[2:], pairs)


class OAuthBearerServer:
    """KIP-255 OAUTHBEARER. A refused token is answered as Kafka does: an error challenge
    ``{"status":"invalid_token"}``, to which the client replies ``\\x01``, and then the failure."""

    name = "OAUTHBEARER"

    def __init__(self, validate: BearerValidator) -> None:
        self._validate = validate
        self._refused: str | None = None
        self._done = False
        self.user: str | None = None  # a refused token's subject is not to be believed

    def start(self, message: bytes) -> Outcome:
        if self._done:
            return _over(self.name)
        parsed = parse_bearer_message(message)
        if parsed is None:
            self._done = True
            return Failure("malformed OAUTHBEARER client message", "Invalid OAUTHBEARER client first message")
        identity = self._validate(parsed.token)
        if identity is None:
            self._refused = "invalid token"
            return Challenge(INVALID_TOKEN.encode())
        self._done = True
        if parsed.authzid and parsed.authzid != identity.principal:
            return Failure(
                "authzid differs from the token's principal",
                "Authentication failed: Client requested an authorization id that is different from the "
                "token's principal name",
            )
        return Success(identity)

    def step(self, message: bytes) -> Outcome:
        refused, self._refused = self._refused, None
        self._done = True
        if refused is None:
            return _over(self.name)
        if message != b"\x01":
            return Failure(f"{refused}; the client did not acknowledge the error")
        return Failure(refused, INVALID_TOKEN)
