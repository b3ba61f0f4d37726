"""A SASL-terminating front for a Tansu broker, for testing the gateway's upstream SASL client.

Tansu speaks SCRAM with ``--authentication``, but with its in-memory storage no user can be created
once authentication is on, so these tests put this small scripted endpoint in front of the broker
instead: it answers SaslHandshake and SaslAuthenticate as a Kafka broker does (RFC 5802 SCRAM server
side, or PLAIN), refuses anything else before authentication, then relays bytes to the broker.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import socket
import socketserver
import ssl
import struct
import threading
from typing import Any

from kio.schema.errors import ErrorCode

from kanal.protocol.api import response_class
from kanal.protocol.entities import build
from kanal.protocol.messages import decode_request, encode_response


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _exactly(sock, 4)
    if head is None:
        return None
    return _exactly(sock, struct.unpack(">i", head)[0])


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _send(sock: socket.socket, body: Any, correlation_id: int) -> None:
    frame = encode_response(body, correlation_id)
    sock.sendall(struct.pack(">i", len(frame)) + frame)


class _Scram:
    def __init__(self, mechanism: str, password: str) -> None:
        self.hash = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        self.salt = os.urandom(16)
        self.salted = hashlib.pbkdf2_hmac(self.hash, password.encode(), self.salt, 4096)
        self.first_bare = self.server_first = ""

    def first(self, message: bytes) -> bytes:
        self.first_bare = message.decode().split(",", 2)[2]
        nonce = (
            dict(p.split("=", 1) for p in self.first_bare.split(","))["r"] + base64.b64encode(os.urandom(9)).decode()
        )
        self.server_first = f"r={nonce},s={base64.b64encode(self.salt).decode()},i=4096"
        return self.server_first.encode()

    def final(self, message: bytes) -> bytes | None:
        text = message.decode()
        without_proof, _, proof = text.rpartition(",p=")
        auth = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        client_key = hmac.new(self.salted, b"Client Key", self.hash).digest()
        stored = hashlib.new(self.hash, client_key).digest()
        signature = hmac.new(stored, auth, self.hash).digest()
        recovered = bytes(a ^ b for a, b in zip(base64.b64decode(proof), signature, strict=True))
        if hashlib.new(self.hash, recovered).digest() != stored:
            return None
        server_key = hmac.new(self.salted, b"Server Key", self.hash).digest()
        return b"v=" + base64.b64encode(hmac.new(server_key, auth, self.hash).digest())


class SaslFront:
    """Listens on a free port; ``authenticated`` counts connections that passed SASL.

    With ``tls``, connections are TLS first (Tansu 0.6.0's CLI refuses ``--cert`` together with
    ``--key``, so it cannot serve TLS itself); with ``mechanism=None`` there is no SASL step.
    """

    def __init__(
        self, mechanism: str | None, username: str = "", password: str = "", tls: ssl.SSLContext | None = None
    ) -> None:
        self.tls = tls
        self.broker: tuple[str, int] = ("127.0.0.1", 0)  # set once the broker behind is started
        self.mechanism, self.username, self.password = mechanism, username, password
        self.authenticated = 0
        self.refused = 0
        front = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                front._serve(self.request)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _serve(self, client: socket.socket) -> None:
        if self.tls is not None:
            try:
                client = self.tls.wrap_socket(client, server_side=True)
            except (ssl.SSLError, OSError):
                self.refused += 1
                return
        if self.mechanism is not None:
            authenticated = self._authenticate(client)
            if authenticated is None:  # refused and already counted
                return
            if not authenticated:
                self.refused += 1
                return
        self.authenticated += 1
        upstream = socket.create_connection(self.broker)
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)

    def _authenticate(self, client: socket.socket) -> bool | None:
        """True once authenticated; False when the client gave up or broke the exchange; None
        when it was refused (counted here, before the answer goes out)."""
        assert self.mechanism is not None
        scram = _Scram(self.mechanism, self.password) if self.mechanism.startswith("SCRAM") else None
        step = 0
        while True:
            frame = _read_frame(client)
            if frame is None:
                return False
            header, body = decode_request(frame)
            key, version, corr = header.api_key, header.api_version, header.correlation_id
            if key == 17:
                ok = body.mechanism == self.mechanism
                _send(
                    client,
                    build(
                        response_class(17, version), error_code=ErrorCode(0 if ok else 33), mechanisms=(self.mechanism,)
                    ),
                    corr,
                )
                if not ok:
                    return False
            elif key == 36:
                reply, done, failed = self._step(scram, step, bytes(body.auth_bytes))
                step += 1
                cls = response_class(36, version)
                if failed:
                    self.refused += 1  # counted before the answer, which the test may check at once
                    _send(client, build(cls, error_code=ErrorCode(58), error_message="Authentication failed"), corr)
                    return None
                _send(client, build(cls, error_code=ErrorCode(0), auth_bytes=reply), corr)
                if done:
                    return True
            else:
                return False  # a broker requiring SASL closes connections that skip it

    def _step(self, scram: _Scram | None, step: int, message: bytes) -> tuple[bytes, bool, bool]:
        if scram is None:
            ok = message == b"\x00" + self.username.encode() + b"\x00" + self.password.encode()
            return b"", True, not ok
        if step == 0:
            if f"n={self.username}," not in message.decode():
                return b"", False, True
            return scram.first(message), False, False
        final = scram.final(message)
        return (final or b""), True, final is None


def _pump(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(262144):
            target.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, target):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
