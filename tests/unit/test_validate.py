"""The protocol firewall's checks, on bytes: captured requests pass, damaged ones are refused with a
reason naming the field, and mutations of real requests never get past it undecodable."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from functools import cache

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from kafka_captures import CapturedFrame, frames
from kio.schema.index import api_key_map, schema_name_map

from kanal.protocol.api import api_name, require_request_class
from kanal.protocol.entities import build, nested
from kanal.protocol.headers import InvalidHeader, RequestHeader, parse_request_header
from kanal.protocol.messages import decode_request_body, encode_request
from kanal.protocol.records import Record, encode_batch
from kanal.protocol.validate import MalformedRequest, RequestScan, prepare, request_schema, validate_request


@cache
def _requests() -> tuple[CapturedFrame, ...]:
    return tuple(f for f in frames() if f.direction == "c2s")


@cache
def _one_per_version() -> tuple[CapturedFrame, ...]:
    seen: dict[tuple[int, int], CapturedFrame] = {}
    for f in _requests():
        seen.setdefault((f.api_key, f.api_version), f)
    return tuple(seen.values())


def _check(frame: bytes | bytearray, **kwargs: bool) -> str | None:
    return validate_request(frame, parse_request_header(frame), **kwargs)


def _scan(frame: bytes | bytearray, chunk: int = 1) -> str | None:
    """The streamed verdict, fed ``chunk`` bytes at a time."""
    header = parse_request_header(frame)
    scan = RequestScan(header, len(frame))
    try:
        for i in range(0, len(frame), chunk):
            scan.feed(memoryview(frame)[i : i + chunk])
        scan.finish()
    except MalformedRequest as exc:
        return str(exc)
    return None


def _produce(version: int, records: bytes | None, topic: str = "t", transactional_id: str | None = None) -> bytearray:
    req = require_request_class(0, version)
    topic_cls = nested(req, "topic_data")
    part_cls = nested(topic_cls, "partition_data")
    topic_fields = {"topic_id": uuid.UUID(int=7)} if version >= 13 else {"name": topic}
    body = build(
        req,
        transactional_id=transactional_id,
        acks=1,
        topic_data=(build(topic_cls, partition_data=(build(part_cls, index=0, records=records),), **topic_fields),),
    )
    return encode_request(body, 1, "c")


def _batch(n: int = 1, compression: int = 0) -> bytes:
    return bytes(
        encode_batch([Record(i, 0, b"k", b"v" * 10) for i in range(n)], base_timestamp=1, compression=compression)
    )


# --------------------------------------------------------------------------- what passes


def test_every_captured_request_passes_both_checks() -> None:
    requests = _requests()
    for f in requests:
        assert _check(f.frame) is None, (f.file, f.seq)
        assert _check(f.frame, unknown_tags=False, check_crc=True) is None, (f.file, f.seq)
        assert _scan(f.frame, 7) is None, (f.file, f.seq)
    assert len(requests) >= 150
    assert {0, 1, 3} <= {f.api_key for f in requests}


def test_every_request_version_kio_ships_has_a_walker() -> None:
    versions = [(int(key), int(v)) for key, name in api_key_map.items() for v in schema_name_map[name]]
    assert len(versions) > 250
    for key, version in versions:
        frame = bytearray(struct.pack(">hhih", key, version, 1, -1)) + b"\x00" * 4
        try:
            header = parse_request_header(frame)
        except InvalidHeader:
            continue
        assert request_schema(key, version) is not None
        reason = validate_request(frame, header)  # compiled, it judges four zero bytes of body
        assert reason is None or reason.startswith(f"{api_name(key)} v{version}: "), reason


def test_a_version_without_schema_is_not_judged() -> None:
    assert prepare(0, 9)
    assert not prepare(18, 99)
    frame = struct.pack(">hhih", 18, 99, 1, -1) + b"garbage"
    assert _check(frame) is None
    assert _scan(frame) is None


def test_built_requests_pass_including_unusual_fields() -> None:
    assert _check(_produce(9, _batch(3), transactional_id="tx")) is None
    assert _check(_produce(13, _batch())) is None  # topic ids
    assert _check(_produce(7, None)) is None  # records are nullable in the schema
    assert _check(_produce(9, _batch(2) + _batch(1))) is None  # several batches
    assert _check(_produce(9, _batch(5, compression=1)), check_crc=True) is None


# --------------------------------------------------------------------------- what is refused


def test_every_truncation_of_a_captured_request_is_refused() -> None:
    for f in _one_per_version():
        header = parse_request_header(f.frame)
        for cut in range(header.body_offset, len(f.frame)):
            reason = validate_request(f.frame[:cut], header)
            assert reason is not None, (f.api_key, f.api_version, cut)
            assert "left" in reason, reason  # every truncation shows as a length or field that does not fit
            assert _scan(f.frame[:cut], 5) == reason


def test_bytes_after_the_body_are_let_through_as_kafka_brokers_ignore_them() -> None:
    for f in _one_per_version():
        for extra in (b"\x00", b"\x01\x02\x03"):
            assert _check(f.frame + extra) is None
            assert _scan(f.frame + extra) is None


def test_a_records_length_past_the_end_names_the_field() -> None:
    frame = _produce(7, _batch())
    records = frame.find(_batch())
    struct.pack_into(">i", frame, records - 4, 9999)
    left = len(frame) - records
    assert (
        _check(frame)
        == f"Produce v7: topic_data[0].partition_data[0].records: length 9999 exceeds the {left} bytes left"
    )
    assert _scan(frame) == _check(frame)


def test_a_compact_length_past_the_end_names_the_field() -> None:
    frame = _produce(9, _batch(), topic="abc")
    at = frame.find(b"\x04abc")
    frame[at] = 0x70  # topic name length 111
    reason = _check(frame)
    assert reason is not None and reason.startswith("Produce v9: topic_data[0].name: length 111 exceeds the ")


def _at(offset: int, raw: bytes) -> Callable[[bytes], bytes]:
    return lambda b: b[:offset] + raw + b[offset + len(raw) :]


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (_at(16, b"\x01"), "batch 0: magic 1, expected 2"),
        (_at(57, struct.pack(">i", -1)), "batch 0: negative record count -1"),
        (_at(57, struct.pack(">i", 1000)), "batch 0: 1000 records cannot fit in 18 bytes"),
        (_at(22, b"\x07"), "batch 0: unknown compression codec 7"),
        (_at(8, struct.pack(">i", 20)), "batch 0: batchLength 20 is less than the v2 header's 49"),
        (_at(8, struct.pack(">i", -100)), "batch 0: batchLength -100 is less than the v2 header's 49"),
        (_at(8, struct.pack(">i", 100)), "batch 0: batchLength 100 exceeds the 67 bytes left"),
        (lambda b: b + bytes(20), "batch 1: 20 bytes left, fewer than a batch header's 61"),
        (lambda b: b[:40], "batch 0: 40 bytes left, fewer than a batch header's 61"),
    ],
)
def test_record_batch_headers_are_checked(damage: Callable[[bytes], bytes], expected: str) -> None:
    batch = _batch()
    assert len(batch) == 79  # the figures above: 61 of header, 18 of one record
    frame = _produce(7, damage(batch))
    reason = _check(frame)
    assert reason == f"Produce v7: topic_data[0].partition_data[0].records: {expected}"
    assert _scan(frame, 3) == reason


def test_a_corrupt_crc_is_refused_only_when_asked() -> None:
    batch = bytearray(_batch())
    batch[-1] ^= 0xFF
    frame = _produce(9, bytes(batch))
    assert _check(frame) is None
    assert _check(frame, check_crc=True) == "Produce v9: topic_data[0].partition_data[0].records: batch 0: CRC mismatch"


def test_strings_must_be_utf8_and_non_null_where_the_schema_says() -> None:
    frame = _produce(7, _batch(), topic="abc")
    at = frame.find(b"\x00\x03abc")
    bad = bytearray(frame)
    bad[at + 2] = 0xFF
    assert _check(bad) == "Produce v7: topic_data[0].name: not valid UTF-8"
    null = bytearray(frame)
    struct.pack_into(">h", null, at, -1)
    assert _check(null) == "Produce v7: topic_data[0].name: null, but the field is not nullable"
    negative = bytearray(frame)
    struct.pack_into(">h", negative, at, -2)
    assert _check(negative) == "Produce v7: topic_data[0].name: negative length -2"
    for damaged in (bad, null, negative):
        assert _scan(damaged) == _check(damaged)


def test_a_client_id_must_be_utf8() -> None:
    frame = bytearray(_produce(9, _batch()))
    frame[10] = 0xC3  # the client id "c": a truncated two-byte sequence
    assert _check(frame) == "Produce v9: header.client_id: not valid UTF-8"
    assert _scan(frame) == _check(frame)


def test_an_array_count_beyond_the_bytes_left_is_refused_without_looping() -> None:
    frame = _produce(7, _batch())
    at = frame.find(b"\x00\x01t")  # the topic name; the topic count is the 4 bytes before it
    struct.pack_into(">i", frame, at - 4, 0x7FFFFFFF)
    reason = _check(frame)
    assert reason is not None and reason.startswith("Produce v7: topic_data: count 2147483647 needs at least ")
    struct.pack_into(">i", frame, at - 4, -1)
    assert _check(frame) == "Produce v7: topic_data: null, but the field is not nullable"


def _fetch12(tags: bytes) -> bytearray:
    """A Fetch v12 request (no topics) whose top-level tagged section is ``tags``."""
    frame = encode_request(build(require_request_class(1, 12), min_bytes=1), 1, "c")
    assert frame[-1] == 0  # the empty top-level tagged section
    return frame[:-1] + tags


def test_tagged_fields() -> None:
    assert _check(_fetch12(b"\x01\x00\x04\x04abc")) is None  # cluster_id "abc"
    assert decode_request_body(1, 12, _fetch12(b"\x01\x00\x04\x04abc"), 12).cluster_id == "abc"
    assert _check(_fetch12(b"\x01\x00\x05\x04abcd")) == (
        "Fetch v12: cluster_id: tagged value ends 1 bytes before its length"
    )
    assert _check(_fetch12(b"\x01\x00\x03\x04abc")) == "Fetch v12: cluster_id: length 3 exceeds the 2 bytes left"
    assert _check(_fetch12(b"\x01\x09\x01\x00")) is None  # an unknown tag is skipped, as Kafka does
    assert _check(_fetch12(b"\x01\x09\x01\x00"), unknown_tags=False) == "Fetch v12: <tagged fields>: unknown tag 9"
    assert _check(_fetch12(b"\x02\x09\x00\x08\x00")) == (
        "Fetch v12: <tagged fields>: tag 8 after tag 9: tags must ascend"
    )
    assert (
        _check(_fetch12(b"\x01\x09\x05\x00")) == "Fetch v12: <tagged fields>: tag 9: length 5 exceeds the 1 bytes left"
    )
    assert _check(_fetch12(b"\x7f")) == "Fetch v12: <tagged fields>: count 127 needs at least 254 bytes, 0 left"
    assert _check(_fetch12(b"\x01\xff\xff\xff\xff\xff\x00")) == "Fetch v12: <tagged fields>: varint longer than 5 bytes"
    assert _check(_fetch12(b"\x01\xff\xff\xff\xff\x0f\x00")) == (
        "Fetch v12: <tagged fields>: varint 4294967295 exceeds 2147483647"
    )
    for tags in (b"\x01\x00\x05\x04abcd", b"\x02\x09\x00\x08\x00", b"\x01\xff\xff\xff\xff\xff\x00", b"\x01\x09\x05"):
        assert _scan(_fetch12(tags)) == _check(_fetch12(tags))


def test_booleans_are_zero_or_one() -> None:
    frame = encode_request(build(require_request_class(3, 12), topics=None), 1, "c")
    assert _check(frame) is None
    frame[-2] = 2  # include_topic_authorized_operations, the last field before the tagged section
    assert _check(frame) == "Metadata v12: include_topic_authorized_operations: boolean 2, expected 0 or 1"
    assert _scan(frame) == _check(frame)


def test_a_duration_kio_cannot_hold_is_refused() -> None:
    """kio holds a duration in 64-bit microseconds: OffsetCommit v3's retention time of more than
    2**63 - 1 microseconds (about 292 years) would not decode, however Python's timedelta takes it."""
    longest = (2**63 - 1) // 1000
    request = build(require_request_class(8, 3), group_id="g", member_id="m", topics=())
    frame = encode_request(request, 1, "c")
    at = len(frame) - 4 - 8  # retention_time_ms, before the (empty) topics array
    for ms, verdict in ((longest, None), (-longest, None), (longest + 1, "out of range"), (-longest - 1, "out")):
        frame[at : at + 8] = struct.pack(">q", ms)
        found = _check(frame)
        assert found is None if verdict is None else (found is not None and verdict in found), (ms, found)
        assert _scan(frame) == found
        if found is None:
            decode_request_body(8, 3, frame, parse_request_header(frame).body_offset)


