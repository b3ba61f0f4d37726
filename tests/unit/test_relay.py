"""Cut-through relay of large frames: byte for byte, records passed on unread, leader hints hidden."""

from __future__ import annotations

import socket
import struct
import uuid
from collections.abc import Callable

import pytest
import trio
import trio.testing

from kanal.net import forward as forward_module
from kanal.net.channel import relay
from kanal.net.forward import PeerClosed
from kanal.protocol.entities import build, nested
from kanal.protocol.framing import InvalidFrame
from kanal.protocol.messages import decode_response, encode_response, response_type
from kanal.protocol.records import Record, encode_batch
from kanal.protocol.scan import NEUTRAL_TAG, ResponseScan, node_endpoints_entry, node_endpoints_position

HEAD = 1000  # bytes of the frame already read when the relay starts


def _fetch_v16(partitions: int, endpoints: int, value_size: int = 50_000) -> bytes:
    cls = response_type(1, 16)
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partitions")
    batch = encode_batch([Record(i, 0, None, bytes([i]) * value_size, []) for i in range(8)], base_timestamp=1)
    parts = tuple(
        build(part_cls, partition_index=i, records=batch if i % 3 else b"", preferred_read_replica=-1)
        for i in range(partitions)
    )
    eps = tuple(build(nested(cls, "node_endpoints"), node_id=n, host="broker", port=9092) for n in range(endpoints))
    body = build(cls, responses=(build(topic_cls, topic_id=uuid.uuid4(), partitions=parts),), node_endpoints=eps)
    return bytes(encode_response(body, 7))


def _hide(tail: bytearray) -> bytearray:
    where = node_endpoints_entry(tail)
    if where is not None:
        tail[where] = NEUTRAL_TAG
    return tail


Pair = Callable[[], tuple[trio.abc.Stream, trio.abc.Stream]]


def _sockets() -> tuple[trio.abc.Stream, trio.abc.Stream]:
    a, b = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return trio.SocketStream(a), trio.SocketStream(b)


def _memory() -> tuple[trio.abc.Stream, trio.abc.Stream]:
    return trio.testing.memory_stream_pair()  # type: ignore[return-value]


