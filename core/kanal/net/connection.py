"""One client connection: requests in, through the chain, upstream; responses back, in order.

Two tasks per connection. The reader takes frames from the client, runs request hooks and sends
them upstream on a link (:mod:`kanal.net.upstream_link`): the client's own, or a shared one of the
broker's pool. Each request that expects an answer takes a slot in the client's session
(:class:`~kanal.protocol.session.ClientSession`); the link's reader fills the slot when the broker
answers, the gateway fills it itself for a local answer. The writer sends the filled slots at the
head of the session, in request order, several at once when several are ready. The session is
bounded: a client that stops reading stops the writer, the session fills and the reader stops
reading from that client. On a listener that authenticates its clients, the login comes first, in
the connection's own task (:meth:`ClientConnection._log_in`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import trio

from kanal.api.context import Connection, Notes, RequestContext, ResponseContext
from kanal.net.channel import STREAM_FROM, next_read_size, receive_rest, relay
from kanal.net.fastio import FastStream
from kanal.net.upstream_link import UpstreamClosed, UpstreamLink, UpstreamTimeout
from kanal.pipeline.chain import Pipeline, ResolvedChain
from kanal.pipeline.core_rules import CoreRules
from kanal.pipeline.decode import decodes_request, decodes_response
from kanal.pipeline.dispatch import CloseConnection, Dispatcher, PartitionFailure
from kanal.pipeline.wire import ResponseFix, WirePath, id_map, streams
from kanal.protocol.api import ApiKey, api_name, request_class, response_class
from kanal.protocol.api_versions import RecentAnswers
from kanal.protocol.error_responses import error_response
from kanal.protocol.fetch_records import FIRST_VERSION as FETCH_FRAME_VERSION
from kanal.protocol.framing import FrameReader, FrameTooLarge, InvalidFrame
from kanal.protocol.headers import (
    InvalidHeader,
    RequestHeader,
    parse_request_header,
    peek_request,
    produce_acks,
    set_response_correlation_id,
)
from kanal.protocol.messages import (
    decode_request_body,
    decode_response,
    encode_request,
    encode_response,
)
from kanal.protocol.rewrite import carries_addresses
from kanal.protocol.sasl_mechanisms import Identity
from kanal.protocol.sasl_server import Action, Authenticator
from kanal.protocol.sasl_sniff import SaslSniffer, UnrelayableExchange
from kanal.protocol.scan import NEUTRAL_TAG, ResponseScan, has_node_endpoints, node_endpoints_entry, scans
from kanal.protocol.session import ClientSession, Slot, stream_response
from kanal.protocol.validate import MalformedRequest, RequestScan, validate_request
from kanal.protocol.waits import requested_wait_ms

if TYPE_CHECKING:
    from kanal.api.services import KafkaClient, TopicNames
    from kanal.config.settings import Settings
    from kanal.metrics import GatewayMetrics
    from kanal.net.upstream_pool import UpstreamPool

log = logging.getLogger(__name__)

# Requests a broker may hold for long (long polls, group joins): never on a shared link, where
# they would hold every other client's requests behind them.
WAITING_APIS = frozenset({ApiKey.FETCH, ApiKey.JOIN_GROUP, ApiKey.SYNC_GROUP})
# A client that authenticates to the broker itself must have a broker connection of its own.
_SASL_APIS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})
_STREAMED = object()  # the response went to the client while it arrived


class FrameTap(Protocol):
    """Sees every frame a connection moves (for capture): ``direction`` is ``c2g`` (client to
    gateway), ``g2u`` (gateway to upstream), ``u2g`` or ``g2c``. Frames are without length prefix
    and must not be kept without copying."""

    def __call__(self, connection: Connection, direction: str, frame: bytes | bytearray) -> None: ...


class ProtocolViolation(Exception):
    """The client or the upstream broke the protocol; the connection is closed."""


class _AnsweredThenClose(Exception):
    """The request was answered (an authentication failure); the connection closes once that
    answer has gone."""


class ConnectionHost(Protocol):
    """What a client connection needs of the gateway that accepted it."""

    settings: Settings
    metrics: GatewayMetrics
    pipeline: Pipeline
    tap: FrameTap | None
    core_rules: CoreRules

    @property
    def kafka(self) -> KafkaClient: ...

    def topic_names_for(self, vcluster: str | None) -> TopicNames:
        """Topic names as the interceptors of a virtual cluster's connections see them."""
        ...

    def topic_id_name(self, topic_id: Any) -> str | None: ...

    async def open_link(self, node_id: int, *, shared: bool) -> UpstreamLink:
        """A new connection to the broker ``node_id`` (its reader task not started)."""
        ...

    def upstream_pool(self, node_id: int) -> UpstreamPool | None:
        """The shared links to ``node_id``, or None when pooling is off."""
        ...

    @property
    def recent_api_versions(self) -> RecentAnswers:
        """ApiVersions answers clients got shortly before (answered from here before a login)."""
        ...

    def authenticator(self, client_host: str) -> Authenticator | None:
        """A new SASL exchange for a client (at ``client_host``) of a listener that authenticates
        its clients itself (GATEWAY_MANAGED), or None."""
        ...

    def identify(self, credential: Identity) -> Identity:
        """The identity a connection carries for an authenticated credential."""
        ...

    def authentication_outcome(
        self, info: Connection, mechanism: str, failure: str | None, user: str | None = None
    ) -> None:
        """Records a login (or re-authentication) of ``info`` with ``mechanism``: a success when
        ``failure`` is None, else refused for that reason (never a secret); ``user`` is the name the
        client claimed, when known (a refused client has no principal)."""
        ...


