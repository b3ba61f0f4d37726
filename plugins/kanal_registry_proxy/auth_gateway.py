"""The gateway provider (``AUTH_PROVIDER=gateway``): one identity for Kafka and registry traffic.

A client sends HTTP Basic credentials made of its service account's name and a gateway token
(``POST /gateway/v2/token``), the same pair it logs in to the Kafka listener with (SASL PLAIN). The
gateway that hosts the proxy checks them (:attr:`kanal.api.GatewayServices.identities`): the token
must verify with GATEWAY_USER_POOL_SECRET_KEY, be unexpired, name that user, and the user must be a
LOCAL service account at the time of the request. The principal is the account's name, so the
registry's authorization and the gateway's interceptor scopes speak of the same names.

A token check is one HMAC and a dictionary lookup, a few microseconds: unlike bcrypt, nothing is
cached, so a deleted account or an expired token is refused at its very next request.
"""

from __future__ import annotations

import trio

from kanal.api import Identities
from kanal_registry_proxy.auth_basic import parse_basic_header
from kanal_registry_proxy.metrics import ProxyMetrics


class GatewayTokenAuthenticator:
    """HTTP Basic with a gateway token as the password, checked by the hosting gateway."""

    provider = "gateway"
    challenge = 'Basic realm="kanal-registry-proxy"'

    def __init__(self, identities: Identities, metrics: ProxyMetrics) -> None:
        self.identities = identities
        self.metrics = metrics

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Nothing to load or refresh: the gateway holds the accounts and the key."""
        task_status.started()
        await trio.sleep_forever()

    async def authenticate(self, header: str | None) -> str | None:
        """The principal (the service account's name) for a valid token, else None."""
        credentials = parse_basic_header(header)
        if credentials is None:
            self.metrics.authenticated(self.provider, "malformed")
            return None
        username, password = credentials
        try:
            token = password.decode("ascii")
        except UnicodeDecodeError:  # a token is base64url text: anything else cannot be one
            token = None
        principal = self.identities.verify_token(username, token) if token else None
        self.metrics.authenticated(self.provider, "failure" if principal is None else "success")
        return None if principal is None else principal.name
