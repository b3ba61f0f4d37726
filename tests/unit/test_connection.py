"""A client connection over memory streams, with the test as the broker: order, acks=0, the
upstream request timeout, lazy upstream connections and pooling, without sockets."""

from __future__ import annotations

import datetime
import struct
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
import trio
import trio.testing
from kio.schema.errors import ErrorCode

import kanal.net.connection as connection_module
from kanal.api.context import Connection
from kanal.api.interceptor import InterceptorSpec, Scope
from kanal.config.settings import Settings
from kanal.metrics import GatewayMetrics
from kanal.net.channel import KafkaChannel
from kanal.net.connection import ClientConnection, ConnectionHost
from kanal.net.upstream_link import UpstreamLink
from kanal.net.upstream_pool import UpstreamPool
from kanal.pipeline.chain import Pipeline
from kanal.pipeline.core_rules import CoreRules
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.api import require_request_class, response_class
from kanal.protocol.entities import build, nested
from kanal.protocol.framing import FrameReader
from kanal.protocol.headers import parse_request_header, response_correlation_id
from kanal.protocol.messages import decode_request_body, decode_response, encode_request, encode_response
from kanal.protocol.records import Record, encode_batch
from kanal.protocol.topic_names import TopicNames
from kanal.tenancy.interceptor import VirtualClusterNames
from kanal.tenancy.names import VirtualNames
from kanal.testing import FakeKafka, FakeServices


def metadata_request() -> Any:
    return build(require_request_class(3, 12), topics=())


def metadata_response() -> Any:
    cls = response_class(3, 12)
    assert cls is not None
    return build(cls, topics=())


def produce_response(topic: str) -> Any:
    cls = response_class(0, 9)
    assert cls is not None
    topic_cls = nested(cls, "responses")
    partition = build(nested(topic_cls, "partition_responses"), index=0, error_code=ErrorCode.none, base_offset=3)
    return build(cls, responses=(build(topic_cls, name=topic, partition_responses=(partition,)),))


def produce_request(acks: int) -> Any:
    cls = require_request_class(0, 9)
    topic_cls = nested(cls, "topic_data")
    batch = encode_batch([Record(0, 0, None, b"v", [])], base_timestamp=1)
    partition = build(nested(topic_cls, "partition_data"), index=0, records=batch)
    return build(
        cls,
        acks=acks,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(build(topic_cls, name="t", partition_data=(partition,)),),
    )