@dataclass(slots=True, eq=False)
class Pending(Slot):
    """One response owed to the client, and what answering it needs."""

    conn: ClientConnection
    client_corr: int
    api_key: int
    api_version: int
    client_id: str | None
    local: bytearray | None = None
    decode: bool = False
    request: Any = None  # the decoded request as forwarded, when a hook decoded it
    frame: bytearray | None = None  # the request as received, kept to answer it with an error
    failures: list[PartitionFailure] = field(default_factory=list)
    notes: Notes | None = None
    started: float = 0.0
    forwarded: float = 0.0
    dedicated: bool = True  # sent on the client's own link (may stream its response)
    fixes: list[ResponseFix] = field(default_factory=list)  # wire stages' response side, applied first

    def __post_init__(self) -> None:
        Slot.__init__(self)

    # -- Waiter (kanal.net.upstream_link): the link's reader hands the response over ---------------

    @property
    def info(self) -> Connection:
        return self.conn.info

    def deliver(self, frame: bytearray) -> None:
        self.conn.deliver(self, frame)

    def fail(self, error: ConnectionError) -> None:
        self.conn.fill(self, error)

    def can_stream(self, size: int) -> bool:
        conn = self.conn
        return (
            stream_response(
                size,
                STREAM_FROM,
                dedicated=self.dedicated,
                decoded=self.decode or not streams(self.fixes) or conn.gateway.tap is not None,
                first=conn.session.is_first(self),
            )
            and not conn.writing
        )

    async def relay(self, source: trio.abc.ReceiveStream, size: int, head: bytearray) -> None:
        await self.conn.relay_response(self, source, size, head)


class _Internal:
    """The answer to a request an interceptor sent on the client's upstream connection."""

    __slots__ = ("api_key", "api_version", "done", "error", "info", "response")

    def __init__(self, info: Connection, api_key: int, api_version: int) -> None:
        self.info = info
        self.api_key = api_key
        self.api_version = api_version
        self.done = trio.Event()
        self.response: Any = None
        self.error: Exception | None = None

    def deliver(self, frame: bytearray) -> None:
        try:
            self.response = decode_response(self.api_key, self.api_version, frame)
        except Exception as exc:
            self.error = exc
        self.done.set()

    def fail(self, error: ConnectionError) -> None:
        self.error = error
        self.done.set()

    def can_stream(self, size: int) -> bool:
        return False

    async def relay(self, source: trio.abc.ReceiveStream, size: int, head: bytearray) -> None:
        raise AssertionError("never streamed")


