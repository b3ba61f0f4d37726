"""Logging in with a gateway token: the one check behind SASL PLAIN on the Kafka listener and HTTP
Basic on the registry proxy, so one service account and its tokens work for both.

The token must verify with GATEWAY_USER_POOL_SECRET_KEY, be unexpired, name the user the client
logs in as, and that user must be a LOCAL service account (in the token's virtual cluster) at the
time of the login: deleting the account stops new logins at once, whatever its tokens' lifetimes.
"""

from __future__ import annotations

from kanal.identity.accounts import ServiceAccounts
from kanal.identity.tokens import TokenClaims, verify
from kanal.protocol.sasl_mechanisms import Identity


def token_login(secret: bytes, accounts: ServiceAccounts, username: str, token: str) -> Identity | str:
    """The identity of a valid login, or why it is refused (for the log: never the token)."""
    claims = verify(token, secret)
    if not isinstance(claims, TokenClaims):
        return claims.value
    if claims.username != username:
        return "it was issued to another user"
    account = accounts.get(username, claims.vcluster)
    if account is None or not account.local:
        return "no such LOCAL service account"
    return Identity(username, vcluster=claims.vcluster, expires_at_ms=claims.expires_at * 1000, local=True)
