"""Importing tcpdump captures (pcap or pcapng) of a broker port into JSONL frames, sans-I/O.

Supported: classic pcap (microsecond and nanosecond, either byte order) and pcapng (sections of
either byte order, several interfaces, ``if_tsresol``; enhanced, simple and obsolete packet
blocks); link types Ethernet (with VLAN tags), BSD loopback (``NULL`` and ``LOOP``, as tcpdump
writes on ``lo0``), Linux cooked (``SLL``, ``SLL2``: ``tcpdump -i any``) and raw IPv4/IPv6; IPv4 and
IPv6 (with extension headers) over TCP.

Every TCP connection to one of the broker ports becomes a captured connection, numbered in the
order its first packet appears; the side on the broker port is the broker (``s2c``), the other the
client (``c2s``). Each direction is reassembled by sequence number (out-of-order segments are held,
retransmitted bytes dropped), cut into Kafka frames, and each frame is stamped with the time of the
packet that completed it; frames are written in the order they completed. Api keys, versions and
correlation ids come from the frames themselves, as for a live capture.

Take the capture with the whole packets (``tcpdump -i lo -s 0 -w out.pcap 'tcp port 9092'``),
starting before the clients connect: a stream whose start was not captured is read from its first
segment, which must then begin a frame.
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from kanal.conformance.frames import C2S, S2C, Frame, label
from kanal.conformance.scripted_broker import broker_addresses
from kanal.protocol.framing import DEFAULT_MAX_FRAME_SIZE, FrameReader, FrameTooLarge, InvalidFrame

# Link types (https://www.tcpdump.org/linktypes.html)
LINKTYPE_NULL = 0
LINKTYPE_ETHERNET = 1
LINKTYPE_RAW_ALT = 12  # raw IP on some BSDs
LINKTYPE_RAW = 101
LINKTYPE_LOOP = 108
LINKTYPE_LINUX_SLL = 113
LINKTYPE_IPV4 = 228
LINKTYPE_IPV6 = 229
LINKTYPE_LINUX_SLL2 = 276

PCAP_MAGIC_US = 0xA1B2C3D4
PCAP_MAGIC_NS = 0xA1B23C4D
PCAPNG_SHB = 0x0A0D0D0A
_BYTE_ORDER_MAGIC = 0x1A2B3C4D

_ETHERTYPE_IPV4 = 0x0800
_ETHERTYPE_IPV6 = 0x86DD
_ETHERTYPE_VLAN = (0x8100, 0x88A8, 0x9100)
_AF_IPV6 = (10, 24, 28, 30)  # Linux, BSDs, FreeBSD, Darwin


class PcapError(ValueError):
    """Not a capture this importer can read."""


@dataclass(frozen=True, slots=True)
class Packet:
    """One captured link-layer packet."""

    index: int
    t: float
    link_type: int
    data: bytes


@dataclass(frozen=True, slots=True)
class Segment:
    """The TCP part of a packet."""

    index: int
    t: float
    src: tuple[str, int]
    dst: tuple[str, int]
    seq: int
    syn: bool
    ack: bool
    fin: bool
    rst: bool
    payload: bytes


# -- file formats -------------------------------------------------------------------------------


def read_packets(data: bytes) -> Iterator[Packet]:
    """The packets of a pcap or pcapng file."""
    if len(data) < 4:
        raise PcapError("file too short to be a capture")
    if struct.unpack_from("<I", data)[0] == PCAPNG_SHB:
        yield from _pcapng(data)
    else:
        yield from _pcap(data)


def _pcap(data: bytes) -> Iterator[Packet]:
    if len(data) < 24:
        raise PcapError("truncated pcap header")
    for endian in ("<", ">"):
        magic = struct.unpack_from(endian + "I", data)[0]
        if magic in (PCAP_MAGIC_US, PCAP_MAGIC_NS):
            break
    else:
        raise PcapError("not a pcap or pcapng file (unknown magic number)")
    scale = 1e-9 if magic == PCAP_MAGIC_NS else 1e-6
    link_type = struct.unpack_from(endian + "I", data, 20)[0] & 0xFFFF
    pos, index = 24, 0
    record = struct.Struct(endian + "IIII")
    while pos + 16 <= len(data):
        sec, frac, incl, orig = record.unpack_from(data, pos)
        pos += 16
        if pos + incl > len(data):
            raise PcapError(f"packet {index + 1} is cut short by the end of the file")
        if incl < orig:
            raise PcapError(
                f"packet {index + 1} was truncated by the snap length ({incl} of {orig} bytes); "
                "capture with tcpdump -s 0"
            )
        index += 1
        yield Packet(index, sec + frac * scale, link_type, data[pos : pos + incl])
        pos += incl


def _pcapng(data: bytes) -> Iterator[Packet]:
    pos, index = 0, 0
    endian = "<"
    interfaces: list[tuple[int, float]] = []  # (link type, seconds per timestamp unit)
    while pos + 12 <= len(data):
        block_type = struct.unpack_from(endian + "I", data, pos)[0]
        if block_type == PCAPNG_SHB:
            bom = data[pos + 8 : pos + 12]
            endian = "<" if struct.unpack("<I", bom)[0] == _BYTE_ORDER_MAGIC else ">"
            if struct.unpack(endian + "I", bom)[0] != _BYTE_ORDER_MAGIC:
                raise PcapError("pcapng section with an invalid byte-order magic")
            interfaces = []
        length = struct.unpack_from(endian + "I", data, pos + 4)[0]
        if length < 12 or pos + length > len(data):
            raise PcapError(f"pcapng block at byte {pos} has an invalid length {length}")
        body = data[pos + 8 : pos + length - 4]
        pos += length
        if block_type == 1:  # Interface Description Block
            link_type = struct.unpack_from(endian + "H", body)[0]
            interfaces.append((link_type, _tsresol(body[8:], endian)))
        elif block_type in (6, 2):  # Enhanced Packet Block, obsolete Packet Block
            if block_type == 6:
                iface, high, low, cap, orig = struct.unpack_from(endian + "IIIII", body)
            else:
                iface, _drops, high, low, cap, orig = struct.unpack_from(endian + "HHIIII", body)
            if iface >= len(interfaces):
                raise PcapError(f"packet refers to interface {iface}, which is not described")
            if cap < orig:
                raise PcapError(f"packet {index + 1} was truncated by the snap length; capture with tcpdump -s 0")
            link_type, unit = interfaces[iface]
            index += 1
            yield Packet(index, ((high << 32) | low) * unit, link_type, bytes(body[20 : 20 + cap]))
        elif block_type == 3:  # Simple Packet Block: interface 0, no timestamp
            if not interfaces:
                raise PcapError("simple packet block before any interface description")
            orig = struct.unpack_from(endian + "I", body)[0]
            index += 1
            yield Packet(index, 0.0, interfaces[0][0], bytes(body[4 : 4 + orig]))


def _tsresol(options: bytes, endian: str) -> float:
    pos = 0
    while pos + 4 <= len(options):
        code, length = struct.unpack_from(endian + "HH", options, pos)
        if code == 0:
            break
        if code == 9 and length >= 1:
            value = options[pos + 4]
            return 2.0 ** -(value & 0x7F) if value & 0x80 else 10.0**-value
        pos += 4 + ((length + 3) & ~3)
    return 1e-6


# -- link, network and transport layers ----------------------------------------------------------


def _ip_payload(packet: Packet) -> bytes | None:
    """The IP packet inside a link-layer frame, or None for other protocols."""
    data, link = packet.data, packet.link_type
    if link == LINKTYPE_ETHERNET:
        if len(data) < 14:
            return None
        ethertype, pos = struct.unpack_from(">H", data, 12)[0], 14
        while ethertype in _ETHERTYPE_VLAN and len(data) >= pos + 4:
            ethertype, pos = struct.unpack_from(">H", data, pos + 2)[0], pos + 4
        return data[pos:] if ethertype in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6) else None
    if link in (LINKTYPE_NULL, LINKTYPE_LOOP):
        if len(data) < 4:
            return None
        families = (
            {struct.unpack_from(">I", data)[0]}
            if link == LINKTYPE_LOOP
            else {struct.unpack_from("<I", data)[0], struct.unpack_from(">I", data)[0]}
        )
        return data[4:] if families & {2, *_AF_IPV6} else None
    if link == LINKTYPE_LINUX_SLL:
        if len(data) < 16:
            return None
        return data[16:] if struct.unpack_from(">H", data, 14)[0] in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6) else None
    if link == LINKTYPE_LINUX_SLL2:
        if len(data) < 20:
            return None
        return data[20:] if struct.unpack_from(">H", data, 0)[0] in (_ETHERTYPE_IPV4, _ETHERTYPE_IPV6) else None
    if link in (LINKTYPE_RAW, LINKTYPE_RAW_ALT, LINKTYPE_IPV4, LINKTYPE_IPV6):
        return data
    raise PcapError(f"unsupported link type {link} (supported: Ethernet, loopback, Linux cooked, raw IP)")


def _tcp(packet: Packet) -> Segment | None:
    ip = _ip_payload(packet)
    if not ip:
        return None
    version = ip[0] >> 4
    if version == 4:
        if len(ip) < 20:
            return None
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack_from(">H", ip, 2)[0]
        flags_fragment = struct.unpack_from(">H", ip, 6)[0]
        if ip[9] != 6 or flags_fragment & 0x3FFF:  # not TCP, or a fragment
            return None
        src, dst = str(ipaddress.IPv4Address(ip[12:16])), str(ipaddress.IPv4Address(ip[16:20]))
        tcp = ip[ihl:total] if total else ip[ihl:]  # total 0: TCP segmentation offload
    elif version == 6:
        if len(ip) < 40:
            return None
        payload_len = struct.unpack_from(">H", ip, 4)[0]
        next_header, pos = ip[6], 40
        end = 40 + payload_len if payload_len else len(ip)
        while next_header in (0, 43, 60, 44):
            if next_header == 44:  # fragment
                return None
            if len(ip) < pos + 2:
                return None
            next_header, pos = ip[pos], pos + (ip[pos + 1] + 1) * 8
        if next_header != 6:
            return None
        src, dst = str(ipaddress.IPv6Address(ip[8:24])), str(ipaddress.IPv6Address(ip[24:40]))
        tcp = ip[pos:end]
    else:
        return None
    if len(tcp) < 20:
        return None
    sport, dport, seq = struct.unpack_from(">HHI", tcp)
    offset = (tcp[12] >> 4) * 4
    flags = tcp[13]
    return Segment(
        packet.index,
        packet.t,
        (src, sport),
        (dst, dport),
        seq,
        syn=bool(flags & 0x02),
        ack=bool(flags & 0x10),
        fin=bool(flags & 0x01),
        rst=bool(flags & 0x04),
        payload=bytes(tcp[offset:]),
    )


# -- reassembly ---------------------------------------------------------------------------------


def _seq_diff(a: int, b: int) -> int:
    """a - b in 32-bit sequence space, signed."""
    return ((a - b + 0x80000000) & 0xFFFFFFFF) - 0x80000000


@dataclass
class _Flow:
    """One direction of a TCP connection."""

    next_seq: int | None = None
    isn: int | None = None
    pending: dict[int, bytes] = field(default_factory=dict)
    reader: FrameReader = field(default_factory=lambda: FrameReader(DEFAULT_MAX_FRAME_SIZE))
    broken: str | None = None

    def segment(self, seg: Segment) -> list[bytes]:
        if seg.syn:
            if self.isn is None:
                self.isn = seg.seq
                self.next_seq = (seg.seq + 1) & 0xFFFFFFFF
            return []
        if not seg.payload or self.broken:
            return []
        if self.next_seq is None:
            self.next_seq = seg.seq  # the capture started after the handshake
        self.pending.setdefault(seg.seq, b"")
        if len(seg.payload) > len(self.pending[seg.seq]):
            self.pending[seg.seq] = seg.payload
        return self._drain()

    def _drain(self) -> list[bytes]:
        out: list[bytes] = []
        assert self.next_seq is not None
        progress = True
        while progress and self.pending:
            progress = False
            for seq in list(self.pending):
                ahead = _seq_diff(seq, self.next_seq)
                if ahead > 0:
                    continue
                data = self.pending.pop(seq)
                progress = True
                if -ahead >= len(data):
                    continue  # retransmitted bytes already delivered
                data = data[-ahead:]
                self.next_seq = (self.next_seq + len(data)) & 0xFFFFFFFF
                try:
                    out.extend(bytes(f) for f in self.reader.feed(data))
                except (FrameTooLarge, InvalidFrame) as exc:
                    self.broken = f"not Kafka framing: {exc}"
                    self.pending.clear()
                    return out
        return out


@dataclass
class _Connection:
    number: int
    client: tuple[str, int]
    server: tuple[str, int]
    c2s: _Flow = field(default_factory=_Flow)
    s2c: _Flow = field(default_factory=_Flow)
    closed: bool = False
    seen_data: bool = False


@dataclass
class PcapImport:
    """The frames of an imported capture, and what could not be imported cleanly."""

    frames: list[Frame]
    connections: int
    packets: int
    warnings: list[str]


def import_pcap(data: bytes, broker_ports: int | Iterable[int]) -> PcapImport:
    """Kafka frames (labelled, in completion order) from a pcap/pcapng file's bytes."""
    ports = {broker_ports} if isinstance(broker_ports, int) else set(broker_ports)
    connections: dict[tuple[tuple[str, int], tuple[str, int]], _Connection] = {}
    all_connections: list[_Connection] = []
    raw: list[tuple[_Connection, str, float, bytes]] = []
    packets = 0
    for packet in read_packets(data):
        packets += 1
        seg = _tcp(packet)
        if seg is None:
            continue
        if seg.dst[1] in ports and seg.src[1] not in ports:
            key, direction = (seg.src, seg.dst), C2S
        elif seg.src[1] in ports and seg.dst[1] not in ports:
            key, direction = (seg.dst, seg.src), S2C
        else:
            continue
        conn = connections.get(key)
        new_syn = seg.syn and not seg.ack and direction == C2S
        if conn is None or (new_syn and conn.c2s.isn not in (None, seg.seq) and (conn.closed or conn.seen_data)):
            conn = _Connection(len(all_connections) + 1, key[0], key[1])
            connections[key] = conn
            all_connections.append(conn)
        flow = conn.c2s if direction == C2S else conn.s2c
        for frame in flow.segment(seg):
            raw.append((conn, direction, seg.t, frame))
        if seg.payload:
            conn.seen_data = True
        if seg.fin or seg.rst:
            conn.closed = True
    warnings = []
    for conn in all_connections:
        for name, flow in ((C2S, conn.c2s), (S2C, conn.s2c)):
            where = f"conn {conn.number} ({conn.client[0]}:{conn.client[1]} {name})"
            if flow.broken:
                warnings.append(f"{where}: {flow.broken}; the rest of that stream is skipped")
            if flow.pending:
                warnings.append(f"{where}: {len(flow.pending)} segments after a gap (packets missing from the capture)")
            if flow.reader.buffered:
                warnings.append(f"{where}: {flow.reader.buffered} bytes of an incomplete frame at the end")
            if flow.isn is None and flow.next_seq is not None:
                warnings.append(f"{where}: the connection's start is not in the capture")
    seqs: dict[int, int] = {}
    frames = []
    for conn, direction, t, payload in raw:
        seq = seqs.get(conn.number, 0)
        seqs[conn.number] = seq + 1
        frames.append(Frame(conn.number, seq, direction, t, None, None, None, payload))
    frames = label(frames)
    frames = _with_nodes(frames, {c.number: c.server for c in all_connections})
    return PcapImport(frames, len(all_connections), packets, warnings)


def _with_nodes(frames: list[Frame], servers: dict[int, tuple[str, int]]) -> list[Frame]:
    """Stamps each frame with the broker id of the address its connection went to, when the
    captured metadata names that address (several brokers); one broker needs no stamp."""
    nodes = broker_addresses([f for f in frames if f.dir == S2C])
    if len(set(nodes.values())) < 2:
        return frames
    by_conn = {conn: nodes.get(server) for conn, server in servers.items()}
    return [replace(f, node=by_conn.get(f.conn)) for f in frames]
