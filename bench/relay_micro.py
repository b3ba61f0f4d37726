"""CPU the gateway's forwarding of opaque bytes costs, per GB, with and without splice.

    python bench/relay_micro.py [--gigabytes 1] [--repeats 3]

Three processes on loopback: a server writing 5 MB chunks, a relay, a client reading. The relay
moves the bytes with :func:`kanal.net.forward.forward` (splice through a pipe), with the same
function made to copy (1 MiB reads, as with TLS), and with a plain trio ``receive_some`` /
``send_all`` loop (the gateway before zero-copy). Figures are the relay process's user and system
CPU seconds per GB moved (median of the repeats); the rate is the client's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import socket
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "core") not in sys.path:
    sys.path.insert(0, str(ROOT / "core"))

import trio  # noqa: E402

from kanal.net import forward as forwarding  # noqa: E402

CHUNK = 5 * 1024 * 1024
MODES = ("splice", "copy", "trio-loop")


def _server(total: int, ports: mp.Queue) -> None:  # type: ignore[type-arg]
    listener = socket.create_server(("127.0.0.1", 0))
    ports.put(listener.getsockname()[1])
    conn, _ = listener.accept()
    chunk = os.urandom(CHUNK)
    for _ in range(total // CHUNK):
        conn.sendall(chunk)
    conn.close()


def _client(port: int, total: int, results: mp.Queue) -> None:  # type: ignore[type-arg]
    conn = socket.create_connection(("127.0.0.1", port))
    buf = bytearray(1 << 20)
    got = 0
    began = time.perf_counter()
    while got < total and (n := conn.recv_into(buf)):
        got += n
    results.put(got / (time.perf_counter() - began))


async def _relay(mode: str, upstream_port: int, total: int, ports: mp.Queue, results: mp.Queue) -> None:  # type: ignore[type-arg]
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen()
    ports.put(listener.getsockname()[1])
    client = trio.SocketStream((await listener.accept())[0])
    upstream = await trio.open_tcp_stream("127.0.0.1", upstream_port)
    before = resource.getrusage(resource.RUSAGE_SELF)
    if mode == "trio-loop":
        moved = 0
        while moved < total:
            data = await upstream.receive_some(1024 * 1024)
            moved += len(data)
            await client.send_all(data)
    else:
        forwarding._Splice.enabled = mode == "splice"
        await forwarding.forward(upstream, client, total)
    after = resource.getrusage(resource.RUSAGE_SELF)
    results.put((after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime))
    await client.aclose()


def _relay_process(mode: str, upstream_port: int, total: int, ports: mp.Queue, results: mp.Queue) -> None:  # type: ignore[type-arg]
    trio.run(_relay, mode, upstream_port, total, ports, results)


def run_once(mode: str, total: int) -> tuple[float, float, float]:
    """(user s, system s, client bytes/s) for one relay of ``total`` bytes."""
    ports: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    cpu: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    rate: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    server = mp.Process(target=_server, args=(total, ports))
    server.start()
    relay = mp.Process(target=_relay_process, args=(mode, ports.get(), total, ports, cpu))
    relay.start()
    client = mp.Process(target=_client, args=(ports.get(), total, rate))
    client.start()
    user, system = cpu.get()
    bytes_per_s = rate.get()
    for process in (client, relay, server):
        process.join()
    return user, system, bytes_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    opts = parser.parse_args()
    total = int(opts.gigabytes * 1e9) // CHUNK * CHUNK
    print(f"{'mode':<10} {'user s/GB':>10} {'sys s/GB':>10} {'total s/GB':>11} {'GB/s':>6}")
    for mode in MODES:
        runs = [run_once(mode, total) for _ in range(opts.repeats)]
        per_gb = total / 1e9
        user = statistics.median(r[0] for r in runs) / per_gb
        system = statistics.median(r[1] for r in runs) / per_gb
        both = statistics.median((r[0] + r[1]) for r in runs) / per_gb
        rate = statistics.median(r[2] for r in runs) / 1e9
        print(f"{mode:<10} {user:>10.3f} {system:>10.3f} {both:>11.3f} {rate:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
