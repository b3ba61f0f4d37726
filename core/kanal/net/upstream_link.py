"""One connection to a broker, dedicated to one client or shared by many: it sends requests and
routes each response to whoever waits for it.

The bookkeeping is :class:`~kanal.protocol.session.UpstreamSession`'s; this module only moves
frames. A reader task per link takes responses as they arrive and hands each to its waiter (a
client's slot, or an interceptor's own request). It also watches the oldest request's deadline:
a broker that holds a request past the wait the request asked for plus
``GATEWAY_UPSTREAM_REQUEST_TIMEOUT_MS`` has stopped answering this connection; every waiter then
gets :class:`UpstreamTimeout` and the link closes (the next request opens a new one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import trio

from kanal.net.channel import SMALL_FRAME, KafkaChannel, receive_rest, relay, relay_checked
from kanal.net.forward import PeerClosed
from kanal.protocol.framing import FrameTooLarge, InvalidFrame
from kanal.protocol.headers import InvalidHeader, response_correlation_id, set_request_correlation_id
from kanal.protocol.session import SessionError, UpstreamSession
from kanal.protocol.validate import MalformedRequest, RequestScan

if TYPE_CHECKING:
    from kanal.api.context import Connection

log = logging.getLogger(__name__)


class UpstreamTimeout(ConnectionError):
    """The broker did not answer within the request's wait plus the upstream request timeout."""


class UpstreamClosed(ConnectionError):
    """The upstream connection ended (closed by the broker, broken, or answering out of order)."""


class Waiter(Protocol):
    """Whoever waits for one response on a link."""

    @property
    def info(self) -> Connection: ...

    def can_stream(self, size: int) -> bool:
        """Whether a large response may be forwarded while it arrives (:meth:`relay`)."""
        ...

    async def relay(self, source: trio.abc.ReceiveStream, size: int, head: bytearray) -> None:
        """Forwards the response while it arrives from ``source`` (``head``: its first bytes)."""
        ...

    def deliver(self, frame: bytearray) -> None: ...

    def fail(self, error: ConnectionError) -> None: ...


