"""Who an authenticated client is to the gateway: its credential's principal, mapped through the
service accounts, and the GatewayGroups it is in.

Every way of authenticating (a gateway token, SCRAM, an OAuth token, a client certificate, a
principal relayed from the cluster) ends here, so names and groups mean the same whatever the
mechanism. A principal vouched for elsewhere (an OAuth subject, a certificate, the cluster) that an
EXTERNAL service account lists among its external names becomes that account (its name and virtual
cluster); a LOCAL account's own login, and any other principal, stays as it is. The identity's groups are
then the GatewayGroups that principal is a member of, by name and virtual cluster, and those listing
one of the groups its credential claims as an external group (see :mod:`kanal.identity.groups`).
"""

from __future__ import annotations

from dataclasses import replace

from kanal.identity.accounts import ServiceAccounts
from kanal.identity.groups import Groups
from kanal.protocol.sasl_mechanisms import Identity


class Directory:
    """Maps identities through the gateway's service accounts and groups (read on every call: the
    admin API replaces their contents, never the objects)."""

    def __init__(self, accounts: ServiceAccounts, groups: Groups | None = None) -> None:
        self.accounts = accounts
        self.groups = Groups() if groups is None else groups

    def identify(self, identity: Identity) -> Identity:
        """The identity the connection carries for a credential's ``identity`` (whose groups are
        the groups the credential claims)."""
        account = None if identity.local else self.accounts.by_external_name(identity.principal)
        if account is not None:
            identity = replace(identity, principal=account.name, vcluster=account.vcluster)
        return replace(identity, groups=self.groups.of(identity.principal, identity.vcluster, identity.groups))
