"""``python -m kanal_registry_proxy.testing [--host H] [--port P] [--auth JSON]``: a test registry.

Prints ``READY <url>`` once it serves, then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

import trio

from kanal_registry_proxy.testing import Registry, serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kanal_registry_proxy.testing")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--auth", help='JSON {"users": {name: password}, "permissions": [...]}')
    args = parser.parse_args(argv)
    auth = json.loads(args.auth) if args.auth else None
    registry = Registry(auth["users"] if auth else None, auth["permissions"] if auth else None)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                url = await nursery.start(serve, registry, args.host, args.port)
                print(f"READY {url}", flush=True)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    trio.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
