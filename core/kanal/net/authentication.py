"""How a listener that authenticates its clients itself (GATEWAY_MANAGED) checks credentials.

Mechanisms offered, in the order the handshake lists them:

- PLAIN carries a gateway token as the password (``POST /gateway/v2/token``): it must verify with
  GATEWAY_USER_POOL_SECRET_KEY, name the user the client logs in as, and that user must be a LOCAL
  service account (in the token's virtual cluster) when the client connects: deleting the account
  stops new logins at once, whatever its tokens' lifetimes. The session lasts until the token
  expires (KIP-368: the client re-authenticates with a fresh token before then).
- SCRAM-SHA-256 and SCRAM-SHA-512 check the client's proof against the salted keys of a
  ``GatewayScramCredential`` (the gateway never sees the password). The credential's LOCAL service
  account must exist too: deleting the account or the credential stops new logins. A user without
  a credential gets an exchange that looks like any other and fails at the proof, so nobody learns
  who exists; its fake salt is derived from the user-pool secret, the same on every node.
- OAUTHBEARER (only with GATEWAY_OAUTH_JWKS_URL) checks a JWT against the identity provider's keys
  (:mod:`kanal.net.jwks`): signature, expiry, not-before, issuer and audiences as configured. The
  principal is the subject claim, the groups the groups claim; the session ends when the token does.

Failed logins are counted per client host, whatever the mechanism: past
GATEWAY_AUTHENTICATION_MAX_FAILURES_PER_MINUTE in the last minute, that host's logins are refused
without looking at the credentials (a brute-force guard; the client sees the same refusal as for a
wrong password) until its failures age out.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial

from kanal.api.services import Service
from kanal.config.settings import Settings
from kanal.identity.accounts import ServiceAccounts, user_pool_secret
from kanal.identity.oauth import JwksValidator, OAuthIdentity
from kanal.identity.scram_credentials import ScramCredentials
from kanal.identity.token_login import token_login
from kanal.net.jwks import JwksKeys
from kanal.protocol.sasl_mechanisms import (
    SCRAM_HASHES,
    Failure,
    Identity,
    OAuthBearerServer,
    Outcome,
    PlainServer,
    ScramServer,
    ScramUser,
    ServerMechanism,
)
from kanal.protocol.sasl_server import Authenticator, MechanismFactory

log = logging.getLogger(__name__)


def _plain_token(secret: bytes, accounts: ServiceAccounts, username: str, password: str) -> Identity | None:
    identity = token_login(secret, accounts, username, password)
    if isinstance(identity, str):
        log.info("refused a gateway token for %r: %s", username, identity)
        return None
    return identity


def _scram_user(
    credentials: ScramCredentials, accounts: ServiceAccounts, mechanism: str, username: str
) -> ScramUser | None:
    found = credentials.get(username, mechanism)
    if found is None:
        return None  # answered with a fake exchange; the failure at the proof is logged as "unknown user"
    vcluster, credential = found
    account = accounts.get(username, vcluster)
    if account is None or not account.local:
        log.info("refused a %s login for %r: its credential has no LOCAL service account", mechanism, username)
        return None
    return ScramUser(credential, Identity(username, vcluster=vcluster, local=True))


def _bearer(keys: JwksKeys, token: str) -> Identity | None:
    checked = keys.validate(token)
    if not isinstance(checked, OAuthIdentity):
        kid = f" (key id {checked.kid[:80]!r})" if checked.kid is not None else ""
        log.info("refused an OAUTHBEARER token: %s%s", checked.problem.value, kid)
        return None
    return Identity(checked.subject, groups=checked.groups, expires_at_ms=int(checked.expires_at * 1000))


class FailedLogins:
    """Failed logins per client host over the last ``window`` seconds, for at most ``hosts`` hosts
    (the least recently failing are forgotten first, so a flood of addresses stays bounded)."""

    def __init__(
        self, limit: int, window: float = 60.0, hosts: int = 10_000, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self._window = window
        self._hosts = hosts
        self._clock = clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, host: str) -> deque[float] | None:
        failures = self._failures.get(host)
        if failures is not None:
            horizon = self._clock() - self._window
            while failures and failures[0] <= horizon:
                failures.popleft()
        return failures

    def blocked(self, host: str) -> bool:
        """Whether ``host`` failed ``limit`` times within the window (0: never blocked)."""
        failures = self._recent(host)
        return bool(self.limit) and failures is not None and len(failures) >= self.limit

    def failed(self, host: str) -> None:
        failures = self._recent(host)
        if failures is None:
            failures = self._failures[host] = deque()
            if len(self._failures) > self._hosts:
                self._failures.popitem(last=False)
        self._failures.move_to_end(host)
        failures.append(self._clock())


class _Guarded:
    """A mechanism behind the brute-force guard: a blocked host is refused before its first message
    is looked at, and every refusal counts against the host."""

    def __init__(self, inner: ServerMechanism, failed: FailedLogins, host: str) -> None:
        self.name = inner.name
        self._inner = inner
        self._failed = failed
        self._host = host

    @property
    def user(self) -> str | None:
        return self._inner.user

    def start(self, message: bytes) -> Outcome:
        if self._failed.blocked(self._host):
            log.warning(
                "refused a %s login from %s without checking it: %d failed logins from there in the last"
                " minute (GATEWAY_AUTHENTICATION_MAX_FAILURES_PER_MINUTE)",
                self.name,
                self._host,
                self._failed.limit,
            )
            return Failure("too many failed logins from this host")
        return self._counted(self._inner.start(message))

    def step(self, message: bytes) -> Outcome:
        return self._counted(self._inner.step(message))

    def _counted(self, outcome: Outcome) -> Outcome:
        if isinstance(outcome, Failure):
            self._failed.failed(self._host)
        return outcome


def _guard(make: MechanismFactory, failed: FailedLogins, host: str) -> ServerMechanism:
    return _Guarded(make(), failed, host)


class Authentication:
    """The SASL side of a GATEWAY_MANAGED listener: called with a client's host, it makes that
    client's :class:`Authenticator`. ``services`` are the companion tasks it needs the gateway to
    run (the JWKS refresher when OAUTHBEARER is on); ``jwks`` is None without OAUTHBEARER."""

    def __init__(self, settings: Settings, accounts: ServiceAccounts, scram: ScramCredentials) -> None:
        assert settings.user_pool_secret_key is not None  # required in this mode (settings validation)
        secret = user_pool_secret(settings.user_pool_secret_key)
        self._max_reauth_ms = settings.max_reauth_ms
        self._failed = FailedLogins(settings.max_failed_logins_per_minute)
        fake_salt_key = hmac.new(secret, b"kanal SCRAM fake salt", hashlib.sha256).digest()
        factories: dict[str, MechanismFactory] = {
            "PLAIN": partial(PlainServer, partial(_plain_token, secret, accounts))
        }
        for mechanism in SCRAM_HASHES:
            lookup = partial(_scram_user, scram, accounts, mechanism)
            factories[mechanism] = partial(ScramServer, mechanism, lookup, fake_salt_key=fake_salt_key)
        self.jwks: JwksKeys | None = None
        self.services: list[Service] = []
        if settings.oauth_jwks_url:
            template = JwksValidator(
                {"keys": []},
                issuer=settings.oauth_expected_issuer,
                audiences=settings.oauth_expected_audiences,
                subject_claim=settings.oauth_sub_claim_name,
                groups_claim=settings.oauth_groups_claim_name,
            )
            self.jwks = JwksKeys(settings.oauth_jwks_url, template, settings.oauth_jwks_refresh_ms / 1000)
            factories[OAuthBearerServer.name] = partial(OAuthBearerServer, partial(_bearer, self.jwks))
            self.services.append(self.jwks.run)
        self._factories = factories

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The mechanisms offered, in the order the handshake lists them."""
        return tuple(self._factories)

    def __call__(self, host: str) -> Authenticator:
        guarded = {name: partial(_guard, make, self._failed, host) for name, make in self._factories.items()}
        authenticator = Authenticator(guarded, max_reauth_ms=self._max_reauth_ms)
        if self.jwks is not None:
            authenticator.prepare_bearer = self.jwks.ensure
        return authenticator


def authenticators(
    settings: Settings, accounts: ServiceAccounts, scram: ScramCredentials | None = None
) -> Authentication | None:
    """The SASL side of the listener (a factory of each client's exchange, given the client's host),
    or None when the gateway does not authenticate its clients (PLAINTEXT and SSL listeners,
    KAFKA_MANAGED). ``scram`` is where the applied SCRAM credentials are (none when not given)."""
    if not settings.security_protocol.startswith("sasl_") or settings.security_mode == "kafka_managed":
        return None
    return Authentication(settings, accounts, scram if scram is not None else ScramCredentials())
