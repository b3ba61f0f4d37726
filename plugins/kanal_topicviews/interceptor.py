"""The interceptor that serves topic views: requests and responses that name a view are rewritten.

The plugin installs one instance, named ``topic-views``, in every gateway's pipeline while at least
one view exists (source ``topic-views``, global scope, priority :data:`PRIORITY`); its config is the
list of stored ``TopicView`` manifests. With no view, no instance runs and the gateway forwards
everything as before.

What each API gets is described in :mod:`kanal_topicviews.rewrite` (Metadata, ListOffsets,
OffsetForLeaderEpoch, Fetch) and :mod:`kanal_topicviews.groups` (offset commits and fetches).
Produce to a view is refused per partition with ``INVALID_TOPIC_EXCEPTION`` (a view is read-only;
other partitions of the request proceed); CreateTopics of a view's name gets ``TOPIC_ALREADY_EXISTS``.

The request hook keeps a *plan* per rewritten request in ``connection.state`` under the request's
correlation id; the response hook takes it back. Requests that name no view cost a scan of their
topic names and are forwarded unchanged.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, ClassVar, Final

import trio

from kanal.api import (
    ApiKey,
    ErrorCode,
    GatewayServices,
    Interceptor,
    InterceptorConfigError,
    PartitionError,
    RecordsContext,
    RecordsResult,
    Reject,
    RequestContext,
    RequestResult,
    Respond,
    ResponseContext,
    ResponseResult,
    hookimpl,
)

from . import groups, readahead, rewrite
from .connections import MissingSchema
from .runtime import Runtime, shared_runtime
from .transform import FetchFailed, next_offset
from .views import View, ViewConfigError, Views

__all__ = ["INVALID_TOPIC_EXCEPTION", "PLUGIN_NAME", "PRIORITY", "TopicViewsInterceptor"]

log = logging.getLogger("kanal_topicviews")

PLUGIN_NAME: Final = "topic-views"
#: After every default-priority interceptor: policies see the names clients use, record plugins of
#: Fetch responses (decryption...) run before the view's SQL.
PRIORITY: Final = 10_000
INVALID_TOPIC_EXCEPTION: Final = int(ErrorCode.invalid_topic_exception)
TOPIC_ALREADY_EXISTS: Final = ErrorCode.topic_already_exists
_ZERO_ID: Final = uuid.UUID(int=0)

_PLANS: Final = "topic-views.plans"
_TURN: Final = "topic-views.turn"
_PLANS_MAX: Final = 4096  # plans of requests another interceptor answered are never taken back

_COMMITS: Final = frozenset({ApiKey.OFFSET_COMMIT, ApiKey.TXN_OFFSET_COMMIT, ApiKey.OFFSET_DELETE})
_RENAMED: Final[Mapping[int, tuple[str, str, str]]] = {
    ApiKey.LIST_OFFSETS: ("name", "partitions", "partition_index"),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: ("topic", "partitions", "partition"),
}
_RESPONSE_PARTS: Final[Mapping[int, str]] = {
    ApiKey.LIST_OFFSETS: "partition_index",
    ApiKey.OFFSET_FOR_LEADER_EPOCH: "partition",
}


class TopicViewsInterceptor(Interceptor):
    """Serves topic views as virtual, read-only topics (installed by the TopicView resources)."""

    plugin_name: ClassVar[str] = PLUGIN_NAME
    description: ClassVar[str] = "Serves TopicView resources: live SQL projections of a topic, as read-only topics."
    config_schema: ClassVar[Mapping[str, Any] | None] = {
        "type": "object",
        "required": ["views"],
        "additionalProperties": False,
        "properties": {
            "views": {"type": "array", "items": {"type": "object"}, "description": "TopicView manifests"},
            "clusterId": {"type": "string", "description": "gateway cluster id (view topic ids derive from it)"},
        },
    }
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(
        {
            ApiKey.METADATA,
            ApiKey.FETCH,
            ApiKey.LIST_OFFSETS,
            ApiKey.OFFSET_FOR_LEADER_EPOCH,
            ApiKey.OFFSET_COMMIT,
            ApiKey.TXN_OFFSET_COMMIT,
            ApiKey.OFFSET_DELETE,
            ApiKey.OFFSET_FETCH,
            ApiKey.CREATE_TOPICS,
        }
    )
    response_api_keys: ClassVar[frozenset[int] | None] = request_api_keys
    # Only the responses to requests naming a view are rewritten: the others are not decoded.
    responses_on_demand: ClassVar[bool] = True

    def __init__(self, config: Mapping[str, Any], services: GatewayServices) -> None:
        super().__init__(config, services)
        cluster_id = str(config.get("clusterId") or services.cluster_id)
        # What the TopicView kind built for this gateway (decoders, helper process, read-ahead flag);
        # None for an instance configured by hand, without the kind: no registry, no read-ahead.
        self.runtime: Runtime | None = shared_runtime(services)
        decoders = self.runtime.decoders if self.runtime is not None else None
        built: list[View] = []
        for i, manifest in enumerate(config["views"]):
            try:
                built.append(View.from_manifest(manifest, cluster_id, decoders))
            except (ViewConfigError, KeyError, TypeError) as exc:
                raise InterceptorConfigError(f"views[{i}]: {exc}") from exc
        self.views = Views.of(built)
        self._id_texts = frozenset(str(v.topic_id) for v in built)
        self._reported: set[tuple[str, int, int]] = set()
        self.read_aheads_started = 0
        self.read_aheads_served = 0
        self._read_ahead_on = self.runtime is not None and self.runtime.read_ahead
        self._pool = self.runtime.pool if self._read_ahead_on and self.runtime is not None else None
        #: input topic ids this interceptor asked the cluster for (see ``_resolve_ids``)
        self._learned_ids: dict[str, uuid.UUID] = {}
        self._read_aheads: set[trio.CancelScope] = set()  # those running, cancelled by ``aclose``
        self._closed = False

    async def aclose(self) -> None:
        """Cancels the read-aheads still running and starts no more. The helper process is not this
        instance's: the plugin's interceptors share it, and the plugin closes it at shutdown."""
        self._closed = True
        for scope in self._read_aheads:
            scope.cancel()

    # -- requests --------------------------------------------------------------------------------

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        api_key = ctx.api_key
        request = ctx.request
        views = self.views
        if api_key == ApiKey.FETCH:
            if ctx.api_version >= 13:
                await self._resolve_ids(ctx, (t.topic_id for t in request.topics))
            turn = ctx.connection.state.get(_TURN, 0)
            done = rewrite.fetch_request(request, ctx.api_version, views, self._physical_id(ctx.topic_names.id), turn)
            if done is None:
                return None
            if done[1].deferred:
                ctx.connection.state[_TURN] = turn + 1
            if self._read_ahead_on:
                answer = await self._from_read_ahead(ctx, done[1])
                if answer is not None:
                    return answer
            return self._forward(ctx, done[0], done[1])
        if api_key == ApiKey.METADATA:
            meta = rewrite.metadata_request(request, ctx.api_version, views)
            if meta is None:
                return None
            return self._forward(ctx, meta[0], meta[1])
        if api_key in _RENAMED:
            key_field, parts_field, part_field = _RENAMED[api_key]
            physical_id = self._physical_id(ctx.topic_names.id)
            renamed = rewrite.rename_request(request.topics, key_field, parts_field, part_field, views, physical_id)
            if renamed is None:
                return None
            return self._forward(ctx, replace(request, topics=renamed[0]), renamed[1])
        if api_key in _COMMITS:
            if request.topics and not hasattr(request.topics[0], "name"):
                await self._resolve_ids(ctx, (t.topic_id for t in request.topics))
            committed = groups.commit_request(request, views, self._physical_id(ctx.topic_names.id))
            if committed is None or isinstance(committed, Reject):
                return committed
            return self._forward(ctx, committed[0], committed[1])
        if api_key == ApiKey.OFFSET_FETCH:
            fetched = groups.offset_fetch_request(request, views, self._physical_id(ctx.topic_names.id))
            if fetched is None:
                return None
            return self._forward(ctx, fetched[0], fetched[1])
        if api_key == ApiKey.CREATE_TOPICS:
            return self._create_topics(ctx)
        return None

    def _forward(self, ctx: RequestContext, request: Any, plan: Any) -> RequestResult:
        state = ctx.connection.state
        plans = state.get(_PLANS)
        if plans is None:
            plans = state[_PLANS] = {}
        elif len(plans) >= _PLANS_MAX:
            plans.clear()
        plans[ctx.correlation_id] = plan
        ctx.request = request
        ctx.want_response()
        return None

    def _physical_id(self, known: Callable[[str], uuid.UUID | None]) -> Callable[[str], uuid.UUID | None]:
        """The topic id of an input topic: the gateway's topic names (``known``), else those
        ``_resolve_ids`` asked the cluster for."""
        learned = self._learned_ids
        if not learned:
            return known

        def physical_id(name: str) -> uuid.UUID | None:
            found = known(name)
            return found if found is not None else learned.get(name)

        return physical_id

    async def _resolve_ids(self, ctx: RequestContext, keys: Iterable[Any]) -> None:
        """Makes sure the input topics of the views named by id have known topic ids (the gateway
        learns them from Metadata; after a restart a client may fetch before asking Metadata again)."""
        missing = []
        for key in keys:
            view = self.views.by_id.get(key) if isinstance(key, uuid.UUID) else None
            if (
                view is not None
                and ctx.topic_names.id(view.physical) is None
                and view.physical not in self._learned_ids
            ):
                missing.append(view.physical)
        if not missing:
            return
        try:
            response = await self.services.kafka.metadata(missing)
        except ConnectionError as exc:
            log.warning("cannot resolve the topic ids of %s: %s", ", ".join(missing), exc)
            return
        for topic in response.topics:
            topic_id = getattr(topic, "topic_id", None)
            if topic.name and topic_id and topic_id != _ZERO_ID:
                self._learned_ids[str(topic.name)] = topic_id

    def _create_topics(self, ctx: RequestContext) -> RequestResult:
        request = ctx.request
        taken = [t for t in request.topics if t.name in self.views.by_name]
        if not taken:
            return None
        message = f"{', '.join(t.name for t in taken)}: the name of a topic view"
        if len(taken) == len(request.topics):
            return Reject(int(TOPIC_ALREADY_EXISTS), message)
        kept = tuple(t for t in request.topics if t.name not in self.views.by_name)
        return self._forward(ctx, replace(request, topics=kept), [t.name for t in taken])

    # -- responses -------------------------------------------------------------------------------

    @hookimpl
    async def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        plans = ctx.connection.state.get(_PLANS)
        if not plans:
            return None
        plan = plans.pop(ctx.correlation_id, None)
        if plan is None:
            return None
        api_key = ctx.api_key
        response = ctx.response
        if api_key == ApiKey.FETCH:
            ctx.response = await self._fetch_response(response, plan)
            if self._read_ahead_on:
                try:
                    self._read_ahead(ctx.connection.state, plan, response, ctx.connection.node_id)
                except Exception:  # an optimisation: never worth failing the response for
                    log.exception("topic views: starting a read-ahead failed")
        elif api_key == ApiKey.METADATA:
            ctx.response = rewrite.metadata_response(response, plan)
        elif api_key in _RENAMED:
            key_field, parts_field, _ = _RENAMED[api_key]
            topics = rewrite.rename_response(response.topics, key_field, parts_field, _RESPONSE_PARTS[api_key], plan)
            ctx.response = replace(response, topics=topics)
        elif api_key in _COMMITS:
            ctx.response = replace(response, topics=groups.commit_response(response.topics, plan))
        elif api_key == ApiKey.OFFSET_FETCH:
            ctx.response = groups.offset_fetch_response(response, plan)
        elif api_key == ApiKey.CREATE_TOPICS:
            ctx.response = _add_taken(response, plan)
        return None

    async def _fetch_response(self, response: Any, plan: rewrite.FetchPlan) -> Any:
        while True:
            try:
                return rewrite.fetch_response(response, plan, self._partition)
            except MissingSchema as missing:  # a view with a schema registry met a new schema id
                await missing.load()

    # -- read-ahead (see kanal_topicviews.readahead) ----------------------------------------------

    async def _from_read_ahead(self, ctx: RequestContext, plan: rewrite.FetchPlan) -> RequestResult:
        """Respond from the read-aheads of every partition this fetch names, if they all match."""
        state = ctx.connection.state
        chains: dict[tuple[str, int], dict[int, readahead.ReadAhead]] | None = state.get(readahead.STATE)
        if not chains or plan.deferred:
            return None
        now = time.monotonic()
        isolation = getattr(plan.upstream, "isolation_level", None)
        picked: list[readahead.ReadAhead] | None = []
        for (_, index), (key, view, offset) in plan.served.items():
            chain = chains.get((view.name, index)) if view is not None else None
            ra = None
            if chain is not None:
                ra = chain.pop(offset, None)
                for stale in [o for o in chain if o < offset]:  # behind the consumer: never asked again
                    del chain[stale]
            if (
                ra is None
                or ra.key != key
                or not ra.usable(now)
                or getattr(ra.request, "isolation_level", None) != isolation
            ):
                picked = None
            elif picked is not None:
                picked.append(ra)
        if not picked:
            return None
        for ra in picked:
            if not ra.done.is_set():
                with trio.move_on_after(readahead.WAIT):
                    await ra.done.wait()
        if any(ra.response is None for ra in picked):
            return None
        response = readahead.serve(picked, "topic_id" if plan.by_id else "topic")
        self.read_aheads_served += len(picked)
        for ra in picked:  # keep the chain going from the furthest read-ahead already read
            chain = chains.get((ra.view.name, ra.partition), {})
            last = max((r for r in chain.values() if r.source is not None), key=lambda r: r.offset, default=ra)
            self._read_ahead_one(state, ra.view, ra.key, ra.physical, last.source, ra.request, plan.by_id, ra.node_id)
        return Respond(response)

    def _read_ahead(self, state: dict[str, Any], plan: rewrite.FetchPlan, response: Any, node_id: int) -> None:
        """Starts read-aheads after a broker's answer when every partition the fetch named is a view
        partition whose answer was large: only then can the next fetch be answered from them."""
        if plan.deferred or any(view is None for _, view, _ in plan.served.values()):
            return
        key_field = "topic_id" if plan.by_id else "topic"
        behind = []
        for topic in response.responses:
            physical = getattr(topic, key_field)
            for part in topic.partitions:
                served = plan.served.get((physical, int(part.partition_index)))
                if served is None or not _behind(part):
                    return
                behind.append((served, physical, part))
        if len(behind) != len(plan.served):
            return
        for (key, view, _), physical, part in behind:
            assert view is not None
            self._read_ahead_one(state, view, key, physical, part, plan.upstream, plan.by_id, node_id)

    def _read_ahead_one(
        self,
        state: dict[str, Any],
        view: View,
        key: Any,
        physical: Any,
        source: Any,
        upstream: Any,
        by_id: bool,
        node_id: int | None,
    ) -> bool:
        """Reads ahead after ``source`` (a broker's partition entry, from broker ``node_id``), unless
        the chain is long enough."""
        if self._closed or source is None or not _behind(source):
            return False
        offset = next_offset(source.records)
        if offset is None:
            return False
        index = int(source.partition_index)
        chains = state.get(readahead.STATE)
        if chains is None:
            chains = state[readahead.STATE] = {}
        chain: dict[int, readahead.ReadAhead] | None = chains.get((view.name, index))
        if chain is None:
            if len(chains) >= readahead.MAX_PARTITIONS:
                return False
            chain = chains[(view.name, index)] = {}
        if offset in chain or len(chain) >= readahead.DEPTH:
            return False
        paused = state.get(readahead.PAUSED)
        if paused and paused.get((view.name, index), 0.0) > time.monotonic():
            return False
        key_field = "topic_id" if by_id else "topic"
        request = readahead.prepare_request(upstream, key_field, physical, index, offset)
        if request is None:
            return False
        ra = readahead.ReadAhead(view, index, offset, request, key=key, physical=physical, node_id=node_id)
        chain[offset] = ra
        self.read_aheads_started += 1
        self.services.start_soon(self._run_read_ahead, ra, by_id, state, name="topic views read-ahead")
        return True

    async def _run_read_ahead(self, ra: readahead.ReadAhead, by_id: bool, state: dict[str, Any]) -> None:
        with trio.CancelScope() as scope:
            self._read_aheads.add(scope)
            try:
                await self._read_ahead_run(ra, by_id, state)
            except Exception as exc:  # a read-ahead that fails is simply not used
                log.debug("read-ahead of %s [%d] at %d failed: %s", ra.view.name, ra.partition, ra.offset, exc)
            finally:
                self._read_aheads.discard(scope)
                ra.done.set()

    async def _read_ahead_run(self, ra: readahead.ReadAhead, by_id: bool, state: dict[str, Any]) -> None:
        if self._closed:
            return
        try:
            # The broker the consumer fetched from: the partition's leader (or its preferred replica).
            response = await self.services.kafka.call(ra.request, node_id=ra.node_id)
        except ConnectionError:
            _pause(state, ra)
            raise
        (topic,) = response.responses
        (part,) = topic.partitions
        if part.error_code != ErrorCode.none or not part.records:
            _pause(state, ra)  # e.g. NOT_LEADER_OR_FOLLOWER: leadership moved since the consumer's fetch
            return
        ra.source = part
        # The broker reads the chunk after this one while the SQL runs over this one: let the new
        # read-ahead send its request before the SQL holds the loop.
        if self._read_ahead_one(state, ra.view, ra.key, ra.physical, part, ra.request, by_id, ra.node_id):
            for _ in range(4):
                await trio.sleep(0)
        plan = rewrite.FetchPlan(by_id, served={(ra.physical, ra.partition): (ra.key, ra.view, ra.offset)})
        view = ra.view
        if self._pool is not None and self._pool.usable and view.transformer.splittable:
            drop = view.on_error == "DROP"
            try:
                done: bytes | FetchFailed = await self._pool.fetch(
                    view.transformer, view.statement, drop, part.records, ra.partition, ra.offset
                )
            except FetchFailed as failed:
                done = failed
            rewritten = rewrite.fetch_response(response, plan, lambda v, p, o: self._entry(v, p, done))
        else:
            rewritten = await self._fetch_response(response, plan)
        (answer,) = rewritten.responses
        answer = replace(answer, partitions=tuple(readahead.clean_partition(p) for p in answer.partitions))
        ra.response = replace(rewritten, responses=(answer,))

    def _partition(self, view: View, partition: Any, fetch_offset: int) -> Any:
        records = partition.records
        if partition.error_code != ErrorCode.none or not records:
            return partition
        try:
            done: bytes | FetchFailed = view.transformer.fetch(records, int(partition.partition_index), fetch_offset)
        except FetchFailed as failed:
            done = failed
        return self._entry(view, partition, done)

    def _entry(self, view: View, partition: Any, done: bytes | FetchFailed) -> Any:
        """The partition entry for the view's consumer, from the transformed records or the failure."""
        if isinstance(done, FetchFailed):
            self._report(view, int(partition.partition_index), done)
            if done.records is None:  # empty, not null: librdkafka cannot parse a null records field
                return replace(partition, error_code=rewrite.CORRUPT_MESSAGE, records=b"")
            return replace(partition, records=done.records)
        return partition if done is partition.records else replace(partition, records=done)

    def _report(self, view: View, partition: int, failed: FetchFailed) -> None:
        key = (view.name, partition, failed.offset)
        if key in self._reported or failed.records is not None:
            return
        if len(self._reported) > 10_000:
            self._reported.clear()
        self._reported.add(key)
        log.warning(
            "topic view %s: partition %d fails at offset %d (onError FAIL_FETCH): %s",
            view.name,
            partition,
            failed.offset,
            failed.reason,
        )

    # -- produce ---------------------------------------------------------------------------------

    def wants_produce_records(self, topic: str) -> bool:
        """Only views (to refuse writes to them): produce to topics is forwarded as it arrives."""
        return topic in self.views.by_name or topic in self._id_texts

    @hookimpl
    def kanal_produce_records(self, ctx: RecordsContext) -> RecordsResult:
        topic = ctx.topic
        view = self.views.by_name.get(topic)
        if view is None and topic in self._id_texts:
            view = next(v for v in self.views.by_name.values() if str(v.topic_id) == topic)
        if view is None:
            return None
        return PartitionError(INVALID_TOPIC_EXCEPTION, f"{view.name} is a topic view: it is read-only")


def _pause(state: dict[str, Any], ra: readahead.ReadAhead) -> None:
    """No read-ahead of ``ra``'s partition for a while: its broker answered an error or cannot be reached."""
    paused = state.setdefault(readahead.PAUSED, {})
    paused[(ra.view.name, ra.partition)] = time.monotonic() + readahead.PAUSE


def _behind(part: Any) -> bool:
    """Whether a broker's partition answer shows a consumer that is behind: a large answer, and more
    records after it."""
    records = part.records
    if part.error_code != ErrorCode.none or not records or len(records) < readahead.MIN_BYTES:
        return False
    offset = next_offset(records)
    return offset is not None and offset < part.high_watermark


def _add_taken(response: Any, taken: list[str]) -> Any:
    cls = rewrite.item_class(type(response), "topics")
    extra = tuple(
        rewrite.make(
            cls,
            name=name,
            topic_id=rewrite.ZERO_ID,
            error_code=TOPIC_ALREADY_EXISTS,
            error_message=f"{name} is the name of a topic view",
            num_partitions=-1,
            replication_factor=-1,
            configs=None,
        )
        for name in taken
    )
    return replace(response, topics=(*response.topics, *extra))
