"""The fleet's two wire formats: a node's member metadata (JoinGroup) and the member list the
leader hands out (SyncGroup).

Both start with a magic and a format version, so that a reader can tell a Kanal blob from anything
else a group carries (a consumer's subscription, an older gateway's metadata) and refuse it cleanly:
every malformed input raises :class:`MetadataError`, never a ``struct.error`` or an ``IndexError``.
The member metadata is self-describing (tagged fields: a newer node adds tags that an older one
skips, without a format change); ``docs/fleet.md`` documents both formats byte by byte.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import IntEnum

#: Protocol type of the membership group: only members speaking it can share the group.
PROTOCOL_TYPE = "kanal-fleet"
#: Version of the membership protocol (what the group's messages mean). A node refuses to share a
#: group with a member of an older one (it exits with code 41, see :mod:`kanal.protocol.membership`).
MEMBERSHIP_PROTOCOL_VERSION = 1
#: The one protocol a node offers in JoinGroup, named by the membership protocol version.
PROTOCOL_NAME = f"v{MEMBERSHIP_PROTOCOL_VERSION}"

METADATA_MAGIC = b"KNLM"
ASSIGNMENT_MAGIC = b"KNLA"
#: Layout of the two blobs; bumped only when a reader of the previous one could not read them.
FORMAT_VERSION = 1

_HEADER = struct.Struct(">4shh")  # magic, format version, membership protocol version
_ASSIGNMENT_HEADER = struct.Struct(">4shi")  # magic, format version, generation
_FIELD = struct.Struct(">HH")  # tag, length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PORTS = struct.Struct(">ii")
_I64 = struct.Struct(">q")


class MetadataError(ValueError):
    """A blob that is not (or not a readable) Kanal member metadata or member list."""


class Tag(IntEnum):
    """Tags of the member metadata's fields."""

    NODE_ID = 1  # UTF-8
    HOST = 2  # UTF-8, the advertised host
    KAFKA_PORTS = 3  # int32 first, int32 last client port
    HTTP_PORT = 4  # int32, the admin API port
    RACK = 5  # UTF-8; absent: no rack
    VERSION = 6  # UTF-8, the gateway's version
    START_TIME = 7  # int64, milliseconds since the epoch
    MIN_BROKER_ID = 8  # int32, GATEWAY_MIN_BROKERID: the broker its first port stands for; absent: unknown


_OPTIONAL = frozenset({Tag.RACK, Tag.MIN_BROKER_ID})


_REQUIRED = frozenset(Tag) - _OPTIONAL


@dataclass(frozen=True)
class MemberMetadata:
    """What a node tells the fleet about itself."""

    node_id: str
    host: str
    first_port: int
    last_port: int
    http_port: int
    rack: str | None
    version: str
    start_time_ms: int
    protocol_version: int = MEMBERSHIP_PROTOCOL_VERSION
    #: The broker id its first client port stands for (None: not announced, as by an older node).
    min_broker_id: int | None = None


def _text(value: str, what: str) -> bytes:
    data = value.encode()
    if len(data) > 0xFFFF:
        raise MetadataError(f"{what} is longer than 65535 bytes")
    return data


def encode_metadata(metadata: MemberMetadata) -> bytes:
    """The JoinGroup protocol metadata of a node."""
    fields: list[tuple[Tag, bytes]] = [
        (Tag.NODE_ID, _text(metadata.node_id, "node id")),
        (Tag.HOST, _text(metadata.host, "host")),
        (Tag.KAFKA_PORTS, _PORTS.pack(metadata.first_port, metadata.last_port)),
        (Tag.HTTP_PORT, _I32.pack(metadata.http_port)),
        (Tag.VERSION, _text(metadata.version, "version")),
        (Tag.START_TIME, _I64.pack(metadata.start_time_ms)),
    ]
    if metadata.rack is not None:
        fields.append((Tag.RACK, _text(metadata.rack, "rack")))
    if metadata.min_broker_id is not None:
        fields.append((Tag.MIN_BROKER_ID, _I32.pack(metadata.min_broker_id)))
    out = bytearray(_HEADER.pack(METADATA_MAGIC, FORMAT_VERSION, metadata.protocol_version))
    for tag, value in sorted(fields):
        out += _FIELD.pack(tag, len(value)) + value
    return bytes(out)


def _fields(data: memoryview) -> Iterator[tuple[int, memoryview]]:
    at = 0
    while at < len(data):
        if len(data) - at < _FIELD.size:
            raise MetadataError(f"truncated field header at byte {_HEADER.size + at}")
        tag, length = _FIELD.unpack_from(data, at)
        at += _FIELD.size
        if len(data) - at < length:
            raise MetadataError(f"field {tag} announces {length} bytes, {len(data) - at} are left")
        yield tag, data[at : at + length]
        at += length


def _utf8(value: memoryview, tag: Tag) -> str:
    try:
        return bytes(value).decode()
    except UnicodeDecodeError:
        raise MetadataError(f"field {tag.name} is not UTF-8") from None


def _fixed(value: memoryview, tag: Tag, layout: struct.Struct) -> tuple[int, ...]:
    if len(value) != layout.size:
        raise MetadataError(f"field {tag.name} has {len(value)} bytes, expected {layout.size}")
    return layout.unpack(value)


