"""``chargeback``: who moves how many bytes through the gateway, so a shared cluster's cost can be
split between its users.

Counts, per principal, virtual cluster, topic and client id, the record bytes and requests going in
(Produce) and out (Fetch), as Prometheus counters (``gateway_chargeback_bytes_total`` and
``gateway_chargeback_requests_total``), and writes the totals of each window (``flushIntervalInSecond``)
as JSON records to ``topicName``. Nothing is decoded record by record: Produce counts the size of each
partition's records field of the request, Fetch the size of the record batches of each partition of
the response (the Fetch response itself stays undecoded).
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Iterable, Iterator
from typing import Annotated, Any, ClassVar

import msgspec
import orjson
import trio
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from kanal.api import (
    ApiKey,
    Connection,
    ErrorCode,
    GatewayServices,
    Interceptor,
    LogError,
    RecordsContext,
    RequestContext,
    StateLog,
    UpstreamError,
    build,
    has_field,
    hookimpl,
    nested,
)

__all__ = ["MAX_SERIES", "Chargeback", "ChargebackConfig", "counted_usage"]

log = logging.getLogger(__name__)

#: Label sets kept per gateway before new topics and client ids are counted as ``_other``.
MAX_SERIES = 10_000
OTHER = "_other"
ANONYMOUS = "anonymous"
PASSTHROUGH = "passthrough"
_LABELS = ("direction", "principal", "vcluster", "topic", "client_id")
_TOTALS = "chargeback.totals"  # services.shared: the counters every chargeback interceptor adds to
_RECORDS_PER_APPEND = 1_000

# (principal, vcluster, topic, client id); a window's usage per owner: bytes in, bytes out, requests in, out
_Owner = tuple[str, str, str, str]


class ChargebackConfig(msgspec.Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    topic_name: Annotated[str, msgspec.Meta(min_length=1)]
    replication_factor: Annotated[int, msgspec.Meta(ge=-1)] = -1
    flush_interval_in_second: Annotated[float, msgspec.Meta(gt=0)] = 300


class _Totals(Collector):
    """The counters since the gateway started, by label set, shared by the chargeback interceptors
    of a gateway (a replaced interceptor's successor keeps counting on); plain dict increments on
    the hot path, Prometheus families built only when ``/metrics`` is scraped."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str, str, str], list[int]] = {}

    def key(self, direction: str, owner: _Owner) -> tuple[str, str, str, str, str]:
        """The label set of ``owner``; once :data:`MAX_SERIES` are kept, topic and client id of a
        new one become ``_other`` (principals and virtual clusters are bounded by configuration)."""
        key = (direction, *owner)
        if key not in self.counts and len(self.counts) >= MAX_SERIES:
            key = (direction, owner[0], owner[1], OTHER, OTHER)
        return key

    def add(self, key: tuple[str, str, str, str, str], size: int, requests: int) -> None:
        counts = self.counts.get(key)
        if counts is None:
            counts = self.counts[key] = [0, 0]
        counts[0] += size
        counts[1] += requests

    def describe(self) -> Iterable[Any]:
        return self._families({})

    def collect(self) -> Iterable[Any]:
        return self._families(self.counts)

    @staticmethod
    def _families(counts: dict[tuple[str, str, str, str, str], list[int]]) -> Iterator[Any]:
        size = CounterMetricFamily(
            "gateway_chargeback_bytes", "Record bytes produced (in) and fetched (out)", labels=_LABELS
        )
        requests = CounterMetricFamily(
            "gateway_chargeback_requests",
            "Produce requests (in) and Fetch responses with records (out)",
            labels=_LABELS,
        )
        for key, (n, r) in list(counts.items()):
            size.add_metric(key, n)
            requests.add_metric(key, r)
        yield size
        yield requests


def _totals(services: GatewayServices) -> _Totals:
    totals = services.shared.get(_TOTALS)
    if totals is None:
        totals = services.shared[_TOTALS] = _Totals()
        services.metrics.register(totals)
    assert isinstance(totals, _Totals)
    return totals


def counted_usage(services: GatewayServices) -> dict[tuple[str, str, str, str, str], tuple[int, int]]:
    """What the chargeback interceptors counted since the gateway started: (direction, principal,
    virtual cluster, topic, client id) -> (bytes, requests), a copy (the console pages through it).
    Empty before the first chargeback interceptor."""
    totals = services.shared.get(_TOTALS)
    if not isinstance(totals, _Totals):
        return {}
    return {key: (counts[0], counts[1]) for key, counts in list(totals.counts.items())}


def _owner(connection: Connection, topic: str, client_id: str | None) -> _Owner:
    return (connection.principal or ANONYMOUS, connection.vcluster or PASSTHROUGH, topic, client_id or "")


class Chargeback(Interceptor):
    """Counts bytes and requests per principal, virtual cluster, topic and client id; flushes each
    window's totals to ``topicName``."""

    plugin_name: ClassVar[str] = "chargeback"
    description: ClassVar[str] = "Counts bytes and requests per principal, topic and client id for chargeback."
    config_type: ClassVar[type[Any] | None] = ChargebackConfig
    # Produce: the sizes of the records fields; Fetch: a sequence number per connection, so the
    # fetch records hook counts one response per topic (Fetch requests are small to decode).
    request_api_keys: ClassVar[frozenset[int] | None] = frozenset({ApiKey.PRODUCE, ApiKey.FETCH})
    config: ChargebackConfig

    def __init__(self, config: ChargebackConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._totals = _totals(services)
        self._window: dict[_Owner, list[int]] = {}
        self._start = _now_ms()
        self._seq_key = f"chargeback.{id(self)}.fetch"  # connection.state: (fetch sequence, topics counted)
        self._log: StateLog = services.state_log(config.topic_name, compacted=False)
        self._topic_ready = False
        self._lock = trio.Lock()
        self._scope: trio.CancelScope | None = None
        self._closed = False
        services.start_soon(self._flush_periodically, name=f"chargeback flush to {config.topic_name}")

    # -- counting (the hot path: a few dict operations per topic or partition)

    def _add(self, way: int, connection: Connection, topic: str, client_id: str | None, size: int, n: int) -> None:
        """Adds to the counters and the window: ``way`` 0 is in (Produce), 1 out (Fetch)."""
        owner = _owner(connection, topic, client_id)
        totals = self._totals
        totals.add(totals.key("in" if way == 0 else "out", owner), size, n)
        window = self._window.get(owner)
        if window is None:
            if len(self._window) >= MAX_SERIES:
                owner = (owner[0], owner[1], OTHER, OTHER)
            window = self._window.setdefault(owner, [0, 0, 0, 0])
        window[way] += size
        window[2 + way] += n

    @hookimpl
    def kanal_request(self, ctx: RequestContext) -> None:
        if ctx.api_key == ApiKey.FETCH:
            state = ctx.connection.state
            state[self._seq_key] = (state.get(self._seq_key, (0, None))[0] + 1, None)
            return None
        names = ctx.topic_names
        for topic in ctx.request.topic_data:
            name = getattr(topic, "name", None)
            if name is None:  # Produce v13+ names topics by id
                name = names.name(topic.topic_id) or str(topic.topic_id)
            size = 0
            for part in topic.partition_data:
                if part.records is not None:
                    size += len(part.records)
            self._add(0, ctx.connection, name, ctx.client_id, size, 1)
        return None

    @hookimpl
    def kanal_fetch_records(self, ctx: RecordsContext) -> None:
        size = 0
        for batch in ctx.records.batches:
            size += batch.batch_length + 12  # the batch as on the wire: offset, length, the rest
        state = ctx.connection.state
        seq, counted = state.get(self._seq_key, (0, None))
        if counted is None:
            counted = set()
            state[self._seq_key] = (seq, counted)
        first = ctx.topic not in counted
        if first:
            counted.add(ctx.topic)
        self._add(1, ctx.connection, ctx.topic, ctx.client_id, size, 1 if first else 0)
        return None

    # -- flushing

    async def _flush_periodically(self) -> None:
        with trio.CancelScope() as scope:
            self._scope = scope
            if self._closed:
                return
            while True:
                await trio.sleep(self.config.flush_interval_in_second)
                try:
                    await self.flush()
                except (LogError, UpstreamError, OSError) as exc:
                    log.warning("chargeback: cannot write to %s, retrying next window: %s", self.config.topic_name, exc)

    async def flush(self) -> None:
        """Writes the totals since the last flush (one record per owner) and starts a new window;
        on failure the totals go back into the current window, so the next flush carries them."""
        async with self._lock:
            window, start, end = self._window, self._start, _now_ms()
            self._window, self._start = {}, end
            if not window:
                return
            try:
                await self._ensure_topic()
                items = [_record(owner, usage, start, end) for owner, usage in window.items()]
                for i in range(0, len(items), _RECORDS_PER_APPEND):
                    await self._log.append_many(items[i : i + _RECORDS_PER_APPEND])
            except BaseException:
                self._restore(window, start)
                raise

    def _restore(self, window: dict[_Owner, list[int]], start: int) -> None:
        for owner, usage in window.items():
            current = self._window.setdefault(owner, [0, 0, 0, 0])
            for i, n in enumerate(usage):
                current[i] += n
        self._start = start

    async def _ensure_topic(self) -> None:
        """Creates ``topicName`` (one partition, ``replicationFactor``) unless it exists, then waits
        until the cluster names its leader."""
        if self._topic_ready:
            return
        kafka = self.services.kafka
        cls = kafka.request_class(ApiKey.CREATE_TOPICS)
        topic_cls = nested(cls, "topics")
        topic = _build(
            topic_cls,
            name=self.config.topic_name,
            num_partitions=1,
            replication_factor=self.config.replication_factor,
            configs=(),
        )
        reply = await kafka.call(_build(cls, topics=(topic,), timeout=datetime.timedelta(seconds=10)), timeout=15)
        for result in reply.topics:
            if result.error_code not in (ErrorCode.none, ErrorCode.topic_already_exists):
                raise LogError(f"cannot create the chargeback topic {self.config.topic_name}: {result.error_code.name}")
        with trio.move_on_after(10):
            while not await self._has_leader():
                await trio.sleep(0.1)
        self._topic_ready = True

    async def _has_leader(self) -> bool:
        metadata = await self.services.kafka.metadata([self.config.topic_name])
        return any(
            t.name == self.config.topic_name and t.error_code == ErrorCode.none and t.partitions
            for t in metadata.topics
        )

    async def aclose(self) -> None:
        """Flushes what was counted since the last flush, then stops the periodic task."""
        self._closed = True
        if self._scope is not None:
            self._scope.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            try:
                await self.flush()
            except (LogError, UpstreamError, OSError) as exc:
                log.warning("chargeback: the last window was not written to %s: %s", self.config.topic_name, exc)
            finally:
                await self._log.aclose()


def _build(cls: type, **values: Any) -> Any:
    return build(cls, **{k: v for k, v in values.items() if has_field(cls, k)})


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _record(owner: _Owner, usage: list[int], start: int, end: int) -> tuple[bytes, bytes]:
    """One flushed record: the owner as its key, the window's usage as its value (JSON)."""
    principal, vcluster, topic, client_id = owner
    identity = {"principal": principal, "vcluster": vcluster, "topic": topic, "clientId": client_id}
    value = {
        **identity,
        "windowStart": start,
        "windowEnd": end,
        "bytesIn": usage[0],
        "bytesOut": usage[1],
        "requestsIn": usage[2],
        "requestsOut": usage[3],
    }
    return orjson.dumps(identity), orjson.dumps(value)


INTERCEPTORS: list[type[Interceptor]] = [Chargeback]
