"""The hand-written SASL requests readers and response writers agree with kio, in every version."""

from __future__ import annotations

import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kanal.protocol.api import ApiKey, require_request_class
from kanal.protocol.headers import parse_request_header
from kanal.protocol.messages import decode_response, encode_request, encode_response, response_type
from kanal.protocol.sasl_messages import (
    MalformedSasl,
    authenticate_bytes,
    authenticate_response,
    handshake_mechanism,
    handshake_response,
)

_MECHANISMS = st.lists(st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]), unique=True)


@given(st.integers(0, 1), st.integers(-(2**31), 2**31 - 1), st.sampled_from([0, 33]), _MECHANISMS)
def test_handshake_responses_match_the_reference(version: int, corr: int, error: int, mechanisms: list[str]) -> None:
    cls = response_type(ApiKey.SASL_HANDSHAKE, version)
    expected = encode_response(cls(error_code=ErrorCode(error), mechanisms=tuple(mechanisms)), corr)
    assert handshake_response(version, corr, error, tuple(mechanisms)) == expected


@given(
    st.integers(0, 2),
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([0, 34, 58]),
    st.none() | st.text(max_size=300),
    st.binary(max_size=300),
    st.integers(0, 2**40),
)
def test_authenticate_responses_match_the_reference(
    version: int, corr: int, error: int, message: str | None, data: bytes, lifetime_ms: int
) -> None:
    cls = response_type(ApiKey.SASL_AUTHENTICATE, version)
    extra = {"session_lifetime": datetime.timedelta(milliseconds=lifetime_ms)} if version >= 1 else {}
    body = cls(error_code=ErrorCode(error), error_message=message, auth_bytes=data, **extra)
    ours = authenticate_response(version, corr, error, message, data, lifetime_ms)
    assert ours == encode_response(body, corr)
    assert decode_response(ApiKey.SASL_AUTHENTICATE, version, ours) == body


@given(st.integers(0, 1), st.text(max_size=40))
def test_the_mechanism_is_read_as_kio_reads_it(version: int, mechanism: str) -> None:
    frame = encode_request(require_request_class(ApiKey.SASL_HANDSHAKE, version)(mechanism=mechanism), 7, "c")
    assert handshake_mechanism(frame, parse_request_header(frame).body_offset) == mechanism
    with pytest.raises(MalformedSasl):
        handshake_mechanism(
            frame[: len(frame) - 1 - (len(mechanism.encode()) > 0)], parse_request_header(frame).body_offset
        )


@given(st.integers(0, 2), st.binary(max_size=400))
def test_the_auth_bytes_are_read_as_kio_reads_them(version: int, data: bytes) -> None:
    frame = encode_request(require_request_class(ApiKey.SASL_AUTHENTICATE, version)(auth_bytes=data), 7, "c")
    offset = parse_request_header(frame).body_offset
    assert authenticate_bytes(frame, offset, version) == data
    cut = len(frame) - (2 if version >= 2 else 1)  # (v2 ends with its tagged fields' count)
    if data:
        with pytest.raises(MalformedSasl):
            authenticate_bytes(frame[:cut], offset, version)