class _Discard(trio.abc.SendStream):
    """Where the answer to an acks=0 produce goes (some brokers send one)."""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        return None

    async def wait_send_all_might_not_block(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


_DISCARD = _Discard()


class UpstreamLink:
    """A broker connection, its session, and the task reading its responses (:meth:`run`)."""

    def __init__(
        self,
        channel: KafkaChannel,
        *,
        name: str,
        request_timeout: float,
        shared: bool,
        tap: Tap | None = None,
        on_closed: Callable[[], None] | None = None,
    ) -> None:
        self.channel = channel
        self.name = name
        self.shared = shared
        self.session: UpstreamSession[Waiter] = UpstreamSession()
        self.closed = False
        self._request_timeout = request_timeout
        self._send_lock = trio.StrictFIFOLock()
        self._watch: trio.CancelScope | None = None
        self._sending: trio.CancelScope | None = None
        self._tap = tap
        self._on_closed = on_closed

    async def send(
        self, frame: bytearray, waiter: Waiter | None, wait_ms: int = 0, info: Connection | None = None
    ) -> None:
        """Sends a request (its correlation id is replaced by this link's); ``waiter`` gets the
        answer, or none is expected (acks=0). ``info``: the client's, for the frame tap."""
        if self.closed:
            raise UpstreamClosed(f"upstream connection {self.name} is closed")
        lock = self._send_lock
        rest: memoryview | None = None
        if not lock.locked() and len(frame) < SMALL_FRAME:
            # The usual path: nothing else being sent, the frame goes in one write without a trip
            # through the scheduler; only what the socket did not take is sent under the lock.
            self._register(frame, waiter, wait_ms, info)
            try:
                rest = self.channel.try_send_frame(frame)
            except trio.BrokenResourceError as exc:
                self.close(UpstreamClosed(f"sending to upstream {self.name} failed: {exc}"))
                raise UpstreamClosed(str(exc)) from exc
            if rest is None:
                return
            lock.acquire_nowait()  # (still free: nothing ran since) the rest must follow, uncut
        elif lock.locked():  # another client's request is being sent on this shared link
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            if rest is None:
                self._register(frame, waiter, wait_ms, info)
            # A frame cut in the middle would garble the connection for every request after it:
            # only :meth:`close` (a broker that stopped reading) stops a send once it started.
            with trio.CancelScope(shield=True) as sending:
                self._sending = sending
                if rest is None:
                    await self.channel.send_frame(frame)
                else:
                    await self.channel.send_rest(rest)
            self._sending = None
            if sending.cancelled_caught:
                raise UpstreamClosed(f"upstream connection {self.name} closed while sending")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.close(UpstreamClosed(f"sending to upstream {self.name} failed: {exc}"))
            raise UpstreamClosed(str(exc)) from exc
        finally:
            lock.release()

    async def send_streamed(
        self,
        source: trio.abc.ReceiveStream,
        size: int,
        head: bytearray,
        waiter: Waiter | None,
        wait_ms: int = 0,
        check: RequestScan | None = None,
    ) -> None:
        """Sends a large request while it arrives from ``source`` (``head``: its first bytes),
        checked on the way by ``check`` (the protocol firewall) when given."""
        if self.closed:
            raise UpstreamClosed(f"upstream connection {self.name} is closed")
        async with self._send_lock:
            self._register(head, waiter, wait_ms)
            try:
                if check is None:
                    await relay(source, self.channel.stream, size, head)
                else:
                    await relay_checked(source, self.channel.stream, size, head, check)
            except MalformedRequest:  # the broker holds part of a frame: the connection is lost
                self.close(UpstreamClosed(f"a malformed request to upstream {self.name} was cut short"))
                raise
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self.close(UpstreamClosed(f"sending to upstream {self.name} failed: {exc}"))
                raise UpstreamClosed(str(exc)) from exc
            except trio.Cancelled:  # the frame is cut: the connection is of no use any more
                self.close(UpstreamClosed(f"a request to upstream {self.name} was cut short"))
                raise

    def _register(self, frame: bytearray, waiter: Waiter | None, wait_ms: int, info: Connection | None = None) -> None:
        """Gives the request this link's next correlation id and expects its answer for ``waiter``."""
        session = self.session
        corr = session.next_correlation_id()
        set_request_correlation_id(frame, corr)
        if self._tap is not None and info is not None:
            self._tap(info, "g2u", frame)
        if waiter is None:
            session.sent_unanswered(corr)
            return
        session.sent(corr, waiter, trio.current_time() + self._request_timeout + wait_ms / 1000)
        watch = self._watch
        if watch is not None and session.deadline < watch.deadline:
            watch.deadline = session.deadline

    def close(self, error: ConnectionError) -> None:
        """Fails every waiter with ``error`` and closes the connection (idempotent)."""
        if self.closed:
            return
        self.closed = True
        for waiter in self.session.abandon():
            waiter.fail(error)
        if self._watch is not None:
            self._watch.cancel()
        if self._sending is not None:
            self._sending.cancel()

    async def run(self) -> None:
        """Reads responses until the link closes; closes the socket on the way out."""
        try:
            await self._read()
        except PeerClosed:
            self.close(UpstreamClosed(f"upstream {self.name} closed the connection"))
        except (SessionError, FrameTooLarge, InvalidFrame, InvalidHeader) as exc:
            log.warning("closing upstream connection %s: %s", self.name, exc)
            self.close(UpstreamClosed(f"upstream {self.name} broke the protocol: {exc}"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            # (also a client that went away while its response was forwarded straight to it)
            self.close(UpstreamClosed(f"upstream connection {self.name} failed: {exc}"))
        finally:
            self.close(UpstreamClosed(f"upstream connection {self.name} closed"))
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.channel.stream)
            if self._on_closed is not None:
                self._on_closed()

    async def _read(self) -> None:
        session = self.session
        channel = self.channel
        receive = channel.receive_frame if self.shared else channel.receive_head
        while not self.closed:
            # One watch for many responses (a scope per read costs more than the rest of the read):
            # its deadline is the oldest request's when it starts, lowered by a send to an idle
            # link; when it fires early (that request was answered), a new one starts.
            with trio.CancelScope(deadline=session.deadline) as watch:
                self._watch = watch
                while True:
                    head = await receive()
                    if isinstance(head, tuple):
                        deadline = session.deadline
                        with trio.CancelScope(shield=True):  # never cut a frame on a stale deadline
                            with trio.move_on_at(deadline) as this_one:
                                await self._large(*head)
                        if this_one.cancelled_caught:
                            self._timed_out()
                            return
                        continue
                    waiter = session.received(response_correlation_id(head))
                    if waiter is not None:
                        if self._tap is not None:
                            self._tap(waiter.info, "u2g", head)
                        waiter.deliver(head)
            self._watch = None
            if self.closed:
                return
            if trio.current_time() >= session.deadline:
                self._timed_out()
                return

    def _timed_out(self) -> None:
        log.warning(
            "upstream %s did not answer within the request's wait plus %d ms"
            " (GATEWAY_UPSTREAM_REQUEST_TIMEOUT_MS): closing that connection",
            self.name,
            int(self._request_timeout * 1000),
        )
        self.close(UpstreamTimeout(f"no answer from upstream {self.name} in time"))

    async def _large(self, size: int, head: bytearray) -> None:
        """A large response still arriving: forwarded while it arrives if its waiter can take it so,
        else received whole."""
        waiter = self.session.received(response_correlation_id(head))
        if waiter is None:
            await relay(self.channel.stream, _DISCARD, size, head)
            return
        if waiter.can_stream(size):
            await waiter.relay(self.channel.stream, size, head)
        else:
            waiter.deliver(await receive_rest(self.channel.stream, size, head))


class Tap(Protocol):
    def __call__(self, connection: Connection, direction: str, frame: bytes | bytearray) -> None: ...
