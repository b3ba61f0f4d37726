"""Topic names found and replaced in Produce and Fetch frames without kio, checked against kio: every
version kio ships, random requests and responses (unicode names, records, tagged fields), renamed
and renamed back, and every truncation refused."""

from __future__ import annotations

import dataclasses
import datetime
import struct
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kanal.protocol.api import require_request_class, supported_versions
from kanal.protocol.entities import build, has_field, hints, nested
from kanal.protocol.headers import InvalidHeader, RequestHeader, encode_request_header, parse_request_header
from kanal.protocol.messages import (
    decode_request_body,
    decode_response,
    encode_request,
    encode_response,
    response_type,
)
from kanal.protocol.name_spans import (
    NameSpan,
    RequestNames,
    fetch_response_ids,
    produce_response_names,
    request_names,
    splice,
)
from kanal.protocol.records import Record, encode_batch


def _versions(api_key: int) -> list[int]:
    span = supported_versions(api_key)
    assert span is not None
    return list(range(span[0], span[1] + 1))


PRODUCE_VERSIONS = _versions(0)
FETCH_VERSIONS = _versions(1)
_SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Names: empty allowed, any unicode, sometimes long enough for a two-byte compact length.
_names = st.one_of(st.text(max_size=12), st.text(min_size=40, max_size=90))
_prefixes = st.one_of(st.text(max_size=8), st.text(min_size=100, max_size=140))
_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)
_batches = st.lists(st.binary(max_size=60), min_size=1, max_size=4).map(
    lambda values: encode_batch([Record(i, 0, b"k", v) for i, v in enumerate(values)], base_timestamp=1)
)
_records = st.one_of(st.none(), st.binary(max_size=200), _batches)
_buffers = st.sampled_from([bytes, bytearray, memoryview])


def _as(kind: Any, frame: bytes) -> bytes | bytearray | memoryview:
    return kind(frame)  # type: ignore[no-any-return]


def _renamed(entity: Any, field: str, new: dict[str, str]) -> Any:
    return dataclasses.replace(entity, **{field: new[getattr(entity, field)]})


def _assert_spans(frame: bytes, spans: tuple[NameSpan, ...], values: list[str], flexible: bool) -> None:
    assert [s.value for s in spans] == values
    for s in spans:
        assert frame[s.text : s.end].decode() == s.value
        if flexible:
            assert frame[s.start] & 0x7F == (len(s.value.encode()) + 1) & 0x7F
        else:
            assert s.text == s.start + 2
            assert struct.unpack_from(">h", frame, s.start)[0] == s.end - s.text


def _assert_truncations_refused(frame: bytes, header: RequestHeader) -> None:
    for cut in range(header.body_offset, len(frame)):
        with pytest.raises(InvalidHeader):
            request_names(frame[:cut], header)
    with pytest.raises(InvalidHeader):
        request_names(frame + b"\x00", header)


def _round_trip(frame: bytes, spans: tuple[NameSpan, ...], new_values: list[str], kind: Any, flexible: bool) -> bytes:
    """Renames, then renames back to the original frame; returns the renamed frame."""
    renamed = splice(_as(kind, frame), spans, new_values, flexible)
    assert isinstance(renamed, bytearray)
    return bytes(renamed)


# --------------------------------------------------------------------------- Produce requests


