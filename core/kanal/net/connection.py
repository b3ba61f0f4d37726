"""One client connection: requests in, through the chain, upstream; responses back, in order.

Two tasks per connection. The reader takes frames from the client, runs request hooks and sends
them upstream, queueing one entry per expected response. The writer takes entries in that same
order and answers each one, either with the next upstream frame (a broker answers one connection
in request order) or with a response the gateway built itself. So ordering is structural, and the
bounded queue is the backpressure: a client that stops reading stops the writer, the queue fills
and the reader stops reading from it.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

import trio
from kio.schema.errors import ErrorCode

from kanal.metrics import GatewayMetrics
from kanal.net.channel import STREAM_FROM, KafkaChannel, next_read_size, receive_rest, relay
from kanal.net.forward import PeerClosed
from kanal.pipeline.chain import ResolvedChain
from kanal.pipeline.context import Connection, RecordsContext, RequestContext, ResponseContext
from kanal.pipeline.results import Close, PartitionError, Reject, Respond
from kanal.protocol.api import ApiKey, api_name, request_class, response_class
from kanal.protocol.api_versions import intersect
from kanal.protocol.entities import build, has_field, nested
from kanal.protocol.error_responses import error_response
from kanal.protocol.framing import FrameReader, FrameTooLarge, InvalidFrame
from kanal.protocol.headers import (
    InvalidHeader,
    RequestHeader,
    parse_request_header,
    produce_acks,
    produce_topics,
    response_correlation_id,
    set_request_correlation_id,
    set_response_correlation_id,
)
from kanal.protocol.messages import (
    decode_request_body,
    decode_response,
    encode_request,
    encode_response,
    response_type,
)
from kanal.protocol.records import RecordSet
from kanal.protocol.rewrite import broker_addresses, carries_addresses, rewrite_addresses
from kanal.protocol.scan import NEUTRAL_TAG, ResponseScan, has_node_endpoints, node_endpoints_entry, scans

if TYPE_CHECKING:
    from kanal.gateway import Gateway

log = logging.getLogger(__name__)

# Responses the core itself must see: address rewriting, version negotiation, topic-id learning.
_CORE_RESPONSES = frozenset({ApiKey.API_VERSIONS, ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER, ApiKey.FIND_COORDINATOR})


class FrameTap(Protocol):
    """Sees every frame a connection moves (for capture): ``direction`` is ``c2g`` (client to
    gateway), ``g2u`` (gateway to upstream), ``u2g`` or ``g2c``. Frames are without length prefix
    and must not be kept without copying."""

    def __call__(self, connection: Connection, direction: str, frame: bytes | bytearray) -> None: ...


class ProtocolViolation(Exception):
    """The client or the upstream broke the protocol; the connection is closed."""


@dataclass(slots=True)
class Pending:
    """One expected response, in request order."""

    client_corr: int
    api_key: int
    api_version: int
    client_id: str | None
    upstream_corr: int = -1
    local: bytearray | None = None
    decode: bool = False
    request: Any = None
    partition_errors: list[tuple[str, Any, int, PartitionError]] = field(default_factory=list)
    started: float = 0.0
    forwarded: float = 0.0


def _needs_response_decode(chain: ResolvedChain, api_key: int, version: int) -> bool:
    """Produce and Fetch responses are decoded for the core only when a scan finds leader hints."""
    return api_key in _CORE_RESPONSES or chain.decode_response(api_key)


async def _run_hooks(hooks: list[Any], ctx: Any) -> Any:
    """Calls hooks in order until one returns a result; awaits async ones."""
    for hook in hooks:
        result = hook(ctx)
        if inspect.isawaitable(result):
            result = await result
        if result is not None:
            return result
    return None


async def _run_timed_hooks(
    hooks: list[Any], ctx: Any, stage: str, api_key: int, chain: ResolvedChain, metrics: GatewayMetrics
) -> Any:
    """:func:`_run_hooks` with each hook's time recorded (lifecycle metrics)."""
    for hook in hooks:
        began = time.perf_counter()
        result = hook(ctx)
        if inspect.isawaitable(result):
            result = await result
        metrics.stage(stage, api_key, chain.name_of(hook), time.perf_counter() - began)
        if result is not None:
            return result
    return None


