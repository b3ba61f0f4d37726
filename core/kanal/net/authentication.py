"""How a listener that authenticates its clients itself (GATEWAY_MANAGED) checks credentials.

SASL PLAIN carries a gateway token as the password (``POST /gateway/v2/token``): it must verify
with GATEWAY_USER_POOL_SECRET_KEY, name the user the client logs in as, and that user must be a
LOCAL service account (in the token's virtual cluster) when the client connects: deleting the
account stops new logins at once, whatever its tokens' lifetimes. The session lasts until the token
expires (KIP-368: the client re-authenticates with a fresh token before then).

Failed logins are counted per client host: past GATEWAY_AUTHENTICATION_MAX_FAILURES_PER_MINUTE in
the last minute, that host's logins are refused without looking at the credentials (a brute-force
guard; the client sees the same refusal as for a wrong password) until its failures age out.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from functools import partial

from kanal.config.settings import Settings
from kanal.identity.accounts import ServiceAccounts, user_pool_secret
from kanal.identity.tokens import TokenClaims, verify
from kanal.protocol.sasl_mechanisms import Identity, PlainServer
from kanal.protocol.sasl_server import Authenticator

log = logging.getLogger(__name__)


def _plain_token(secret: bytes, accounts: ServiceAccounts, username: str, password: str) -> Identity | None:
    claims = verify(password, secret)
    if not isinstance(claims, TokenClaims):
        log.info("refused a gateway token for %r: %s", username, claims.value)
        return None
    if claims.username != username:
        log.info("refused a gateway token for %r: it was issued to another user", username)
        return None
    account = accounts.get(username, claims.vcluster)
    if account is None or not account.local:
        log.info("refused a gateway token for %r: no such LOCAL service account", username)
        return None
    return Identity(username, vcluster=claims.vcluster, expires_at_ms=claims.expires_at * 1000)


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


def _guarded(
    validate: Callable[[str, str], Identity | None], failed: FailedLogins, host: str, username: str, password: str
) -> Identity | None:
    if failed.blocked(host):
        log.warning(
            "refused a login for %r from %s without checking it: %d failed logins from there in the last"
            " minute (GATEWAY_AUTHENTICATION_MAX_FAILURES_PER_MINUTE)",
            username,
            host,
            failed.limit,
        )
        return None
    identity = validate(username, password)
    if identity is None:
        failed.failed(host)
    return identity


def authenticators(settings: Settings, accounts: ServiceAccounts) -> Callable[[str], Authenticator] | None:
    """A factory of SASL exchanges for clients of the listener (given the client's host), or None
    when the gateway does not authenticate its clients (PLAINTEXT and SSL listeners, KAFKA_MANAGED)."""
    if not settings.security_protocol.startswith("sasl_") or settings.security_mode == "kafka_managed":
        return None
    assert settings.user_pool_secret_key is not None  # required in this mode (settings validation)
    token = partial(_plain_token, user_pool_secret(settings.user_pool_secret_key), accounts)
    failed = FailedLogins(settings.max_failed_logins_per_minute)

    def authenticator(host: str) -> Authenticator:
        mechanisms = {"PLAIN": partial(PlainServer, partial(_guarded, token, failed, host))}
        return Authenticator(mechanisms, max_reauth_ms=settings.max_reauth_ms)

    return authenticator