# --------------------------------------------------------------------------- the streamed check


def test_the_scan_passes_record_bodies_unread() -> None:
    batch = _batch(200)
    frame = _produce(9, batch)
    header = parse_request_header(frame)
    scan = RequestScan(header, len(frame))
    head = frame.find(batch) + 61  # through the batch header
    scan.feed(frame[:head])
    assert scan.opaque == len(batch) - 61
    scan.skip(scan.opaque)
    scan.feed(frame[head + len(batch) - 61 :])
    scan.finish()
    assert scan.done


def test_the_scan_refuses_the_chunk_that_shows_the_damage_before_the_frame_ends() -> None:
    frame = _produce(9, _batch(50))
    records = frame.find(_batch(50))
    frame[records + 16] = 1  # magic
    scan = RequestScan(parse_request_header(frame), len(frame))
    scan.feed(frame[: records + 16])
    with pytest.raises(MalformedRequest, match=r"records: batch 0: magic 1, expected 2"):
        scan.feed(frame[records + 16 : records + 70])
    with pytest.raises(MalformedRequest):  # and it stays refused
        scan.feed(b"")


def test_the_scan_passes_bytes_after_the_structure_over() -> None:
    frame = _produce(9, _batch()) + b"\x00" * 10
    scan = RequestScan(parse_request_header(frame), len(frame))
    scan.feed(frame[:-10])  # the walk ends here: the 10 bytes to come are surplus
    assert scan.opaque == 10
    scan.feed(frame[-10:])
    scan.finish()


