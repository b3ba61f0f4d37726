"""The lean HTTP/1.1 listener and the upstream client, on raw sockets."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable

import pytest
import trio
from kanal_registry_proxy import httpserver
from kanal_registry_proxy.testing.proxy import ProxyThread
from kanal_registry_proxy.upstream import HttpClient, UpstreamError

from registry_proxy.srp_helpers import AVRO_ORDER, basic, register


def exchange(url: str, raw: bytes, read_until_close: bool = False) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(raw)
        if read_until_close:
            chunks = []
            while data := sock.recv(65536):
                chunks.append(data)
            return b"".join(chunks)
        sock.settimeout(1.0)
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except TimeoutError:
            pass
        return data


def auth_line() -> bytes:
    return b"Authorization: " + basic("root")["Authorization"].encode() + b"\r\n"


@pytest.fixture
def proxy(make_proxy: Callable[..., ProxyThread]) -> ProxyThread:
    proxy = make_proxy()
    assert register(proxy.url, "orders-value").status_code == 200
    return proxy


def test_pipelined_requests_are_answered_in_order(proxy: ProxyThread) -> None:
    one = b"GET /subjects HTTP/1.1\r\nHost: x\r\n" + auth_line() + b"\r\n"
    two = b"GET /schemas/ids/1 HTTP/1.1\r\nHost: x\r\n" + auth_line() + b"Connection: close\r\n\r\n"
    answer = exchange(proxy.url, one + two, read_until_close=True)
    assert answer.count(b"HTTP/1.1 200 OK") == 2
    assert answer.index(b'["orders-value"]') < answer.index(b'{"schema"')
    assert b"connection: close" in answer


def test_chunked_bodies_and_expect_continue(proxy: ProxyThread) -> None:
    body = json.dumps({"schema": AVRO_ORDER}).encode()
    chunked = b"".join(
        [
            f"{len(body[:10]):x}\r\n".encode(),
            body[:10],
            b"\r\n",
            f"{len(body[10:]):x}\r\n".encode(),
            body[10:],
            b"\r\n0\r\n\r\n",
        ]
    )
    request = (
        b"POST /subjects/orders-value HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + auth_line()
        + b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n"
        + chunked
    )
    answer = exchange(proxy.url, request, read_until_close=True)
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert b'"id":1' in answer


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /subjects HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"NONSENSE\r\n\r\n",
        b"GET /subjects HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GET /subjects HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    ],
    ids=["smuggling", "request-line", "header", "content-length"],
)
def test_malformed_requests_get_400_and_a_closed_connection(proxy: ProxyThread, request_bytes: bytes) -> None:
    answer = exchange(proxy.url, request_bytes, read_until_close=True)
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in answer


def test_http_1_0_closes_after_the_answer(proxy: ProxyThread) -> None:
    answer = exchange(proxy.url, b"GET /subjects HTTP/1.0\r\n" + auth_line() + b"\r\n", read_until_close=True)
    assert answer.startswith(b"HTTP/1.1 200 OK") and answer.endswith(b'["orders-value"]')


def test_idle_and_incomplete_connections_are_closed_after_their_timeouts(
    make_proxy: Callable[..., ProxyThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(httpserver, "KEEP_ALIVE_TIMEOUT", 0.3)
    monkeypatch.setattr(httpserver, "HEAD_TIMEOUT", 0.3)
    monkeypatch.setattr(httpserver, "WATCH_INTERVAL", 0.05)
    proxy = make_proxy()
    host, port = proxy.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as idle:
        idle.sendall(b"GET /subjects HTTP/1.1\r\nHost: x\r\n" + auth_line() + b"\r\n")
        answer = b""
        while not answer.endswith(b"[]"):
            answer += idle.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200 OK")
        assert idle.recv(65536) == b""  # kept alive, then closed once idle past the timeout
    with socket.create_connection((host, int(port)), timeout=10) as slow:
        slow.sendall(b"GET /subjects HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
        assert slow.recv(65536) == b""


class RawServer:
    """Answers each connection with scripted bytes, for the client's framing cases."""

    def __init__(self, answers: list[bytes], close_after: bool = True) -> None:
        self.answers = list(answers)
        self.close_after = close_after
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self.run, daemon=True).start()

    def run(self) -> None:
        while self.answers:
            conn, _ = self.sock.accept()
            self.connections += 1
            with conn:
                conn.recv(65536)
                conn.sendall(self.answers.pop(0))


@pytest.mark.parametrize(
    ("answer", "body"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\nX-T: 1\r\n\r\n", b"hello"),
        (b"HTTP/1.0 200 OK\r\n\r\nhello", b"hello"),
        (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    ],
    ids=["content-length", "chunked", "until-close", "no-content"],
)
def test_client_response_framing(answer: bytes, body: bytes) -> None:
    server = RawServer([answer])
    client = HttpClient("127.0.0.1", server.port)

    async def main() -> bytes:
        response = await client.request("GET", b"/x")
        await client.aclose()
        return response.body

    assert trio.run(main) == body


def test_client_retries_once_on_a_connection_the_server_closed() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    server = RawServer([answer, answer])  # each connection answers once, then closes
    client = HttpClient("127.0.0.1", server.port)

    async def main() -> list[bytes]:
        first = await client.request("GET", b"/x")
        await trio.sleep(0.1)
        second = await client.request("GET", b"/x")  # the kept connection is dead: a new one
        await client.aclose()
        return [first.body, second.body]

    assert trio.run(main) == [b"ok", b"ok"]
    assert server.connections == 2


def test_client_errors() -> None:
    async def main() -> None:
        with pytest.raises(UpstreamError, match="cannot connect"):
            await HttpClient("127.0.0.1", 1).request("GET", b"/")
        server = RawServer([b"garbage\r\n\r\n"])
        with pytest.raises(UpstreamError, match="did not answer HTTP"):
            await HttpClient("127.0.0.1", server.port).request("GET", b"/")
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        with pytest.raises(UpstreamError, match="did not answer within") as failure:
            await HttpClient("127.0.0.1", silent.getsockname()[1], timeout=0.2).request("GET", b"/")
        assert failure.value.timeout
        silent.close()

    trio.run(main)


def test_client_timeout_enforced_by_its_watch_task() -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    client = HttpClient("127.0.0.1", silent.getsockname()[1], timeout=0.2)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(client.watch)
            with pytest.raises(UpstreamError, match="did not answer within") as failure:
                await client.request("GET", b"/")  # connected, never answered: its connection is closed
            assert failure.value.timeout
            assert not client._busy and not client._idle
            nursery.cancel_scope.cancel()
        await client.aclose()

    trio.run(main)
    silent.close()
