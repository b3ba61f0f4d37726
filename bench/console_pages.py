"""How long the console's pages take to render, with many resources and a large topic.

    python bench/console_pages.py [--records 1000000] [--policies 1000] [--requests 20]

Starts one Tansu broker and one gateway (with the first-party plugins), stores ``--policies``
data-quality policies (over three rules) and a topic view through the admin API, produces
``--records`` 200-byte JSON records to a six-partition topic, logs in to the console, then requests
each page ``--requests`` times (after two warm-up requests) and prints, per page, the median, the
95th percentile and the maximum time from request to full response, measured by the client on the
loopback interface (an upper bound of the server's time: the client's share is a few hundred
microseconds). Pages that do not exist in this build (a plugin not installed) are skipped, said so.
The target (issue 20) is 300 ms per page.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kanal.embedded import GatewayProcess, TansuBroker

USERS = '[{"username": "bench", "password": "bench-pw", "admin": true}]'
TARGET_MS = 300.0


def produce(broker: TansuBroker, topic: str, records: int) -> int:
    """Produces the records; returns the time (ms) at which the second half started."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(30)
    producer = Producer(
        {"bootstrap.servers": broker.bootstrap, "linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4"}
    )
    pad = "x" * 120
    middle = 0
    for i in range(records):
        if i == records // 2:
            assert producer.flush(120) == 0
            middle = int(time.time() * 1000) + 1
        value = f'{{"id": {i}, "amount": {i % 1000}, "currency": "EUR", "pad": "{pad}"}}'
        while True:
            try:
                producer.produce(topic, value.encode(), key=str(i).encode())
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10000 == 0:
            producer.poll(0)
    assert producer.flush(120) == 0
    return middle


def resources(http: httpx.Client, topic: str, policies: int) -> None:
    rules = [
        ("positive-amount", {"type": "Cel", "displayName": "Positive", "celExpression": "value.amount >= 0"}),
        ("has-currency", {"type": "Cel", "displayName": "Currency", "celExpression": "has(value.currency)"}),
        ("small-id", {"type": "Cel", "displayName": "Small id", "celExpression": "value.id < 10000000"}),
    ]
    for name, spec in rules:
        body = {"apiVersion": "v1", "kind": "DataQualityRule", "metadata": {"name": name}, "spec": spec}
        answer = http.put("/gateway/v2/data-quality-rule", json=body)
        assert answer.status_code == 200, answer.text

    def store(i: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "DataQualityPolicy",
            "metadata": {"name": f"policy-{i:04d}", "group": f"team-{i % 10}"},
            "spec": {
                "displayName": f"Policy {i}",
                "rules": [r for r, _ in rules],
                "targets": [{"cluster": "gateway", "topic": f"bench-topic-{i}", "patternType": "LITERAL"}],
                "actions": {"block": {"enabled": False}, "mark": {"enabled": False}},
            },
        }
        answer = http.put("/gateway/v2/data-quality-policy", json=body)
        assert answer.status_code == 200, answer.text

    with ThreadPoolExecutor(16) as pool:  # (each PUT waits for its write to the state topic)
        list(pool.map(store, range(policies)))
    view = {
        "apiVersion": "gateway/v2",
        "kind": "TopicView",
        "metadata": {"name": "bench_view"},
        "spec": {
            "transformation": {"type": "sql", "statement": f"SELECT id, amount FROM {topic} WHERE amount > 500"},
            "onError": {"type": "DROP"},
        },
    }
    answer = http.put("/gateway/v2/topic-view", json=view)
    assert answer.status_code == 200, answer.text


def login(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, follow_redirects=False, timeout=60)
    page = client.get("/console/login").text
    token = re.search(r'name="csrf" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]
    answer = client.post("/console/login", data={"csrf": token, "username": "bench", "password": "bench-pw"})
    assert answer.status_code == 303, answer.text
    return client


def measure(client: httpx.Client, path: str, requests: int) -> list[float] | None:
    for _ in range(2):
        answer = client.get(path)
        if answer.status_code == 404:
            return None
        assert answer.status_code == 200, f"{path}: {answer.status_code} {answer.text[:300]}"
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        answer = client.get(path)
        times.append((time.perf_counter() - started) * 1000)
        assert answer.status_code == 200, path
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--policies", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="kanal-console-bench-"))
    broker = TansuBroker(log_path=logs / "tansu.log")
    broker.start(timeout=30)
    topic = f"bench_orders_{uuid.uuid4().hex[:6]}"
    try:
        env = {**broker.gateway_settings(), "GATEWAY_ADMIN_API_USERS": USERS}
        gateway = GatewayProcess(env, log_path=logs / "gateway.log")
        gateway.start(timeout=30)
        try:
            base = f"http://127.0.0.1:{env['GATEWAY_HTTP_PORT']}"
            started = time.monotonic()
            with httpx.Client(base_url=base, auth=("bench", "bench-pw"), timeout=60) as http:
                resources(http, topic, args.policies)
            print(f"stored {args.policies} policies in {time.monotonic() - started:.1f} s", flush=True)
            started = time.monotonic()
            halfway = produce(broker, topic, args.records)
            print(f"produced {args.records:,} records in {time.monotonic() - started:.1f} s", flush=True)
            client = login(base)
            middle = args.records // 12  # an offset inside partition 0
            pages = [
                "/console/gateway",
                "/console/interceptors",
                "/console/topics",
                f"/console/topics/{topic}",
                f"/console/topics/{topic}?count=500",
                f"/console/topics/{topic}?partition=0&mode=offset&offset={middle}&count=100",
                f"/console/topics/{topic}?mode=time&time={halfway}&count=100",
                "/console/topic-views",
                "/console/topic-views/edit?name=bench_view",
                "/console/data-quality/policies",
                "/console/data-quality/rules",
                "/console/data-quality/policies/policy-0500",
                "/console/data-quality/backtests",
                "/console/traffic",
                "/console/service-accounts",
                "/console/groups",
                "/console/virtual-clusters",
                "/console/audit",
            ]
            print(f"{'page':<72} {'median':>9} {'p95':>9} {'max':>9}  (ms; target {TARGET_MS:.0f})")
            worst = 0.0
            for path in pages:
                times = measure(client, path, args.requests)
                shown = path.replace(topic, "<topic>").replace(str(halfway), "<halfway>")
                if times is None:
                    print(f"{shown:<72} {'(not in this build)':>29}")
                    continue
                times.sort()
                p95 = times[min(len(times) - 1, int(len(times) * 0.95))]
                worst = max(worst, statistics.median(times))
                print(f"{shown:<72} {statistics.median(times):9.1f} {p95:9.1f} {times[-1]:9.1f}")
            print(f"slowest median: {worst:.1f} ms ({'met' if worst <= TARGET_MS else 'NOT met'})")
        finally:
            gateway.stop()
    finally:
        broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