def decode_metadata(data: bytes | bytearray | memoryview) -> MemberMetadata:
    """A member's metadata; unknown tags (a newer node's fields) are skipped."""
    view = memoryview(data)
    if len(view) < _HEADER.size:
        raise MetadataError(f"{len(view)} bytes, too short for Kanal member metadata")
    magic, format_version, protocol_version = _HEADER.unpack_from(view)
    if magic != METADATA_MAGIC:
        raise MetadataError(f"not Kanal member metadata (starts with {bytes(magic)!r})")
    if format_version != FORMAT_VERSION:
        raise MetadataError(f"member metadata format {format_version}, this node reads {FORMAT_VERSION}")
    seen: dict[Tag, memoryview] = {}
    for number, value in _fields(view[_HEADER.size :]):
        if number not in Tag._value2member_map_:
            continue
        tag = Tag(number)
        if tag in seen:
            raise MetadataError(f"field {tag.name} appears twice")
        seen[tag] = value
    missing = sorted(t.name for t in _REQUIRED - seen.keys())
    if missing:
        raise MetadataError(f"member metadata lacks {', '.join(missing)}")
    first, last = _fixed(seen[Tag.KAFKA_PORTS], Tag.KAFKA_PORTS, _PORTS)
    rack = seen.get(Tag.RACK)
    min_broker_id = seen.get(Tag.MIN_BROKER_ID)
    return MemberMetadata(
        node_id=_utf8(seen[Tag.NODE_ID], Tag.NODE_ID),
        host=_utf8(seen[Tag.HOST], Tag.HOST),
        first_port=first,
        last_port=last,
        http_port=_fixed(seen[Tag.HTTP_PORT], Tag.HTTP_PORT, _I32)[0],
        rack=None if rack is None else _utf8(rack, Tag.RACK),
        version=_utf8(seen[Tag.VERSION], Tag.VERSION),
        start_time_ms=_fixed(seen[Tag.START_TIME], Tag.START_TIME, _I64)[0],
        protocol_version=protocol_version,
        min_broker_id=None if min_broker_id is None else _fixed(min_broker_id, Tag.MIN_BROKER_ID, _I32)[0],
    )


@dataclass(frozen=True)
class MemberList:
    """The SyncGroup assignment: every member of one generation, with the metadata it joined with
    (as it sent it: each reader decodes each member's, so one unreadable blob costs one entry)."""

    generation: int
    leader: str
    members: tuple[tuple[str, bytes], ...]


def encode_member_list(generation: int, leader: str, members: Sequence[tuple[str, bytes]]) -> bytes:
    """The assignment the leader gives every member: the whole membership of the generation."""
    out = bytearray(_ASSIGNMENT_HEADER.pack(ASSIGNMENT_MAGIC, FORMAT_VERSION, generation))
    leader_id = _text(leader, "member id")
    out += _I16.pack(len(leader_id)) + leader_id + _I32.pack(len(members))
    for member_id, metadata in members:
        encoded = _text(member_id, "member id")
        out += _I16.pack(len(encoded)) + encoded + _I32.pack(len(metadata)) + metadata
    return bytes(out)


class _Reader:
    def __init__(self, data: memoryview, at: int) -> None:
        self.data = data
        self.at = at

    def take(self, size: int, what: str) -> memoryview:
        if size < 0 or len(self.data) - self.at < size:
            raise MetadataError(f"member list truncated in {what} at byte {self.at}")
        value = self.data[self.at : self.at + size]
        self.at += size
        return value

    def i16(self, what: str) -> int:
        value: int = _I16.unpack(self.take(_I16.size, what))[0]
        return value

    def i32(self, what: str) -> int:
        value: int = _I32.unpack(self.take(_I32.size, what))[0]
        return value

    def text(self, what: str) -> str:
        try:
            return bytes(self.take(self.i16(what), what)).decode()
        except UnicodeDecodeError:
            raise MetadataError(f"{what} is not UTF-8") from None


def decode_member_list(data: bytes | bytearray | memoryview) -> MemberList:
    """The member list of a SyncGroup assignment."""
    view = memoryview(data)
    if len(view) < _ASSIGNMENT_HEADER.size:
        raise MetadataError(f"{len(view)} bytes, too short for a Kanal member list")
    magic, format_version, generation = _ASSIGNMENT_HEADER.unpack_from(view)
    if magic != ASSIGNMENT_MAGIC:
        raise MetadataError(f"not a Kanal member list (starts with {bytes(magic)!r})")
    if format_version != FORMAT_VERSION:
        raise MetadataError(f"member list format {format_version}, this node reads {FORMAT_VERSION}")
    reader = _Reader(view, _ASSIGNMENT_HEADER.size)
    leader = reader.text("the leader's member id")
    count = reader.i32("the member count")
    if count < 0 or count > len(view):  # each member takes at least 6 bytes: a lie about the count
        raise MetadataError(f"member count {count} does not fit in {len(view)} bytes")
    members = []
    for i in range(count):
        member_id = reader.text(f"member {i}'s id")
        size = reader.i32(f"member {i}'s metadata")
        members.append((member_id, bytes(reader.take(size, f"member {i}'s metadata"))))
    # bytes after the last member: what a later leader may add, ignored here
    return MemberList(generation, leader, tuple(members))
