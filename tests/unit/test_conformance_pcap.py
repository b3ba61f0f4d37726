"""The pcap/pcapng importer, on captures written by hand here (Ethernet, loopback, Linux cooked and
raw link types; IPv4 and IPv6; segmentation, reordering, retransmission, sequence wrap-around)."""

from __future__ import annotations

import ipaddress
import itertools
import struct
from pathlib import Path

import pytest

from kanal.cli import main
from kanal.conformance.frames import C2S, S2C, Frame, read_frames
from kanal.conformance.pcap import (
    LINKTYPE_ETHERNET,
    LINKTYPE_LINUX_SLL,
    LINKTYPE_LINUX_SLL2,
    LINKTYPE_LOOP,
    LINKTYPE_NULL,
    LINKTYPE_RAW,
    PcapError,
    import_pcap,
    read_packets,
)

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = ROOT / "conformance" / "captures" / "kafka"
BROKER = 9092

SYN, ACK, FIN, PSH = 0x02, 0x10, 0x01, 0x08


# -- writing packets by hand ---------------------------------------------------------------------


def tcp(sport: int, dport: int, seq: int, payload: bytes = b"", flags: int = ACK | PSH) -> bytes:
    return struct.pack(">HHIIBBHHH", sport, dport, seq & 0xFFFFFFFF, 0, 5 << 4, flags, 65535, 0, 0) + payload


def ipv4(src: str, dst: str, segment: bytes) -> bytes:
    header = struct.pack(
        ">BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(segment),
        1,
        0x4000,
        64,
        6,
        0,
        ipaddress.IPv4Address(src).packed,
        ipaddress.IPv4Address(dst).packed,
    )
    return header + segment


def ipv6(src: str, dst: str, segment: bytes, hop_by_hop: bool = False) -> bytes:
    ext = b""
    next_header = 6
    if hop_by_hop:  # an extension header the parser must skip
        ext = bytes([6, 0]) + b"\x01\x04\x00\x00\x00\x00"
        next_header = 0
    header = struct.pack(
        ">IHBB16s16s",
        6 << 28,
        len(ext) + len(segment),
        next_header,
        64,
        ipaddress.IPv6Address(src).packed,
        ipaddress.IPv6Address(dst).packed,
    )
    return header + ext + segment


def ethernet(ip: bytes, vlan: bool = False) -> bytes:
    ethertype = 0x86DD if ip[0] >> 4 == 6 else 0x0800
    tag = struct.pack(">HH", 0x8100, 42) if vlan else b""
    padding = b"\x00" * max(0, 46 - len(ip))  # Ethernet pads short frames: the IP length must win
    return b"\x02" * 6 + b"\x04" * 6 + tag + struct.pack(">H", ethertype) + ip + padding


def pcap(packets: list[tuple[float, bytes]], link_type: int, *, nanos: bool = False, endian: str = "<") -> bytes:
    magic = 0xA1B23C4D if nanos else 0xA1B2C3D4
    out = struct.pack(endian + "IHHiIII", magic, 2, 4, 0, 0, 262144, link_type)
    for t, data in packets:
        sec = int(t)
        frac = round((t - sec) * (1e9 if nanos else 1e6))
        out += struct.pack(endian + "IIII", sec, frac, len(data), len(data)) + data
    return out


def pcapng(
    packets: list[tuple[float, bytes]], link_type: int, *, tsresol: int | None = None, endian: str = "<"
) -> bytes:
    def block(kind: int, body: bytes) -> bytes:
        body += b"\x00" * (-len(body) % 4)
        length = 12 + len(body)
        return struct.pack(endian + "II", kind, length) + body + struct.pack(endian + "I", length)

    out = block(0x0A0D0D0A, struct.pack(endian + "IHHq", 0x1A2B3C4D, 1, 0, -1))
    options = b""
    if tsresol is not None:
        options = struct.pack(endian + "HH", 9, 1) + bytes([tsresol]) + b"\x00" * 3 + struct.pack(endian + "HH", 0, 0)
    out += block(1, struct.pack(endian + "HHI", link_type, 0, 0) + options)
    unit = 10.0 ** -(tsresol if tsresol is not None else 6)
    for t, data in packets:
        ticks = round(t / unit)
        out += block(6, struct.pack(endian + "IIIII", 0, ticks >> 32, ticks & 0xFFFFFFFF, len(data), len(data)) + data)
    return out


def framed(frame: Frame) -> bytes:
    return len(frame.data).to_bytes(4, "big") + frame.data


def first_exchanges(name: str, conn: int) -> list[Frame]:
    return [f for f in read_frames(CAPTURES / name) if f.conn == conn]