@st.composite
def _produce_requests(draw: st.DrawFn, version: int) -> Any:
    req = require_request_class(0, version)
    topic_cls = nested(req, "topic_data")
    part_cls = nested(topic_cls, "partition_data")
    topics = []
    for _ in range(draw(st.integers(0, 3))):
        parts = tuple(build(part_cls, index=draw(_i32), records=draw(_records)) for _ in range(draw(st.integers(0, 3))))
        key = {"topic_id": draw(st.uuids())} if version >= 13 else {"name": draw(_names)}
        topics.append(build(topic_cls, partition_data=parts, **key))
    return build(
        req,
        transactional_id=draw(st.none() | _names),
        acks=draw(st.sampled_from([-1, 0, 1])),
        timeout=datetime.timedelta(milliseconds=draw(st.integers(0, 2**31 - 1))),
        topic_data=tuple(topics),
    )


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@_SETTINGS
@given(data=st.data())
def test_produce_request_names_match_kio_and_rename_round_trips(version: int, data: st.DataObject) -> None:
    body = data.draw(_produce_requests(version))
    prefix = data.draw(_prefixes)
    kind = data.draw(_buffers)
    frame = bytes(encode_request(body, 7, "client"))
    header = parse_request_header(frame)
    flexible = header.header_version >= 2
    assert decode_request_body(0, version, frame, header.body_offset) == body

    names = request_names(_as(kind, frame), header)
    assert isinstance(names, RequestNames) and names.follower is False
    topic_names = [t.name for t in body.topic_data] if version < 13 else []
    _assert_spans(frame, names.topics, topic_names, flexible)
    assert names.topic_ids == (tuple(t.topic_id for t in body.topic_data) if version >= 13 else ())
    txn = names.transactional_id
    assert (None if txn is None else txn.value) == body.transactional_id
    if txn is not None:
        _assert_spans(frame, (txn,), [body.transactional_id], flexible)

    # Rename the transactional id and every topic: kio reads the renamed request.
    spans = ((txn,) if txn is not None else ()) + names.topics
    new = {v: prefix + v for v in [s.value for s in spans]}
    renamed = _round_trip(frame, spans, [prefix + s.value for s in spans], kind, flexible)
    expected = dataclasses.replace(
        body,
        transactional_id=None if txn is None else prefix + txn.value,
        topic_data=tuple(_renamed(t, "name", new) for t in body.topic_data) if version < 13 else body.topic_data,
    )
    assert decode_request_body(0, version, renamed, header.body_offset) == expected

    # And back: the names found in the renamed frame strip to the original bytes.
    again = request_names(renamed, parse_request_header(renamed))
    spans_again = ((again.transactional_id,) if again.transactional_id is not None else ()) + again.topics
    assert [s.value for s in spans_again] == [prefix + s.value for s in spans]
    assert splice(renamed, spans_again, [s.value for s in spans], flexible) == frame

    _assert_truncations_refused(frame, header)


# --------------------------------------------------------------------------- Fetch requests


@st.composite
def _fetch_requests(draw: st.DrawFn, version: int) -> Any:
    req = require_request_class(1, version)
    topic_cls = nested(req, "topics")
    part_cls = nested(topic_cls, "partitions")
    key = "topic_id" if version >= 13 else "topic"
    topic_key = st.uuids() if version >= 13 else _names

    def partition() -> Any:
        values = {
            "partition": draw(_i32),
            "current_leader_epoch": draw(_i32),
            "fetch_offset": draw(_i64),
            "last_fetched_epoch": draw(_i32),
            "log_start_offset": draw(_i64),
            "partition_max_bytes": draw(_i32),
            "replica_directory_id": draw(st.none() | st.uuids()),  # tagged (v17+)
            "high_watermark": draw(st.sampled_from([2**63 - 1, 0, 42])),  # tagged (v18+)
        }
        return build(part_cls, **{k: v for k, v in values.items() if has_field(part_cls, k)})

    topics = tuple(
        build(
            topic_cls, partitions=tuple(partition() for _ in range(draw(st.integers(0, 3)))), **{key: draw(topic_key)}
        )
        for _ in range(draw(st.integers(0, 3)))
    )
    fields: dict[str, Any] = {"topics": topics, "max_wait": datetime.timedelta(milliseconds=draw(st.integers(0, 9)))}
    if has_field(req, "forgotten_topics_data"):
        forgotten_cls = nested(req, "forgotten_topics_data")
        fields["forgotten_topics_data"] = tuple(
            build(forgotten_cls, partitions=tuple(draw(st.lists(_i32, max_size=3))), **{key: draw(topic_key)})
            for _ in range(draw(st.integers(0, 3)))
        )
    if has_field(req, "replica_id"):
        fields["replica_id"] = draw(st.integers(-2, 3))
    if has_field(req, "replica_state"):
        state_cls = hints(req)["replica_state"]
        fields["replica_state"] = draw(
            st.just(state_cls())
            | st.builds(lambda r, e: state_cls(replica_id=r, replica_epoch=e), st.integers(0, 5), _i64)
        )
    if has_field(req, "cluster_id"):
        fields["cluster_id"] = draw(st.none() | _names)
    if has_field(req, "rack_id"):
        fields["rack_id"] = draw(_names)
    if has_field(req, "session_id"):
        fields["session_id"] = draw(_i32)
    return build(req, **fields)


