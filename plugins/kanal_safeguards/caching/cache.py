"""``cache``: answers Fetch requests from record batches the gateway already saw, without going
upstream.

Batches come from successful Produce requests (placed at the offsets the Produce response assigned)
and from Fetch responses, into a :class:`~.cache_store.CacheStore`. A Fetch is answered from it only
when every partition it asks for can be answered exactly as the broker would (see the store's
rules); any other Fetch goes upstream unchanged (apart from never opening a fetch session) and its
response feeds the cache. The cache does not support incremental fetch sessions: it refuses to be
created while ``GATEWAY_FEATURE_FLAGS_INCREMENTAL_FETCH_SESSIONS_ENABLED`` is true, and it turns the
fetch sessions its clients would open into sessionless fetches.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Hashable
from typing import Annotated, Any, ClassVar

import msgspec
from prometheus_client import Counter

from kanal.api import (
    ApiKey,
    ErrorCode,
    GatewayServices,
    Interceptor,
    InterceptorConfigError,
    RecordBatch,
    RequestContext,
    RequestResult,
    Respond,
    ResponseContext,
    ResponseResult,
    build,
    has_field,
    hookimpl,
    nested,
    response_class,
)
from kanal_safeguards.base import TopicMatcher
from kanal_safeguards.caching.cache_store import CachedBatch, CacheStore, Served, parse_batches

__all__ = ["INTERCEPTORS", "Cache", "CacheConfig", "CacheInterceptorConfig", "InMemConfig"]

SESSIONS_FLAG = "INCREMENTAL_FETCH_SESSIONS_ENABLED"
SESSIONS_VARIABLE = "GATEWAY_FEATURE_FLAGS_" + SESSIONS_FLAG


class InMemConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """``cacheConfig.inMemConfig``: the bounds of the in-memory cache."""

    cache_size: Annotated[int, msgspec.Meta(ge=1)] = 100 * 1024 * 1024  # bytes of record batches
    expire_time_ms: Annotated[int, msgspec.Meta(ge=1)] = 60_000


class CacheConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """``cacheConfig``: where batches are kept (IN_MEMORY only)."""

    type: str = "IN_MEMORY"
    in_mem_config: InMemConfig = msgspec.field(default_factory=InMemConfig)
    rocksdb_config: dict[str, Any] | None = None  # accepted so that ROCKSDB is refused by name


class CacheInterceptorConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """What operators write under ``config:``."""

    topic: str = ".*"
    cache_config: CacheConfig = msgspec.field(default_factory=CacheConfig)


def _metrics(services: GatewayServices) -> tuple[Counter, Counter]:
    """The hit and miss counters, registered once per gateway (instances come and go)."""
    shared = services.shared
    if "cache.metrics" not in shared:
        shared["cache.metrics"] = (
            Counter("kanal_cache_hits", "Fetch requests answered from the cache", registry=services.metrics),
            Counter("kanal_cache_misses", "Fetch requests of cached topics sent upstream", registry=services.metrics),
        )
    counters: tuple[Counter, Counter] = shared["cache.metrics"]
    return counters


def _some(cls: type, **values: Any) -> Any:
    """A kio entity from the fields its version has."""
    return build(cls, **{k: v for k, v in values.items() if has_field(cls, k)})


class Cache(Interceptor):
    """Serves Fetch requests of the matching topics from the batches it saw, when it can do so
    exactly as the broker would."""

    plugin_name: ClassVar[str] = "cache"
    description: ClassVar[str] = "Answers Fetch requests from produced and fetched record batches kept in memory."
    config_type: ClassVar[type[CacheInterceptorConfig]] = CacheInterceptorConfig
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset(
        {ApiKey.FETCH, ApiKey.PRODUCE, ApiKey.DELETE_TOPICS, ApiKey.DELETE_RECORDS}
    )
    response_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.FETCH, ApiKey.PRODUCE})
    responses_on_demand: ClassVar[bool] = True
    config: CacheInterceptorConfig

    def __init__(self, config: CacheInterceptorConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        if services.feature(SESSIONS_FLAG, False):
            raise InterceptorConfigError(
                f"{SESSIONS_VARIABLE}: the cache does not support incremental fetch sessions;"
                f" set {SESSIONS_VARIABLE}=false to use it"
            )
        kind = config.cache_config.type
        if kind == "ROCKSDB":
            raise InterceptorConfigError("cacheConfig.type: ROCKSDB is not supported by Kanal (use IN_MEMORY)")
        if kind != "IN_MEMORY":
            raise InterceptorConfigError(f"cacheConfig.type: {kind!r} is not a cache type (use IN_MEMORY)")
        mem = config.cache_config.in_mem_config
        self._matches = TopicMatcher(config.topic)
        self.store = CacheStore(mem.cache_size, mem.expire_time_ms)
        self.hits, self.misses = _metrics(services)

    @hookimpl
    async def kanal_request(self, ctx: RequestContext) -> RequestResult:
        if ctx.api_key == ApiKey.FETCH:
            return await self._fetch(ctx)
        if ctx.api_key == ApiKey.PRODUCE:
            await self._produce(ctx)
        elif ctx.api_key == ApiKey.DELETE_TOPICS:
            self._delete_topics(ctx)
        elif ctx.api_key == ApiKey.DELETE_RECORDS:
            vcluster = ctx.connection.vcluster
            for topic in ctx.request.topics:
                for part in topic.partitions:
                    self.store.drop((vcluster, str(topic.name), int(part.partition_index)))
        return None

    @hookimpl
    def kanal_response(self, ctx: ResponseContext) -> ResponseResult:
        if "fetch" in ctx.notes:
            self._fetched(ctx, ctx.notes["fetch"])
        elif "produce" in ctx.notes:
            self._produced(ctx, *ctx.notes["produce"])
        return None

    # -- Fetch --------------------------------------------------------------------------------

    async def _fetch(self, ctx: RequestContext) -> RequestResult:
        request = ctx.request
        names = [await _topic_name(ctx, topic) for topic in request.topics]
        if not any(name is not None and self._matches(name) for name in names):
            return None
        ctx.notes["fetch"] = names
        ctx.want_response()
        answer = self._answer(ctx, names)
        if answer is not None:
            self.hits.inc()
            return Respond(answer)
        self.misses.inc()
        if getattr(request, "session_id", 0) == 0 and getattr(request, "session_epoch", -1) == 0:
            ctx.request = dataclasses.replace(request, session_epoch=-1)  # no fetch session is opened
        return None

    def _answer(self, ctx: RequestContext, names: list[str | None]) -> Any:
        """The Fetch response the cache can give for every partition of the request, else None."""
        request, version = ctx.request, ctx.api_version
        replica = getattr(getattr(request, "replica_state", None), "replica_id", getattr(request, "replica_id", -1))
        if replica != -1 or getattr(request, "session_id", 0) != 0 or getattr(request, "session_epoch", -1) > 0:
            return None
        if getattr(request, "forgotten_topics_data", ()):
            return None
        isolation = int(getattr(request, "isolation_level", 0))
        if isolation not in (0, 1):
            return None
        budget = int(getattr(request, "max_bytes", 0x7FFFFFFF))
        response_type = response_class(ApiKey.FETCH, version)
        if response_type is None:
            return None
        topic_type = nested(response_type, "responses")
        partition_type = nested(topic_type, "partitions")
        vcluster, node_id = ctx.connection.vcluster, ctx.connection.node_id
        topics = []
        for topic, name in zip(request.topics, names, strict=True):
            if name is None or not self._matches(name):
                return None
            partitions = []
            for part in topic.partitions:
                if getattr(part, "last_fetched_epoch", -1) != -1 or budget <= 0:
                    return None
                key = (vcluster, name, int(part.partition))
                run = self.store.run(key)
                epoch = getattr(part, "current_leader_epoch", -1)
                if run is None or run.node_id != node_id or (epoch != -1 and epoch not in run.client_epochs):
                    return None
                limit = min(int(part.partition_max_bytes), budget)
                served = self.store.read(key, int(part.fetch_offset), limit, committed=isolation == 1)
                if served is None:
                    return None
                budget -= len(served.records)
                partitions.append(_partition(partition_type, int(part.partition), served, isolation))
            topics.append(
                _some(
                    topic_type,
                    topic=name,
                    topic_id=getattr(topic, "topic_id", None),
                    partitions=tuple(partitions),
                )
            )
        return _some(
            response_type,
            throttle_time=datetime.timedelta(0),
            error_code=ErrorCode.none,
            session_id=0,
            responses=tuple(topics),
            node_endpoints=(),
        )

    def _fetched(self, ctx: ResponseContext, names: list[str | None]) -> None:
        """Feeds the cache from a broker's Fetch response (or drops partitions it failed)."""
        request = ctx.request
        epochs: dict[tuple[str | None, int], int] = {}
        by_id: dict[Any, str | None] = {}
        for topic, name in zip(request.topics if request is not None else (), names, strict=False):
            by_id[getattr(topic, "topic_id", None)] = name
            for part in topic.partitions:
                epochs[(name, int(part.partition))] = int(getattr(part, "current_leader_epoch", -1))
        vcluster, node_id = ctx.connection.vcluster, ctx.connection.node_id
        for topic in ctx.response.responses:
            name = getattr(topic, "topic", None) or by_id.get(getattr(topic, "topic_id", None))
            if name is None:
                name = ctx.topic_names.name(topic.topic_id) if getattr(topic, "topic_id", None) else None
            if name is None or not self._matches(name):
                continue
            for part in topic.partitions:
                index = int(part.partition_index)
                key = (vcluster, name, index)
                if part.error_code != ErrorCode.none:
                    self.store.drop(key)
                    continue
                self.store.observe(
                    key,
                    high_watermark=int(part.high_watermark),
                    last_stable_offset=int(getattr(part, "last_stable_offset", -1)),
                    log_start_offset=int(getattr(part, "log_start_offset", -1)),
                    node_id=node_id,
                    client_epoch=epochs.get((name, index), -1),
                )
                batches = parse_batches(part.records, fetched=True)
                if batches:
                    self.store.add(key, batches, node_id)

    # -- Produce ------------------------------------------------------------------------------

    async def _produce(self, ctx: RequestContext) -> None:
        request = ctx.request
        acks = int(request.acks)
        if acks == 0:
            return  # no response: no offsets to place the batches at
        written: dict[tuple[str, int], bytes] = {}
        for topic in request.topic_data:
            name = getattr(topic, "name", None) or await ctx.topic_names.resolve(topic.topic_id)
            if not name or not self._matches(name):
                continue
            for part in topic.partition_data:
                if part.records:
                    written[(str(name), int(part.index))] = bytes(part.records)
        if written:
            ctx.notes["produce"] = (written, acks == -1)
            ctx.want_response()

    def _produced(self, ctx: ResponseContext, written: dict[tuple[str, int], bytes], all_acks: bool) -> None:
        """Places the written batches at the offsets the broker assigned (successful partitions only)."""
        vcluster, node_id = ctx.connection.vcluster, ctx.connection.node_id
        for topic in ctx.response.responses:
            name = getattr(topic, "name", None) or ctx.topic_names.name(topic.topic_id)
            for part in topic.partition_responses:
                records = written.get((str(name), int(part.index)))
                if records is None:
                    continue
                key = (vcluster, str(name), int(part.index))
                if part.error_code != ErrorCode.none:
                    self.store.drop(key)
                    continue
                if int(part.base_offset) < 0 or getattr(part, "log_append_time", None) is not None:
                    continue  # no offset, or timestamps the broker rewrote: left to Fetch responses
                batches = self._placed(key, records, int(part.base_offset))
                if batches:
                    self.store.add(key, batches, node_id)
                    if all_acks:
                        self.store.acknowledged(key, batches[-1].next, node_id)

    def _placed(self, key: Hashable, records: bytes, base_offset: int) -> list[CachedBatch]:
        """The produced batches with the offsets (and leader epoch) the broker gave them."""
        run = self.store.run(key)
        epoch = run.leader_epoch if run is not None else -1
        placed: list[CachedBatch] = []
        offset = base_offset
        for b in parse_batches(records, fetched=False):
            batch = RecordBatch.from_bytes(b.data)
            batch.base_offset = offset
            batch.partition_leader_epoch = epoch
            data = batch.to_bytes()
            placed.append(dataclasses.replace(b, base=offset, next=batch.next_offset, data=data, leader_epoch=epoch))
            offset = batch.next_offset
        return placed

    def _delete_topics(self, ctx: RequestContext) -> None:
        request = ctx.request
        names = {str(n) for n in getattr(request, "topic_names", ())}
        for topic in getattr(request, "topics", ()):
            name = topic.name or (ctx.topic_names.name(topic.topic_id) if topic.topic_id else None)
            if name:
                names.add(str(name))
        vcluster = ctx.connection.vcluster
        self.store.drop_where(lambda key: isinstance(key, tuple) and key[0] == vcluster and key[1] in names)


async def _topic_name(ctx: RequestContext, topic: Any) -> str | None:
    """A Fetch topic's name (v13+ names topics by id; None for an id the gateway cannot resolve)."""
    name = getattr(topic, "topic", None)
    topic_id = getattr(topic, "topic_id", None)
    if name is None and topic_id is not None:
        name = ctx.topic_names.name(topic_id) or await ctx.topic_names.resolve(topic_id)
    return str(name) if name else None


def _partition(cls: type, index: int, served: Served, isolation: int) -> Any:
    return _some(
        cls,
        partition_index=index,
        error_code=ErrorCode.none,
        high_watermark=served.high_watermark,
        last_stable_offset=served.last_stable_offset,
        log_start_offset=served.log_start_offset,
        aborted_transactions=() if isolation == 1 else None,
        preferred_read_replica=-1,
        records=served.records,
    )


INTERCEPTORS: list[type[Interceptor]] = [Cache]
