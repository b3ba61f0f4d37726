"""The gateway's own Kafka client (``GatewayServices.kafka``): one connection per broker.

Each connection carries one request at a time, so a slow call (a long-polling Fetch) holds only the
connection to its broker: calls to other brokers, and the gateway's own metadata calls through the
bootstrap connection, go on beside it. Versions are negotiated per connection (ApiVersions) and each
request goes at the newest version both sides know, up to :data:`OWN_REQUEST_VERSIONS`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import trio

from kanal.api.errors import UpstreamError
from kanal.config.upstream import UpstreamSettings
from kanal.net.upstream import Address, Bootstrap, BrokerCalls, UnsupportedVersion, own_request_class, reason
from kanal.protocol.entities import build, nested

_BROKEN = (OSError, ConnectionError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError)


class _Broker:
    """One broker's connection, opened on first use, reopened after a failure."""

    def __init__(self, open_calls: Any) -> None:
        self._open = open_calls
        self.calls: BrokerCalls | None = None
        self.lock = trio.Lock()

    async def call(self, make: Any, timeout: float) -> Any:
        async with self.lock:
            for attempt in (1, 2):
                if self.calls is None:  # a failure to connect or authenticate is not retried here
                    self.calls = await self._open()
                try:
                    return await self.calls.call(make(self.calls), timeout)
                except UnsupportedVersion:
                    raise
                except _BROKEN as exc:
                    await self.aclose()
                    if attempt == 2 or isinstance(exc, trio.TooSlowError):
                        raise UpstreamError(f"upstream call failed: {reason(exc)}") from exc
            raise AssertionError("unreachable")

    async def aclose(self) -> None:
        if self.calls is not None:
            calls, self.calls = self.calls, None
            await calls.aclose()


class GatewayKafkaClient:
    """Implements :class:`kanal.api.services.KafkaClient` over the gateway's upstream settings."""

    def __init__(
        self,
        upstream: UpstreamSettings,
        timeout: float,
        max_frame_size: int,
        client_id: str,
        on_metadata: Callable[[Any], None] | None = None,
    ) -> None:
        self.upstream = upstream
        self.on_metadata = on_metadata  # the gateway learns topic ids from every Metadata answer
        self.timeout = timeout
        self.max_frame_size = max_frame_size
        self.client_id = client_id
        self._bootstrap_servers = Bootstrap(upstream.bootstrap_servers)
        self._bootstrap = _Broker(self._open_bootstrap)
        self._brokers: dict[int, _Broker] = {}
        self.addresses: dict[int, Address] = {}

    async def _open(self, address: Address) -> BrokerCalls:
        return await BrokerCalls.open(address, self.upstream, self.timeout, self.max_frame_size, self.client_id)

    async def _open_bootstrap(self) -> BrokerCalls:
        return await self._bootstrap_servers.connect(self._open)

    @property
    def versions(self) -> dict[int, tuple[int, int]]:
        """The API versions the bootstrap connection's broker offers (empty before the first call)."""
        calls = self._bootstrap.calls
        return calls.versions if calls is not None else {}

    def request_class(self, api_key: int) -> Any:
        return own_request_class(api_key, self.versions)

    def _broker(self, node_id: int | None) -> _Broker:
        if node_id is None:
            return self._bootstrap
        broker = self._brokers.get(node_id)
        if broker is None:
            if node_id not in self.addresses:
                raise UpstreamError(f"broker {node_id} is not known (ask for metadata first)")
            # a broker that moved is reached at its new address once its connection fails
            broker = self._brokers[node_id] = _Broker(lambda: self._open(self.addresses[node_id]))
        return broker

    async def call(self, request: Any, *, node_id: int | None = None, timeout: float | None = None) -> Any:
        return await self._broker(node_id).call(lambda calls: request, timeout or self.timeout)

    async def call_built(self, make: Any, *, node_id: int | None = None, timeout: float | None = None) -> Any:
        """Like :meth:`call`, with the request built by ``make(connection)`` once the connection's
        versions are known (``connection.request_class(api_key)``)."""
        return await self._broker(node_id).call(make, timeout or self.timeout)

    async def metadata(self, topics: Sequence[str] | None = None) -> Any:
        def make(calls: BrokerCalls) -> Any:
            cls = calls.request_class(3)
            requested = None if topics is None else tuple(build(nested(cls, "topics"), name=t) for t in topics)
            return build(cls, topics=requested, allow_auto_topic_creation=False)

        response = await self.call_built(make)
        self.learn({int(b.node_id): (str(b.host), int(b.port)) for b in response.brokers})
        if self.on_metadata is not None:
            self.on_metadata(response)
        return response

    def learn(self, addresses: dict[int, Address]) -> None:
        """Broker addresses from a Metadata or DescribeCluster response."""
        self.addresses.update(addresses)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._bootstrap.aclose()
            for broker in self._brokers.values():
                await broker.aclose()