def _fetch_follower(body: Any) -> bool:
    if hasattr(body, "replica_id"):
        return bool(body.replica_id >= 0)
    return bool(body.replica_state != type(body.replica_state)())  # kio writes the tag when not default


@pytest.mark.parametrize("version", FETCH_VERSIONS)
@_SETTINGS
@given(data=st.data())
def test_fetch_request_names_match_kio_and_rename_round_trips(version: int, data: st.DataObject) -> None:
    body = data.draw(_fetch_requests(version))
    prefix = data.draw(_prefixes)
    kind = data.draw(_buffers)
    frame = bytes(encode_request(body, 7, None))
    header = parse_request_header(frame)
    flexible = header.header_version >= 2
    assert decode_request_body(1, version, frame, header.body_offset) == body
    forgotten = getattr(body, "forgotten_topics_data", ())

    names = request_names(_as(kind, frame), header)
    assert names.transactional_id is None
    assert names.follower is _fetch_follower(body)
    if version >= 13:
        assert names.topics == ()
        assert names.topic_ids == tuple(t.topic_id for t in body.topics) + tuple(f.topic_id for f in forgotten)
    else:
        assert names.topic_ids == ()
        _assert_spans(frame, names.topics, [t.topic for t in body.topics] + [f.topic for f in forgotten], flexible)

        new = {s.value: prefix + s.value for s in names.topics}
        renamed = _round_trip(frame, names.topics, [prefix + s.value for s in names.topics], kind, flexible)
        changes: dict[str, Any] = {"topics": tuple(_renamed(t, "topic", new) for t in body.topics)}
        if forgotten:
            changes["forgotten_topics_data"] = tuple(_renamed(f, "topic", new) for f in forgotten)
        assert decode_request_body(1, version, renamed, header.body_offset) == dataclasses.replace(body, **changes)
        again = request_names(renamed, header)
        assert [s.value for s in again.topics] == [prefix + s.value for s in names.topics]
        assert again.follower is names.follower
        assert splice(renamed, again.topics, [s.value for s in names.topics], flexible) == frame

    _assert_truncations_refused(frame, header)


def _fetch_frame(version: int, **fields: Any) -> tuple[bytes, RequestHeader]:
    req = require_request_class(1, version)
    topic_cls = nested(req, "topics")
    key = {"topic_id": uuid.UUID(int=5)} if version >= 13 else {"topic": "orders"}
    body = build(req, topics=(build(topic_cls, partitions=(build(nested(topic_cls, "partitions")),), **key),), **fields)
    frame = bytes(encode_request(body, 1, "c"))
    return frame, parse_request_header(frame)


def test_fetch_followers_are_told_from_consumers() -> None:
    for version in FETCH_VERSIONS:
        req = require_request_class(1, version)
        if has_field(req, "replica_id"):
            for replica_id, follower in ((-1, False), (-2, False), (0, True), (3, True)):
                frame, header = _fetch_frame(version, replica_id=replica_id)
                assert request_names(frame, header).follower is follower, (version, replica_id)
        else:
            state_cls = hints(req)["replica_state"]
            frame, header = _fetch_frame(version, replica_state=state_cls(replica_id=1, replica_epoch=3))
            assert request_names(frame, header).follower is True, version
            frame, header = _fetch_frame(version, cluster_id="c")  # another tagged field: still a consumer
            assert request_names(frame, header).follower is False, version


