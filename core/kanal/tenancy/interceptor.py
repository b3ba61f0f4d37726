"""A virtual cluster's names on the wire: the built-in interceptor innermost in its clients' chains.

Innermost, so every interceptor and the ACL enforcer see the tenant's logical names, and only the
cluster sees physical ones: requests are renamed after every other request hook ran, responses
before any response hook runs. APIs that cannot be scoped are refused with
CLUSTER_AUTHORIZATION_FAILED (see :mod:`kanal.tenancy.scope`), as are changes to the configs of
brokers, which every tenant shares.
"""

from __future__ import annotations

from typing import Any, ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map

from kanal.api.context import RequestContext, ResponseContext
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor
from kanal.api.results import Reject, Respond
from kanal.api.services import GatewayServices
from kanal.protocol.api import ApiKey, api_name
from kanal.tenancy.names import VirtualNames
from kanal.tenancy.rewrite import UNCHANGED, Rewrite, renames_response, to_logical, to_physical
from kanal.tenancy.scope import PASSED_APIS, RENAMED_APIS

__all__ = ["VirtualClusterNames"]

_ALTERS_CONFIGS = frozenset({ApiKey.ALTER_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS})
_TENANT_CONFIGS = frozenset({2, 32})  # topics and groups: renamed; anything else is the cluster's


class VirtualClusterNames(Interceptor):
    """Renames one virtual cluster's requests to physical names and its responses back."""

    plugin_name: ClassVar[str] = "kanal.virtual-cluster"
    description: ClassVar[str] = "A virtual cluster's names (built in, always innermost)."
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(api_key_map) - PASSED_APIS
    response_api_keys: ClassVar[frozenset[int] | None] = RENAMED_APIS
    responses_on_demand: ClassVar[bool] = True

    def __init__(self, names: VirtualNames, services: GatewayServices, vcluster: str) -> None:
        super().__init__(None, services)
        self.names = names
        self.vcluster = vcluster

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> Any:
        api_key = ctx.api_key
        if api_key not in RENAMED_APIS:
            return Reject(
                ErrorCode.cluster_authorization_failed,
                f"{api_name(api_key)} acts on the whole cluster: not allowed in virtual cluster {self.vcluster!r}",
            )
        if api_key in _ALTERS_CONFIGS and any(
            int(r.resource_type) not in _TENANT_CONFIGS for r in ctx.request.resources
        ):
            return Reject(
                ErrorCode.cluster_authorization_failed,
                f"broker configs are the whole cluster's: not allowed in virtual cluster {self.vcluster!r}",
            )
        physical, rewrite = to_physical(api_key, ctx.request, self.names)
        if rewrite.answer is not None:
            return Respond(rewrite.answer)
        ctx.request = physical
        if rewrite is not UNCHANGED or renames_response(api_key, ctx.api_version):
            ctx.notes["rewrite"] = rewrite
            ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> None:
        rewrite: Rewrite | None = ctx.notes.get("rewrite")
        if rewrite is not None:
            ctx.response = to_logical(ctx.api_key, ctx.response, rewrite, self.names)
