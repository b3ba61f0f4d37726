"""How many new authenticated client connections per second the gateway accepts, end to end.

    python bench/auth_connections.py [--seconds 5] [--clients 3] [--repeats 3]

Starts one Tansu broker and two gateways in front of it, same build, same run: one with a PLAINTEXT
listener and one with SASL_PLAINTEXT (GATEWAY_MANAGED, a LOCAL service account and a gateway token).
``--clients`` processes then open connections as fast as they can for ``--seconds``, each doing
what a Kafka client does before its first real request, then closing it:

- ``plaintext``: connect, ApiVersions v3 (the floor: a connection that does not authenticate);
- ``plain-token``: connect, ApiVersions v3, SaslHandshake v1 PLAIN, SaslAuthenticate v2 with the
  service account's name and a gateway token;
- ``scram-sha-512`` (when the gateway stores SCRAM credentials): the same with SCRAM-SHA-512 at
  4096 iterations; the client keeps its SaltedPassword between connections (RFC 5802 allows it),
  so the client's PBKDF2 does not hide the gateway's cost.

Every exchange is checked (a refused login stops the bench). Prints, per case, the median over
``--repeats`` runs of the connections per second the clients completed and the gateway's CPU per
connection (``/proc``), from which ``per core`` = 1e6 / CPU us: what one core of the gateway would
accept were the clients elsewhere (here they share the machine's cores with it).
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "core", ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from kanalbench.cpu import cpu_seconds  # noqa: E402

from kanal.embedded import GatewayProcess, TansuBroker  # noqa: E402
from kanal.embedded.admin_http import AdminHttp  # noqa: E402
from kanal.protocol.api import ApiKey, require_request_class  # noqa: E402
from kanal.protocol.messages import decode_response, encode_request  # noqa: E402
from kanal.protocol.sasl import ScramMechanism  # noqa: E402

USER = "bench-app"
PASSWORD = "bench-app-password"
ADMIN = "[{username: admin, password: secret, admin: true}]"


def frame(api_key: int, version: int, correlation_id: int, **fields: object) -> bytes:
    body = bytes(encode_request(require_request_class(api_key, version)(**fields), correlation_id, "bench"))
    return struct.pack(">i", len(body)) + body


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the gateway closed the connection")
        data += chunk
    return bytes(data)


def call(sock: socket.socket, request: bytes, api_key: int, version: int) -> Any:
    sock.sendall(request)
    size = struct.unpack(">i", _exactly(sock, 4))[0]
    return decode_response(api_key, version, _exactly(sock, size))


API_VERSIONS = frame(ApiKey.API_VERSIONS, 3, 1, client_software_name="bench", client_software_version="1")


def _authenticate(sock: socket.socket, mechanism: str, token: str) -> None:
    handshake = call(sock, frame(ApiKey.SASL_HANDSHAKE, 1, 2, mechanism=mechanism), ApiKey.SASL_HANDSHAKE, 1)
    assert handshake.error_code == 0, handshake
    if mechanism == "PLAIN":
        steps: list[bytes] = [f"\x00{USER}\x00{token}".encode()]
        client = None
    else:
        client = ScramMechanism(mechanism, USER, PASSWORD)
        steps = [client.start()]
    correlation = 3
    while steps:
        request = frame(ApiKey.SASL_AUTHENTICATE, 2, correlation, auth_bytes=steps.pop())
        answer = call(sock, request, ApiKey.SASL_AUTHENTICATE, 2)
        if answer.error_code != 0:
            raise SystemExit(f"{mechanism} login refused: {answer.error_message}")
        correlation += 1
        if client is not None:
            following = client.step(answer.auth_bytes)
            if following is not None:
                steps.append(following)


def _worker(address: tuple[str, int], mechanism: str | None, token: str, deadline: float, out: object) -> None:
    # The client's cache of SaltedPassword (one PBKDF2 per salt, not per connection).
    hashlib.pbkdf2_hmac = functools.lru_cache(maxsize=4)(hashlib.pbkdf2_hmac)  # type: ignore[assignment]
    done = 0
    while time.monotonic() < deadline:
        with socket.create_connection(address) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            call(sock, API_VERSIONS, ApiKey.API_VERSIONS, 3)
            if mechanism is not None:
                _authenticate(sock, mechanism, token)
        done += 1
    out.put(done)  # type: ignore[attr-defined]


def run_case(
    address: tuple[str, int], gateway_pid: int, mechanism: str | None, token: str, clients: int, seconds: float
) -> tuple[float, float]:
    """(connections per second, gateway CPU microseconds per connection) of one run."""
    queue: multiprocessing.Queue[int] = multiprocessing.Queue()
    start = time.monotonic() + 0.5  # the workers start before the clock does
    deadline = start + seconds
    workers = [
        multiprocessing.Process(target=_worker, args=(address, mechanism, token, deadline, queue))
        for _ in range(clients)
    ]
    for worker in workers:
        worker.start()
    while time.monotonic() < start:
        time.sleep(0.01)
    cpu_before = cpu_seconds(gateway_pid)
    counts = [queue.get(timeout=seconds + 60) for _ in workers]
    cpu_after = cpu_seconds(gateway_pid)
    elapsed = time.monotonic() - start
    for worker in workers:
        worker.join()
    total = sum(counts)
    return total / elapsed, (cpu_after - cpu_before) * 1e6 / max(total, 1)


def start_gateway(broker: TansuBroker, env: dict[str, str], workdir: Path) -> tuple[GatewayProcess, AdminHttp]:
    settings = {
        **broker.gateway_settings(),
        "GATEWAY_CLUSTER_ID": f"bench-{uuid.uuid4().hex[:8]}",
        "GATEWAY_ADMIN_API_USERS": ADMIN,
        "GATEWAY_LOG_LEVEL": "warning",
        **env,
    }
    gateway = GatewayProcess(settings, log_path=workdir / f"{settings['GATEWAY_CLUSTER_ID']}.log").start(timeout=60)
    return gateway, AdminHttp(settings["GATEWAY_HTTP_PORT"])


def prepare_sasl(admin: AdminHttp) -> tuple[str, bool]:
    """Creates the service account; returns its token and whether SCRAM credentials could be stored."""
    account = {"apiVersion": "gateway/v2", "kind": "GatewayServiceAccount", "metadata": {"name": USER}}
    status, answer = admin.put("/gateway/v2/service-account", {**account, "spec": {"type": "LOCAL"}})
    assert status == 200, answer
    status, answer = admin.call("POST", "/gateway/v2/token", {"username": USER, "lifeTimeSeconds": 3600})
    assert status == 200, answer
    return answer["token"], store_scram_credential(admin)


def store_scram_credential(admin: AdminHttp) -> bool:
    """Stores the account's SCRAM-SHA-512 credential if the gateway manages SCRAM credentials."""
    credential = {
        "apiVersion": "gateway/v2",
        "kind": "GatewayScramCredential",
        "metadata": {"name": USER},
        "spec": {"mechanisms": ["SCRAM-SHA-512"], "iterations": 4096, "password": PASSWORD},
    }
    status, _ = admin.put("/gateway/v2/scram-credential", credential)
    return status == 200


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"kanal-bench-auth-{uuid.uuid4().hex[:8]}"
    workdir.mkdir(parents=True)
    secret = base64.b64encode(os.urandom(32)).decode()
    with TansuBroker(log_path=workdir / "tansu.log") as broker:
        plain, _ = start_gateway(broker, {}, workdir)
        sasl, admin = start_gateway(
            broker, {"GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "GATEWAY_USER_POOL_SECRET_KEY": secret}, workdir
        )
        try:
            token, scram = prepare_sasl(admin)
            cases: dict[str, Callable[[], tuple[float, float]]] = {}
            for name, gateway, mechanism in (
                ("plaintext", plain, None),
                ("plain-token", sasl, "PLAIN"),
                *((("scram-sha-512", sasl, "SCRAM-SHA-512"),) if scram else ()),
            ):
                host, port = gateway.bootstrap.rsplit(":", 1)
                pid = gateway.pid
                assert pid is not None
                cases[name] = functools.partial(
                    run_case, (host, int(port)), pid, mechanism, token, args.clients, args.seconds
                )
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
            for _ in range(args.repeats):  # interleaved, so a disturbance hits every case alike
                for name, case in cases.items():
                    results[name].append(case())
        finally:
            plain.stop(timeout=15)
            sasl.stop(timeout=15)
    print(f"{args.clients} client processes, {args.seconds:.0f} s per run, median of {args.repeats} runs")
    print(f"{'case':<16}{'connections/s':>15}{'gateway CPU us/conn':>22}{'per core':>10}   runs (conn/s)")
    for name, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        raw = ", ".join(f"{r:,.0f}" for r, _ in runs)
        print(f"{name:<16}{rate:>15,.0f}{cpu:>22.0f}{1e6 / cpu:>10,.0f}   {raw}")


if __name__ == "__main__":
    main()
