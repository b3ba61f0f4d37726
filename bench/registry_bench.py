"""Schema registry proxy benchmark: GET /schemas/ids/{id} through the proxy against the test registry directly.

One run starts the test registry (a process of its own), registers a schema, starts the proxy
(``kanal registry-proxy``, a process of its own, basic auth, read-only mode, access log on), warms
the credential and id caches, then measures, alternating direct and proxy paths:

- throughput: N kept-alive connections, each sending the next request as soon as the previous
  answer arrived, for S seconds (a load-generator process of its own);
  The CPU time each server process spends per request is reported too (from /proc): unlike
  throughput, it does not depend on what else the machine runs;
- latency: a fixed rate (500 requests/s by default) spread over kept-alive connections; each latency
  runs from the request's scheduled send time to its answer, so queueing counts.

It prints the median over the repeats of each path, the ratio proxy/direct (throughput) and the
added p50/p99 (latency), then every raw number. No Kafka is involved (read-only mode).

    PY=/work/venv/bin/python
    $PY bench/registry_bench.py                      # throughput and latency, 5 repeats
    $PY bench/registry_bench.py --seconds 5 --connections 8 --rate 500 --repeats 5 --json out.json
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
PYTHONPATH = os.pathsep.join([str(ROOT / "core"), str(ROOT / "plugins")])
USER, PASSWORD = "bench", "bench-password"


# -- load generator (runs in a process of its own) ----------------------------------------------------


def _request(host: str, port: int, path: str, auth: str | None) -> bytes:
    lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: application/vnd.schemaregistry.v1+json"]
    if auth:
        lines.append(f"Authorization: {auth}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class _Conn:
    __slots__ = ("buffer", "sent_at", "sock")

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.buffer = bytearray()
        self.sent_at = 0.0

    def responses(self) -> int:
        """Complete responses in the buffer (removed); raises on a non-200."""
        done = 0
        buffer = self.buffer
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return done
            head = bytes(buffer[:end]).lower()
            if not head.startswith(b"http/1.1 200"):
                raise RuntimeError(f"unexpected answer: {head[:80]!r}")
            at = head.find(b"content-length:")
            stop = head.find(b"\r\n", at)
            length = int(head[at + 15 : stop if stop > 0 else None])
            if len(buffer) < end + 4 + length:
                return done
            del buffer[: end + 4 + length]
            done += 1


def worker_throughput(url: str, path: str, auth: str | None, connections: int, seconds: float) -> dict[str, Any]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = _request(host, port, path, auth)
    selector = selectors.DefaultSelector()
    conns = [_Conn(host, port) for _ in range(connections)]
    for conn in conns:
        selector.register(conn.sock, selectors.EVENT_READ, conn)
        conn.sock.send(request)
    count = 0
    started = time.perf_counter()
    end = started + seconds
    while time.perf_counter() < end:
        for key, _ in selector.select(0.5):
            conn = key.data
            data = conn.sock.recv(262144)
            if not data:
                raise RuntimeError("connection closed")
            conn.buffer += data
            done = conn.responses()
            if done:
                count += done
                conn.sock.send(request)
    elapsed = time.perf_counter() - started
    return {"requests": count, "seconds": elapsed, "rps": count / elapsed}


def worker_latency(
    url: str, path: str, auth: str | None, rate: float, seconds: float, connections: int
) -> dict[str, Any]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    request = _request(host, port, path, auth)
    selector = selectors.DefaultSelector()
    idle = [_Conn(host, port) for _ in range(connections)]
    for conn in idle:
        selector.register(conn.sock, selectors.EVENT_READ, conn)
    latencies: list[float] = []
    backlog: list[float] = []  # scheduled times waiting for a free connection
    interval = 1.0 / rate
    start = time.perf_counter() + 0.05
    total = int(rate * seconds)
    scheduled = 0
    while scheduled < total or len(idle) < connections or backlog:
        now = time.perf_counter()
        while scheduled < total and start + scheduled * interval <= now:
            backlog.append(start + scheduled * interval)
            scheduled += 1
        while backlog and idle:
            conn = idle.pop()
            conn.sent_at = backlog.pop(0)
            conn.sock.send(request)
        next_due = start + scheduled * interval if scheduled < total else now + 0.5
        for key, _ in selector.select(max(0.0, next_due - time.perf_counter())):
            conn = key.data
            data = conn.sock.recv(262144)
            if not data:
                if conn not in idle:
                    raise RuntimeError("connection closed with a request in flight")
                # the server closed an idle kept-alive connection: open another, as a client would
                selector.unregister(conn.sock)
                conn.sock.close()
                idle.remove(conn)
                fresh = _Conn(host, port)
                selector.register(fresh.sock, selectors.EVENT_READ, fresh)
                idle.append(fresh)
                continue
            conn.buffer += data
            if conn.responses():
                latencies.append(time.perf_counter() - conn.sent_at)
                idle.append(conn)
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {"requests": len(latencies), "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": latencies[-1] * 1000}


# -- orchestration ----------------------------------------------------------------------------------


def _worker(args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": PYTHONPATH}
    out = subprocess.run(
        [sys.executable, __file__, "--worker", *args], capture_output=True, text=True, env=env, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"worker failed: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def run(opts: argparse.Namespace) -> dict[str, Any]:
    sys.path[:0] = [str(ROOT / "core"), str(ROOT / "plugins")]
    from kanal_registry_proxy.testing import TestRegistry
    from kanal_registry_proxy.testing.proxy import credentials_file, license_pair

    workdir = Path(tempfile.mkdtemp(prefix="srp-bench-"))
    upstream = TestRegistry(mode="process").start()
    proxy: subprocess.Popen[bytes] | None = None
    try:
        schema = {"type": "record", "name": "Order", "namespace": "bench", "fields": [{"name": "id", "type": "long"}]}
        request = urllib.request.Request(
            upstream.url + "/subjects/orders-value/versions",
            data=json.dumps({"schema": json.dumps(schema)}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        schema_id = json.loads(urllib.request.urlopen(request).read())["id"]
        path = f"/schemas/ids/{schema_id}"
        token, public_key, _ = license_pair()
        credentials = credentials_file(workdir / "basic-auth.json", {USER: PASSWORD}, rounds=opts.bcrypt_rounds)
        port = _free_port()
        env = {
            **os.environ,
            "PYTHONPATH": PYTHONPATH,
            "VENDOR_LICENSE": token,
            "VENDOR_LICENSE_PUBLIC_KEY": public_key,
            "AUTH_PROVIDER": "basic",
            "BASIC_AUTH_LOCATION": str(credentials),
            "AUTHORIZATION_MODE": "read-only",
            "SCHEMA_REGISTRY_URL": upstream.url,
            "SRP_HTTP_PORT": str(port),
            "SRP_BIND_HOST": "127.0.0.1",
            "SRP_LOG_LEVEL": "info",
        }
        log = open(workdir / "proxy.log", "w")  # noqa: SIM115 - closed with the process
        proxy = subprocess.Popen([sys.executable, "-m", "kanal", "registry-proxy"], env=env, stdout=log, stderr=log)
        proxy_url = f"http://127.0.0.1:{port}"
        _wait_http(proxy_url + "/health/ready")
        auth = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        # warm-up: the credential cache and the id-to-subjects cache, and both processes' code paths
        for url in (upstream.url, proxy_url):
            _worker(["throughput", url, path, auth, "4", "1.0"])
        results: dict[str, Any] = {"throughput": {"direct": [], "proxy": []}, "latency": {"direct": [], "proxy": []}}
        for _ in range(opts.repeats):
            for name, url in (("direct", upstream.url), ("proxy", proxy_url)):
                if "throughput" in opts.measure:
                    before = {"proxy": _cpu_seconds(proxy.pid), "upstream": _cpu_seconds(upstream.pid)}
                    measured = _worker(["throughput", url, path, auth, str(opts.connections), str(opts.seconds)])
                    for process, pid in (("proxy", proxy.pid), ("upstream", upstream.pid)):
                        used = _cpu_seconds(pid) - before[process]
                        measured[f"{process}_cpu_us_per_request"] = used / max(1, measured["requests"]) * 1e6
                    measured["loadavg"] = os.getloadavg()[0]
                    results["throughput"][name].append(measured)
                if "latency" in opts.measure:
                    results["latency"][name].append(
                        _worker(["latency", url, path, auth, str(opts.rate), str(opts.seconds), str(opts.connections)])
                    )
        summary: dict[str, Any] = {}
        if "throughput" in opts.measure:
            direct = statistics.median(r["rps"] for r in results["throughput"]["direct"])
            via = statistics.median(r["rps"] for r in results["throughput"]["proxy"])
            summary["throughput"] = {
                "direct_rps": direct,
                "proxy_rps": via,
                "ratio": via / direct,
                # each proxy run divided by the direct run just before it: less sensitive to load that
                # other processes put on the machine for part of the run
                "paired_ratio": statistics.median(
                    p["rps"] / d["rps"]
                    for d, p in zip(results["throughput"]["direct"], results["throughput"]["proxy"], strict=True)
                ),
                "upstream_cpu_us_per_request": statistics.median(
                    r["upstream_cpu_us_per_request"] for r in results["throughput"]["direct"]
                ),
                "proxy_cpu_us_per_request": statistics.median(
                    r["proxy_cpu_us_per_request"] for r in results["throughput"]["proxy"]
                ),
            }
        if "latency" in opts.measure:
            lat: dict[str, float] = {}
            for name in ("direct", "proxy"):
                lat[f"{name}_p50_ms"] = statistics.median(r["p50_ms"] for r in results["latency"][name])
                lat[f"{name}_p99_ms"] = statistics.median(r["p99_ms"] for r in results["latency"][name])
            lat["added_p50_ms"] = lat["proxy_p50_ms"] - lat["direct_p50_ms"]
            lat["added_p99_ms"] = lat["proxy_p99_ms"] - lat["direct_p99_ms"]
            lat["paired_added_p99_ms"] = statistics.median(
                p["p99_ms"] - d["p99_ms"]
                for d, p in zip(results["latency"]["direct"], results["latency"]["proxy"], strict=True)
            )
            summary["latency"] = lat
        return {
            "scenario": "registry-proxy GET /schemas/ids/{id}",
            "settings": vars(opts),
            "summary": summary,
            "raw": results,
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        }
    finally:
        if proxy is not None:
            proxy.terminate()
            try:
                proxy.wait(10)
            except subprocess.TimeoutExpired:
                proxy.kill()
        upstream.stop()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        kind, url, path, auth = argv[1:5]
        if kind == "throughput":
            result = worker_throughput(url, path, auth, int(argv[5]), float(argv[6]))
        else:
            result = worker_latency(url, path, auth, float(argv[5]), float(argv[6]), int(argv[7]))
        print(json.dumps(result))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each measurement")
    parser.add_argument("--connections", type=int, default=8, help="kept-alive connections of the load generator")
    parser.add_argument("--rate", type=float, default=500.0, help="requests/s of the latency measurement")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per path (alternating)")
    parser.add_argument("--bcrypt-rounds", type=int, default=12, help="cost of the bench user's hash")
    parser.add_argument("--measure", nargs="+", default=["throughput", "latency"], choices=["throughput", "latency"])
    parser.add_argument("--json", help="write every number to this file")
    opts = parser.parse_args(argv)
    result = run(opts)
    summary = result["summary"]
    if "throughput" in summary:
        t = summary["throughput"]
        print(
            f"throughput  direct {t['direct_rps']:.0f} req/s  proxy {t['proxy_rps']:.0f} req/s  ratio {t['ratio']:.2f}"
            f" (paired {t['paired_ratio']:.2f})"
            f"  (CPU per request: registry {t['upstream_cpu_us_per_request']:.0f} us,"
            f" proxy {t['proxy_cpu_us_per_request']:.0f} us)"
        )
    if "latency" in summary:
        lat = summary["latency"]
        print(
            f"latency at {opts.rate:.0f} req/s"
            f"  direct p50 {lat['direct_p50_ms']:.2f} ms p99 {lat['direct_p99_ms']:.2f} ms"
            f"  proxy p50 {lat['proxy_p50_ms']:.2f} ms p99 {lat['proxy_p99_ms']:.2f} ms"
            f"  added p50 {lat['added_p50_ms']:.2f} ms p99 {lat['added_p99_ms']:.2f} ms"
            f" (paired {lat['paired_added_p99_ms']:.2f} ms)"
        )
    print(json.dumps(result["raw"]))
    if opts.json:
        Path(opts.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
