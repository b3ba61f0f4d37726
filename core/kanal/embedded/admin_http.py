"""A blocking client for the admin HTTP API, for tests and tooling (stdlib only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from kanal.config.users import basic_header


class AdminHttp:
    """Calls ``http://127.0.0.1:<port>`` with Basic credentials; answers ``(status, body)`` with JSON
    bodies decoded and others as text."""

    def __init__(self, port: int | str) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def call(
        self, method: str, path: str, body: Any = None, user: tuple[str, str] | None = ("admin", "secret")
    ) -> tuple[int, Any]:
        """``user`` is the (username, password) pair to send; None sends no credentials."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if user:
            request.add_header("Authorization", basic_header(*user))
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                status, payload, kind = response.status, response.read(), response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            status, payload, kind = exc.code, exc.read(), exc.headers.get("Content-Type", "")
        if "json" in kind and payload:
            return status, json.loads(payload)
        return status, payload.decode()

    def put(self, path: str, body: Any, **kw: Any) -> tuple[int, Any]:
        return self.call("PUT", path, body, **kw)

    def get(self, path: str, **kw: Any) -> tuple[int, Any]:
        return self.call("GET", path, **kw)