class ClientConnection:
    """Owns one client stream, its session, and its own upstream link if it has one."""

    def __init__(self, gateway: ConnectionHost, stream: trio.abc.Stream, info: Connection) -> None:
        self.gateway = gateway
        self.client = stream
        self._io = FastStream(stream)
        self.info = info
        self._last_read = 0.0  # (set when it runs)
        self._unsent: memoryview | None = None  # the rest of a response a link's reader began sending
        settings = gateway.settings
        self.session: ClientSession[Pending] = ClientSession(settings.max_in_flight)
        self.writing = False  # the writer holds responses it has not finished sending
        self._own: UpstreamLink | None = None
        self._pinned: UpstreamLink | None = None
        self._pool = gateway.upstream_pool(info.node_id)
        # KAFKA_MANAGED: the broker authenticates the client, on the client's own link from its first
        # request (a shared link is the gateway's, and so is its identity); the gateway watches.
        self._sniff = SaslSniffer(settings.oauth_sub_claim_name) if settings.security_mode == "kafka_managed" else None
        self._relays_identity = self._sniff is not None
        self._auth = gateway.authenticator(info.client_address.rpartition(":")[0])
        self._internal = 0  # interceptors' own requests in flight
        self._reading = True
        self._writer_lot = trio.lowlevel.ParkingLot()
        self._reader_lot = trio.lowlevel.ParkingLot()
        self._nursery: trio.Nursery | None = None
        self._validate = settings.feature("validate_requests", True)
        self._chain_version = -1
        self._chain: ResolvedChain | None = None
        self._dispatcher: Dispatcher | None = None
        self._wire = WirePath(info)
        self._identity: tuple[str | None, tuple[str, ...], str | None] = (None, (), None)
        self._read_scope = trio.CancelScope()
        self._login_scope = trio.CancelScope()
        self._reader = FrameReader(settings.max_frame_size)

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

    def _closing(self, reason: object, level: int = logging.WARNING, exc_info: bool = False) -> None:
        log.log(
            level, "closing client %s: %s", self.info.client_address, reason, exc_info=exc_info, extra=self._fields()
        )

    def drain(self) -> None:
        """Stops reading new requests; in-flight ones are still answered."""
        self._read_scope.cancel()
        self._login_scope.cancel()

    def chain(self) -> ResolvedChain:
        """The chain for this connection, resolved again when the interceptors, the group
        memberships or the client's identity (principal, groups, virtual cluster) change."""
        pipeline = self.gateway.pipeline
        info = self.info
        if self._chain_version != pipeline.version and info.principal is not None:
            # A GatewayGroup change moves the version too: the groups as they are now (a credential
            # checked here, such as an OAuth token, may claim external groups).
            credential = self._auth.identity if self._auth is not None else None
            info.groups = pipeline.groups_of(info.principal, info.vcluster, credential.groups if credential else ())
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
                gateway.topic_names_for(self.info.vcluster),
                gateway.settings.hook_timeout_ms / 1000,
                metrics.stage if metrics.lifecycle is not None else None,
            )
        return self._dispatcher

    async def run(self) -> None:
        self._last_read = trio.current_time()
        try:
            await self.dispatcher().opened(self.info)
            unread: tuple[bytearray | None, list[bytearray]] = (None, [])
            if self._auth is not None and self.gateway.tap is None:
                logged_in = await self._log_in()
                if logged_in is None:
                    return
                unread = logged_in
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._read_client, nursery.cancel_scope, unread)
                nursery.start_soon(self._write_client, nursery.cancel_scope)
        finally:
            with trio.CancelScope(shield=True):
                await self.client.aclose()  # (its own link closed with the nursery)
                try:
                    await self.dispatcher().closed(self.info)
                except CloseConnection as exc:
                    log.warning("%s", exc, extra=self._fields())

    # -- the session -------------------------------------------------------------------------

    def deliver(self, pending: Pending, frame: bytearray) -> None:
        """A response from a link. When nothing needs it decoded, nothing is owed before it and the
        writer is idle, it is answered here and now, in the link's reader (one task switch less
        per request); otherwise the writer answers it in turn."""
        if self._sniff is not None and pending.api_key in _SASL_APIS:
            answer = self._sasl_answer(pending, frame)
            if answer is None:
                return
            frame = answer
        if (
            pending.decode
            or self.writing
            or self._unsent is not None
            or self.gateway.tap is not None
            or not self.session.is_first(pending)
        ):
            self.fill(pending, frame)
            return
        try:
            out = self._plain_response(pending, frame)
        except Exception:  # the writer meets it again, and closes the connection saying why
            self.fill(pending, frame)
            return
        set_response_correlation_id(out, pending.client_corr)
        data = len(out).to_bytes(4, "big") + out
        self.session.take_first()
        try:
            sent = self._io.try_send(data)
        except trio.BrokenResourceError:
            sent = len(data)  # the client is gone; its reader sees it
        self.gateway.metrics.response(pending.api_key, len(out), time.perf_counter() - pending.started)
        if sent < len(data):
            self._unsent = memoryview(data)[sent:]
            self._writer_lot.unpark_all()
        elif self.session.first_filled() or not self._reading:  # (draining: the writer ends it)
            self._writer_lot.unpark_all()
        self._reader_lot.unpark_all()

    def _sasl_answer(self, pending: Pending, frame: bytearray) -> bytearray | None:
        """The broker's answer in a relayed SASL exchange (KAFKA_MANAGED): once the broker accepts
        the client, the connection takes the user name the exchange carried; a refusal is recorded.
        Returns the answer for the client, or None when it was dealt with here: a raw token
        (handshake v0) for the client, or a refused raw exchange, which closes the connection."""
        assert self._sniff is not None
        reply = self._sniff.response(pending.api_key, pending.api_version, frame)
        login = reply.login
        if login is not None:
            if login.identity is not None:
                self.identified(login.identity, login.mechanism)
            elif login.failure is None:
                log.warning(
                    "client %s authenticated with the cluster (%s), but the gateway could not read its user"
                    " name: the connection stays anonymous",
                    self.info.client_address,
                    login.mechanism,
                    extra=self._fields(),
                )
            else:
                log.info(
                    "client %s failed authentication with the cluster as %r (%s): %s",
                    self.info.client_address,
                    login.user,
                    login.mechanism,
                    login.failure,
                    extra=self._fields(),
                )
            self.gateway.authentication_outcome(self.info, login.mechanism, login.failure, login.user)
        if reply.close:
            why = login.failure if login is not None else "refused"
            self.fill(pending, _AnsweredThenClose(f"SASL: the cluster refused the client: {why}"))
            return None
        if reply.raw:
            pending.local = reply.frame
            self.fill(pending, reply.frame)
            return None
        return reply.frame

    def fill(self, pending: Pending, response: object) -> None:
        """A response for ``pending`` is there (a frame, an error, or streamed): the writer may go."""
        self.session.fill(pending, response)
        self._writer_lot.unpark_all()

    async def _owe(self, pending: Pending) -> Pending:
        """Takes a slot for ``pending``, waiting while the client has too many responses owed."""
        while self.session.full:
            await self._reader_lot.park()
        return self.session.owe(pending)

    async def _link(self, api_key: int) -> UpstreamLink:
        """The link a request goes on: the client's pool link unless the request may wait at the
        broker or the client authenticates to the broker itself; else its own, opened on need."""
        if self._pool is not None and not self._relays_identity and api_key not in WAITING_APIS:
            link = self._pinned
            if link is None or link.closed:
                link = self._pinned = await self._pool.link()
            return link
        link = self._own
        if link is None or link.closed:
            assert self._nursery is not None
            link = self._own = await self.gateway.open_link(self.info.node_id, shared=False)
            self._nursery.start_soon(link.run)
        return link

    def _uses_own_link(self, api_key: int) -> bool:
        return self._pool is None or self._relays_identity or api_key in WAITING_APIS

    # -- reading requests ----------------------------------------------------------------------

    def close_if_idle(self, now: float, timeout: float) -> None:
        """Closes the connection once it has sent nothing for ``timeout`` seconds with nothing in
        flight (a long poll is not idle). The gateway asks every connection now and then (see
        ``Gateway._close_idle``): one task for all of them costs less than one each, or a
        timeout around every read."""
        if now < self._last_read + timeout:
            return
        if self.session.owed or self._internal or self._reader.peek_partial() is not None:
            self._last_read = now  # waiting for the broker, or in the middle of a frame
            return
        self._closing(
            f"no request for {self.gateway.settings.idle_connection_timeout_ms} ms"
            " (GATEWAY_IDLE_CONNECTION_TIMEOUT_MS)",
            logging.INFO,
        )
        self._login_scope.cancel()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def _read_client(self, scope: trio.CancelScope, unread: tuple[bytearray | None, list[bytearray]]) -> None:
        """Reads requests until the client leaves. ``unread``: what :meth:`_log_in` left, a frame
        the SASL exchange has seen and passed on, and frames read after it."""
        with self._read_scope:
            try:
                passed, rest = unread
                if passed is not None:
                    await self._handle_request(passed)
                for frame in rest:
                    await self._take(frame)
                while True:
                    data = await self._io.receive_some(next_read_size(self._reader))
                    self._last_read = trio.current_time()
                    if not data:  # the client is gone: nothing waiting upstream can reach it
                        scope.cancel()
                        return
                    for frame in self._reader.feed(data):
                        if self.gateway.tap is not None:
                            self.gateway.tap(self.info, "c2g", frame)
                        await self._take(frame)
                    partial = self._reader.peek_partial()
                    if partial is not None and partial[0] >= STREAM_FROM and len(partial[1]) >= _STREAM_HEAD:
                        self._reader.take_partial()
                        if self._may_stream(*partial):
                            await self._handle_request(partial[1], partial[0])
                            continue
                        frame = await receive_rest(self.client, *partial)
                        if self.gateway.tap is not None:
                            self.gateway.tap(self.info, "c2g", frame)
                        await self._take(frame)
            except _AnsweredThenClose as exc:  # the writer sends what is owed, then ends
                self._closing(exc, logging.INFO)
            except Exception as exc:
                self._read_failed(exc)
                scope.cancel()
        self._reading = False
        self._writer_lot.unpark_all()

    async def _take(self, frame: bytearray) -> None:
        """One whole request from the client: the SASL exchange's, or one to handle."""
        if self._auth is not None and not self._in_session(frame) and await self._authenticating(frame):
            return
        await self._handle_request(frame)

    def _read_failed(self, exc: Exception) -> None:
        """Says why reading from the client ended early (the caller then ends the connection)."""
        if isinstance(exc, (FrameTooLarge, InvalidFrame, InvalidHeader, ProtocolViolation)):
            self._closing(exc)
        elif isinstance(exc, MalformedRequest):  # found in a request forwarded while it arrived
            self._closing(f"malformed request: {exc}")
        elif isinstance(exc, CloseConnection):
            self._closing(exc, exc_info=exc.__cause__ is not None)
        elif isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError)):
            pass
        elif isinstance(exc, (ConnectionError, OSError)):  # the upstream is unreachable (counted when opened)
            self._closing(f"upstream unavailable: {exc}")
        else:
            log.error(
                "closing client %s: request handling failed",
                self.info.client_address,
                exc_info=exc,
                extra=self._fields(),
            )

    async def _log_in(self) -> tuple[bytearray | None, list[bytearray]] | None:
        """The SASL exchange of a listener that authenticates its clients, in the connection's own
        task before its reader and writer start: each answer is local and written at once, so a
        login costs no task switches, and a refused or abandoned one never starts those tasks.
        Returns what is left for the reader (see :meth:`_read_client`) once the client has logged
        in or sent a frame the exchange passes on (an ApiVersions to forward); None when the
        connection is over (the client left or was refused, it idled, the gateway drains).
        """
        auth = self._auth
        assert auth is not None
        with self._login_scope:
            try:
                while True:
                    data = await self._io.receive_some(next_read_size(self._reader))
                    self._last_read = trio.current_time()
                    if not data:
                        return None
                    frames = self._reader.feed(data)
                    for at, frame in enumerate(frames):
                        step = await self._login_step(frame)
                        if step is None:
                            return frame, frames[at + 1 :]
                        pending, closing = step
                        if pending is not None:
                            await self._answer_now(pending)
                        if closing is not None:
                            self._closing(closing, logging.INFO)
                            return None
                        if auth.authenticated:
                            return None, frames[at + 1 :]
            except Exception as exc:
                self._read_failed(exc)
        return None

    async def _answer_now(self, pending: Pending) -> None:
        """Writes a local answer while nothing else is owed (before the writer runs)."""
        answer = pending.local
        assert answer is not None and not self.session.owed
        await self._io.send_all(len(answer).to_bytes(4, "big") + answer)
        self.gateway.metrics.response(pending.api_key, len(answer), time.perf_counter() - pending.started)

    def _may_stream(self, size: int, head: bytearray) -> bool:
        """A large request (its header in) that no hook needs is forwarded while it arrives, on
        the client's own link (on a shared one a slow client would stall the others)."""
        if self.gateway.tap is not None or (self._auth is not None and not self._auth.authenticated):
            return False
        header = parse_request_header(head)
        if not self._uses_own_link(header.api_key):
            return False
        chain = self.chain()
        return not chain.wire_for(header.api_key) and not decodes_request(
            chain, header, head, self.gateway.topic_id_name
        )

    def _in_session(self, frame: bytearray) -> bool:
        """An authenticated client's request in its session: none of the exchange's business (checked
        without a coroutine, as it is for every request of such a client)."""
        auth = self._auth
        assert auth is not None
        return (
            auth.authenticated
            and not auth.expects_raw_token
            and int.from_bytes(frame[:2], "big") not in _SASL_APIS
            and not auth.session_expired()
        )

    async def _authenticating(self, frame: bytearray) -> bool:
        """The SASL exchange of a listener that authenticates its clients (GATEWAY_MANAGED), once
        the reader runs: True when ``frame`` was part of it (answered here, never forwarded).
        Once authenticated, only a re-authentication or an ended session (KIP-368) comes here."""
        step = await self._login_step(frame)
        if step is None:
            return False
        pending, closing = step
        if pending is not None:
            self.fill(await self._owe(pending), pending.local)
        if closing is not None:
            raise _AnsweredThenClose(closing)
        return True

    async def _login_step(self, frame: bytearray) -> tuple[Pending | None, str | None] | None:
        """One frame of the SASL exchange: None when it is not the exchange's (forward it), else
        the local answer (a Pending holding it, or None) and, when the connection must close once
        that answer has gone, why. Before authentication only ApiVersions and the exchange itself
        are served; a refused login is answered, then the connection closes."""
        auth = self._auth
        assert auth is not None
        if auth.prepare_bearer is not None:  # OAUTHBEARER: fetch the token's signing key if it is new
            token = auth.bearer_token(frame)
            if token is not None:
                await auth.prepare_bearer(token)
        step = auth.feed(frame)
        if step.action is Action.API_VERSIONS:
            answered = self._recent_api_versions(frame)
            return None if answered is None else (answered, None)
        if step.action is Action.FORWARD:
            return None
        if step.authenticated:
            self._authenticated(auth)
        if step.authenticated or step.failure is not None:
            self.gateway.authentication_outcome(self.info, auth.mechanism or "unknown", step.failure, auth.claimed_user)
        pending = None
        if step.response is not None:
            if auth.expects_raw_token or len(frame) < 8:
                corr, api_key, version = 0, int(ApiKey.SASL_AUTHENTICATE), 0
            else:
                api_key, version, corr = peek_request(frame)
            pending = Pending(
                self, corr, api_key, version, None, local=bytearray(step.response), started=time.perf_counter()
            )
        closing = f"SASL: {step.failure}" if step.action is Action.CLOSE else None  # refused, or the session is over
        return pending, closing

    def _sees_api_versions(self, header: RequestHeader, frame: bytearray) -> bool:
        """Whether a hook of the chain (or a capture) sees ApiVersions requests or responses."""
        chain = self.chain()
        return (
            self.gateway.tap is not None
            or chain.decode_response(ApiKey.API_VERSIONS)
            or decodes_request(chain, header, frame, self.gateway.topic_id_name)
        )

    def _recent_api_versions(self, frame: bytearray) -> Pending | None:
        """ApiVersions before the login, answered as the broker answered shortly before, when the
        gateway has such an answer and no hook sees it (see RecentAnswers); else None."""
        header = parse_request_header(frame)
        answer = self.gateway.recent_api_versions.get(self.info.node_id, header.api_version, header.correlation_id)
        if answer is None or self._sees_api_versions(header, frame):
            return None
        self.info.client_id = header.client_id
        self.gateway.metrics.request(header.api_key, len(frame))
        corr, version = header.correlation_id, header.api_version
        return Pending(self, corr, header.api_key, version, None, local=answer, started=time.perf_counter())

    def _authenticated(self, auth: Authenticator) -> None:
        assert auth.identity is not None
        self.identified(auth.identity, auth.mechanism or "SASL")

    def identified(self, credential: Identity, how: str) -> None:
        """Gives the connection the identity a credential (``how``: a SASL mechanism, ``SSL``)
        stands for, as the gateway's service accounts and groups map it."""
        identity = self.gateway.identify(credential)
        info = self.info
        first = info.principal is None
        info.principal = identity.principal
        info.groups = tuple(identity.groups)
        info.vcluster = identity.vcluster
        log.info(
            "client %s %s as %s (%s)",
            info.client_address,
            "authenticated" if first else "re-authenticated",
            identity.principal,
            how,
            extra=self._fields(),
        )

    async def _handle_request(self, frame: bytearray, streamed_size: int | None = None) -> None:
        """Handles one request. With ``streamed_size``, ``frame`` is only the start of a large frame
        still arriving, which is forwarded while it arrives (only for requests no hook decodes)."""
        sniff = self._sniff
        if sniff is not None:
            if sniff.failed:  # (a broker closes a connection whose authentication it refused)
                raise _AnsweredThenClose("SASL: a request after the cluster refused the client's authentication")
            if sniff.expects_raw_token:  # handshake v0: a raw token, carried to the broker wrapped
                if streamed_size is not None:
                    raise ProtocolViolation(f"a raw SASL token of {streamed_size} bytes")
                frame = sniff.wrap(frame, self.info.client_id)
        header = parse_request_header(frame)
        api_key, version = header.api_key, header.api_version
        if request_class(api_key, version) is None and api_key != ApiKey.API_VERSIONS:
            # The gateway never offers such a version (ApiVersions is answered by the broker
            # even for versions it does not know, as clients rely on that to negotiate).
            raise ProtocolViolation(f"unsupported request: api key {api_key} version {version}")
        if self._validate and streamed_size is None:
            self._check(frame, header)
        started = time.perf_counter()
        self.info.client_id = header.client_id
        self.gateway.metrics.request(api_key, len(frame) if streamed_size is None else streamed_size)
        chain = self.chain()
        if streamed_size is None and decodes_request(chain, header, frame, self.gateway.topic_id_name):
            await self._intercept_request(frame, header, chain, started)
            return
        received: bytearray = frame
        fixes: list[ResponseFix] = []
        stages = chain.wire_for(api_key)
        if stages:  # (never streamed: see _may_stream)
            try:
                handled = self._wire.run(stages, self._chain_version, header, frame)
            except InvalidHeader as exc:
                raise ProtocolViolation(f"malformed {api_name(api_key)} request: {exc}") from exc
            if handled is None:
                await self._intercept_request(frame, header, chain, started)
                return
            frame, fixes = handled
        secret = False  # the request carries credentials: not kept to answer it with an error
        if api_key in _SASL_APIS:
            self._relays_identity = True
            if sniff is not None:
                if streamed_size is not None:
                    raise ProtocolViolation(f"a SASL request of {streamed_size} bytes")
                frame = self._sniffed_request(frame)
                secret = True
        link = await self._link(api_key)
        pending = None
        if api_key != ApiKey.PRODUCE or produce_acks(frame, header) != 0:
            pending = await self._owe(
                Pending(
                    self,
                    header.correlation_id,
                    api_key,
                    version,
                    header.client_id,
                    decode=decodes_response(chain, api_key) or secret,  # (never streamed: watched)
                    frame=received if streamed_size is None and not secret else None,
                    started=started,
                    forwarded=time.perf_counter(),
                    dedicated=not link.shared,
                    fixes=fixes,
                )
            )
        wait_ms = requested_wait_ms(frame, header) if pending is not None else 0
        if streamed_size is None:
            await link.send(frame, pending, wait_ms, self.info)
        else:
            check = RequestScan(header, streamed_size) if self._validate else None
            await link.send_streamed(self.client, streamed_size, frame, pending, wait_ms, check)
            self.gateway.metrics.streamed_request(api_key)

    def _sniffed_request(self, frame: bytearray) -> bytearray:
        """A SASL request of a relayed exchange (KAFKA_MANAGED), as it goes to the broker."""
        assert self._sniff is not None
        try:
            return self._sniff.request(frame)
        except UnrelayableExchange as exc:
            raise ProtocolViolation(str(exc)) from None

    def _check(self, frame: bytearray, header: RequestHeader) -> None:
        """The protocol firewall (GATEWAY_FEATURE_FLAGS_VALIDATE_REQUESTS)."""
        reason = validate_request(frame, header)
        if reason is not None:
            raise ProtocolViolation(f"malformed request: {reason}")

    async def _intercept_request(
        self, frame: bytearray, header: RequestHeader, chain: ResolvedChain, started: float
    ) -> None:
        api_key, version = header.api_key, header.api_version
        original = decode_request_body(api_key, version, frame, header.body_offset)
        ctx = RequestContext(
            self.info,
            api_key,
            version,
            header.correlation_id,
            header.client_id,
            original,
            self.gateway.topic_names_for(self.info.vcluster),
            _sender=self._send_own_request,
        )
        expects = api_key != ApiKey.PRODUCE or original.acks != 0
        outcome = await self.dispatcher().request(ctx, expects)
        expects = api_key != ApiKey.PRODUCE or ctx.request.acks != 0
        pending = Pending(
            self,
            header.correlation_id,
            api_key,
            version,
            header.client_id,
            started=started,
            decode=outcome.response_wanted or decodes_response(chain, api_key) or bool(outcome.failures),
            failures=outcome.failures,
            notes=outcome.notes,
        )
        if outcome.request is None:  # answered by an interceptor
            if expects and outcome.answer is not None:
                pending.local = encode_response(outcome.answer, header.correlation_id)
                self.fill(await self._owe(pending), pending.local)
            return
        unchanged = outcome.request is original and ctx.client_id == header.client_id
        out = frame if unchanged else encode_request(outcome.request, 0, ctx.client_id)
        pending.request = outcome.request
        if api_key in _SASL_APIS:
            self._relays_identity = True
            if self._sniff is not None:  # watched (so never streamed), its credentials not kept
                out = self._sniffed_request(out)
                pending.decode, pending.request = True, None
        link = await self._link(api_key)
        pending.dedicated = not link.shared
        if expects:
            await self._owe(pending)
        pending.forwarded = time.perf_counter()
        wait_ms = requested_wait_ms(out, parse_request_header(out)) if expects else 0
        await link.send(out, pending if expects else None, wait_ms, self.info)

    async def _send_own_request(self, request: Any) -> Any:
        """``RequestContext.send_request``: an interceptor's request on this client's upstream link."""
        api_key, version = int(request.__api_key__), int(request.__version__)
        internal = _Internal(self.info, api_key, version)
        self._internal += 1
        try:
            link = await self._link(api_key)
            await link.send(encode_request(request, 0, "kanal-interceptor"), internal, 0, self.info)
            await internal.done.wait()
        finally:
            self._internal -= 1
            self._writer_lot.unpark_all()
        if internal.error is not None:
            raise internal.error
        return internal.response

    async def _send_gateway_request(self, request: Any) -> Any:
        """``ResponseContext.send_request``: on the gateway's own connection to this client's broker."""
        return await self.gateway.kafka.call(request, node_id=self.info.node_id)

    # -- writing responses ---------------------------------------------------------------------

    async def _write_client(self, scope: trio.CancelScope) -> None:
        session = self.session
        metrics = self.gateway.metrics
        tap = self.gateway.tap
        io = self._io
        try:
            while True:
                if self._unsent is not None:  # a link's reader began this response: it goes first
                    self.writing = True
                    await io.send_all(self._unsent)
                    self._unsent = None
                    self.writing = False
                ready = session.take_ready()
                if not ready:
                    if not self._reading and not session.owed and not self._internal:
                        return  # drained
                    await self._writer_lot.park()
                    continue
                self._reader_lot.unpark_all()
                self.writing = True
                out = bytearray()
                for pending in ready:
                    frame = await self._response(pending, metrics)
                    if frame is None:
                        continue
                    if tap is not None:
                        tap(self.info, "g2c", frame)
                    if len(frame) >= _COPY_LIMIT:
                        if out:
                            await io.send_all(out)
                            out = bytearray()
                        await io.send_all(len(frame).to_bytes(4, "big"))
                        await io.send_all(frame)
                    else:
                        out += len(frame).to_bytes(4, "big")
                        out += frame
                    metrics.response(pending.api_key, len(frame), time.perf_counter() - pending.started)
                if out:
                    await io.send_all(out)
                self.writing = False
        except UpstreamClosed as exc:
            self._closing(exc, logging.INFO)
            metrics.upstream_error()
        except _AnsweredThenClose as exc:
            self._closing(exc, logging.INFO)
        except (ProtocolViolation, FrameTooLarge, InvalidFrame) as exc:
            self._closing(exc)
        except CloseConnection as exc:
            self._closing(exc, exc_info=exc.__cause__ is not None)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except Exception:
            log.exception("closing client %s: response handling failed", self.info.client_address, extra=self._fields())
        finally:
            scope.cancel()

    async def _response(self, pending: Pending, metrics: GatewayMetrics) -> bytearray | None:
        """The frame answering ``pending`` (None when it was streamed)."""
        response = pending.response
        if response is _STREAMED:
            return None
        if isinstance(response, _AnsweredThenClose):  # a refused raw SASL exchange (KAFKA_MANAGED)
            raise response
        if isinstance(response, ConnectionError):
            if isinstance(response, UpstreamTimeout):
                return self._timed_out(pending, response)
            raise response
        assert isinstance(response, bytearray)
        if pending.local is not None:
            return response
        if metrics.lifecycle is not None:
            metrics.stage("upstream", pending.api_key, "", time.perf_counter() - pending.forwarded)
        out = await self._process_response(pending, response)
        set_response_correlation_id(out, pending.client_corr)
        if pending.api_key == ApiKey.API_VERSIONS and self._auth is not None and not self._auth.authenticated:
            self._learn_api_versions(pending, out)
        return out

    def _learn_api_versions(self, pending: Pending, answer: bytearray) -> None:
        """Keeps an ApiVersions answer a client got before its login, unless a hook saw it."""
        request = pending.frame
        if request is not None and not self._sees_api_versions(parse_request_header(request), request):
            self.gateway.recent_api_versions.learn(self.info.node_id, pending.api_version, answer)

    def _timed_out(self, pending: Pending, error: UpstreamTimeout) -> bytearray:
        """A retriable error where the client's library looks for one (REQUEST_TIMED_OUT)."""
        request = pending.request
        if request is None and pending.frame is not None:
            request = decode_request_body(
                pending.api_key, pending.api_version, pending.frame, parse_request_header(pending.frame).body_offset
            )
        if request is None:  # a large request streamed through and not kept: only closing says it
            raise UpstreamClosed(str(error))
        body = error_response(pending.api_key, pending.api_version, request, _REQUEST_TIMED_OUT, str(error))
        return encode_response(body, pending.client_corr)

    async def relay_response(
        self, pending: Pending, source: trio.abc.ReceiveStream, size: int, head: bytearray
    ) -> None:
        """Forwards a large response while it arrives (the link's reader calls it when
        :meth:`Pending.can_stream`). Produce and Fetch responses that may carry KIP-951 leader
        hints are scanned on the way, and their last part (where the hints would be) is kept back
        until it is whole; a Fetch response's topic ids are mapped on the way when a wire stage
        asked for it (a virtual cluster's own ids)."""
        set_response_correlation_id(head, pending.client_corr)
        api_key, version = pending.api_key, pending.api_version
        metrics = self.gateway.metrics
        ids = id_map(pending.fixes)
        try:
            if not scans(api_key, version):
                scan = None if ids is None else ResponseScan(api_key, version, ids)
                await relay(source, self.client, size, head, scan)
            else:

                def finish(tail: bytearray) -> bytearray:
                    try:
                        where = node_endpoints_entry(tail)
                    except (IndexError, ValueError) as exc:
                        raise ProtocolViolation(f"malformed {api_name(api_key)} response from upstream: {exc}") from exc
                    if where is not None:
                        # Too late to rewrite (the length went out first): hide the hints under a
                        # tag no client knows; clients skip it and ask the gateway for Metadata.
                        tail[where] = NEUTRAL_TAG
                        log.info(
                            "dropped KIP-951 leader hints from a streamed %s response",
                            api_name(api_key),
                            extra=self._fields(),
                        )
                    return tail

                await relay(source, self.client, size, head, ResponseScan(api_key, version, ids), finish)
        except ProtocolViolation as exc:
            self._closing(exc)
            if self._nursery is not None:
                self._nursery.cancel_scope.cancel()
            raise UpstreamClosed(str(exc)) from exc
        metrics.streamed_response(api_key)
        metrics.response(api_key, size, time.perf_counter() - pending.started)
        self.fill(pending, _STREAMED)

    # -- processing responses ---------------------------------------------------------------------------

    def _plain_response(self, pending: Pending, frame: bytearray) -> bytearray:
        """A response no hook needs: as it came, unless it carries broker addresses (KIP-951
        leader hints) the core must rewrite."""
        api_key, version = pending.api_key, pending.api_version
        for fix in pending.fixes:
            frame = fix(frame)
        if not carries_addresses(api_key, version) or not has_node_endpoints(api_key, version, frame):
            return frame
        body = _decoded(pending, frame)
        if body is None:
            return frame
        rewritten = self.gateway.core_rules.response(api_key, version, body, self.info)
        return frame if rewritten is body else encode_response(rewritten, pending.client_corr)

    def _records_in_frame(self, pending: Pending, frame: bytearray) -> bool:
        """Whether a Fetch response's records hooks can run on its frame: flexible, no response
        hook wanting the decoded body, no leader hints for the core to rewrite."""
        if pending.api_key != ApiKey.FETCH or pending.api_version < FETCH_FRAME_VERSION:
            return False
        chain = self.dispatcher().chain
        if not chain.fetch_records or chain.responses_for(ApiKey.FETCH):
            return False
        return not has_node_endpoints(pending.api_key, pending.api_version, frame)

    async def _process_response(self, pending: Pending, frame: bytearray) -> bytearray:
        if not pending.decode:
            return self._plain_response(pending, frame)
        for fix in pending.fixes:
            frame = fix(frame)
        if self._records_in_frame(pending, frame):
            try:
                done = await self.dispatcher().fetch_records_in_frame(
                    self.info, pending.api_version, pending.client_id, frame
                )
            except InvalidHeader as exc:
                log.debug("Fetch response decoded: its frame does not walk: %s", exc, extra=self._fields())
            else:
                return frame if done is None else done
        body = _decoded(pending, frame)
        if body is None:
            return frame
        api_key = pending.api_key
        original = body
        body = self.gateway.core_rules.response(api_key, pending.api_version, body, self.info)
        dispatcher = self.dispatcher()
        chain = dispatcher.chain
        if chain.responses_for(api_key) or pending.failures or (api_key == ApiKey.FETCH and chain.fetch_records):
            ctx = ResponseContext(
                self.info,
                api_key,
                pending.api_version,
                pending.client_corr,
                pending.client_id,
                pending.request,
                body,
                self.gateway.topic_names_for(self.info.vcluster),
                pending.notes,
                _sender=self._send_gateway_request,
            )
            body = await dispatcher.response(ctx, failures=pending.failures)
        if body is original:
            return frame
        return encode_response(body, pending.client_corr)


def _decoded(pending: Pending, frame: bytearray) -> Any:
    """The response's body, or None when it goes to the client as it came: no class for its
    version, or not decodable (e.g. an ApiVersions error answered in v0 format)."""
    api_key, version = pending.api_key, pending.api_version
    if response_class(api_key, version) is None:
        return None
    try:
        return decode_response(api_key, version, frame)
    except Exception as exc:
        log.debug("forwarding undecodable %s response as is: %s", api_name(api_key), exc)
        return None


_STREAM_HEAD = 1024  # once this much of them is in: enough for the header and Produce's acks
_COPY_LIMIT = 64 * 1024  # larger responses are sent on their own, not copied into a batch of writes
_REQUEST_TIMED_OUT = 7  # retriable: the client's library retries
