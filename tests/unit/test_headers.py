import datetime
import uuid

import pytest
from kafka_captures import frames

from kanal.protocol.api import request_class
from kanal.protocol.entities import build, nested
from kanal.protocol.headers import (
    InvalidHeader,
    encode_request_header,
    parse_request_header,
    peek_request,
    produce_acks,
    produce_topics,
    response_correlation_id,
    set_request_correlation_id,
    set_response_correlation_id,
)
from kanal.protocol.messages import decode_request, encode_request


def test_every_captured_request_header_parses_like_kio() -> None:
    count = 0
    for f in frames():
        if f.direction != "c2s":
            continue
        header = parse_request_header(f.frame)
        assert (header.api_key, header.api_version, header.correlation_id) == (
            f.api_key,
            f.api_version,
            f.correlation_id,
        )
        _, body = decode_request(f.frame)  # kio reads the body where our header parser says it starts
        assert body is not None
        count += 1
    assert count > 100


def test_produce_acks_is_read_without_decoding_the_body() -> None:
    seen = set()
    for f in frames():
        if f.direction == "c2s" and f.api_key == 0:
            header = parse_request_header(f.frame)
            _, body = decode_request(f.frame)
            assert produce_acks(f.frame, header) == body.acks
            seen.add((f.api_version, body.acks))
    assert {v for v, _ in seen} >= {7, 9, 10}
    assert -1 in {a for _, a in seen}  # aiokafka used acks=all


def test_produce_topics_are_read_without_decoding_the_body() -> None:
    seen = set()
    for f in frames():
        if f.direction == "c2s" and f.api_key == 0:
            _, body = decode_request(f.frame)
            assert produce_topics(f.frame, parse_request_header(f.frame)) == [t.name for t in body.topic_data]
            seen.add(f.api_version)
    assert seen >= {7, 9, 10}


def _produce(version: int, topics: list[tuple[str, int]], records: bytes) -> bytearray:
    cls = request_class(0, version)
    topic_cls = nested(cls, "topic_data")
    part_cls = nested(topic_cls, "partition_data")
    data = []
    for name, partitions in topics:
        parts = tuple(build(part_cls, index=i, records=records) for i in range(partitions))
        key = {"topic_id": uuid.uuid5(uuid.NAMESPACE_DNS, name)} if version >= 13 else {"name": name}
        data.append(build(topic_cls, **key, partition_data=parts))
    body = build(
        cls,
        transactional_id="tx" if version >= 3 else None,
        acks=-1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=tuple(data),
    )
    return encode_request(body, 7, "client")


@pytest.mark.parametrize("version", range(3, 14))
def test_produce_topics_from_the_first_bytes_of_a_request(version: int) -> None:
    def expect(names: list[str]) -> list[object]:
        return [uuid.uuid5(uuid.NAMESPACE_DNS, n) for n in names] if version >= 13 else list(names)

    records = b"r" * 5000
    one = _produce(version, [("orders", 3)], records)
    header = parse_request_header(one)
    assert produce_topics(one, header) == expect(["orders"])
    assert produce_topics(one[:100], header) == expect(["orders"])  # one topic: its name is enough
    several = _produce(version, [("orders", 2), ("payments-é", 1), ("audit", 2)], records)
    assert produce_topics(several, header) == expect(["orders", "payments-é", "audit"])
    assert produce_topics(several[:5000], header) is None  # the other names come after records
    assert produce_topics(_produce(version, [], b""), header) == []
    assert produce_topics(one[: header.body_offset + 3], header) is None


def test_correlation_ids_are_patched_in_place() -> None:
    request = bytearray(encode_request_header(3, 12, 7, "me", 2) + b"\x00")
    set_request_correlation_id(request, 12345)
    assert peek_request(request) == (3, 12, 12345)
    response = bytearray(b"\x00\x00\x00\x07\x00rest")
    set_response_correlation_id(response, 99)
    assert response_correlation_id(response) == 99
    assert response[4:] == b"\x00rest"


@pytest.mark.parametrize("version,header_version", [(0, 1), (12, 2)])
def test_header_round_trip(version: int, header_version: int) -> None:
    raw = encode_request_header(3, version, 42, "client-é", header_version)
    header = parse_request_header(raw)
    assert (header.correlation_id, header.client_id, header.header_version, header.body_offset) == (
        42,
        "client-é",
        header_version,
        len(raw),
    )


def test_null_client_id() -> None:
    raw = encode_request_header(3, 12, 1, None, 2)
    assert parse_request_header(raw).client_id is None


@pytest.mark.parametrize("raw", [b"", b"\x00\x03\x00", b"\x00\x03\x00\x0c\x00\x00\x00\x01\x00\x09ab"])
def test_truncated_headers_raise(raw: bytes) -> None:
    with pytest.raises(InvalidHeader):
        parse_request_header(raw)
