"""Recording the traffic a gateway moves, as JSONL frames, with optional redaction.

:class:`CaptureTap` is a :class:`~kanal.net.connection.FrameTap`: set it as ``gateway.tap`` and
every frame of both sides is written (``c2g``, ``g2u``, ``u2g``, ``g2c``), with api key, version and
correlation id, and ``node``, the broker id of the gateway port the client used. Such a capture
replays as a golden case: the scripted broker answers from the upstream side, and the client must
get what the gateway answered then.

Redaction (sans-I/O, also used by the pcap importer), applied as frames are recorded:

- ``sasl``: the SASL exchange. SaslAuthenticate (36) requests and responses keep their structure
  with ``auth_bytes`` replaced by ``REDACTED``; SaslHandshake (17) frames hold only mechanism names
  and are kept, but after a SaslHandshake v0 the raw (unframed by Kafka headers) SASL tokens that
  follow are replaced by ``REDACTED`` whole.
- ``records``: the records of Produce requests and Fetch responses: every key, value and header
  value is replaced by as many ``*`` bytes (null stays null), batches re-encoded with their codec.
  Offsets, timestamps, header keys, counts and sizes of the plain data stay.

A redacted frame carries ``"redacted": ["sasl"]`` or ``["records"]``. Redaction re-encodes the
frame with kio, which omits tagged fields holding their default value: an equivalent message.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import IO

from kanal.api.context import Connection
from kanal.conformance.frames import REQUEST_DIRECTIONS, ApiTracker, Frame, FrameWriter
from kanal.protocol.api import ApiKey, request_class, response_class
from kanal.protocol.headers import InvalidHeader, parse_request_header, peek_request, response_correlation_id
from kanal.protocol.messages import decode_request, decode_response, encode_request, encode_response
from kanal.protocol.records import RecordSet

REDACTED = b"REDACTED"
SASL_KEYS = frozenset({ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


def _mask(data: bytes | None) -> bytes | None:
    return None if data is None else b"*" * len(data)


def redact_record_set(records: bytes | None) -> bytes | None:
    """A records blob with keys, values and header values masked."""
    if not records:
        return records
    record_set = RecordSet.parse(records)
    for batch in record_set.batches:
        if batch.is_control:
            continue
        for record in batch.records():
            record.key = _mask(record.key)
            record.value = _mask(record.value)
            record.headers = [(k, _mask(v)) for k, v in record.headers]
        batch.mark_changed()
    return record_set.to_bytes()


def redact_produce_request(data: bytes) -> bytes:
    header, body = decode_request(data)
    topics = tuple(
        replace(t, partition_data=tuple(replace(p, records=redact_record_set(p.records)) for p in t.partition_data))
        for t in body.topic_data
    )
    return bytes(encode_request(replace(body, topic_data=topics), header.correlation_id, header.client_id))


def redact_fetch_response(data: bytes, version: int) -> bytes:
    body = decode_response(ApiKey.FETCH, version, data)
    topics = tuple(
        replace(t, partitions=tuple(replace(p, records=redact_record_set(p.records)) for p in t.partitions))
        for t in body.responses
    )
    return bytes(encode_response(replace(body, responses=topics), response_correlation_id(data)))


def redact_sasl_authenticate(data: bytes, is_request: bool, version: int) -> bytes:
    if is_request:
        header, body = decode_request(data)
        return bytes(encode_request(replace(body, auth_bytes=REDACTED), header.correlation_id, header.client_id))
    body = decode_response(ApiKey.SASL_AUTHENTICATE, version, data)
    return bytes(encode_response(replace(body, auth_bytes=REDACTED), response_correlation_id(data)))


def _is_kafka_request(data: bytes) -> bool:
    try:
        key, version, _ = peek_request(data)
        if request_class(key, version) is None:
            return False
        parse_request_header(data)
    except (InvalidHeader, UnicodeDecodeError):
        return False
    return True


class Redactor:
    """Redacts frames as they are recorded; keeps per-connection state for raw SASL tokens."""

    def __init__(self, *, sasl: bool = False, records: bool = False) -> None:
        self.sasl = sasl
        self.records = records
        self._raw_sasl: set[int] = set()

    @property
    def active(self) -> bool:
        return self.sasl or self.records

    def __call__(self, frame: Frame) -> Frame:
        if not self.active:
            return frame
        key, version = frame.api_key, frame.api_version
        is_request = frame.is_request
        if self.sasl and frame.conn in self._raw_sasl:
            if is_request and _is_kafka_request(frame.data):
                self._raw_sasl.discard(frame.conn)
            elif key is None or not is_request:
                return replace(frame, data=REDACTED, redacted=("sasl",))
        if key is None or version is None:
            return frame
        try:
            if self.sasl and key == ApiKey.SASL_HANDSHAKE and is_request and version == 0:
                self._raw_sasl.add(frame.conn)
            if self.sasl and key == ApiKey.SASL_AUTHENTICATE:
                data = redact_sasl_authenticate(frame.data, is_request, version)
                return replace(frame, data=data, redacted=("sasl",))
            if self.records and key == ApiKey.PRODUCE and is_request and request_class(key, version) is not None:
                return replace(frame, data=redact_produce_request(frame.data), redacted=("records",))
            if self.records and key == ApiKey.FETCH and not is_request and response_class(key, version) is not None:
                return replace(frame, data=redact_fetch_response(frame.data, version), redacted=("records",))
        except Exception:  # a frame that does not decode is cut to its header rather than leaked
            return replace(frame, data=frame.data[:8] if is_request else frame.data[:4], redacted=("undecodable",))
        return frame


class CaptureTap:
    """A gateway frame tap writing JSONL frames to ``out``; see the module docstring.

    The tap runs on the gateway's hot path: it copies the frame, labels it, redacts it if asked
    and writes one line to a buffered file. Call :meth:`flush` now and then and at the end."""

    def __init__(
        self,
        out: IO[bytes],
        *,
        redact_sasl: bool = False,
        redact_records: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.writer = FrameWriter(out)
        self.redactor = Redactor(sasl=redact_sasl, records=redact_records)
        self.clock = clock
        self._tracker = ApiTracker()
        self._seq: dict[int, int] = {}

    @property
    def count(self) -> int:
        return self.writer.count

    def __call__(self, connection: Connection, direction: str, frame: bytes | bytearray) -> None:
        data = bytes(frame)
        conn = connection.id
        if direction in REQUEST_DIRECTIONS:
            key, version, corr = self._tracker.request(conn, direction, data)
        else:
            key, version, corr = self._tracker.response(conn, direction, data)
        seq = self._seq.get(conn, 0)
        self._seq[conn] = seq + 1
        record = Frame(conn, seq, direction, self.clock(), key, version, corr, data, node=connection.node_id)
        self.writer.write(self.redactor(record))

    def flush(self) -> None:
        self.writer.flush()


def tap_frames(frames: list[Frame], redactor: Redactor) -> list[Frame]:
    """Applies a redactor to frames already labelled (the pcap importer's path)."""
    return [redactor(f) for f in frames]
