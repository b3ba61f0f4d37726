"""A virtual cluster's names on the wire: the built-in interceptor innermost in its clients' chains.

Innermost, so every interceptor and the ACL enforcer see the tenant's logical names, and only the
cluster sees physical ones: requests are renamed after every other request hook ran, responses
before any response hook runs. APIs that cannot be scoped are refused with
CLUSTER_AUTHORIZATION_FAILED (see :mod:`kanal.tenancy.scope`), as are changes to the configs of
brokers, which every tenant shares.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, ClassVar

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map

from kanal.api.context import RequestContext, ResponseContext
from kanal.api.hookspecs import hookimpl
from kanal.api.interceptor import Interceptor
from kanal.api.results import Reject, Respond
from kanal.api.services import GatewayServices
from kanal.pipeline.wire import ResponseFix, TopicIdFix, WireRequest
from kanal.protocol.api import ApiKey, api_name
from kanal.protocol.headers import response_body_offset, response_correlation_id
from kanal.protocol.messages import decode_response, encode_response, response_type
from kanal.protocol.name_spans import produce_response_names, splice
from kanal.tenancy.apis import TOPIC_APIS
from kanal.tenancy.names import VirtualNames
from kanal.tenancy.rewrite import UNCHANGED, Rewrite, renames_response, to_logical, to_physical
from kanal.tenancy.scope import PASSED_APIS, RENAMED_APIS
from kanal.tenancy.topic_ids import VirtualTopicIds, carries_topic_ids, map_topic_ids

__all__ = ["PassthroughAliases", "VirtualClusterNames"]

_ALTERS_CONFIGS = frozenset({ApiKey.ALTER_CONFIGS, ApiKey.INCREMENTAL_ALTER_CONFIGS})
_TENANT_CONFIGS = frozenset({2, 32})  # topics and groups: renamed; anything else is the cluster's


class VirtualClusterNames(Interceptor):
    """Renames one virtual cluster's requests to physical names and its responses back."""

    plugin_name: ClassVar[str] = "kanal.virtual-cluster"
    description: ClassVar[str] = "A virtual cluster's names (built in, always innermost)."
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(api_key_map) - PASSED_APIS
    response_api_keys: ClassVar[frozenset[int] | None] = RENAMED_APIS
    responses_on_demand: ClassVar[bool] = True
    #: Renamed on the wire bytes (see :meth:`wire_request`).
    wire_api_keys: ClassVar[frozenset[int]] = frozenset({ApiKey.PRODUCE, ApiKey.FETCH})

    def __init__(
        self, names: VirtualNames, services: GatewayServices, vcluster: str, ids: VirtualTopicIds | None = None
    ) -> None:
        """``ids``: the virtual cluster's own topic ids (topic-id support on), else the physical ones."""
        super().__init__(None, services)
        self.names = names
        self.vcluster = vcluster
        self.ids = ids
        self._fixes: dict[tuple[int, int], ResponseFix] = {}  # (api key, version): built once

    def wire_request(self, request: WireRequest) -> bool:
        """Produce: the transactional id and topic names get the prefix in a splice, and the
        response's names lose it the same way. Fetch v13+ names topics by id only: nothing to do,
        but for the virtual cluster's own ids (patched in place). Fetch up to v12 carries names in
        its large responses: the decoded path renames a virtual cluster's. A request naming an alias
        is decoded (its answer names what the request did); the passthrough cluster's other
        requests need nothing."""
        header = request.header
        version = header.api_version
        aliases = self.names.aliases
        if header.api_key == ApiKey.FETCH:
            if self.names.prefix and renames_response(ApiKey.FETCH, version):
                return False
            if self.ids is not None:
                return self._fetch_ids(request)
            return not (aliases and any(span.value in aliases for span in request.names.topics))
        names = request.names
        if self.ids is not None and names.topic_ids:
            return False  # ids of its own: mapped on the decoded path
        if aliases and any(span.value in aliases for span in names.topics):
            return False  # its response names the topic as the request did: the decoded path remembers
        if not self.names.prefix:
            return True  # the passthrough cluster: only aliases are renamed
        spans = list(names.topics)
        physical = [self.names.topic(span.value) for span in spans]
        txn = names.transactional_id
        if txn is not None:
            spans.insert(0, txn)
            physical.insert(0, self.names.transactional_id(txn.value))
        if spans:
            request.frame = splice(request.frame, spans, physical, header.header_version >= 2)
        if renames_response(ApiKey.PRODUCE, version):
            request.fixes.append(self._fix(ApiKey.PRODUCE, version))
        return True

    def _fetch_ids(self, request: WireRequest) -> bool:
        """A Fetch by id with the virtual cluster's own ids: each id patched in place to the physical
        one, and back in the response (ids keep their length: nothing else moves). A request using
        an alias's id is decoded (it leaves its fetch session there)."""
        ids = self.ids
        assert ids is not None
        names = request.names
        physical = []
        for topic_id in names.topic_ids:
            physical_id, alias = ids.resolve(topic_id)
            if alias is not None:
                return False
            physical.append(physical_id)
        if physical:
            frame = bytearray(request.frame)
            for at, physical_id in zip(names.id_at, physical, strict=True):
                frame[at : at + 16] = physical_id.bytes
            request.frame = frame
        request.fixes.append(self._fix(ApiKey.FETCH, request.header.api_version))
        return True

    def _fetch_fix(self, version: int) -> ResponseFix:
        ids = self.ids
        assert ids is not None
        return TopicIdFix(version, lambda physical: ids.virtual(uuid.UUID(bytes=physical)).bytes)

    def _fix(self, api_key: int, version: int) -> ResponseFix:
        fix = self._fixes.get((api_key, version))
        if fix is None:
            build = self._logical_produce_response if api_key == ApiKey.PRODUCE else self._fetch_fix
            fix = self._fixes[(api_key, version)] = build(version)
        return fix

    def _logical_produce_response(self, version: int) -> ResponseFix:
        """The names of a Produce response of this version back to logical ones. Like requests (see
        :class:`kanal.pipeline.wire.WirePath`), the responses to a producer repeat their body's bytes
        up to the end of their only topic name: the last such part and its renaming are kept."""
        names = self.names
        flexible = version >= 9
        header_version = 1 if flexible else 0
        last: list[bytes] = [b"", b""]  # (body up to the name, renamed)

        def fix(frame: bytearray) -> bytearray:
            body = response_body_offset(frame, header_version)
            prefix, renamed = last
            end = body + len(prefix)
            if prefix and frame[body:end] == prefix:
                return frame[:body] + renamed + frame[end:]
            spans = produce_response_names(frame, version)
            logical = []
            for span in spans:
                name = names.logical_topic(span.value)
                if name is None:  # not the tenant's (no broker answers with one): as the decoded path does
                    response = decode_response(ApiKey.PRODUCE, version, frame)
                    return encode_response(
                        to_logical(ApiKey.PRODUCE, response, UNCHANGED, names), response_correlation_id(frame)
                    )
                logical.append(name)
            out = splice(frame, spans, logical, flexible)
            if len(spans) == 1:
                moved = spans[0].end + len(out) - len(frame)
                last[:] = [bytes(frame[body : spans[0].end]), bytes(out[body:moved])]
            return out

        return fix

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
        return self._rename(ctx)

    def _rename(self, ctx: RequestContext) -> Any:
        api_key = ctx.api_key
        physical, rewrite = to_physical(api_key, ctx.request, self.names)
        if rewrite.answer is not None:
            return Respond(rewrite.answer)
        if self.ids is not None:
            physical = map_topic_ids(physical, self._physical_ids(ctx.notes))
        if api_key == ApiKey.FETCH and (rewrite.aliased or "aliased ids" in ctx.notes):
            physical = _sessionless(physical)
        ctx.request = physical
        if (
            rewrite is not UNCHANGED
            or renames_response(api_key, ctx.api_version)
            or (self.ids is not None and carries_topic_ids(response_type(api_key, ctx.api_version)))
        ):
            ctx.notes["rewrite"] = rewrite
            ctx.want_response()
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> None:
        rewrite: Rewrite | None = ctx.notes.get("rewrite")
        if rewrite is None:
            return
        response = to_logical(ctx.api_key, ctx.response, rewrite, self.names)
        ids = self.ids
        if ids is not None:
            aliased: dict[uuid.UUID, uuid.UUID] = ctx.notes.get("aliased ids", {})
            response = map_topic_ids(response, lambda physical: aliased.get(physical) or ids.virtual(physical))
            if self.names.aliases:
                response = self._alias_ids(response)
        ctx.response = response

    def _physical_ids(self, notes: Any) -> Callable[[uuid.UUID], uuid.UUID]:
        """Maps a request's ids to physical ones, noting the alias ids it used (their answers keep them)."""
        ids = self.ids
        assert ids is not None

        def physical(virtual: uuid.UUID) -> uuid.UUID:
            physical_id, alias = ids.resolve(virtual)
            if alias is not None:
                notes.setdefault("aliased ids", {})[physical_id] = virtual
            return physical_id

        return physical

    def _alias_ids(self, response: Any) -> Any:
        """Topic entries named by an alias (Metadata, CreateTopics, DescribeTopicPartitions) show the
        alias's id, not the one of the topic it stands for."""
        topics = getattr(response, "topics", None)
        ids = self.ids
        if not topics or ids is None:
            return response
        changed = False
        entries = []
        for entry in topics:
            name, topic_id = getattr(entry, "name", None), getattr(entry, "topic_id", None)
            if name in self.names.aliases and topic_id is not None and topic_id.int:
                alias_id = ids.virtual(ids.physical(topic_id), name)
                if alias_id != topic_id:
                    entry, changed = replace(entry, topic_id=alias_id), True
            entries.append(entry)
        return replace(response, topics=tuple(entries)) if changed else response