def test_an_unknown_top_level_tag_is_skipped_and_tag_1_before_v15_is_no_follower() -> None:
    # Fetch v12-v14: tag 1 means nothing, the consumer's replica_id -1 decides.
    frame, header = _fetch_frame(14, replica_id=-1)
    assert frame[-1] == 0  # empty top-level tagged fields
    patched = frame[:-1] + bytes([2, 1, 2, 0xAA, 0xBB, 0x7F, 1, 0])
    names = request_names(patched, header)
    assert names.follower is False and names.topic_ids == (uuid.UUID(int=5),)
    patched = frame[:-1] + bytes([1, 1, 2, 0xAA])  # a tag whose value runs past the end
    with pytest.raises(InvalidHeader):
        request_names(patched, header)


# --------------------------------------------------------------------------- Produce responses


@st.composite
def _produce_responses(draw: st.DrawFn, version: int) -> Any:
    cls = response_type(0, version)
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partition_responses")
    errors = st.sampled_from([ErrorCode.none, ErrorCode.not_leader_or_follower, ErrorCode.invalid_record])

    def partition() -> Any:
        values: dict[str, Any] = {
            "index": draw(_i32),
            "error_code": draw(errors),
            "base_offset": draw(_i64),
            "log_start_offset": draw(_i64),
        }
        if has_field(part_cls, "record_errors"):
            err_cls = nested(part_cls, "record_errors")
            values["record_errors"] = tuple(
                build(err_cls, batch_index=draw(_i32), batch_index_error_message=draw(st.none() | _names))
                for _ in range(draw(st.integers(0, 2)))
            )
            values["error_message"] = draw(st.none() | _names)
        if has_field(part_cls, "current_leader"):
            leader_cls = hints(part_cls)["current_leader"]
            values["current_leader"] = draw(
                st.just(leader_cls()) | st.builds(lambda i, e: leader_cls(leader_id=i, leader_epoch=e), _i32, _i32)
            )
        return build(part_cls, **{k: v for k, v in values.items() if has_field(part_cls, k)})

    key = "topic_id" if version >= 13 else "name"
    topic_key = st.uuids() if version >= 13 else _names
    topics = tuple(
        build(
            topic_cls,
            partition_responses=tuple(partition() for _ in range(draw(st.integers(0, 3)))),
            **{key: draw(topic_key)},
        )
        for _ in range(draw(st.integers(0, 3)))
    )
    fields: dict[str, Any] = {
        "responses": topics,
        "throttle_time": datetime.timedelta(milliseconds=draw(st.integers(0, 2**31 - 1))),
    }
    if has_field(cls, "node_endpoints"):
        ep_cls = nested(cls, "node_endpoints")
        fields["node_endpoints"] = tuple(
            build(ep_cls, node_id=draw(_i32), host=draw(_names), port=draw(_i32), rack=draw(st.none() | _names))
            for _ in range(draw(st.integers(0, 2)))
        )
    return build(cls, **fields)


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
@_SETTINGS
@given(data=st.data())
def test_produce_response_names_match_kio_and_rename_round_trips(version: int, data: st.DataObject) -> None:
    body = data.draw(_produce_responses(version))
    prefix = data.draw(_prefixes)
    kind = data.draw(_buffers)
    flexible = version >= 9
    frame = bytes(encode_response(body, 11))
    if flexible and data.draw(st.booleans()):  # a response header with a tagged field of its own
        frame = frame[:4] + bytes([1, 9, 3, 1, 2, 3]) + frame[5:]
    assert decode_response(0, version, frame) == body

    spans = produce_response_names(_as(kind, frame), version)
    if version >= 13:
        assert spans == ()
    else:
        _assert_spans(frame, spans, [t.name for t in body.responses], flexible)
        new = {s.value: prefix + s.value for s in spans}
        renamed = _round_trip(frame, spans, [prefix + s.value for s in spans], kind, flexible)
        expected = dataclasses.replace(body, responses=tuple(_renamed(t, "name", new) for t in body.responses))
        assert decode_response(0, version, renamed) == expected
        again = produce_response_names(renamed, version)
        assert [s.value for s in again] == [prefix + s.value for s in spans]
        assert splice(renamed, again, [s.value for s in spans], flexible) == frame

    for cut in range(len(frame)):
        with pytest.raises(InvalidHeader):
            produce_response_names(frame[:cut], version)
    with pytest.raises(InvalidHeader):
        produce_response_names(frame + b"\x00", version)


