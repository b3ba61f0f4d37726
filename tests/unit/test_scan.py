import uuid

from kafka_captures import frames

from kanal.protocol.entities import build, nested
from kanal.protocol.messages import decode_response, encode_response, response_type
from kanal.protocol.records import Record, encode_batch
from kanal.protocol.scan import has_node_endpoints


def test_captured_responses_have_no_endpoints_and_the_scan_agrees_with_kio() -> None:
    checked = 0
    for f in frames():
        if f.direction == "s2c" and (
            (f.api_key == 1 and f.api_version >= 16) or (f.api_key == 0 and f.api_version >= 10)
        ):
            body = decode_response(f.api_key, f.api_version, f.frame)
            assert has_node_endpoints(f.api_key, f.api_version, f.frame) == bool(body.node_endpoints)
            checked += 1
    assert checked >= 15


def _fetch(version: int, endpoints: int, aborted: int) -> bytes:
    cls = response_type(1, version)
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partitions")
    aborted_cls = nested(part_cls, "aborted_transactions")
    batch = encode_batch([Record(i, 0, b"k", b"v" * 300, [("h", b"x")]) for i in range(5)], base_timestamp=1)
    parts = tuple(
        build(
            part_cls,
            partition_index=i,
            records=batch if i % 2 else None,
            preferred_read_replica=-1,
            aborted_transactions=tuple(build(aborted_cls, producer_id=7, first_offset=3) for _ in range(aborted)),
        )
        for i in range(3)
    )
    eps = tuple(build(nested(cls, "node_endpoints"), node_id=n, host="h", port=1) for n in range(endpoints))
    body = build(cls, responses=(build(topic_cls, topic_id=uuid.uuid4(), partitions=parts),) * 2, node_endpoints=eps)
    return bytes(encode_response(body, 9))


def _produce(version: int, endpoints: int) -> bytes:
    cls = response_type(0, version)
    topic_cls = nested(cls, "responses")
    part_cls = nested(topic_cls, "partition_responses")
    err_cls = nested(part_cls, "record_errors")
    parts = tuple(
        build(
            part_cls,
            index=i,
            error_message="boom" if i else None,
            record_errors=(build(err_cls, batch_index=1, batch_index_error_message="bad"),),
        )
        for i in range(2)
    )
    key = {"topic_id": uuid.uuid4()} if version >= 13 else {"name": "orders"}
    eps = tuple(build(nested(cls, "node_endpoints"), node_id=n, host="h", port=1) for n in range(endpoints))
    body = build(cls, responses=(build(topic_cls, partition_responses=parts, **key),), node_endpoints=eps)
    return bytes(encode_response(body, 9))


def test_fetch_scan_finds_endpoints_past_records_and_aborted_transactions() -> None:
    for version in (16, 17, 18):
        for endpoints in (0, 1, 2):
            for aborted in (0, 2):
                frame = _fetch(version, endpoints, aborted)
                assert has_node_endpoints(1, version, frame) == (endpoints > 0), (version, endpoints, aborted)


def test_produce_scan_finds_endpoints() -> None:
    for version in (10, 11, 12, 13):
        for endpoints in (0, 1):
            assert has_node_endpoints(0, version, _produce(version, endpoints)) == (endpoints > 0)


def test_older_versions_never_carry_endpoints_and_garbage_is_decoded() -> None:
    assert not has_node_endpoints(1, 15, b"\x00" * 40)
    assert has_node_endpoints(1, 16, b"\x00\x00\x00\x01\x00\x00")  # truncated: let the decoder judge


def test_incremental_scan_stops_at_the_same_tail_whatever_the_cuts() -> None:
    from kanal.protocol.scan import NEUTRAL_TAG, ResponseScan, node_endpoints_entry, node_endpoints_position

    frame = _fetch(16, 2, 1)
    where = node_endpoints_position(1, 16, frame)
    assert where is not None and frame[where] == 0
    for cut in (1, 7, 100, len(frame) // 2, len(frame) - 3):
        scan = ResponseScan(1, 16)
        taken = scan.feed(frame[:cut])
        if not scan.at_tail:
            if scan.opaque:  # pass over record bytes unread, as a relay does
                skipped = min(scan.opaque, len(frame) - cut)
                scan.skip(skipped)
                taken += skipped
            taken += scan.feed(frame[taken:])
        assert scan.at_tail and taken == scan.position
        assert taken + node_endpoints_entry(frame[taken:]) == where  # type: ignore[operator]
    patched = bytearray(frame)
    patched[where] = NEUTRAL_TAG  # what the gateway does when it cannot rewrite any more
    assert node_endpoints_position(1, 16, patched) is None
    # KIP-482: clients skip unknown tagged fields. kio is stricter, so show the rest of the frame
    # decodes once that one field is cut out (count byte before it set to zero).
    assert frame[where - 1] == 1  # one top-level tagged field
    body = decode_response(1, 16, bytes(frame[: where - 1]) + b"\x00")
    assert body.node_endpoints == () and len(body.responses) == 2


def test_scan_reads_varints_split_across_feeds_and_refuses_overlong_ones() -> None:
    import pytest

    from kanal.protocol.headers import InvalidHeader
    from kanal.protocol.scan import ResponseScan

    frame = _produce(12, 1)
    scan = ResponseScan(0, 12)
    for i in range(len(frame)):  # one byte at a time
        if scan.at_tail:
            break
        scan.feed(frame[i : i + 1])
    assert scan.at_tail
    whole = ResponseScan(0, 12)
    whole.feed(frame)
    assert scan.position == whole.position
    with pytest.raises(InvalidHeader):
        ResponseScan(0, 12).feed(b"\x00\x00\x00\x09" + b"\xff" * 6)
