"""The admin app of a gateway, served to a test: its resource store following an in-memory log, and
quart-trio's test client (what an operator sees over HTTP, without a socket)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from kanal.admin.app import AdminApi

Client = Any


def serve_admin(api: AdminApi, body: Callable[[AdminApi, Client], Awaitable[None]]) -> AdminApi:
    """Runs ``body(api, client)`` while the store follows its log; returns ``api``."""

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(api.store.run)
            async with api.app.test_app() as app:
                await body(api, app.test_client())
            nursery.cancel_scope.cancel()

    trio.run(main)
    return api
