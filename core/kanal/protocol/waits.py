"""How long a broker may rightly hold a request before answering it, read from the request.

A long-poll Fetch waits up to its ``max_wait``, a JoinGroup up to its rebalance timeout, an admin
request up to its ``timeout``: the gateway's upstream request timeout counts from there, so that it
catches a broker that stopped answering without cutting a request that is waiting as asked.
Fetch and Produce, on every client's path, are read at fixed offsets; the rest is decoded (rare).
"""

from __future__ import annotations

import datetime
import struct

from kanal.protocol.api import ApiKey
from kanal.protocol.headers import RequestHeader, produce_wait_offset
from kanal.protocol.messages import decode_request_body

_I32 = struct.Struct(">i")
# The fields that bound a broker's wait, by the name kio gives them, in order of preference.
_WAIT_FIELDS = ("rebalance_timeout", "max_wait", "timeout", "session_timeout")
# Requests answered at once whatever they carry: not worth decoding.
_PROMPT = frozenset(
    {
        ApiKey.METADATA,
        ApiKey.API_VERSIONS,
        ApiKey.LIST_OFFSETS,
        ApiKey.OFFSET_COMMIT,
        ApiKey.OFFSET_FETCH,
        ApiKey.FIND_COORDINATOR,
        ApiKey.HEARTBEAT,
        ApiKey.LEAVE_GROUP,
    }
)


def requested_wait_ms(frame: bytes | bytearray, header: RequestHeader) -> int:
    """The longest the broker may hold this request as the request itself asks (0 when it asks
    for nothing or cannot be read: the caller's timeout still applies)."""
    api_key, version, pos = header.api_key, header.api_version, header.body_offset
    try:
        if api_key == ApiKey.FETCH:
            wait: int = _I32.unpack_from(frame, pos + (4 if version < 15 else 0))[0]
            return max(0, wait)
        if api_key == ApiKey.PRODUCE:
            wait = _I32.unpack_from(frame, produce_wait_offset(frame, header))[0]
            return max(0, wait)
        if api_key in _PROMPT:
            return 0
        body = decode_request_body(api_key, version, frame, pos)
    except Exception:  # a malformed request: the broker's business, not the timeout's
        return 0
    for name in _WAIT_FIELDS:
        value = getattr(body, name, None)
        if isinstance(value, datetime.timedelta):
            return max(0, int(value.total_seconds() * 1000))
        if isinstance(value, int):
            return max(0, value)
    return 0
