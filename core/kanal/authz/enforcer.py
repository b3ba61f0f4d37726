"""The gateway's ACL enforcement: a built-in interceptor that runs before every other one.

It sits outermost in the chain of the connections whose cluster has ACLs on (the passthrough cluster
with ``GATEWAY_ACL_ENABLED``), so no interceptor sees a request the principal may not make, and
every answer it gives goes back through nothing but the core. It decides each request with
:mod:`kanal.authz.requests`, records each denial as an AUTHORIZATION audit event with the client's
connection, and answers CreateAcls, DescribeAcls and DeleteAcls itself from the ACLs it enforces
(super users, or principals allowed ALTER / DESCRIBE on the cluster, manage them).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map

from kanal.api.context import Connection, RequestContext, ResponseContext
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor
from kanal.api.results import Reject, Respond
from kanal.api.services import GatewayServices
from kanal.authz import acl_api
from kanal.authz.acl import AclBinding, user_principal
from kanal.authz.requests import OPEN, Check, Denial, Verdict, check, filter_response
from kanal.authz.store import AclDirectory, AclStoreUnavailable
from kanal.pipeline.wire import WireRequest
from kanal.protocol.acl_codes import ACL_APIS, CLUSTER_NAME, Operation, ResourceType
from kanal.protocol.api import ApiKey, api_name
from kanal.protocol.entities import build
from kanal.protocol.messages import response_type

__all__ = ["AUTHORIZATION", "FOREIGN_TOPIC", "AclEnforcer", "client_host"]

AUTHORIZATION = "AUTHORIZATION"
_ANONYMOUS = "User:ANONYMOUS"
#: What a topic id of another virtual cluster is called in decisions and audit events: never allowed.
FOREIGN_TOPIC = "<a topic of another virtual cluster>"
#: What a topic id the cluster does not know is called: let through, so the client gets the broker's
#: UNKNOWN_TOPIC_ID (retriable: it refreshes its metadata), as from Kafka, which cannot authorize a
#: name it cannot find, and never a TOPIC_AUTHORIZATION_FAILED because a name lookup failed.
UNKNOWN_TOPIC = "<a topic id the cluster does not know>"
_UNAVAILABLE = ErrorCode.request_timed_out  # retriable: the client's library tries again
_DECLARED = "the ACLs of virtual cluster {!r} are those of its VirtualCluster resource (aclMode REST_API)"


def client_host(address: str) -> str:
    """The host of ``host:port`` (an IPv6 host may come with or without brackets)."""
    host = address.rpartition(":")[0] or address
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class AclEnforcer(Interceptor):
    """Enforces the ACLs of one cluster (None: the passthrough one) on its connections."""

    plugin_name: ClassVar[str] = "kanal.acls"
    description: ClassVar[str] = "The gateway's ACLs (GATEWAY_ACL_ENABLED): built in, always outermost."
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(api_key_map) - OPEN
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset(api_key_map) - OPEN
    responses_on_demand: ClassVar[bool] = True
    #: Checked on the wire bytes when everything is allowed (see :meth:`wire_request`).
    wire_api_keys: ClassVar[frozenset[int]] = frozenset({ApiKey.PRODUCE, ApiKey.FETCH})

    def __init__(
        self,
        directory: AclDirectory,
        services: GatewayServices,
        vcluster: str | None = None,
        logical_topic: Callable[[str], str | None] | None = None,
        resolve_id: Callable[[uuid.UUID], tuple[uuid.UUID, str | None]] | None = None,
    ) -> None:
        """``logical_topic`` names a physical topic in the virtual cluster (None: another's): a topic
        a request names by id is checked under the name the tenant's ACLs use. ``resolve_id``: the
        physical id of one of the virtual cluster's own topic ids, and the alias it is the id of
        (topic-id support on)."""
        super().__init__(None, services)
        self.directory = directory
        self.vcluster = vcluster
        self._topic_names = services.topic_names
        self._logical_topic = logical_topic
        self._resolve_id = resolve_id

    def _decide(self, connection: Connection) -> Check:
        """The decisions for this connection's principal and host, against the cluster's ACLs now."""
        authorizer = self.directory.authorizer(self.vcluster)
        principal = _principal(connection)
        host = client_host(connection.client_address)

        def decide(operation: Operation, resource_type: ResourceType, name: str) -> bool:
            if name == FOREIGN_TOPIC:
                return False
            if name == UNKNOWN_TOPIC:
                return True
            return authorizer.allows(principal, host, operation, resource_type, name)

        def decide_any(operation: Operation, resource_type: ResourceType) -> bool:
            return authorizer.allows_any(principal, host, operation, resource_type)

        return Check(decide, decide_any)

    def wire_request(self, request: WireRequest) -> bool:
        """A Produce or Fetch whose every name is allowed goes on undecoded (the common case); any
        denial, a follower's fetch or a topic id not yet named takes :meth:`kanal_request`, which
        answers exactly what was denied and audits it."""
        names = request.names
        if names.follower:
            return False
        allows = self.directory.authorizer(self.vcluster).allows
        info = request.info
        principal, host = _principal(info), client_host(info.client_address)
        topic = ResourceType.TOPIC
        operation = Operation.WRITE if request.header.api_key == ApiKey.PRODUCE else Operation.READ
        txn = names.transactional_id
        if txn is not None and not allows(principal, host, Operation.WRITE, ResourceType.TRANSACTIONAL_ID, txn.value):
            return False
        for span in names.topics:
            if not allows(principal, host, operation, topic, span.value):
                return False
        for topic_id in names.topic_ids:
            physical, name = self._physical(topic_id)
            if name is None:
                name = self._topic_names.name(physical)
                if name is not None and self._logical_topic is not None:
                    name = self._logical_topic(name)
            if name is None or not allows(principal, host, operation, topic, name):
                return False
        return True

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> Any:
        decide = self._decide(ctx.connection)
        if ctx.api_key in ACL_APIS:
            return await self._acl_api(ctx, decide)
        response_cls = response_type(ctx.api_key, ctx.api_version)
        names = await self._names(ctx.request)
        verdict = check(ctx.api_key, ctx.request, response_cls, decide, lambda entry: _topic_name(entry, names))
        if verdict.allowed:
            return None
        self._audit(ctx, verdict.denied)
        if verdict.error is not None:
            return Reject(verdict.error, _message(verdict.denied))
        if verdict.request is None:
            return Respond(_with_extra(build(response_cls), verdict))
        ctx.request = verdict.request
        ctx.notes["verdict"] = verdict
        ctx.notes["decide"] = decide
        ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> None:
        verdict: Verdict | None = ctx.notes.get("verdict")
        if verdict is None:
            return
        response = _with_extra(ctx.response, verdict)
        if verdict.filtered:
            # the request as this enforcer let it go (inner interceptors may have changed ctx.request)
            request = verdict.request if verdict.request is not None else ctx.request
            decide: Check = ctx.notes["decide"]
            response = filter_response(ctx.api_key, request, response, decide.decide)
        ctx.response = response

    async def _names(self, request: Any) -> dict[uuid.UUID, str]:
        """Names of the topics a request names by id only (Produce, Fetch v13+; Metadata, DeleteTopics
        by id), from the gateway's cache or the cluster."""
        names: dict[uuid.UUID, str] = {}
        for field_name in ("topic_data", "topics"):
            for entry in getattr(request, field_name, None) or ():
                topic_id = getattr(entry, "topic_id", None)
                if topic_id is not None and not _named(entry) and topic_id not in names:
                    physical, alias = self._physical(topic_id)
                    if alias is not None:
                        names[topic_id] = alias
                        continue
                    name = self._topic_names.name(physical) or await self._topic_names.resolve(physical)
                    if name == str(physical):  # (what resolve answers for an id nobody could name)
                        name = UNKNOWN_TOPIC
                    elif self._logical_topic is not None:
                        name = self._logical_topic(name) or FOREIGN_TOPIC
                    names[topic_id] = name
        return names

    def _physical(self, topic_id: uuid.UUID) -> tuple[uuid.UUID, str | None]:
        """The physical id of a request's topic id, and the alias it is the id of."""
        return (topic_id, None) if self._resolve_id is None else self._resolve_id(topic_id)

    def _audit(self, ctx: RequestContext, denied: list[Denial]) -> None:
        for denial in dict.fromkeys(denied):
            self.services.audit(
                AUTHORIZATION,
                ctx.connection,
                {
                    "apiKey": api_name(ctx.api_key),
                    "operation": denial.operation.name,
                    "resourceType": denial.resource_type.name,
                    "resourceName": denial.name,
                    "decision": "DENIED",
                },
            )

    async def _acl_api(self, ctx: RequestContext, decide: Check) -> Any:
        api_key, version, request = ctx.api_key, ctx.api_version, ctx.request
        operation = Operation.DESCRIBE if api_key == ApiKey.DESCRIBE_ACLS else Operation.ALTER
        allowed = decide(operation, ResourceType.CLUSTER, CLUSTER_NAME)
        if not allowed:
            self._audit(ctx, decide.denied)
        denied = ErrorCode.cluster_authorization_failed
        if api_key == ApiKey.DESCRIBE_ACLS:
            if not allowed:
                return Reject(denied, _message(decide.denied))
            found = self.directory.acls(self.vcluster).matching(acl_api.describe_filter(request))
            return Respond(acl_api.describe_response(version, found))
        declared = self.directory.declares(self.vcluster)
        if declared:  # aclMode REST_API: the VirtualCluster resource holds them
            denied = ErrorCode.invalid_request
        if api_key == ApiKey.CREATE_ACLS:
            wanted = acl_api.creations(request)
            if not allowed or declared:
                reason = _DECLARED.format(self.vcluster) if allowed else _message(decide.denied)
                return Respond(acl_api.create_response(version, [reason] * len(wanted), denied))
            valid = [acl for acl in wanted if isinstance(acl, AclBinding)]
            try:
                await self.directory.create(valid, self.vcluster)
            except AclStoreUnavailable as exc:
                return Respond(acl_api.create_response(version, [str(exc)] * len(wanted), _UNAVAILABLE))
            return Respond(acl_api.create_response(version, [None if isinstance(a, AclBinding) else a for a in wanted]))
        filters = acl_api.delete_filters(request)
        if not allowed or declared:
            return Respond(acl_api.delete_response(version, [[] for _ in filters], denied))
        try:
            deleted = await self.directory.delete(filters, self.vcluster)
        except AclStoreUnavailable:
            return Respond(acl_api.delete_response(version, [[] for _ in filters], _UNAVAILABLE))
        return Respond(acl_api.delete_response(version, deleted))


def _principal(connection: Connection) -> str:
    return user_principal(connection.principal) if connection.principal else _ANONYMOUS


def _named(entry: Any) -> bool:
    return bool(getattr(entry, "name", None) or getattr(entry, "topic", None))


def _topic_name(entry: Any, names: dict[uuid.UUID, str]) -> str:
    if isinstance(entry, str):
        return entry
    name = getattr(entry, "name", None) or getattr(entry, "topic", None)
    if name:
        return str(name)
    return names.get(getattr(entry, "topic_id", None), "")  # type: ignore[arg-type]


def _with_extra(response: Any, verdict: Verdict) -> Any:
    """The response with the error entries of the denied part of the request."""
    if not verdict.extra:
        return response
    added: dict[str, list[Any]] = {}
    for field_name, entry in verdict.extra:
        added.setdefault(field_name, []).append(entry)
    return replace(response, **{name: (*getattr(response, name), *entries) for name, entries in added.items()})


def _message(denied: list[Denial]) -> str:
    if not denied:
        return "not authorized"
    first = denied[0]
    return f"not authorized to {first.operation.name} {first.resource_type.name} {first.name!r}"
