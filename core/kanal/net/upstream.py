"""Connections to the backing cluster: TCP, optional TLS, optional SASL, then plain frames."""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import trio
from kio.schema.errors import ErrorCode

from kanal.api.errors import UpstreamError
from kanal.config.upstream import UpstreamSettings
from kanal.net.channel import KafkaChannel, RequestChannel
from kanal.net.tls import upstream_context
from kanal.protocol.api import require_request_class, supported_versions
from kanal.protocol.entities import build
from kanal.protocol.sasl import SaslError, mechanism_for

log = logging.getLogger(__name__)

Address = tuple[str, int]
T = TypeVar("T")


async def _sasl(channel: KafkaChannel, upstream: UpstreamSettings) -> None:
    assert upstream.sasl_mechanism and upstream.sasl_username is not None and upstream.sasl_password is not None
    calls = RequestChannel(channel)
    handshake = await calls.call(build(require_request_class(17, 1), mechanism=upstream.sasl_mechanism))
    if handshake.error_code != ErrorCode.none:
        raise UpstreamError(
            f"upstream refused SASL mechanism {upstream.sasl_mechanism} ({handshake.error_code.name}); "
            f"it offers {', '.join(handshake.mechanisms)}"
        )
    mechanism = mechanism_for(upstream.sasl_mechanism, upstream.sasl_username, upstream.sasl_password)
    message: bytes | None = mechanism.start()
    while message is not None:
        reply = await calls.call(build(require_request_class(36, 2), auth_bytes=message))
        if reply.error_code != ErrorCode.none:
            raise UpstreamError(f"upstream SASL authentication failed: {reply.error_message or reply.error_code.name}")
        try:
            message = mechanism.step(bytes(reply.auth_bytes))
        except SaslError as exc:
            raise UpstreamError(f"upstream SASL authentication failed: {exc}") from exc


async def open_upstream(
    address: Address,
    upstream: UpstreamSettings,
    timeout: float,
    max_frame_size: int,
    context: ssl.SSLContext | None = None,
) -> KafkaChannel:
    """A ready channel to one broker: connected, TLS-wrapped and authenticated as configured."""
    host, port = address
    try:
        with trio.fail_after(timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            ctx = context if context is not None else upstream_context(upstream)
            if ctx is not None:
                tls = trio.SSLStream(stream, ctx, server_hostname=host)
                await tls.do_handshake()
                stream = tls
            channel = KafkaChannel(stream, max_frame_size)
            if upstream.uses_sasl:
                await _sasl(channel, upstream)
            return channel
    except trio.TooSlowError:
        raise UpstreamError(f"timed out connecting to upstream {host}:{port}") from None
    except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
        raise UpstreamError(f"cannot connect to upstream {host}:{port}: {exc}") from exc


def reason(exc: BaseException) -> str:
    """What went wrong, never empty (``trio.TooSlowError`` and some OS errors have no message)."""
    if isinstance(exc, trio.TooSlowError):
        return str(exc) or "timed out"
    return str(exc) or type(exc).__name__


class Bootstrap:
    """The bootstrap servers, tried in turn from the one after the last used, so that a server
    that failed is not the first one tried again."""

    def __init__(self, servers: Sequence[Address]) -> None:
        self.servers = servers
        self._next = 0

    async def connect(self, open_one: Callable[[Address], Awaitable[T]]) -> T:
        """The first ``open_one(address)`` that succeeds; UpstreamError naming the last failure
        when none does."""
        last: Exception | None = None
        for _ in range(len(self.servers)):
            address = self.servers[self._next % len(self.servers)]
            self._next += 1
            try:
                return await open_one(address)
            except (OSError, trio.BrokenResourceError, trio.TooSlowError) as exc:
                last = exc
        raise UpstreamError(reason(last) if last else "no bootstrap servers")


async def api_versions(channel: KafkaChannel, client_id: str) -> tuple[RequestChannel, dict[int, tuple[int, int]]]:
    """Asks a new connection which versions of each API the broker offers."""
    calls = RequestChannel(channel, client_id)
    reply = await calls.call(
        build(require_request_class(18, 3), client_software_name="kanal", client_software_version="0")
    )
    return calls, {int(k.api_key): (int(k.min_version), int(k.max_version)) for k in reply.api_keys}


class UnsupportedVersion(UpstreamError):
    """The broker offers none of the versions of an API that the gateway's own requests use."""


# Versions of the gateway's own requests: the newest ones that still name topics, not topic ids.
OWN_REQUEST_VERSIONS = {0: (3, 9), 1: (4, 12), 2: (1, 7), 3: (1, 12), 18: (3, 3), 19: (2, 7)}


def own_request_class(api_key: int, versions: dict[int, tuple[int, int]]) -> Any:
    """The request class of ``api_key`` at the highest version that ``versions`` (a broker's
    ApiVersions; empty: not known yet) allows, within :data:`OWN_REQUEST_VERSIONS` for the APIs listed
    there and within what the gateway speaks for the others."""
    known = supported_versions(api_key)
    if known is None:
        raise UnsupportedVersion(f"the gateway does not speak api key {api_key}")
    lowest, highest = OWN_REQUEST_VERSIONS.get(api_key, known)
    low, high = versions.get(api_key, (0, highest))
    version = min(high, highest)
    if version < max(low, lowest):
        raise UnsupportedVersion(f"the upstream does not support api key {api_key} at versions {lowest}-{highest}")
    return require_request_class(api_key, version)


class BrokerCalls:
    """One connection to one broker for the gateway's own requests, with the API versions the
    broker offers: each request goes at the highest version both sides know."""

    def __init__(self, calls: RequestChannel, versions: dict[int, tuple[int, int]]) -> None:
        self.calls = calls
        self.versions = versions

    @classmethod
    async def open(
        cls, address: Address, upstream: UpstreamSettings, timeout: float, max_frame_size: int, client_id: str
    ) -> BrokerCalls:
        channel = await open_upstream(address, upstream, timeout, max_frame_size)
        return cls(*await api_versions(channel, client_id))

    def request_class(self, api_key: int) -> Any:
        """The request class of ``api_key`` at the highest version of :data:`OWN_REQUEST_VERSIONS`
        that the broker offers."""
        return own_request_class(api_key, self.versions)

    async def call(self, body: Any, timeout: float) -> Any:
        with trio.fail_after(timeout):
            return await self.calls.call(body)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self.calls.channel.aclose()
