"""A SASL-terminating front for a Tansu broker: a broker that checks SCRAM passwords.

Tansu 0.6.0 speaks SCRAM with ``--authentication`` but cannot hold a SCRAM user: its storage
engine (dynostore, the only one built into the shipped binary, behind both ``memory://`` and
``s3://``) accepts AlterUserScramCredentials and stores nothing, and answers every credential lookup
with "no such user". Tests that need a SCRAM login that succeeds (or a PLAIN one that checks the
password, which Tansu does not) put this small scripted endpoint in front of a broker instead. It
answers SaslHandshake and SaslAuthenticate as a Kafka broker does (RFC 5802 SCRAM server side, or
PLAIN), relays ApiVersions before authentication and refuses anything else, then relays frames to
the broker. With ``session_lifetime_ms`` it tells clients their session ends (KIP-368) and serves
their re-authentication on the same connection, after the broker's answers owed before it.
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
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from kanal.protocol.entities import build
from kanal.protocol.headers import parse_request_header, produce_acks
from kanal.protocol.messages import decode_request, encode_response, response_type

_HANDSHAKE, _AUTHENTICATE, _API_VERSIONS, _PRODUCE = 17, 36, 18, 0


def _read_frame(sock: socket.socket) -> bytes | None:
    head = _exactly(sock, 4)
    if head is None:
        return None
    return _exactly(sock, struct.unpack(">i", head)[0])


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data


def _framed(frame: bytes | bytearray) -> bytes:
    return struct.pack(">i", len(frame)) + frame


def _saslname(text: str) -> str:
    return text.replace("=2C", ",").replace("=3D", "=")


class _Scram:
    def __init__(self, mechanism: str) -> None:
        self.hash = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        self.salt = os.urandom(16)
        self.salted = b""
        self.first_bare = self.server_first = ""

    def first(self, message: bytes, password: str) -> bytes:
        self.salted = hashlib.pbkdf2_hmac(self.hash, password.encode(), self.salt, 4096)
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
    """Listens on a free port; ``authenticated`` counts successful logins (re-authentications
    included), ``refused`` refused ones, ``logins`` lists who logged in, in order.

    ``users`` maps user names to passwords (``username``/``password`` add one more). With ``tls``,
    connections are TLS first (Tansu 0.6.0's CLI refuses ``--cert`` together with ``--key``, so it
    cannot serve TLS itself); with ``mechanism=None`` there is no SASL step.
    """

    def __init__(
        self,
        mechanism: str | None,
        username: str = "",
        password: str = "",
        tls: ssl.SSLContext | None = None,
        *,
        users: Mapping[str, str] | None = None,
        session_lifetime_ms: int = 0,
    ) -> None:
        self.tls = tls
        self.broker: tuple[str, int] = ("127.0.0.1", 0)  # set once the broker behind is started
        self.mechanism = mechanism
        self.users = dict(users or {})
        if username:
            self.users[username] = password
        self.session_lifetime_ms = session_lifetime_ms
        self.authenticated = 0
        self.refused = 0
        self.logins: list[str] = []
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
        upstream = socket.create_connection(self.broker)
        try:
            if self.mechanism is None:
                self.authenticated += 1
                threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
                _pump(client, upstream)
            else:
                _Session(self, client, upstream).run()
        finally:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.close()


class _Session:
    """One client connection through the front: SASL answered here, the rest relayed in order."""

    def __init__(self, front: SaslFront, client: socket.socket, upstream: socket.socket) -> None:
        self.front = front
        self.client = client
        self.upstream = upstream
        self.owed = 0  # requests relayed to the broker and not answered yet
        self.lock = threading.Condition()

    def _send_client(self, frame: bytes | bytearray) -> None:
        with self.lock:
            self.client.sendall(_framed(frame))

    def _answer(self, body: Any, correlation_id: int) -> None:
        self._send_client(encode_response(body, correlation_id))

    def run(self) -> None:
        # Before authentication: ApiVersions is relayed (one at a time), anything else but SASL closes.
        frame = _read_frame(self.client)
        while frame is not None and parse_request_header(frame).api_key == _API_VERSIONS:
            self.upstream.sendall(_framed(frame))
            answer = _read_frame(self.upstream)
            if answer is None:
                return
            self._send_client(answer)
            frame = _read_frame(self.client)
        if frame is None or parse_request_header(frame).api_key != _HANDSHAKE or not self._exchange(frame):
            return
        threading.Thread(target=self._from_broker, daemon=True).start()
        while (frame := _read_frame(self.client)) is not None:
            header = parse_request_header(frame)
            if header.api_key == _HANDSHAKE:  # re-authentication (KIP-368), after what is owed
                with self.lock:
                    self.lock.wait_for(lambda: self.owed == 0)
                if not self._exchange(frame):
                    return
                continue
            if header.api_key != _PRODUCE or produce_acks(frame, header) != 0:
                with self.lock:
                    self.owed += 1
            try:
                self.upstream.sendall(_framed(frame))
            except OSError:
                return

    def _from_broker(self) -> None:
        try:
            while (frame := _read_frame(self.upstream)) is not None:
                with self.lock:
                    self.client.sendall(_framed(frame))
                    self.owed -= 1
                    self.lock.notify_all()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                self.client.shutdown(socket.SHUT_RDWR)

    def _exchange(self, handshake: bytes) -> bool:
        """One SASL exchange from its handshake; True once the client is authenticated. After a
        handshake v0 the mechanism's messages come and go as raw tokens, and a refusal just closes."""
        front = self.front
        assert front.mechanism is not None
        header, body = decode_request(handshake)
        ok = body.mechanism == front.mechanism
        raw = header.api_version == 0
        cls = response_type(_HANDSHAKE, header.api_version)
        self._answer(
            build(cls, error_code=ErrorCode(0 if ok else 33), mechanisms=(front.mechanism,)), header.correlation_id
        )
        if not ok:
            return False
        scram = _Scram(front.mechanism) if front.mechanism.startswith("SCRAM") else None
        user: str | None = None
        step = 0
        while True:
            frame = _read_frame(self.client)
            if frame is None:
                return False
            if raw:
                message = frame
            else:
                header, body = decode_request(frame)
                if header.api_key != _AUTHENTICATE:
                    return False  # a broker requiring SASL closes connections that skip it
                message = bytes(body.auth_bytes)
            if step == 0:
                user = self._user(message)
            reply, done, failed = self._step(scram, step, message, user)
            step += 1
            if failed:
                front.refused += 1  # counted before the answer, which the test may check at once
            if raw:
                if failed:
                    return False
                self._send_client(reply)
            else:
                cls = response_type(_AUTHENTICATE, header.api_version)
                extra: dict[str, Any] = {}
                if header.api_version >= 1:
                    extra["session_lifetime"] = timedelta(milliseconds=front.session_lifetime_ms if done else 0)
                if failed:
                    refusal = build(cls, error_code=ErrorCode(58), error_message="Authentication failed", **extra)
                    self._answer(refusal, header.correlation_id)
                    return False
                self._answer(build(cls, error_code=ErrorCode(0), auth_bytes=reply, **extra), header.correlation_id)
            if done:
                assert user is not None
                front.authenticated += 1
                front.logins.append(user)
                return True

    def _user(self, message: bytes) -> str | None:
        try:
            if self.front.mechanism == "PLAIN":
                parts = message.split(b"\x00")
                return parts[1].decode() if len(parts) == 3 else None
            bare = message.decode().split(",", 2)[2]
        except (UnicodeDecodeError, IndexError):
            return None
        return _saslname(bare.split(",")[0][2:]) if bare.startswith("n=") else None

    def _step(self, scram: _Scram | None, step: int, message: bytes, user: str | None) -> tuple[bytes, bool, bool]:
        password = self.front.users.get(user or "")
        if scram is None:
            ok = password is not None and message.split(b"\x00")[2] == password.encode()
            return b"", True, not ok
        if step == 0:
            if password is None:
                return b"", False, True
            return scram.first(message, password), False, False
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