def test_the_scan_is_finished_only_by_the_whole_frame() -> None:
    frame = _produce(9, _batch())
    scan = RequestScan(parse_request_header(frame), len(frame))
    scan.feed(frame[:-1])
    with pytest.raises(MalformedRequest, match=f"the frame ends after {len(frame) - 1} of its {len(frame)} bytes"):
        scan.finish()
    with pytest.raises(ValueError, match="fed"):
        scan.feed(b"\x00\x00")


# --------------------------------------------------------------------------- mutations of real requests


def _mutate(data: st.DataObject, frame: bytes) -> bytes:
    out = bytearray(frame)
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "insert", "delete", "i16", "i32", "varint"]))
        at = data.draw(st.integers(0, max(len(out) - 1, 0)))
        if kind == "flip" and out:
            out[at] = data.draw(st.integers(0, 255))
        elif kind == "truncate":
            del out[at:]
        elif kind == "insert":
            out[at:at] = data.draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del out[at : at + data.draw(st.integers(1, 8))]
        elif kind in ("i16", "i32"):
            fmt, bound = (">h", 1 << 15) if kind == "i16" else (">i", 1 << 31)
            value = data.draw(st.one_of(st.integers(-2, 300), st.integers(-bound, bound - 1)))
            packed = struct.pack(fmt, value)
            out[at : at + len(packed)] = packed
        else:
            value = data.draw(st.one_of(st.integers(0, 300), st.integers(0, (1 << 35) - 1)))
            varint = bytearray()
            while True:
                varint.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
                value >>= 7
                if not varint[-1] & 0x80:
                    break
            out[at : at + 1] = varint
    return bytes(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_requests_are_refused_or_decode(data: st.DataObject) -> None:
    """The oracle is kio's full decoder: whatever passes (with unknown tags refused, as kio does)
    decodes. The check raises nothing but its verdict, and the streamed check agrees, however the
    bytes are cut."""
    original = data.draw(st.sampled_from(_requests()))
    frame = _mutate(data, original.frame)
    try:
        header: RequestHeader = parse_request_header(frame)
    except InvalidHeader:
        reject()  # the connection refuses those before any check
    strict = validate_request(frame, header, unknown_tags=False)
    lenient = validate_request(frame, header)
    assert strict is None or isinstance(strict, str)
    if strict is None:
        assert lenient is None
        if request_schema(header.api_key, header.api_version) is not None:
            decode_request_body(header.api_key, header.api_version, frame, header.body_offset)
    chunk = data.draw(st.integers(1, 64))
    assert _scan(frame, chunk) == lenient
