"""Service accounts as the gateway's connections look them up, and the user-pool secret.

A service account is who a client is to the gateway. A LOCAL account authenticates with a gateway
token (``POST /gateway/v2/token``); an EXTERNAL account gives a friendly name to a principal some
other authority vouches for (an OAuth ``sub``, a certificate subject), listed in its external names.
The admin API's ``GatewayServiceAccount`` kind fills a :class:`ServiceAccounts`; the listener reads it
on every authentication, so a deleted account's tokens stop working at the next login. Lookups are
plain dictionary reads, with no I/O: this module sits below the network layer.
"""

from __future__ import annotations

import base64
import binascii
import enum
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kanal.identity.tokens import MIN_SECRET_BYTES

USER_POOL_SECRET_ENV = "GATEWAY_USER_POOL_SECRET_KEY"


class AccountType(enum.StrEnum):
    """How a service account proves who it is."""

    LOCAL = "LOCAL"  # with a gateway token
    EXTERNAL = "EXTERNAL"  # with a credential checked elsewhere, mapped through its external names


@dataclass(frozen=True, slots=True)
class ServiceAccount:
    """One account: name and virtual cluster (None: the gateway's own cluster) identify it."""

    name: str
    vcluster: str | None
    type: AccountType
    external_names: tuple[str, ...] = ()

    @property
    def local(self) -> bool:
        return self.type is AccountType.LOCAL


class ServiceAccounts:
    """The accounts the admin API applied on this node, replaced whole on each change.

    One instance lives as long as the gateway; readers keep a reference to it, not to its contents,
    so a change reaches every later lookup. Replacing swaps the dictionaries in one assignment each,
    which no trio task can observe half done.
    """

    def __init__(self, accounts: Iterable[ServiceAccount] = ()) -> None:
        self._by_key: dict[tuple[str | None, str], ServiceAccount] = {}
        self._by_external: dict[str, ServiceAccount] = {}
        self.replace(accounts)

    def replace(self, accounts: Iterable[ServiceAccount]) -> list[tuple[ServiceAccount, str]]:
        """Makes ``accounts`` the whole set. An external name claimed twice stays with the first
        account in the given order; the others are returned with the reason, for their status."""
        by_key: dict[tuple[str | None, str], ServiceAccount] = {}
        by_external: dict[str, ServiceAccount] = {}
        refused: list[tuple[ServiceAccount, str]] = []
        for account in accounts:
            taken = [n for n in account.external_names if n in by_external]
            if taken:
                owner = by_external[taken[0]]
                refused.append((account, f"external name {taken[0]!r} already belongs to {describe(owner)}"))
                continue
            by_key[(account.vcluster, account.name)] = account
            for external in account.external_names:
                by_external[external] = account
        self._by_key, self._by_external = by_key, by_external
        return refused

    def get(self, name: str, vcluster: str | None = None) -> ServiceAccount | None:
        """The account ``name`` of virtual cluster ``vcluster`` (None: not in a virtual cluster)."""
        return self._by_key.get((vcluster, name))

    def by_external_name(self, name: str) -> ServiceAccount | None:
        """The EXTERNAL account that lists ``name`` (a principal from a certificate or a JWT)."""
        return self._by_external.get(name)

    def __iter__(self) -> Iterator[ServiceAccount]:
        return iter(list(self._by_key.values()))

    def __len__(self) -> int:
        return len(self._by_key)


def describe(account: ServiceAccount) -> str:
    """``'app1'`` or ``'app1' (vCluster=tenant-a)``, for messages."""
    return repr(account.name) + (f" (vCluster={account.vcluster})" if account.vcluster is not None else "")


def user_pool_secret(text: str) -> bytes:
    """The key that signs gateway tokens, from the base64 text of GATEWAY_USER_POOL_SECRET_KEY.

    Raises ValueError (without the value: it is a secret) unless the text is base64 of at least 32
    bytes, the length HS256 needs to be as strong as its hash.
    """
    compact = "".join(text.split())
    try:
        secret = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        try:  # the URL-safe alphabet, as some key generators print it
            secret = base64.b64decode(compact, altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raise ValueError("expected base64 text of at least 32 random bytes") from None
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the key must be at least {MIN_SECRET_BYTES} random bytes (256 bits) once decoded, got {len(secret)}"
        )
    return secret