class Stream:
    """Writes one TCP connection's packets: handshake, then data segments as asked."""

    def __init__(
        self,
        wrap,
        client: tuple[str, int],
        server: tuple[str, int],
        isn_c: int = 1000,
        isn_s: int = 5000,
        t: float = 1700000000.0,
    ) -> None:
        self.wrap, self.client, self.server = wrap, client, server
        self.seq = {C2S: isn_c, S2C: isn_s}
        self.t = t
        self.packets: list[tuple[float, bytes]] = []

    def _emit(self, direction: str, seq: int, payload: bytes, flags: int) -> None:
        self.t += 0.001
        src, dst = (self.client, self.server) if direction == C2S else (self.server, self.client)
        self.packets.append((self.t, self.wrap(src[0], dst[0], tcp(src[1], dst[1], seq, payload, flags))))

    def handshake(self) -> None:
        self._emit(C2S, self.seq[C2S], b"", SYN)
        self._emit(S2C, self.seq[S2C], b"", SYN | ACK)
        self.seq[C2S] += 1
        self.seq[S2C] += 1

    def send(
        self,
        direction: str,
        data: bytes,
        cuts: tuple[int, ...] = (),
        order: tuple[int, ...] | None = None,
        repeat: int | None = None,
    ) -> None:
        """Sends ``data`` cut at ``cuts``, the pieces in ``order``; ``repeat`` resends a piece."""
        bounds = [0, *cuts, len(data)]
        pieces = [(self.seq[direction] + a, data[a:b]) for a, b in itertools.pairwise(bounds)]
        for i in order if order is not None else range(len(pieces)):
            self._emit(direction, *pieces[i], ACK | PSH)
        if repeat is not None:
            self._emit(direction, *pieces[repeat], ACK | PSH)
        self.seq[direction] += len(data)

    def close(self) -> None:
        self._emit(C2S, self.seq[C2S], b"", FIN | ACK)
        self._emit(S2C, self.seq[S2C], b"", FIN | ACK)


# -- tests ---------------------------------------------------------------------------------------


def test_ethernet_ipv4_with_segmentation_reordering_and_retransmission() -> None:
    frames = first_exchanges("rdkafka.jsonl", 1)  # ApiVersions and Metadata, request and response
    assert [f.dir for f in frames] == [C2S, S2C, C2S, S2C]

    def wrap(src: str, dst: str, seg: bytes) -> bytes:
        return ethernet(ipv4(src, dst, seg), vlan=True)

    stream = Stream(wrap, ("10.0.0.2", 40000), ("10.0.0.1", BROKER))
    stream.handshake()
    stream.send(C2S, framed(frames[0]), cuts=(2, 10))  # the length prefix itself is split
    stream.send(S2C, framed(frames[1]), cuts=(100, 200), order=(2, 0, 1), repeat=0)
    stream.send(C2S, framed(frames[2]), cuts=(5,), order=(1, 0), repeat=1)
    stream.send(S2C, framed(frames[3]))
    stream.close()
    noise = (stream.t + 1, ethernet(ipv4("10.0.0.2", "10.0.0.9", tcp(40001, 80, 1, b"GET / HTTP/1.1\r\n\r\n"))))
    result = import_pcap(pcap([*stream.packets, noise], LINKTYPE_ETHERNET), BROKER)

    assert result.warnings == []
    assert result.connections == 1
    assert [(f.conn, f.seq, f.dir, f.api_key, f.api_version, f.correlation_id, f.data) for f in result.frames] == [
        (1, i, f.dir, f.api_key, f.api_version, f.correlation_id, f.data) for i, f in enumerate(frames)
    ]
    # each frame is stamped with the time of the packet that completed it, in completion order
    times = [f.t for f in result.frames]
    assert times == sorted(times) and times[0] > 1700000000.0


def test_pcapng_loopback_ipv6_big_endian_nanoseconds_and_several_connections() -> None:
    first = first_exchanges("kafkapython.jsonl", 1)
    second = first_exchanges("kafkapython.jsonl", 2)

    def wrap(src: str, dst: str, seg: bytes) -> bytes:
        return struct.pack("<I", 30) + ipv6(src, dst, seg, hop_by_hop=True)  # DLT_NULL, AF_INET6 (Darwin)

    a = Stream(wrap, ("::1", 50000), ("::1", BROKER), isn_c=0xFFFFFFF0)  # client sequence numbers wrap around
    a.handshake()
    b = Stream(wrap, ("::1", 50001), ("::1", BROKER), t=a.t + 0.0005)
    b.handshake()
    for stream, frames in ((a, first), (b, second)):
        for f in frames:
            stream.send(f.dir, framed(f), cuts=(3,))
    packets = sorted(a.packets + b.packets)
    result = import_pcap(pcapng(packets, LINKTYPE_NULL, tsresol=9, endian=">"), [BROKER])

    assert result.warnings == []
    assert result.connections == 2
    for conn, frames in ((1, first), (2, second)):
        got = [f for f in result.frames if f.conn == conn]
        assert [(f.dir, f.api_key, f.data) for f in got] == [(f.dir, f.api_key, f.data) for f in frames]
    assert abs(result.frames[0].t - a.packets[3][0]) < 1e-6  # the packet completing the frame, ns resolution


