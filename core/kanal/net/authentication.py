"""How a listener that authenticates its clients itself (GATEWAY_MANAGED) checks credentials.

SASL PLAIN carries a gateway token as the password (``POST /gateway/v2/token``): it must verify
with GATEWAY_USER_POOL_SECRET_KEY, name the user the client logs in as, and that user must be a
LOCAL service account (in the token's virtual cluster) when the client connects: deleting the
account stops new logins at once, whatever its tokens' lifetimes. The session lasts until the token
expires (KIP-368: the client re-authenticates with a fresh token before then).
"""

from __future__ import annotations

import logging
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


def authenticators(settings: Settings, accounts: ServiceAccounts) -> Callable[[], Authenticator] | None:
    """A factory of SASL exchanges for the client listener, or None when the gateway does not
    authenticate its clients (PLAINTEXT and SSL listeners, or KAFKA_MANAGED)."""
    if not settings.security_protocol.startswith("sasl_") or settings.security_mode == "kafka_managed":
        return None
    assert settings.user_pool_secret_key is not None  # required in this mode (settings validation)
    validate = partial(_plain_token, user_pool_secret(settings.user_pool_secret_key), accounts)
    mechanisms = {"PLAIN": partial(PlainServer, validate)}
    return partial(Authenticator, mechanisms, max_reauth_ms=settings.max_reauth_ms)
