"""One client connection: requests in, through the chain, upstream; responses back, in order.

Two tasks per connection. The reader takes frames from the client, runs request hooks and sends
them upstream, queueing one entry per expected response. The writer takes entries in that same
order and answers each one, either with the next upstream frame (a broker answers one connection
in request order) or with a response the gateway built itself. So ordering is structural, and the
bounded queue is the backpressure: a client that stops reading stops the writer, the queue fills
and the reader stops reading from it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from kanal.api.context import Connection, Notes, RequestContext, ResponseContext
from kanal.net.channel import STREAM_FROM, KafkaChannel, next_read_size, receive_rest, relay
from kanal.net.forward import PeerClosed
from kanal.pipeline.chain import Pipeline, ResolvedChain
from kanal.pipeline.core_rules import CoreRules
from kanal.pipeline.decode import decodes_request, decodes_response
from kanal.pipeline.dispatch import CloseConnection, Dispatcher, PartitionFailure, merge_partition_errors
from kanal.protocol.api import ApiKey, api_name, request_class, response_class
from kanal.protocol.framing import FrameReader, FrameTooLarge, InvalidFrame
from kanal.protocol.headers import (
    InvalidHeader,
    RequestHeader,
    parse_request_header,
    produce_acks,
    response_correlation_id,
    set_request_correlation_id,
    set_response_correlation_id,
)
from kanal.protocol.messages import (
    decode_request_body,
    decode_response,
    encode_request,
    encode_response,
)
from kanal.protocol.rewrite import carries_addresses
from kanal.protocol.scan import NEUTRAL_TAG, ResponseScan, has_node_endpoints, node_endpoints_entry, scans

if TYPE_CHECKING:
    from kanal.api.services import KafkaClient, TopicNames
    from kanal.config.settings import Settings
    from kanal.metrics import GatewayMetrics

log = logging.getLogger(__name__)


class FrameTap(Protocol):
    """Sees every frame a connection moves (for capture): ``direction`` is ``c2g`` (client to
    gateway), ``g2u`` (gateway to upstream), ``u2g`` or ``g2c``. Frames are without length prefix
    and must not be kept without copying."""

    def __call__(self, connection: Connection, direction: str, frame: bytes | bytearray) -> None: ...


class ProtocolViolation(Exception):
    """The client or the upstream broke the protocol; the connection is closed."""


class ConnectionHost(Protocol):
    """What a client connection needs of the gateway that accepted it."""

    settings: Settings
    metrics: GatewayMetrics
    pipeline: Pipeline
    tap: FrameTap | None
    core_rules: CoreRules

    @property
    def kafka(self) -> KafkaClient: ...

    @property
    def resolving_topic_names(self) -> TopicNames: ...

    def topic_id_name(self, topic_id: Any) -> str | None: ...

    async def connect_upstream(self, node_id: int) -> KafkaChannel: ...


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
    failures: list[PartitionFailure] = field(default_factory=list)
    notes: Notes | None = None
    started: float = 0.0
    forwarded: float = 0.0
    internal: _Internal | None = None  # a request a hook sent (ctx.send_request), not the client


class _Internal:
    """The answer to a request an interceptor sent on the client's upstream connection."""

    __slots__ = ("done", "error", "response")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.response: Any = None
        self.error: BaseException | None = None