@st.composite
def _fetch_responses(draw: st.DrawFn, version: int) -> Any:
    cls = response_type(1, version)
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partitions")
    aborted_cls = nested(part_cls, "aborted_transactions")

    def partition() -> Any:
        aborted = draw(st.none() | st.lists(st.builds(lambda p, o: (p, o), _i64, _i64), max_size=2))
        values: dict[str, Any] = {
            "partition_index": draw(_i32),
            "error_code": draw(st.sampled_from([ErrorCode.none, ErrorCode.offset_out_of_range])),
            "high_watermark": draw(_i64),
            "last_stable_offset": draw(_i64),
            "log_start_offset": draw(_i64),
            "aborted_transactions": None
            if aborted is None
            else tuple(build(aborted_cls, producer_id=p, first_offset=o) for p, o in aborted),
            "preferred_read_replica": draw(_i32),
            "records": draw(_records),
        }
        if draw(st.booleans()):
            leader_cls = hints(part_cls)["current_leader"]
            values["current_leader"] = leader_cls(leader_id=draw(_i32), leader_epoch=draw(_i32))
        return build(part_cls, **values)

    topics = tuple(
        build(
            topic_cls, topic_id=draw(st.uuids()), partitions=tuple(partition() for _ in range(draw(st.integers(0, 3))))
        )
        for _ in range(draw(st.integers(0, 3)))
    )
    fields: dict[str, Any] = {"responses": topics, "session_id": draw(_i32)}
    if has_field(cls, "node_endpoints"):
        ep_cls = nested(cls, "node_endpoints")
        fields["node_endpoints"] = tuple(
            build(ep_cls, node_id=draw(_i32), host=draw(_names), port=draw(_i32), rack=draw(st.none() | _names))
            for _ in range(draw(st.integers(0, 2)))
        )
    return build(cls, **fields)


@pytest.mark.parametrize("version", [v for v in FETCH_VERSIONS if v >= 13])
@_SETTINGS
@given(data=st.data())
def test_fetch_response_ids_are_found_in_place(version: int, data: st.DataObject) -> None:
    body = data.draw(_fetch_responses(version))
    frame = bytes(encode_response(body, 11))
    at = fetch_response_ids(frame, version)
    assert [uuid.UUID(bytes=frame[p : p + 16]) for p in at] == [t.topic_id for t in body.responses]
    patched = bytearray(frame)
    for p in at:
        patched[p : p + 16] = uuid.UUID(int=5).bytes
    expected = [dataclasses.replace(t, topic_id=uuid.UUID(int=5)) for t in body.responses]
    assert list(decode_response(1, version, patched).responses) == expected
    for cut in range(0, len(frame), 7):
        with pytest.raises(InvalidHeader):
            fetch_response_ids(frame[:cut], version)


def test_fetch_responses_before_v13_carry_no_ids() -> None:
    assert fetch_response_ids(b"", 12) == ()


# --------------------------------------------------------------------------- hand-built frames


def _header(api_key: int, version: int, hv: int = 1) -> tuple[bytes, RequestHeader]:
    head = encode_request_header(api_key, version, 1, "c", hv)
    return head, RequestHeader(api_key, version, 1, "c", hv, len(head))


def _produce_v2(name: bytes, records: int) -> tuple[bytes, RequestHeader]:
    """A Produce v2 request (older than kio's schemas: no transactional id) naming one topic."""
    head, header = _header(0, 2)
    body = struct.pack(">hii", 1, 1000, 1) + struct.pack(">h", len(name)) + name + struct.pack(">ii", 1, 0)
    body += struct.pack(">i", records) + b"r" * max(records, 0)
    return head + body, header


