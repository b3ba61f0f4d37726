import pytest
from kafka_captures import frames

from kanal.protocol.headers import (
    InvalidHeader,
    encode_request_header,
    parse_request_header,
    peek_request,
    produce_acks,
    response_correlation_id,
    set_request_correlation_id,
    set_response_correlation_id,
)
from kanal.protocol.messages import decode_request


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
