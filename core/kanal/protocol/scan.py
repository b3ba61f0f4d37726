"""Cheap scans of Produce and Fetch responses that spare a full decode.

Produce v10+ and Fetch v16+ responses may carry KIP-951 leader hints (``node_endpoints``, top-level
tag 0) holding broker addresses the gateway must rewrite. They are rare (only after a leader
change) while the responses are the bulk of the traffic, so the gateway walks the response's
structure, skipping record bytes by their length, and decodes only when the tag is present.

The walk is incremental (:class:`ResponseScan`): it is fed the bytes of a response as they arrive
and says how many of the bytes that follow are opaque (record sets), so a response being forwarded
while it arrives can pass its records on without reading them, and keep back only its last part,
the top-level tagged fields, until that part is whole.

The same walk maps the topic ids of a Fetch v13+ response on the way (a virtual cluster's own ids,
:mod:`kanal.tenancy.topic_ids`): an id keeps its 16 bytes, so it is rewritten in place before its
bytes go on, and the response streams like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Generator

from kanal.protocol.headers import InvalidHeader, read_uvarint

# A tag no version of Produce or Fetch defines: clients skip unknown tagged fields.
NEUTRAL_TAG = 0x7F

# A walk yields VARINT to read the next unsigned varint (sent back to it), TOPIC_ID for the next 16
# bytes (a topic id, mapped when the scan maps ids), n < 0 to pass over the next -n bytes unread; it
# returns when it reaches the top-level tagged fields.
VARINT = 0
TOPIC_ID = 1
_ID = 16
#: Maps a topic id's 16 bytes to the client's.
IdMap = Callable[[bytes], bytes]
_Walk = Generator[int, int | None, None]


def _compact_bytes() -> _Walk:
    length = yield VARINT
    assert length is not None
    if length > 1:
        yield 1 - length


def _tagged_fields() -> _Walk:
    count = yield VARINT
    assert count is not None
    for _ in range(count):
        yield VARINT  # tag
        size = yield VARINT
        assert size is not None
        if size:
            yield -size


def _fetch_walk() -> _Walk:
    yield -4  # correlation id
    yield from _tagged_fields()
    yield -(4 + 2 + 4)  # throttle time, error code, session id
    topics = yield VARINT
    assert topics is not None
    for _ in range(topics - 1):
        yield TOPIC_ID
        partitions = yield VARINT
        assert partitions is not None
        for _ in range(partitions - 1):
            yield -(4 + 2 + 8 + 8 + 8)
            aborted = yield VARINT
            assert aborted is not None
            for _ in range(aborted - 1):
                yield -16
                yield from _tagged_fields()
            yield -4  # preferred read replica
            yield from _compact_bytes()  # records
            yield from _tagged_fields()
        yield from _tagged_fields()


def _produce_walk(version: int) -> _Walk:
    yield -4  # correlation id
    yield from _tagged_fields()
    topics = yield VARINT
    assert topics is not None
    for _ in range(topics - 1):
        if version >= 13:
            yield -16  # topic id
        else:
            yield from _compact_bytes()  # name
        partitions = yield VARINT
        assert partitions is not None
        for _ in range(partitions - 1):
            yield -(4 + 2 + 8 + 8 + 8)
            errors = yield VARINT
            assert errors is not None
            for _ in range(errors - 1):
                yield -4
                yield from _compact_bytes()  # batch index error message
                yield from _tagged_fields()
            yield from _compact_bytes()  # error message
            yield from _tagged_fields()
        yield from _tagged_fields()
    yield -4  # throttle time


def scans(api_key: int, version: int) -> bool:
    """Whether responses of this API version may carry leader hints (and so are scanned)."""
    return (api_key == 1 and version >= 16) or (api_key == 0 and version >= 10)


def maps_ids(api_key: int, version: int) -> bool:
    """Whether responses of this API version name topics by id (and so can have them mapped)."""
    return api_key == 1 and version >= 13


class ResponseScan:
    """Walks a Produce v10+ / Fetch v16+ response frame (body without length prefix) as it arrives;
    with ``topic_ids``, a Fetch v13+ response, mapping its topic ids.

    Feed it the frame's bytes in order; bytes reported :attr:`opaque` may instead be passed over
    with :meth:`skip`. Once :attr:`at_tail` is set, the rest of the frame is the top-level tagged
    fields, for :func:`node_endpoints_entry`.
    """

    __slots__ = ("_ids", "_partial", "_walk", "_want", "at_tail", "position")

    def __init__(self, api_key: int, version: int, topic_ids: IdMap | None = None) -> None:
        if topic_ids is not None and not maps_ids(api_key, version):
            raise ValueError(f"api key {api_key} version {version} names no topics by id")
        if topic_ids is None and not scans(api_key, version):
            raise ValueError(f"api key {api_key} version {version} carries no leader hints")
        self._walk = _fetch_walk() if api_key == 1 else _produce_walk(version)
        self._ids = topic_ids
        self._partial = bytearray()
        self._want = next(self._walk)
        self.at_tail = False
        self.position = 0  # frame bytes consumed so far

    @property
    def maps_ids(self) -> bool:
        """Whether :meth:`feed` rewrites topic ids (it then needs a bytearray)."""
        return self._ids is not None

    @property
    def opaque(self) -> int:
        """How many of the next bytes are known not to matter to the scan."""
        return -self._want if self._want < 0 and not self.at_tail else 0

    def feed(self, data: bytes | bytearray | memoryview) -> int:
        """Consumes bytes up to the top-level tagged fields; returns how many of ``data`` it took:
        all of them, unless the tail starts inside ``data`` or (when mapping ids) a topic id does
        not end in it; feed the rest again with the bytes that follow. Topic ids are mapped in
        ``data`` itself."""
        i, n = 0, len(data)
        partial = self._partial
        while i < n and not self.at_tail:
            want = self._want
            if want == TOPIC_ID:
                if self._ids is None:
                    self._want = -_ID
                    continue
                if n - i < _ID:
                    break
                if not isinstance(data, bytearray):
                    raise TypeError("topic ids are mapped in a bytearray")
                data[i : i + _ID] = self._ids(bytes(data[i : i + _ID]))
                i += _ID
                self._resume(None)
                continue
            if want < 0:
                k = min(-want, n - i)
                i += k
                if want + k:
                    self._want = want + k
                else:
                    self._resume(None)
                continue
            b = data[i]
            i += 1
            if b >= 0x80:
                partial.append(b)
                if len(partial) > 4:
                    raise InvalidHeader("varint too long")
                continue
            if partial:  # a varint that straddled two reads
                partial.append(b)
                b, _ = read_uvarint(partial, 0)
                partial.clear()
            self._resume(b)
        self.position += i
        return i

    def skip(self, n: int) -> None:
        """Passes over ``n`` opaque bytes (at most :attr:`opaque`) without seeing them."""
        if not 0 < n <= self.opaque:
            raise ValueError(f"cannot skip {n} bytes, {self.opaque} are opaque")
        self.position += n
        if self._want + n:
            self._want += n
        else:
            self._resume(None)

    def _resume(self, value: int | None) -> None:
        try:
            self._want = self._walk.send(value)
        except StopIteration:
            self.at_tail = True


def node_endpoints_entry(tail: bytes | bytearray | memoryview) -> int | None:
    """Where the leader hints' entry (its tag byte) starts in a top-level tagged-field section,
    or None when there is none or it is empty."""
    count, pos = read_uvarint(tail, 0)
    for _ in range(count):
        entry = pos
        tag, pos = read_uvarint(tail, pos)
        size, pos = read_uvarint(tail, pos)
        if tag == 0:
            return entry if size > 1 else None  # an empty compact array is the single byte 0x01
        pos += size
    if pos > len(tail):
        raise InvalidHeader("truncated tagged fields")
    return None


def node_endpoints_position(api_key: int, version: int, frame: bytes | bytearray | memoryview) -> int | None:
    """Where the KIP-951 node endpoints entry of a whole Produce v10+ / Fetch v16+ response frame
    starts (the position of its tag), or None when it has none. Raises InvalidHeader (or
    IndexError) on a frame that does not parse."""
    if not scans(api_key, version):
        return None
    scan = ResponseScan(api_key, version)
    start = scan.feed(frame)
    if not scan.at_tail:
        raise InvalidHeader("truncated response")
    where = node_endpoints_entry(memoryview(frame)[start:])
    return None if where is None else start + where


def has_node_endpoints(api_key: int, version: int, frame: bytes | bytearray | memoryview) -> bool:
    """Whether a response frame carries KIP-951 node endpoints.

    Errs on the side of True when the frame does not parse as expected, so a malformed or
    unexpected response is decoded (and checked) rather than forwarded unread.
    """
    try:
        return node_endpoints_position(api_key, version, frame) is not None
    except (IndexError, ValueError):
        return True