def _run_relay(
    pair: Pair, frame: bytes, scan: ResponseScan | None, send: bytes | None = None, chunk: int | None = None
) -> bytes:
    """Writes ``send`` (default: the frame) into one pair, ``chunk`` bytes at a time (default: at
    once), relays the frame to another; returns what came out (length prefix included)."""
    received = bytearray()
    failed: list[Exception] = []

    async def main() -> None:
        upstream_far, upstream = pair()
        client, client_far = pair()

        async def feed() -> None:
            data = frame[HEAD:] if send is None else send
            step = chunk or len(data)
            for at in range(0, len(data), step):
                await upstream_far.send_all(data[at : at + step])
                await trio.testing.wait_all_tasks_blocked()  # the relay reads this piece alone
            await upstream_far.aclose()

        async def drain() -> None:
            while data := await client_far.receive_some(1 << 20):
                received.extend(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(feed)
            nursery.start_soon(drain)
            try:
                await relay(upstream, client, len(frame), bytearray(frame[:HEAD]), scan, _hide)
            except Exception as exc:
                failed.append(exc)
                nursery.cancel_scope.cancel()
            finally:
                await client.aclose()

    trio.run(main)
    if failed:
        raise failed[0]
    return bytes(received)


@pytest.mark.parametrize("pair", [_sockets, _memory], ids=["sockets-splice", "memory-copy"])
def test_a_scanned_fetch_response_passes_byte_for_byte(pair: Pair) -> None:
    frame = _fetch_v16(partitions=7, endpoints=0)
    assert len(frame) > 1_500_000
    out = _run_relay(pair, frame, ResponseScan(1, 16))
    assert out == struct.pack(">i", len(frame)) + frame


@pytest.mark.parametrize("pair", [_sockets, _memory], ids=["sockets-splice", "memory-copy"])
def test_leader_hints_at_the_end_of_a_streamed_response_are_hidden(pair: Pair) -> None:
    frame = _fetch_v16(partitions=4, endpoints=2)
    where = node_endpoints_position(1, 16, frame)
    assert where is not None
    out = _run_relay(pair, frame, ResponseScan(1, 16))[4:]
    assert len(out) == len(frame) and out[where] == NEUTRAL_TAG
    assert out[:where] == frame[:where] and out[where + 1 :] == frame[where + 1 :]
    # the client sees the same response, minus the hints it cannot be given any more
    body = decode_response(1, 16, out[: where - 1] + b"\x00")
    assert len(body.responses[0].partitions) == 4


def _fetch_by_ids(version: int, topics: int, value_size: int) -> bytes:
    cls = response_type(1, version)
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partitions")
    batch = encode_batch([Record(0, 0, None, b"v" * value_size, [])], base_timestamp=1)
    parts = tuple(build(part_cls, partition_index=p, records=batch, preferred_read_replica=-1) for p in range(3))
    responses = tuple(build(topic_cls, topic_id=uuid.UUID(int=t + 1), partitions=parts) for t in range(topics))
    return bytes(encode_response(build(cls, responses=responses), 7))


def _flip(topic_id: bytes) -> bytes:
    return bytes(b ^ 0x5A for b in topic_id)


@pytest.mark.parametrize("version", [13, 16])
@pytest.mark.parametrize("chunk", [None, 7, 16, 4096])
def test_topic_ids_are_mapped_while_a_response_streams(version: int, chunk: int | None) -> None:
    frame = _fetch_by_ids(version, topics=6, value_size=700)
    out = _run_relay(_memory, frame, ResponseScan(1, version, _flip), chunk=chunk)[4:]
    assert len(out) == len(frame)
    body = decode_response(1, version, out)
    mapped = [uuid.UUID(bytes=_flip(uuid.UUID(int=t + 1).bytes)) for t in range(6)]
    assert [t.topic_id for t in body.responses] == mapped
    expected = decode_response(1, version, frame)
    assert [[p.records for p in t.partitions] for t in body.responses] == [
        [p.records for p in t.partitions] for t in expected.responses
    ]


def test_an_unscanned_frame_is_spliced_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    real = forward_module.os.splice

    def counting(*args: int, **kwargs: int) -> int:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(forward_module.os, "splice", counting)
    frame = _fetch_v16(partitions=3, endpoints=0)
    assert _run_relay(_sockets, frame, None) == struct.pack(">i", len(frame)) + frame
    assert calls >= 2  # the bytes went through a pipe, not through the process


@pytest.mark.parametrize("pair", [_sockets, _memory], ids=["sockets-splice", "memory-copy"])
def test_a_source_that_ends_early_is_reported(pair: Pair) -> None:
    frame = _fetch_v16(partitions=4, endpoints=0)
    with pytest.raises(PeerClosed):
        _run_relay(pair, frame, ResponseScan(1, 16), send=frame[HEAD : len(frame) // 2])


def test_a_response_whose_structure_overruns_the_frame_is_refused() -> None:
    frame = _fetch_v16(partitions=4, endpoints=0)
    short = frame[: len(frame) - 40]  # announced shorter than its own record sets say
    with pytest.raises(InvalidFrame):
        _run_relay(_memory, short, ResponseScan(1, 16))


@pytest.mark.parametrize("pair", [_sockets, _memory], ids=["sockets", "memory"])
def test_a_large_frame_is_received_whole_and_the_next_one_after_it(pair: Pair) -> None:
    from kanal.net.channel import KafkaChannel

    big = _fetch_v16(partitions=4, endpoints=0)
    small = b"\x00\x00\x00\x08tail"
    got: list[bytes] = []

    async def main() -> None:
        far, near = pair()
        channel = KafkaChannel(near, max_frame_size=100 * 1024 * 1024)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(far.send_all, struct.pack(">i", len(big)) + big + struct.pack(">i", len(small)) + small)
            got.append(bytes(await channel.receive_frame()))
            got.append(bytes(await channel.receive_frame()))

    trio.run(main)
    assert got == [big, small]


def test_memory_follows_the_bytes_that_arrived_not_the_announced_length() -> None:
    """A peer announcing a huge frame and sending little costs little (no buffer of the announced size)."""
    import tracemalloc

    from kanal.net.channel import KafkaChannel

    announced = 90 * 1024 * 1024
    peaks: list[int] = []

    async def main() -> None:
        far, near = _memory()
        channel = KafkaChannel(near, max_frame_size=100 * 1024 * 1024)
        await far.send_all(struct.pack(">i", announced) + b"\x00" * 300_000)
        await far.aclose()
        tracemalloc.start()
        try:
            with pytest.raises(PeerClosed):
                await channel.receive_frame()
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()

    trio.run(main)
    assert peaks[0] < 10 * 1024 * 1024
