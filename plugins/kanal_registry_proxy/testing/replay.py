"""Replaying the captured registry exchanges against a server and comparing the answers.

An exchange matches when the status is the same, the Content-Type is the same, and the bodies are
equal as JSON (or as text when not JSON) — except where an expectation documents a difference:

- ``error_code``: only the status and the ``error_code`` of an error body must match (the message
  text differs, e.g. another parser's wording);
- ``status``: the status must be the one given instead (and nothing else is compared);
- ``skip``: not compared at all.

Each expectation carries its reason; a difference without one fails the replay.
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CAPTURE = Path(__file__).resolve().parents[3] / "conformance" / "captures" / "registry" / "karapace.jsonl"

# the passwords the capture's authfile scenario used (redacted in the capture itself)
CAPTURE_USERS = {"admin": "admin-pass", "alice": "alice-pass", "bob": "bob-pass"}
CAPTURE_PERMISSIONS = [
    {"username": "admin", "operation": "Write", "resource": ".*"},
    {"username": "alice", "operation": "Write", "resource": "Subject:orders-.*"},
    {"username": "alice", "operation": "Read", "resource": "Subject:payments-value$"},
    {"username": "bob", "operation": "Read", "resource": "Subject:orders-value"},
]


@dataclass(frozen=True)
class Exchange:
    seq: int
    scenario: str
    label: str
    method: str
    path: str
    query: str
    request_headers: dict[str, str]
    request_body: Any
    status: int
    response_headers: dict[str, str]
    response_body: Any

    @property
    def target(self) -> str:
        return self.path + (f"?{self.query}" if self.query else "")


@dataclass(frozen=True)
class Expectation:
    kind: str  # error_code, status, skip
    reason: str
    status: int | None = None


def load(path: Path = CAPTURE) -> list[Exchange]:
    exchanges = []
    with open(path) as handle:
        for line in handle:
            item = json.loads(line)
            exchanges.append(
                Exchange(
                    item["seq"],
                    item["scenario"],
                    item["label"],
                    item["method"],
                    item["path"],
                    item["query"],
                    item["request_headers"],
                    item["request_body"],
                    item["status"],
                    item["response_headers"],
                    item["response_body"],
                )
            )
    return exchanges


def user_of(exchange: Exchange) -> str | None:
    """Who made an authfile-scenario call, from its label (the capture redacts credentials)."""
    label = exchange.label.lower()
    if exchange.scenario != "authfile" or "without credentials" in label or "no credentials" in label:
        return None
    if "wrong password" in label:
        return "admin:wrong"
    if "unknown user" in label:
        return "mallory:whatever"
    for name in ("admin", "alice", "bob"):
        if f"auth: {name} " in label or label.startswith(f"auth: {name}"):
            return f"{name}:{CAPTURE_USERS[name]}"
    if "with credentials" in label:
        return f"admin:{CAPTURE_USERS['admin']}"
    return None


@dataclass
class Result:
    seq: int
    label: str
    problem: str | None
    status: int
    body: Any


def send(url: str, exchange: Exchange, authorization: str | None) -> tuple[int, str | None, bytes]:
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=30)
    headers = {k: v for k, v in exchange.request_headers.items() if k not in ("content-length", "authorization")}
    if authorization is not None:
        headers["authorization"] = authorization
    body: bytes | None = None
    if exchange.request_body is not None:
        if "json" in exchange.request_body:
            body = json.dumps(exchange.request_body["json"]).encode()
        else:
            body = exchange.request_body["text"].encode()
    elif exchange.method in ("POST", "PUT"):
        body = b""
    try:
        connection.request(exchange.method, parts.path.rstrip("/") + exchange.target, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.getheader("content-type"), response.read()
    finally:
        connection.close()


def basic(credentials: str) -> str:
    return "Basic " + base64.b64encode(credentials.encode()).decode()


def _decoded(payload: bytes) -> Any:
    try:
        return {"json": json.loads(payload)}
    except ValueError:
        return {"text": payload.decode("utf-8", "replace")}


def compare(
    exchange: Exchange, status: int, content_type: str | None, payload: bytes, expectation: Expectation | None
) -> str | None:
    """None when the answer matches the capture (modulo the expectation), else what differs."""
    if expectation is not None and expectation.kind == "skip":
        return None
    if expectation is not None and expectation.kind == "status":
        return None if status == expectation.status else f"status {status}, expected {expectation.status}"
    if status != exchange.status:
        return f"status {status}, captured {exchange.status}; body {payload[:200]!r}"
    captured_type = exchange.response_headers.get("content-type")
    if captured_type is not None and content_type != captured_type:
        return f"content-type {content_type!r}, captured {captured_type!r}"
    body = _decoded(payload)
    if expectation is not None and expectation.kind == "error_code":
        got = body.get("json")
        want = (exchange.response_body or {}).get("json")
        if isinstance(got, dict) and isinstance(want, dict) and got.get("error_code") == want.get("error_code"):
            return None
        return f"error body {got!r}, captured {want!r}"
    if body != exchange.response_body:
        return f"body {json.dumps(body)[:300]}, captured {json.dumps(exchange.response_body)[:300]}"
    return None


def replay(
    url_of: Callable[[Exchange], str],
    exchanges: Iterable[Exchange],
    expectations: dict[int, Expectation],
    authorization_of: Callable[[Exchange], str | None],
) -> list[Result]:
    results = []
    for exchange in exchanges:
        status, content_type, payload = send(url_of(exchange), exchange, authorization_of(exchange))
        problem = compare(exchange, status, content_type, payload, expectations.get(exchange.seq))
        results.append(Result(exchange.seq, exchange.label, problem, status, _decoded(payload)))
    return results


def report(results: list[Result]) -> str:
    return "\n".join(f"seq {r.seq} ({r.label}): {r.problem}" for r in results if r.problem)


# Where the test registry answers differently from Karapace (error texts of other parsers).
TEST_REGISTRY_EXPECTATIONS: dict[int, Expectation] = {
    45: Expectation("error_code", "an unknown Avro type: fastavro's message, not Avro's"),
    46: Expectation("error_code", "unparsable schema text: orjson's message, not Karapace's JSON parser's"),
    51: Expectation("error_code", "malformed request body: the pydantic error details (position, text) differ"),
}