def test_versions_older_than_kio_ships_are_walked() -> None:
    frame, header = _produce_v2(b"orders", 5)
    names = request_names(frame, header)
    assert [s.value for s in names.topics] == ["orders"] and names.transactional_id is None
    renamed = splice(frame, names.topics, ["t.orders"], flexible=False)
    assert renamed == frame.replace(b"\x00\x06orders", b"\x00\x08t.orders")

    # Fetch v0: replica_id, max_wait, min_bytes, topics[topic, partitions[partition, offset, max_bytes]].
    head, header = _header(1, 0)
    body = struct.pack(">iii", 2, 100, 1) + struct.pack(">ih", 1, 1) + b"x" + struct.pack(">iiqi", 1, 0, 5, 1024)
    names = request_names(head + body, header)
    assert [s.value for s in names.topics] == ["x"] and names.follower is True

    # Produce response v0: responses[name, partitions[index, error, base_offset]], no throttle time.
    frame = struct.pack(">i", 3) + struct.pack(">ih", 1, 2) + b"ab" + struct.pack(">iihq", 1, 0, 0, 7)
    assert [s.value for s in produce_response_names(frame, 0)] == ["ab"]
    with pytest.raises(InvalidHeader):
        produce_response_names(frame + b"\x00\x00\x00\x00", 0)  # v0 has no throttle time


@pytest.mark.parametrize(
    ("name", "records"),
    [
        (b"\xff\xfe", 0),  # not UTF-8
        (b"ok", -2),  # a records length below null's -1
        (b"ok", 6),  # records running past the end
    ],
)
def test_malformed_produce_requests_raise_invalid_header(name: bytes, records: int) -> None:
    frame, header = _produce_v2(name, records)
    if records == 6:
        frame = frame[:-1]
    with pytest.raises(InvalidHeader):
        request_names(frame, header)


def test_null_names_and_absurd_counts_raise_invalid_header() -> None:
    head, header = _header(0, 2)
    null_name = struct.pack(">hii", 1, 1000, 1) + struct.pack(">h", -1) + struct.pack(">i", 0)
    with pytest.raises(InvalidHeader):
        request_names(head + null_name, header)
    huge = struct.pack(">hii", 1, 1000, 2**31 - 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", 2**31 - 1)
    with pytest.raises(InvalidHeader):
        request_names(head + huge, header)
    # Flexible: a compact null (0) topic name, and a varint that never ends.
    head, header = _header(0, 9, 2)
    with pytest.raises(InvalidHeader):
        request_names(head + b"\x00" + struct.pack(">hi", 1, 0) + b"\x02\x00", header)
    with pytest.raises(InvalidHeader):
        request_names(head + b"\x00" + struct.pack(">hi", 1, 0) + b"\xff" * 8, header)


def test_other_apis_and_unknown_versions_are_value_errors_not_invalid_headers() -> None:
    for key, version in ((3, 12), (0, 14), (1, 19), (0, -1)):
        _, header = _header(key, version)
        with pytest.raises(ValueError) as info:
            request_names(b"\x00" * 64, header)
        assert not isinstance(info.value, InvalidHeader)
    with pytest.raises(ValueError) as info:
        produce_response_names(b"\x00" * 64, 14)
    assert not isinstance(info.value, InvalidHeader)


def test_splice_encodes_lengths_and_refuses_bad_spans() -> None:
    frame = b"AB\x00\x02xyCD\x00\x01zEF"
    spans = [NameSpan(2, 4, 6, "xy"), NameSpan(8, 10, 11, "z")]
    assert splice(frame, spans, ["", "long"], flexible=False) == b"AB\x00\x00CD\x00\x04longEF"
    compact = b"AB\x03xyCD"
    assert splice(compact, [NameSpan(2, 3, 5, "xy")], ["é" * 70], flexible=True) == (
        b"AB\x8d\x01" + "é".encode() * 70 + b"CD"
    )
    assert splice(frame, [], [], flexible=False) == frame
    with pytest.raises(ValueError):
        splice(frame, spans, ["one"], flexible=False)
    with pytest.raises(ValueError):
        splice(frame, spans[::-1], ["a", "b"], flexible=False)
    with pytest.raises(ValueError):
        splice(frame, [NameSpan(2, 4, 99, "xy")], ["a"], flexible=False)
    with pytest.raises(ValueError):
        splice(frame, spans[:1], ["x" * 32768], flexible=False)