def _sessionless(fetch: Any) -> Any:
    """A Fetch naming an alias, as a full fetch outside any session (KIP-227's epoch -1): the broker
    then answers for exactly the topics the request names, under the names (and ids) it used, so
    each answer is renamed from its own request; a session would bring back the alias's partitions
    later under the physical topic's name. The client reads session id 0 as "no session" and keeps
    sending full fetches."""
    if getattr(fetch, "session_epoch", None) is None or fetch.session_epoch == -1:
        return fetch
    return replace(fetch, session_id=0, session_epoch=-1)


class PassthroughAliases(VirtualClusterNames):
    """The passthrough cluster's alias topics: the same renaming with no prefix, on the APIs that
    can name a topic; nothing is refused (the cluster is the clients' own)."""

    plugin_name: ClassVar[str] = "kanal.aliases"
    description: ClassVar[str] = "The passthrough cluster's alias topics (built in, always innermost)."
    request_api_keys: ClassVar[frozenset[int] | None] = TOPIC_APIS
    response_api_keys: ClassVar[frozenset[int] | None] = TOPIC_APIS

    def __init__(self, aliases: Mapping[str, str], services: GatewayServices) -> None:
        super().__init__(VirtualNames.passthrough(aliases), services, "passthrough")

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> Any:
        return self._rename(ctx)