class ClientConnection:
    """Owns one client stream and its upstream channel."""

    def __init__(self, gateway: Gateway, stream: trio.abc.Stream, info: Connection) -> None:
        self.gateway = gateway
        self.client = stream
        self.info = info
        self.upstream: KafkaChannel | None = None
        self._next_corr = 0
        # Upstream correlation ids of acks=0 produces: Kafka never answers them, some brokers do.
        self._unanswered: deque[int] = deque()
        self._chain_version = -1
        self._chain: ResolvedChain | None = None
        self._identity: tuple[str | None, tuple[str, ...], str | None] = (None, (), None)
        self._read_scope = trio.CancelScope()
        self._reader = FrameReader(gateway.settings.max_frame_size)

    # -- lifecycle ---------------------------------------------------------------------------

    async def _hooks(self, hooks: list[Any], ctx: Any, stage: str, api_key: int, chain: ResolvedChain) -> Any:
        if not hooks:
            return None
        metrics = self.gateway.metrics
        if metrics.lifecycle is None:
            return await _run_hooks(hooks, ctx)
        return await _run_timed_hooks(hooks, ctx, stage, api_key, chain, metrics)

    def _fields(self) -> dict[str, Any]:
        """Structured fields of this connection's log lines (shown by the JSON log format)."""
        info = self.info
        return {
            "connection_id": info.id,
            "client_address": info.client_address,
            "client_id": info.client_id,
            "principal": info.principal,
            "listener_address": info.listener_address,
        }

    def drain(self) -> None:
        """Stops reading new requests; in-flight ones are still answered."""
        self._read_scope.cancel()

    def chain(self) -> ResolvedChain:
        """The chain for this connection, resolved again when the interceptors or the client's
        identity (principal, groups, virtual cluster) change."""
        pipeline = self.gateway.pipeline
        info = self.info
        identity = (info.principal, info.groups, info.vcluster)
        if self._chain is None or self._chain_version != pipeline.version or self._identity != identity:
            self._chain = pipeline.resolve(*identity)
            self._chain_version = pipeline.version
            self._identity = identity
        return self._chain

    async def run(self) -> None:
        gateway = self.gateway
        try:
            self.upstream = await gateway.connect_upstream(self.info.node_id)
        except ConnectionError as exc:
            log.warning(
                "closing client %s: upstream unavailable: %s", self.info.client_address, exc, extra=self._fields()
            )
            gateway.metrics.upstream_error()
            await self.client.aclose()
            return
        gateway.metrics.upstream_connections.inc()
        send, receive = trio.open_memory_channel[Pending](gateway.settings.max_in_flight)
        try:
            for hook in self.chain().opened:
                await _maybe_await(hook(self.info))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_client, send, nursery.cancel_scope)
                nursery.start_soon(self._write_client, receive, nursery.cancel_scope)
        finally:
            with trio.CancelScope(shield=True):
                await self.client.aclose()
                await self.upstream.aclose()
                gateway.metrics.upstream_connections.dec()
                for hook in self.chain().closed:
                    try:
                        await _maybe_await(hook(self.info))
                    except Exception:
                        log.exception("connection_closed hook failed", extra=self._fields())

    async def _read_client(self, send: trio.MemorySendChannel[Pending], scope: trio.CancelScope) -> None:
        async with send:
            with self._read_scope:
                try:
                    while True:
                        data = await self.client.receive_some(next_read_size(self._reader))
                        if not data:
                            return
                        for frame in self._reader.feed(data):
                            if self.gateway.tap is not None:
                                self.gateway.tap(self.info, "c2g", frame)
                            await self._handle_request(frame, send)
                        partial = self._reader.peek_partial()
                        if partial is not None and partial[0] >= STREAM_FROM and len(partial[1]) >= _STREAM_HEAD:
                            self._reader.take_partial()
                            if self._may_stream(*partial):
                                await self._handle_request(partial[1], send, partial[0])
                                continue
                            frame = await receive_rest(self.client, *partial)
                            if self.gateway.tap is not None:
                                self.gateway.tap(self.info, "c2g", frame)
                            await self._handle_request(frame, send)
                except (FrameTooLarge, InvalidFrame, InvalidHeader, ProtocolViolation) as exc:
                    log.warning("closing client %s: %s", self.info.client_address, exc, extra=self._fields())
                    scope.cancel()
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    scope.cancel()
                except Exception:
                    log.exception(
                        "closing client %s: request handling failed", self.info.client_address, extra=self._fields()
                    )
                    scope.cancel()

    async def _write_client(self, receive: trio.MemoryReceiveChannel[Pending], scope: trio.CancelScope) -> None:
        assert self.upstream is not None
        metrics = self.gateway.metrics
        try:
            async with receive:
                async for pending in receive:
                    if pending.local is not None:
                        out = pending.local
                    else:
                        streamable = not pending.decode and self.gateway.tap is None
                        head = await self._upstream_response(pending.upstream_corr, streamable)
                        if metrics.lifecycle is not None:
                            metrics.stage("upstream", pending.api_key, "", time.perf_counter() - pending.forwarded)
                        if isinstance(head, tuple):  # a large response still arriving: cut through
                            await self._relay_response(pending, *head)
                            metrics.streamed_response(pending.api_key)
                            metrics.response(pending.api_key, head[0], time.perf_counter() - pending.started)
                            continue
                        out = await self._process_response(pending, head)
                        set_response_correlation_id(out, pending.client_corr)
                    if self.gateway.tap is not None:
                        self.gateway.tap(self.info, "g2c", out)
                    await _send_frame(self.client, out)
                    metrics.response(pending.api_key, len(out), time.perf_counter() - pending.started)
        except PeerClosed:
            log.info("upstream closed the connection of client %s", self.info.client_address, extra=self._fields())
            metrics.upstream_error()
            scope.cancel()
        except (ProtocolViolation, FrameTooLarge, InvalidFrame) as exc:
            log.warning("closing client %s: %s", self.info.client_address, exc, extra=self._fields())
            scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            scope.cancel()
        except Exception:
            log.exception("closing client %s: response handling failed", self.info.client_address, extra=self._fields())
            scope.cancel()

    async def _upstream_response(self, expected: int, streamable: bool = False) -> bytearray | tuple[int, bytearray]:
        """The upstream frame answering ``expected``, skipping answers to acks=0 produces. When
        ``streamable``, a frame still arriving comes back as ``(size, first bytes)`` for cut-through."""
        assert self.upstream is not None
        unanswered = self._unanswered
        while True:
            head = await (self.upstream.receive_head() if streamable else self.upstream.receive_frame())
            first = head[1] if isinstance(head, tuple) else head
            if not isinstance(head, tuple) and self.gateway.tap is not None:
                self.gateway.tap(self.info, "u2g", head)
            corr = response_correlation_id(first)
            if corr == expected:
                while unanswered and _sent_before(unanswered[0], expected):
                    unanswered.popleft()  # never answered, as Kafka specifies
                return head
            if unanswered and corr == unanswered[0]:
                unanswered.popleft()
                if isinstance(head, tuple):
                    await relay(self.upstream.stream, _Discard(), head[0], head[1])
                continue
            raise ProtocolViolation(f"upstream answered correlation id {corr}, expected {expected}")

    async def _relay_response(self, pending: Pending, size: int, head: bytearray) -> None:
        """Forwards a response while it arrives. Produce and Fetch responses that may carry KIP-951
        leader hints are scanned on the way, and their last part (where the hints would be) is
        kept back until it is whole."""
        assert self.upstream is not None
        set_response_correlation_id(head, pending.client_corr)
        api_key, version = pending.api_key, pending.api_version
        if not scans(api_key, version):
            await relay(self.upstream.stream, self.client, size, head)
            return

        def finish(tail: bytearray) -> bytearray:
            try:
                where = node_endpoints_entry(tail)
            except (IndexError, ValueError) as exc:
                raise ProtocolViolation(f"malformed {api_name(api_key)} response from upstream: {exc}") from exc
            if where is not None:
                # Too late to rewrite (the length went out first): hide the hints under a tag no
                # client knows; clients skip it and ask the gateway for Metadata instead.
                tail[where] = NEUTRAL_TAG
                log.info(
                    "dropped KIP-951 leader hints from a streamed %s response", api_name(api_key), extra=self._fields()
                )
            return tail

        await relay(self.upstream.stream, self.client, size, head, ResponseScan(api_key, version), finish)

    # -- requests ----------------------------------------------------------------------------

    def _upstream_corr(self) -> int:
        self._next_corr = (self._next_corr + 1) & 0x7FFFFFFF
        return self._next_corr

    def _may_stream(self, size: int, head: bytearray) -> bool:
        """A large request (its header in) that no hook needs is forwarded while it arrives."""
        if self.gateway.tap is not None:
            return False
        return not self._decodes(self.chain(), parse_request_header(head), head)

    def _decodes(self, chain: ResolvedChain, header: RequestHeader, frame: bytearray) -> bool:
        """Whether a hook needs this request decoded (``frame``: the request, or its first bytes).
        A Produce request only for topics that no records hook wants is not."""
        api_key = header.api_key
        if api_key != ApiKey.PRODUCE or not chain.produce_records:
            return chain.decode_request(api_key)
        topics = produce_topics(frame, header)
        names: list[str] | None = None
        if topics is not None:
            names = []
            for topic in topics:
                name = topic if isinstance(topic, str) else self.gateway.topic_names.name(topic)
                if name is None:  # an id this gateway has not seen named: decode, the hooks decide
                    return True
                names.append(name)
        return chain.decode_produce(names)

    async def _handle_request(
        self, frame: bytearray, send: trio.MemorySendChannel[Pending], streamed_size: int | None = None
    ) -> None:
        """Handles one request. With ``streamed_size``, ``frame`` is only the start of a large frame
        still arriving, which is forwarded while it arrives (only for requests no hook decodes)."""
        header = parse_request_header(frame)
        api_key, version = header.api_key, header.api_version
        if request_class(api_key, version) is None and api_key != ApiKey.API_VERSIONS:
            # The gateway never offers such a version (ApiVersions is answered by the broker
            # even for versions it does not know, as clients rely on that to negotiate).
            raise ProtocolViolation(f"unsupported request: api key {api_key} version {version}")
        started = time.perf_counter()
        self.info.client_id = header.client_id
        self.gateway.metrics.request(api_key, len(frame) if streamed_size is None else streamed_size)
        chain = self.chain()
        if streamed_size is None and self._decodes(chain, header, frame):  # (streamed: no hook needs it)
            await self._intercept_request(frame, header, chain, send, started)
            return
        expects = api_key != ApiKey.PRODUCE or produce_acks(frame, header) != 0
        upstream_corr = self._upstream_corr()
        set_request_correlation_id(frame, upstream_corr)
        if expects:
            await send.send(
                Pending(
                    header.correlation_id,
                    api_key,
                    version,
                    header.client_id,
                    upstream_corr,
                    decode=_needs_response_decode(chain, api_key, version),
                    started=started,
                    forwarded=time.perf_counter(),
                )
            )
        else:
            self._unanswered.append(upstream_corr)
        if streamed_size is None:
            await self._send_upstream(frame)
        else:
            assert self.upstream is not None
            await relay(self.client, self.upstream.stream, streamed_size, frame)
            self.gateway.metrics.streamed_request(api_key)

    async def _send_upstream(self, frame: bytearray) -> None:
        assert self.upstream is not None
        if self.gateway.tap is not None:
            self.gateway.tap(self.info, "g2u", frame)
        await self.upstream.send_frame(frame)

    async def _intercept_request(
        self,
        frame: bytearray,
        header: RequestHeader,
        chain: ResolvedChain,
        send: trio.MemorySendChannel[Pending],
        started: float,
    ) -> None:
        assert self.upstream is not None
        api_key, version = header.api_key, header.api_version
        original = decode_request_body(api_key, version, frame, header.body_offset)
        ctx = RequestContext(
            self.info, api_key, version, header.correlation_id, header.client_id, original, self.gateway.topic_names
        )
        result = await self._hooks(chain.requests_for(api_key), ctx, "request", api_key, chain)
        expects = api_key != ApiKey.PRODUCE or ctx.request.acks != 0
        pending = Pending(
            header.correlation_id,
            api_key,
            version,
            header.client_id,
            started=started,
            decode=ctx.response_wanted or _needs_response_decode(chain, api_key, version),
        )
        if result is None and api_key == ApiKey.PRODUCE and chain.produce_records:
            ctx.request = await self._produce_records(ctx, chain, pending)
            if ctx.request is None:  # every partition failed: answer without going upstream
                result = Respond(self._merge_partition_errors(build(response_type(api_key, version)), pending))
        if isinstance(result, Close):
            raise ProtocolViolation(f"closed by interceptor: {result.reason}")
        if isinstance(result, Respond | Reject):
            if expects:
                body = (
                    result.response
                    if isinstance(result, Respond)
                    else error_response(
                        api_key,
                        version,
                        ctx.request if ctx.request is not None else original,
                        result.error_code,
                        result.message,
                    )
                )
                pending.local = encode_response(body, header.correlation_id)
                await send.send(pending)
            return
        pending.upstream_corr = self._upstream_corr()
        pending.request = ctx.request
        pending.forwarded = time.perf_counter()
        if ctx.request is original:
            set_request_correlation_id(frame, pending.upstream_corr)
            out = frame
        else:
            out = encode_request(ctx.request, pending.upstream_corr, header.client_id)
        if pending.partition_errors:
            pending.decode = True
        if expects:
            await send.send(pending)
        else:
            self._unanswered.append(pending.upstream_corr)
        await self._send_upstream(out)

    async def _produce_records(self, ctx: RequestContext, chain: ResolvedChain, pending: Pending) -> Any:
        """Runs the produce record hooks per partition; returns the request to forward (None when
        no partition is left)."""
        request = ctx.request
        topics = []
        changed = False
        for topic in request.topic_data:
            name = await self._topic_name(topic)
            partitions = []
            for part in topic.partition_data:
                records = RecordSet.parse(part.records)
                rctx = RecordsContext(
                    self.info, ctx.api_key, ctx.api_version, ctx.client_id, name, int(part.index), records
                )
                outcome = await self._hooks(chain.produce_records, rctx, "produce_records", ctx.api_key, chain)
                if isinstance(outcome, PartitionError):
                    pending.partition_errors.append((name, getattr(topic, "topic_id", None), int(part.index), outcome))
                    changed = True
                    continue
                if records.changed():
                    part = replace(part, records=records.to_bytes())
                    changed = True
                partitions.append(part)
            if partitions:
                topics.append(replace(topic, partition_data=tuple(partitions)) if changed else topic)
        if not topics:
            return None
        return replace(request, topic_data=tuple(topics)) if changed else request

    async def _topic_name(self, topic: Any) -> str:
        """The name of a Produce or Fetch topic entry, which may carry only a topic id (v13+)."""
        name = getattr(topic, "name", None) or getattr(topic, "topic", None)
        if name:
            return str(name)
        return await self.gateway.topic_name(topic.topic_id)

    def _merge_partition_errors(self, response: Any, pending: Pending) -> Any:
        """Adds the partitions that record hooks failed to a Produce response."""
        if not pending.partition_errors:
            return response
        topic_cls = nested(type(response), "responses")
        part_cls = nested(topic_cls, "partition_responses")
        by_name = has_field(topic_cls, "name")
        topics = {t.name if by_name else t.topic_id: t for t in response.responses}
        for name, topic_id, index, error in pending.partition_errors:
            extra: dict[str, Any] = {"log_start_offset": -1} if has_field(part_cls, "log_start_offset") else {}
            if has_field(part_cls, "error_message"):
                extra["error_message"] = error.message
            entry = build(part_cls, index=index, error_code=ErrorCode(error.error_code), base_offset=-1, **extra)
            key = name if by_name else topic_id
            topic = topics.get(key)
            if topic is None:
                topics[key] = build(topic_cls, **{"name" if by_name else "topic_id": key}, partition_responses=(entry,))
            else:
                topics[key] = replace(topic, partition_responses=(*topic.partition_responses, entry))
        return replace(response, responses=tuple(topics.values()))

    # -- responses ---------------------------------------------------------------------------

    async def _process_response(self, pending: Pending, frame: bytearray) -> bytearray:
        if not pending.decode:
            if not carries_addresses(pending.api_key, pending.api_version):
                return frame
            if not has_node_endpoints(pending.api_key, pending.api_version, frame):
                return frame
        if response_class(pending.api_key, pending.api_version) is None:
            return frame
        api_key = pending.api_key
        try:
            body = decode_response(api_key, pending.api_version, frame)
        except Exception as exc:  # e.g. an ApiVersions error answered in v0 format
            log.debug("forwarding undecodable %s response as is: %s", api_name(api_key), exc)
            return frame
        original = body
        gateway = self.gateway
        if api_key == ApiKey.API_VERSIONS:
            body = intersect(body) or body
        elif api_key in (ApiKey.METADATA, ApiKey.DESCRIBE_CLUSTER):
            gateway.learn_brokers(broker_addresses(api_key, body))
            gateway.topic_names.learn(api_key, body)
        if carries_addresses(api_key, pending.api_version):
            body = rewrite_addresses(api_key, body, gateway.advertised_address) or body
        if pending.partition_errors:
            body = self._merge_partition_errors(body, pending)
        chain = self.chain()
        if api_key == ApiKey.FETCH and chain.fetch_records:
            body = await self._fetch_records(body, pending, chain)
        hooks = chain.responses_for(api_key)
        if hooks:
            ctx = ResponseContext(
                self.info,
                api_key,
                pending.api_version,
                pending.client_corr,
                pending.client_id,
                pending.request,
                body,
                gateway.topic_names,
            )
            result = await self._hooks(hooks, ctx, "response", api_key, chain)
            if isinstance(result, Close):
                raise ProtocolViolation(f"closed by interceptor: {result.reason}")
            body = result.response if isinstance(result, Respond) else ctx.response
        if body is original:
            return frame
        return encode_response(body, pending.client_corr)

    async def _fetch_records(self, response: Any, pending: Pending, chain: ResolvedChain) -> Any:
        topics = []
        changed = False
        for topic in response.responses:
            name = await self._topic_name(topic)
            partitions = []
            for part in topic.partitions:
                if part.records is None or part.error_code != 0:
                    partitions.append(part)
                    continue
                records = RecordSet.parse(part.records)
                rctx = RecordsContext(
                    self.info,
                    pending.api_key,
                    pending.api_version,
                    pending.client_id,
                    name,
                    int(part.partition_index),
                    records,
                )
                outcome = await self._hooks(chain.fetch_records, rctx, "fetch_records", pending.api_key, chain)
                if isinstance(outcome, PartitionError):
                    # empty, not null: librdkafka reads a null record set as a broken frame and refetches
                    part = replace(part, error_code=ErrorCode(outcome.error_code), records=b"")
                    changed = True
                elif records.changed():
                    part = replace(part, records=records.to_bytes())
                    changed = True
                partitions.append(part)
            topics.append(replace(topic, partitions=tuple(partitions)) if changed else topic)
        return replace(response, responses=tuple(topics)) if changed else response


_STREAM_HEAD = 1024  # once this much of them is in: enough for the header and Produce's acks


class _Discard(trio.abc.SendStream):
    """Where the answer to an acks=0 produce goes (some brokers send one)."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        return None

    async def wait_send_all_might_not_block(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _sent_before(a: int, b: int) -> bool:
    """Whether upstream correlation id ``a`` was sent before ``b`` (ids wrap at 2**31)."""
    return a != b and ((b - a) & 0x7FFFFFFF) < 0x40000000


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


async def _send_frame(stream: trio.abc.Stream, frame: bytearray) -> None:
    size = len(frame).to_bytes(4, "big")
    if len(frame) < 65536:
        await stream.send_all(size + frame)
    else:
        await stream.send_all(size)
        await stream.send_all(frame)
