"""A blocking raw Kafka socket for tests that need to control the wire exactly."""

from __future__ import annotations

import datetime
import socket
import struct
import time
from typing import Any

from kanal.protocol.api import require_request_class
from kanal.protocol.entities import build, nested
from kanal.protocol.headers import response_correlation_id
from kanal.protocol.messages import decode_response, encode_request
from kanal.protocol.records import Record, encode_batch


class WireClient:
    def __init__(self, bootstrap: str, timeout: float = 10.0) -> None:
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, body: Any, correlation_id: int, client_id: str = "wire-test") -> None:
        frame = encode_request(body, correlation_id, client_id)
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)

    def _exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                raise ConnectionError("closed by the gateway")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def receive(self) -> bytes:
        (size,) = struct.unpack(">i", self._exactly(4))
        return self._exactly(size)

    def call(self, body: Any, correlation_id: int = 1) -> Any:
        self.send(body, correlation_id)
        frame = self.receive()
        assert response_correlation_id(frame) == correlation_id
        return decode_response(int(body.__api_key__), int(body.__version__), frame)

    def closed_by_peer(self, timeout: float = 10.0) -> bool:
        """True when the gateway closes the connection (EOF or reset) within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                if not self.sock.recv(65536):
                    return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def metadata_request(topics: list[str] | None = None, version: int = 12) -> Any:
    """Metadata of ``topics``, or of every topic (v0 says so with an empty list: it has no null)."""
    cls = require_request_class(3, version)
    if topics is None:
        requested = () if version == 0 else None
    else:
        requested = tuple(build(nested(cls, "topics"), name=t) for t in topics)
    return build(cls, topics=requested, allow_auto_topic_creation=False)


def api_versions_request(version: int = 3) -> Any:
    return build(require_request_class(18, version), client_software_name="wire", client_software_version="1")


def produce_request(topic: str, acks: int, values: list[bytes], partition: int = 0) -> Any:
    """A Produce v9 request of ``values`` to one partition."""
    cls = require_request_class(0, 9)
    topic_cls = nested(cls, "topic_data")
    part_cls = nested(topic_cls, "partition_data")
    batch = encode_batch(
        [Record(i, 0, None, v, []) for i, v in enumerate(values)], base_timestamp=int(time.time() * 1000)
    )
    return build(
        cls,
        acks=acks,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(build(topic_cls, name=topic, partition_data=(build(part_cls, index=partition, records=batch),)),),
    )