@pytest.mark.parametrize(
    ("link_type", "wrap"),
    [
        (LINKTYPE_LINUX_SLL, lambda s, d, seg: b"\x00" * 14 + b"\x08\x00" + ipv4(s, d, seg)),
        (LINKTYPE_LINUX_SLL2, lambda s, d, seg: b"\x08\x00" + b"\x00" * 18 + ipv4(s, d, seg)),
        (LINKTYPE_LOOP, lambda s, d, seg: struct.pack(">I", 2) + ipv4(s, d, seg)),
        (LINKTYPE_RAW, lambda s, d, seg: ipv4(s, d, seg)),
    ],
    ids=["linux-sll", "linux-sll2", "loop", "raw"],
)
def test_other_link_types(link_type: int, wrap) -> None:  # type: ignore[no-untyped-def]
    frames = first_exchanges("aiokafka.jsonl", 1)
    stream = Stream(wrap, ("127.0.0.1", 40000), ("127.0.0.1", BROKER))
    stream.handshake()
    for f in frames:
        stream.send(f.dir, framed(f))
    result = import_pcap(pcap(stream.packets, link_type, endian=">"), BROKER)
    assert [f.data for f in result.frames] == [f.data for f in frames]


def test_a_stream_whose_start_was_not_captured_is_read_from_its_first_segment() -> None:
    frames = first_exchanges("rdkafka.jsonl", 1)
    stream = Stream(lambda s, d, seg: ethernet(ipv4(s, d, seg)), ("10.0.0.2", 40000), ("10.0.0.1", BROKER))
    stream.seq = {C2S: 77, S2C: 99}  # no handshake
    for f in frames:
        stream.send(f.dir, framed(f))
    result = import_pcap(pcap(stream.packets, LINKTYPE_ETHERNET), BROKER)
    assert [f.data for f in result.frames] == [f.data for f in frames]
    assert any("start is not in the capture" in w for w in result.warnings)


def test_gaps_and_incomplete_frames_are_reported() -> None:
    frames = first_exchanges("rdkafka.jsonl", 1)
    stream = Stream(lambda s, d, seg: ethernet(ipv4(s, d, seg)), ("10.0.0.2", 40000), ("10.0.0.1", BROKER))
    stream.handshake()
    stream.send(C2S, framed(frames[0]), cuts=(10, 20), order=(0, 2))  # the middle piece was lost
    result = import_pcap(pcap(stream.packets, LINKTYPE_ETHERNET), BROKER)
    assert result.frames == []
    assert any("after a gap" in w for w in result.warnings)
    assert any("incomplete frame" in w for w in result.warnings)


def test_errors() -> None:
    with pytest.raises(PcapError, match="unknown magic"):
        list(read_packets(b"\x00" * 64))
    truncated = bytearray(pcap([(1.0, ethernet(ipv4("1.1.1.1", "2.2.2.2", tcp(1, BROKER, 1, b"x" * 50))))], 1))
    struct.pack_into("<I", truncated, 24 + 12, 10_000)  # orig_len larger than what was kept
    with pytest.raises(PcapError, match="snap length"):
        list(read_packets(bytes(truncated)))
    with pytest.raises(PcapError, match="unsupported link type"):
        import_pcap(pcap([(1.0, b"\x00" * 40)], 147), BROKER)


def pcap_of_capture(frames: list[Frame]) -> bytes:
    """A whole JSONL capture written back as the pcap tcpdump would have taken of it (frames cut
    into 1400-byte segments)."""
    streams: dict[int, Stream] = {}
    for f in frames:
        stream = streams.get(f.conn)
        if stream is None:
            client = ("127.0.0.1", 30000 + f.conn)
            stream = streams[f.conn] = Stream(
                lambda s, d, seg: ethernet(ipv4(s, d, seg)), client, ("127.0.0.1", BROKER), t=f.t - 0.0001
            )
            stream.handshake()
        stream.t = max(stream.t, f.t)
        data = framed(f)
        stream.send(f.dir, data, cuts=tuple(range(1400, len(data), 1400)))
    packets = [p for s in streams.values() for p in s.packets]
    return pcap(sorted(packets, key=lambda p: p[0]), LINKTYPE_ETHERNET, nanos=True)


def test_import_pcap_command_then_replay_green(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The aiokafka capture, turned into a pcap, imported by the CLI and replayed: same frames, green."""
    original = read_frames(CAPTURES / "aiokafka.jsonl")
    source = tmp_path / "aiokafka.pcap"
    source.write_bytes(pcap_of_capture(original))
    out = tmp_path / "imported.jsonl"

    assert main(["capture", "import-pcap", str(source), "--broker-port", str(BROKER), "--output", str(out)]) == 0
    assert f"{len(original)} frames from 9 connections" in capsys.readouterr().out
    imported = read_frames(out)
    key = lambda f: (f.conn, f.dir, f.api_key, f.api_version, f.correlation_id, f.data)  # noqa: E731
    assert sorted(map(key, imported)) == sorted(map(key, original))

    # the expectations of the original capture apply to the imported one
    (tmp_path / "imported.case.yaml").write_text((CAPTURES / "aiokafka.case.yaml").read_text())
    assert main(["conformance", "run", str(tmp_path)]) == 0
    assert "PASS imported" in capsys.readouterr().out
