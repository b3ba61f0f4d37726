"""An L4 relay written with trio and the gateway's socket path (:class:`kanal.net.fastio.FastStream`):
what any trio proxy pays per request before it does anything with the bytes.

    python -m kanalbench.trio_relay LISTEN_PORT TARGET_HOST TARGET_PORT

The request-rate scenario runs it in place of socat with ``KANALBENCH_RELAY=trio`` (see
:mod:`kanalbench.relay`), which separates the cost of the event loop from the gateway's own work.
"""

from __future__ import annotations

import sys
from functools import partial

import trio

from kanal.net.fastio import FastStream

READ_SIZE = 64 * 1024


async def _pump(source: trio.SocketStream, sink: trio.SocketStream, both: trio.CancelScope) -> None:
    reader, writer = FastStream(source), FastStream(sink)
    try:
        while data := await reader.receive_some(READ_SIZE):
            await writer.send_all(data)
        await sink.send_eof()
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        both.cancel()  # a peer reset the connection: that connection ends, the relay goes on


async def _handle(target: tuple[str, int], client: trio.SocketStream) -> None:
    try:
        upstream = await trio.open_tcp_stream(*target)
    except OSError:
        await client.aclose()
        return
    async with client, upstream, trio.open_nursery() as nursery:
        nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
        nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)


def main(argv: list[str]) -> None:
    port, host, target_port = int(argv[0]), argv[1], int(argv[2])
    trio.run(partial(trio.serve_tcp, partial(_handle, (host, target_port)), port, host=host))


if __name__ == "__main__":
    main(sys.argv[1:])
