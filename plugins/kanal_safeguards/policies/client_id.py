"""``client-id-policy``: client ids must follow a naming convention, so that quotas, logs and
audits can tell applications apart.

Every request is checked but ApiVersions, the SASL exchange and Metadata (those a client sends
before it can do anything, and Metadata reveals no data; refusing them would only make clients
reconnect in a loop). BLOCK answers the others with ``POLICY_VIOLATION`` and the reason
(``ClientId 'x' is invalid.``) where the response has room for a message; INFO lets them through.
The decision is audited once per connection and client id, not per request (a consumer fetches
many times a second).

OVERRIDE rewrites the client id of those requests from ``clientIdTemplate`` (required with it):
the broker sees the rendered id (``{{userIp}}``, ``{{user}}``, ``{{clientId}}``, ``{{uuid}}``,
``{{vcluster}}``), the client keeps its own.
"""

from __future__ import annotations

import re
import uuid
from typing import Any, ClassVar

import msgspec

from kanal.api import (
    ApiKey,
    Connection,
    ErrorCode,
    GatewayServices,
    Reject,
    RequestContext,
    RequestResult,
    hookimpl,
)
from kanal_safeguards.base import SafeguardInterceptor
from kanal_safeguards.decisions import Action, Decisions, Violation
from kanal_safeguards.templates import compile_template, connection_variables, variables

__all__ = ["TEMPLATE_VARIABLES", "ClientIdPolicy", "ClientIdPolicyConfig", "render"]

#: What a ``clientIdTemplate`` may use, each as ``{{name}}``.
TEMPLATE_VARIABLES = ("userIp", "user", "clientId", "uuid", "vcluster")
_UNCHECKED = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE, ApiKey.METADATA})
_CHECKED = frozenset(int(k) for k in ApiKey if k not in _UNCHECKED)
_SEEN = "client-id-policy.seen"  # connection.state: the client ids already decided on it


class ClientIdPolicyConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True, dict=True):
    naming_convention: str = ".*"
    action: Action = Action.BLOCK
    client_id_template: str | None = None

    def __post_init__(self) -> None:
        try:
            self.pattern = re.compile(self.naming_convention)
        except re.error as exc:
            raise ValueError(f"namingConvention {self.naming_convention!r} is not a valid regex: {exc}") from None
        if self.client_id_template is not None:
            unknown = [v for v in variables(self.client_id_template) if v not in TEMPLATE_VARIABLES]
            if unknown:
                known = ", ".join(f"{{{{{v}}}}}" for v in TEMPLATE_VARIABLES)
                raise ValueError(f"clientIdTemplate: unknown template variable {{{{{unknown[0]}}}}} (known: {known})")
        if self.action is Action.OVERRIDE and self.client_id_template is None:
            raise ValueError("clientIdTemplate must not be null when the action is OVERRIDE")
        if self.action is Action.THROTTLE:
            raise ValueError("action THROTTLE is not one of BLOCK, INFO")


def render(template: str, connection: Connection, client_id: str | None) -> str:
    """``template`` with its ``{{variables}}`` filled in for a request of ``connection``."""
    values = {**connection_variables(connection, client_id), "uuid": str(uuid.uuid4())}
    return compile_template(template).format_map(values)


class ClientIdPolicy(SafeguardInterceptor):
    """Checks the client id of every request against ``namingConvention``."""

    plugin_name: ClassVar[str] = "client-id-policy"
    description: ClassVar[str] = "Client ids must match a naming convention."
    config_type: ClassVar[type[Any] | None] = ClientIdPolicyConfig
    request_api_keys: ClassVar[frozenset[int] | None] = _CHECKED
    config: ClientIdPolicyConfig

    def __init__(self, config: ClientIdPolicyConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._verdicts: dict[str | None, Violation | None] = {}  # by client id (bounded below)

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> RequestResult:
        client_id = ctx.client_id
        violation = self._verdict(client_id)
        if violation is None:
            return None
        if violation.action is Action.OVERRIDE:
            assert self.config.client_id_template is not None
            ctx.client_id = render(self.config.client_id_template, ctx.connection, client_id)
            violation = Violation(violation.reason, Action.OVERRIDE, "clientId", client_id, ctx.client_id)
        seen: set[str | None] = ctx.connection.state.setdefault(f"{_SEEN}.{id(self)}", set())
        decisions = Decisions([violation])
        if client_id not in seen:
            seen.add(client_id)
            self.audit(decisions, ctx.connection, clientId=client_id)
        if decisions.blocked:
            return Reject(ErrorCode.policy_violation, decisions.message)
        return None

    def _verdict(self, client_id: str | None) -> Violation | None:
        """The check of one client id, cached: every request of a client repeats it."""
        try:
            return self._verdicts[client_id]
        except KeyError:
            pass
        violation = None
        if client_id is None or not self.config.pattern.fullmatch(client_id):
            violation = Violation(
                f"ClientId '{client_id or ''}' is invalid.", self.config.action, "clientId", client_id
            )
        if len(self._verdicts) >= 4096:
            self._verdicts.clear()
        self._verdicts[client_id] = violation
        return violation

    @hookimpl
    def kanal_connection_closed(self, connection: Connection) -> None:
        connection.state.pop(f"{_SEEN}.{id(self)}", None)
