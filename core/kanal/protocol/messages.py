"""Request and response bodies through kio, with the reader and writer lookups cached.

Decoding is the expensive step the gateway avoids when it can: these functions are called only
for the (api key, version) pairs that a hook or a core rule needs.
"""

from __future__ import annotations

import io
from typing import Any

from kio.serial import entity_reader, entity_writer

from kanal.protocol.api import (
    request_class,
    request_header_version,
    response_class,
    response_header_version,
)
from kanal.protocol.headers import (
    encode_request_header,
    encode_response_header,
    parse_request_header,
    response_body_offset,
)


class UnsupportedApi(ValueError):
    """kio has no schema for this (api key, version)."""


_readers: dict[type, Any] = {}
_writers: dict[type, Any] = {}


def _reader(cls: type) -> Any:
    reader = _readers.get(cls)
    if reader is None:
        reader = _readers[cls] = entity_reader(cls)
    return reader


def _writer(cls: type) -> Any:
    writer = _writers.get(cls)
    if writer is None:
        writer = _writers[cls] = entity_writer(cls)
    return writer


def _readonly(frame: bytes | bytearray) -> bytes | memoryview:
    """kio's native reader refuses writable buffers; a read-only view avoids a copy."""
    return frame if isinstance(frame, bytes) else memoryview(frame).toreadonly()


def _request_cls(api_key: int, version: int) -> Any:
    cls = request_class(api_key, version)
    if cls is None:
        raise UnsupportedApi(f"no request schema for api key {api_key} version {version}")
    return cls


def _response_cls(api_key: int, version: int) -> Any:
    cls = response_class(api_key, version)
    if cls is None:
        raise UnsupportedApi(f"no response schema for api key {api_key} version {version}")
    return cls


def decode_request_body(api_key: int, version: int, frame: bytes | bytearray, offset: int) -> Any:
    """Decodes the body of a request frame that starts at ``offset``."""
    body, _ = _reader(_request_cls(api_key, version))(_readonly(frame), offset)
    return body


def decode_request(frame: bytes | bytearray) -> tuple[Any, Any]:
    """(parsed header, decoded body) of a whole request frame."""
    header = parse_request_header(frame)
    return header, decode_request_body(header.api_key, header.api_version, frame, header.body_offset)


def encode_body(body: Any) -> bytes:
    """Encodes a kio request or response body (without header)."""
    buf = io.BytesIO()
    _writer(type(body))(buf, body)
    return buf.getvalue()


def encode_request(body: Any, correlation_id: int, client_id: str | None) -> bytearray:
    """A whole request frame (without length prefix) for a kio request body."""
    key, version = int(body.__api_key__), int(body.__version__)
    head = encode_request_header(key, version, correlation_id, client_id, request_header_version(key, version))
    return _frame(head, body)


def _frame(head: bytes, body: Any) -> bytearray:
    """``head`` and the encoded ``body`` in one buffer, copied once (a Fetch response or Produce
    request carries megabytes of records: ``head + encode_body(body)`` would copy them twice more)."""
    buf = io.BytesIO()
    buf.write(head)
    _writer(type(body))(buf, body)
    with buf.getbuffer() as view:
        return bytearray(view)


def decode_response(api_key: int, version: int, frame: bytes | bytearray) -> Any:
    """Decodes the body of a response frame (the header is skipped)."""
    cls = _response_cls(api_key, version)
    offset = response_body_offset(frame, response_header_version(api_key, version))
    body, _ = _reader(cls)(_readonly(frame), offset)
    return body


def encode_response(body: Any, correlation_id: int) -> bytearray:
    """A whole response frame (without length prefix) for a kio response body."""
    key, version = int(body.__api_key__), int(body.__version__)
    head = encode_response_header(correlation_id, response_header_version(key, version))
    return _frame(head, body)


def response_type(api_key: int, version: int) -> Any:
    """The kio response class, for hooks that build an answer themselves."""
    return _response_cls(api_key, version)
