"""Who an authenticated client is to the gateway: its credential's principal, mapped through the
service accounts (and, later, its groups).

Every way of authenticating (a gateway token, SCRAM, an OAuth token, a client certificate, a
principal relayed from the cluster) ends here, so names and groups mean the same whatever the
mechanism. A principal that an EXTERNAL service account lists among its external names becomes that
account (its name and virtual cluster); any other principal stays as it is.
"""

from __future__ import annotations

from dataclasses import replace

from kanal.identity.accounts import ServiceAccounts
from kanal.protocol.sasl_mechanisms import Identity


class Directory:
    """Maps identities through the gateway's service accounts (read on every call: the admin API
    replaces their contents, never the objects)."""

    def __init__(self, accounts: ServiceAccounts) -> None:
        self.accounts = accounts

    def identify(self, identity: Identity) -> Identity:
        """The identity the connection carries for a credential's ``identity``."""
        account = self.accounts.by_external_name(identity.principal)
        if account is not None:
            identity = replace(identity, principal=account.name, vcluster=account.vcluster)
        return identity