class Broker:
    """The far end of one upstream connection: reads requests, answers when told to."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = FrameReader()
        self.requests: list[bytearray] = []

    async def next_request(self) -> bytearray:
        while len(self.requests) == 0:
            data = await self.stream.receive_some(65536)
            assert data, "the gateway closed the upstream connection"
            self.requests.extend(self.reader.feed(data))
        return self.requests.pop(0)

    async def answer(self, request: bytearray, body: Any) -> None:
        corr = parse_request_header(request).correlation_id
        frame = encode_response(body, corr)
        await self.stream.send_all(struct.pack(">i", len(frame)) + frame)


class Host:
    """What a connection needs of a gateway; every upstream connection opened lands in ``brokers``."""

    def __init__(self, **settings: Any) -> None:
        self.settings = Settings(**settings)
        self.metrics = GatewayMetrics()
        self.pipeline = Pipeline(PluginRegistry(), lambda plugin: None)  # type: ignore[arg-type,return-value]
        self.tap = None
        names = TopicNames()
        self.core_rules = CoreRules(lambda brokers: None, names, lambda node: ("127.0.0.1", 6969))
        self.kafka = FakeKafka()
        self.topic_names = names
        self.brokers: list[Broker] = []
        self.opened = trio.Event()
        self.pool: UpstreamPool | None = None

    def topic_id_name(self, topic_id: Any) -> str | None:
        return None

    def topic_names_for(self, vcluster: str | None) -> TopicNames:
        return self.topic_names

    async def open_link(self, node_id: int, *, shared: bool) -> UpstreamLink:
        ours, theirs = trio.testing.memory_stream_pair()
        self.brokers.append(Broker(theirs))
        self.opened.set()
        return UpstreamLink(
            KafkaChannel(ours, 1 << 20),
            name=f"test:{node_id}",
            request_timeout=self.settings.upstream_request_timeout_ms / 1000,
            shared=shared,
        )

    def upstream_pool(self, node_id: int) -> UpstreamPool | None:
        return self.pool

    def authenticator(self, client_host: str) -> None:
        return None  # a PLAINTEXT listener


class Client:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.reader = FrameReader()
        self.frames: list[bytearray] = []

    async def send(self, request: Any, corr: int) -> None:
        frame = encode_request(request, corr, "test")
        await self.stream.send_all(struct.pack(">i", len(frame)) + frame)

    async def receive(self) -> bytearray:
        while not self.frames:
            data = await self.stream.receive_some(65536)
            assert data, "the gateway closed the client connection"
            self.frames.extend(self.reader.feed(data))
        return self.frames.pop(0)


async def _with_connection(host: Host, test: Callable[[Client], Awaitable[None]], vcluster: str | None = None) -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    info = Connection(id=1, client_address="test:1", listener_address="gw:1", node_id=0)
    if vcluster is not None:
        info.principal, info.vcluster = "alice", vcluster
    connection = ClientConnection(cast(ConnectionHost, host), ours, info)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(connection.run)
        await test(Client(theirs))
        await theirs.aclose()


def test_responses_keep_request_order_and_acks0_gets_none() -> None:
    host = Host()

    async def test(client: Client) -> None:
        await client.send(metadata_request(), 1)
        await client.send(produce_request(acks=0), 2)  # never answered
        await client.send(metadata_request(), 3)
        await host.opened.wait()
        broker = host.brokers[0]
        first, fire, third = [await broker.next_request() for _ in range(3)]
        assert parse_request_header(fire).api_key == 0
        await broker.answer(first, metadata_response())
        await broker.answer(third, metadata_response())
        assert response_correlation_id(await client.receive()) == 1
        assert response_correlation_id(await client.receive()) == 3

    trio.run(_with_connection, host, test)


def test_no_upstream_connection_before_the_first_request() -> None:
    host = Host()

    async def test(client: Client) -> None:
        await trio.testing.wait_all_tasks_blocked()
        assert host.brokers == []
        await client.send(metadata_request(), 1)
        await host.opened.wait()
        assert len(host.brokers) == 1

    trio.run(_with_connection, host, test)


def test_a_hung_broker_gets_the_client_a_retriable_error_and_a_new_upstream_connection() -> None:
    host = Host(upstream_request_timeout_ms=2000)

    async def test(client: Client) -> None:
        await client.send(produce_request(acks=1), 7)
        await host.opened.wait()
        await host.brokers[0].next_request()  # ... and never answered
        start = trio.current_time()
        frame = await client.receive()
        assert response_correlation_id(frame) == 7
        assert trio.current_time() - start >= 2.0
        response = decode_response(0, 9, frame)
        assert response.responses[0].partition_responses[0].error_code == 7  # REQUEST_TIMED_OUT
        await client.send(metadata_request(), 8)  # on a new upstream connection
        while len(host.brokers) < 2:
            await trio.sleep(0.01)
        broker = host.brokers[1]
        await broker.answer(await broker.next_request(), metadata_response())
        assert response_correlation_id(await client.receive()) == 8

    trio.run(_with_connection, host, test, clock=trio.testing.MockClock(autojump_threshold=0.01))


def test_pooled_clients_share_upstream_connections_and_each_gets_its_own_answers() -> None:
    host = Host(upstream_pool_type="round_robin", upstream_num_connection=1)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            host.pool = UpstreamPool(1, lambda: host.open_link(0, shared=True), nursery)
            clients: list[Client] = []
            for n in range(3):
                ours, theirs = trio.testing.memory_stream_pair()
                conn = ClientConnection(
                    cast(ConnectionHost, host),
                    ours,
                    Connection(id=n, client_address=f"test:{n}", listener_address="gw:1", node_id=0),
                )
                nursery.start_soon(conn.run)
                clients.append(Client(theirs))
            for n, client in enumerate(clients):
                await client.send(metadata_request(), 100 + n)
            await host.opened.wait()
            assert len(host.brokers) == 1  # one shared connection for the three
            broker = host.brokers[0]
            requests = [await broker.next_request() for _ in clients]
            for request in requests:
                await broker.answer(request, metadata_response())
            for n, client in enumerate(clients):
                assert response_correlation_id(await client.receive()) == 100 + n
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_a_virtual_clusters_produce_is_renamed_on_the_wire_without_decoding(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in names stage splices the prefix in and out; nothing is decoded either way, and a
    timed-out request is answered with the names the client sent."""
    host = Host(upstream_request_timeout_ms=2000)
    names = VirtualClusterNames(VirtualNames("a."), FakeServices(), "a.")
    spec = InterceptorSpec("kanal-virtual-cluster", names.plugin_name, 1000, Scope(vcluster="a."))
    host.pipeline.builtins = lambda vcluster: [(spec, names)] if vcluster == "a." else []

    def no_decoding(*args: Any) -> Any:
        raise AssertionError("decoded")

    async def test(client: Client) -> None:
        with monkeypatch.context() as patched:
            patched.setattr(connection_module, "decode_request_body", no_decoding)
            patched.setattr(connection_module, "decode_response", no_decoding)
            await client.send(produce_request(acks=1), 5)
            await host.opened.wait()
            broker = host.brokers[0]
            upstream = await broker.next_request()
            header = parse_request_header(upstream)
            sent = decode_request_body(0, 9, upstream, header.body_offset)
            assert [t.name for t in sent.topic_data] == ["a.t"]
            assert sent.topic_data[0].partition_data == produce_request(acks=1).topic_data[0].partition_data
            await broker.answer(upstream, produce_response("a.t"))
            answer = decode_response(0, 9, await client.receive())
            assert [t.name for t in answer.responses] == ["t"]
        await client.send(produce_request(acks=1), 6)
        await broker.next_request()  # ... never answered
        timed_out = decode_response(0, 9, await client.receive())
        assert [(t.name, t.partition_responses[0].error_code) for t in timed_out.responses] == [("t", 7)]

    trio.run(_with_connection, host, test, "a.", clock=trio.testing.MockClock(autojump_threshold=0.01))