class ClientConnection:
    """Owns one client stream and its upstream channel."""

    def __init__(self, gateway: ConnectionHost, stream: trio.abc.Stream, info: Connection) -> None:
        self.gateway = gateway
        self.client = stream
        self.info = info
        self.upstream: KafkaChannel | None = None
        self._next_corr = 0
        # Upstream correlation ids of acks=0 produces: Kafka never answers them, some brokers do.
        self._unanswered: deque[int] = deque()
        self._chain_version = -1
        self._chain: ResolvedChain | None = None
        self._dispatcher: Dispatcher | None = None
        self._in_flight = 0  # expected responses not yet answered (for the idle timeout)
        self._requests: trio.MemorySendChannel[Pending] | None = None
        self._identity: tuple[str | None, tuple[str, ...], str | None] = (None, (), None)
        self._read_scope = trio.CancelScope()
        self._reader = FrameReader(gateway.settings.max_frame_size)

    # -- lifecycle ---------------------------------------------------------------------------

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

    def _closing(self, exc: CloseConnection) -> None:
        """Logs why an interceptor's doing closes this connection (with the hook's traceback)."""
        log.warning(
            "closing client %s: %s",
            self.info.client_address,
            exc,
            exc_info=exc.__cause__ is not None,
            extra=self._fields(),
        )

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
            self._dispatcher = None
        return self._chain

    def dispatcher(self) -> Dispatcher:
        """The dispatcher of this connection's current chain."""
        chain = self.chain()
        if self._dispatcher is None:
            gateway = self.gateway
            metrics = gateway.metrics
            self._dispatcher = Dispatcher(
                chain,
                gateway.resolving_topic_names,
                gateway.settings.hook_timeout_ms / 1000,
                metrics.stage if metrics.lifecycle is not None else None,
            )
        return self._dispatcher

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
        self._requests = send
        try:
            await self.dispatcher().opened(self.info)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_client, send, nursery.cancel_scope)
                nursery.start_soon(self._write_client, receive, nursery.cancel_scope)
        finally:
            with trio.CancelScope(shield=True):
                await self.client.aclose()
                await self.upstream.aclose()
                gateway.metrics.upstream_connections.dec()
                try:
                    await self.dispatcher().closed(self.info)
                except CloseConnection as exc:
                    log.warning("%s", exc, extra=self._fields())

    async def _read_client(self, send: trio.MemorySendChannel[Pending], scope: trio.CancelScope) -> None:
        async with send:
            with self._read_scope:
                try:
                    idle = self.gateway.settings.idle_connection_timeout_ms / 1000 or math.inf
                    while True:
                        with trio.move_on_after(idle) as waiting:
                            data = await self.client.receive_some(next_read_size(self._reader))
                        if waiting.cancelled_caught:
                            if self._in_flight or self._reader.peek_partial() is not None:
                                continue  # waiting for the broker, or in the middle of a frame
                            log.info(
                                "closing idle client %s: no request for %d ms (GATEWAY_IDLE_CONNECTION_TIMEOUT_MS)",
                                self.info.client_address,
                                self.gateway.settings.idle_connection_timeout_ms,
                                extra=self._fields(),
                            )
                            scope.cancel()
                            return
                        if not data:  # the client is gone: nothing waiting upstream can reach it
                            scope.cancel()
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
                except CloseConnection as exc:
                    self._closing(exc)
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
                    try:
                        await self._answer(pending, metrics)
                    finally:
                        self._in_flight -= 1
        except PeerClosed:
            log.info("upstream closed the connection of client %s", self.info.client_address, extra=self._fields())
            metrics.upstream_error()
            scope.cancel()
        except (ProtocolViolation, FrameTooLarge, InvalidFrame) as exc:
            log.warning("closing client %s: %s", self.info.client_address, exc, extra=self._fields())
            scope.cancel()
        except CloseConnection as exc:
            self._closing(exc)
            scope.cancel()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            scope.cancel()
        except Exception:
            log.exception("closing client %s: response handling failed", self.info.client_address, extra=self._fields())
            scope.cancel()

    async def _answer(self, pending: Pending, metrics: GatewayMetrics) -> None:
        """Answers one expected response: a request of an interceptor's, a local answer, or the
        upstream's (cut through while it arrives when nothing needs it decoded)."""
        if pending.internal is not None:
            await self._answer_internal(pending)
            return
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
                return
            out = await self._process_response(pending, head)
            set_response_correlation_id(out, pending.client_corr)
        if self.gateway.tap is not None:
            self.gateway.tap(self.info, "g2c", out)
        await _send_frame(self.client, out)
        metrics.response(pending.api_key, len(out), time.perf_counter() - pending.started)

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
        return not decodes_request(self.chain(), parse_request_header(head), head, self.gateway.topic_id_name)

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
        if streamed_size is None and decodes_request(
            chain, header, frame, self.gateway.topic_id_name
        ):  # (streamed: no hook needs it)
            await self._intercept_request(frame, header, chain, send, started)
            return
        expects = api_key != ApiKey.PRODUCE or produce_acks(frame, header) != 0
        upstream_corr = self._upstream_corr()
        set_request_correlation_id(frame, upstream_corr)
        if expects:
            self._in_flight += 1
            await send.send(
                Pending(
                    header.correlation_id,
                    api_key,
                    version,
                    header.client_id,
                    upstream_corr,
                    decode=decodes_response(chain, api_key),
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
            self.info,
            api_key,
            version,
            header.correlation_id,
            header.client_id,
            original,
            self.gateway.resolving_topic_names,
            _sender=self._send_own_request,
        )
        expects = api_key != ApiKey.PRODUCE or original.acks != 0
        outcome = await self.dispatcher().request(ctx, expects)
        expects = api_key != ApiKey.PRODUCE or ctx.request.acks != 0
        pending = Pending(
            header.correlation_id,
            api_key,
            version,
            header.client_id,
            started=started,
            decode=outcome.response_wanted or decodes_response(chain, api_key),
            failures=outcome.failures,
            notes=outcome.notes,
        )
        if outcome.request is None:  # answered by an interceptor
            if expects and outcome.answer is not None:
                pending.local = encode_response(outcome.answer, header.correlation_id)
                self._in_flight += 1
                await send.send(pending)
            return
        pending.upstream_corr = self._upstream_corr()
        pending.request = outcome.request
        pending.forwarded = time.perf_counter()
        if outcome.request is original:
            set_request_correlation_id(frame, pending.upstream_corr)
            out = frame
        else:
            out = encode_request(outcome.request, pending.upstream_corr, header.client_id)
        if pending.failures:
            pending.decode = True
        if expects:
            self._in_flight += 1
            await send.send(pending)
        else:
            self._unanswered.append(pending.upstream_corr)
        await self._send_upstream(out)

    async def _send_own_request(self, request: Any) -> Any:
        """``RequestContext.send_request``: an interceptor's request on this client's upstream
        connection, answered in turn by the writer (a broker answers a connection in order)."""
        assert self._requests is not None
        api_key, version = int(request.__api_key__), int(request.__version__)
        internal = _Internal()
        pending = Pending(-1, api_key, version, None, self._upstream_corr(), internal=internal)
        self._in_flight += 1
        await self._requests.send(pending)
        await self._send_upstream(encode_request(request, pending.upstream_corr, "kanal-interceptor"))
        await internal.done.wait()
        if internal.error is not None:
            raise internal.error
        return internal.response

    async def _send_gateway_request(self, request: Any) -> Any:
        """``ResponseContext.send_request``: on the gateway's own connection to this client's broker."""
        return await self.gateway.kafka.call(request, node_id=self.info.node_id)

    async def _answer_internal(self, pending: Pending) -> None:
        internal = pending.internal
        assert internal is not None
        try:
            frame = await self._upstream_response(pending.upstream_corr)
            assert isinstance(frame, bytearray)
            internal.response = decode_response(pending.api_key, pending.api_version, frame)
        except BaseException as exc:
            internal.error = exc if isinstance(exc, Exception) else ConnectionError("connection closed")
            raise
        finally:
            internal.done.set()

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
        body = self.gateway.core_rules.response(api_key, pending.api_version, body)
        if pending.failures:
            body = merge_partition_errors(body, pending.failures)
        dispatcher = self.dispatcher()
        chain = dispatcher.chain
        if chain.responses_for(api_key) or (api_key == ApiKey.FETCH and chain.fetch_records):
            ctx = ResponseContext(
                self.info,
                api_key,
                pending.api_version,
                pending.client_corr,
                pending.client_id,
                pending.request,
                body,
                self.gateway.resolving_topic_names,
                pending.notes,
                _sender=self._send_gateway_request,
            )
            body = await dispatcher.response(ctx)
        if body is original:
            return frame
        return encode_response(body, pending.client_corr)


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


async def _send_frame(stream: trio.abc.Stream, frame: bytearray) -> None:
    size = len(frame).to_bytes(4, "big")
    if len(frame) < 65536:
        await stream.send_all(size + frame)
    else:
        await stream.send_all(size)
        await stream.send_all(frame)
