"""Records ``virtual-cluster.jsonl``: clients of virtual cluster ``team-a.`` through ``kanal capture``.

Run from the repository root (needs the Tansu binary of ``kanal[dev]`` and the test clients)::

    .venv/bin/python conformance/cases/virtual-cluster/record.py

It starts a Tansu broker, then ``kanal capture`` in front of it with the ``env:`` of
``virtual-cluster.case.yaml`` (so the recording and the replay run the same gateway settings), applies
the case's ``resources:`` through the admin API (``kanal apply -f``), mints a gateway token for the
service account through ``POST /gateway/v2/token`` with the longest lifetime the admin API allows, and
runs the clients below. Ctrl-C of the capture (SIGINT) flushes the file, which replaces the case's
capture. Both sides of every connection are recorded, so the replay checks the renaming both ways.

The scenario, all with logical names (the cluster stores them under ``team-a.``):

- confluent-kafka (librdkafka): CreateTopics ``orders``; a producer writes three keyed records; a
  transactional producer (``orders-tx``) writes two in a committed transaction; a consumer of group
  ``billing`` reads all of them (read_committed) and commits synchronously;
- kafka-python: a producer writes one record; a consumer of group ``audit`` reads all and commits.
"""

from __future__ import annotations

import base64
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kafka import KafkaConsumer, KafkaProducer

from kanal.admin.identity import MAX_LIFETIME_SECONDS
from kanal.embedded.tansu import ProcessOutput, TansuBroker, spawn, terminate

HERE = Path(__file__).resolve().parent
CASE = HERE / "virtual-cluster.case.yaml"
CAPTURE = HERE / "virtual-cluster.jsonl"
KANAL = Path(sys.executable).with_name("kanal")
ADMIN_USER, ADMIN_PASSWORD = "admin", "conformance"
ACCOUNT, VCLUSTER = "orders-app", "team-a."
TOPIC = "orders"
TIMEOUT = 60.0


def _wait_for(what: str, ready: Any, timeout: float = TIMEOUT) -> None:
    """Polls ``ready()`` until it is true; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise SystemExit(f"record: {what} did not happen within {timeout:.0f} s")
        time.sleep(0.2)


def _admin(base: str, method: str, path: str, body: Any = None) -> Any:
    """One admin API call (HTTP Basic as the admin user); the JSON answer."""
    request = urllib.request.Request(
        base + path,
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    credentials = base64.b64encode(f"{ADMIN_USER}:{ADMIN_PASSWORD}".encode()).decode()
    request.add_header("Authorization", f"Basic {credentials}")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


def _ready(base: str) -> bool:
    """Whether the admin API answers READY (the listeners are up and the resources loaded)."""
    try:
        with urllib.request.urlopen(base + "/health/ready", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _run_clients(bootstrap: str, token: str) -> None:
    """The scenario of the module docstring; every client logs in as the service account."""
    rd: dict[str, str | int | float | bool] = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": ACCOUNT,
        "sasl.password": token,
    }
    admin = AdminClient(rd)
    for future in admin.create_topics([NewTopic(TOPIC, 1)], request_timeout=15).values():
        future.result()
    del admin  # (no close(): destroyed, its connections closed)
    gc.collect()

    producer = Producer({**rd, "linger.ms": 0})
    for i in range(3):
        producer.produce(TOPIC, key=f"k{i}".encode(), value=f"order {i}".encode())
    assert producer.flush(15) == 0
    producer.close()

    tx = Producer({**rd, "transactional.id": "orders-tx", "message.timeout.ms": 15000})
    tx.init_transactions(15)
    tx.begin_transaction()
    for i in range(3, 5):
        tx.produce(TOPIC, key=f"k{i}".encode(), value=f"order {i}".encode())
    tx.commit_transaction(15)
    tx.close()

    consumer = Consumer(
        {
            **rd,
            "group.id": "billing",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    consumer.subscribe([TOPIC])
    values: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    while len(values) < 5 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        value = None if message is None or message.error() is not None else message.value()
        if value is not None:
            values.append(value)
    consumer.commit(asynchronous=False)
    consumer.close()
    assert len(values) == 5, values

    kp: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": ACCOUNT,
        "sasl_plain_password": token,
    }
    kafka_producer = KafkaProducer(**kp)
    kafka_producer.send(TOPIC, key=b"k5", value=b"order 5").get(timeout=15)
    kafka_producer.close()
    kafka_consumer = KafkaConsumer(
        TOPIC,
        group_id="audit",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        session_timeout_ms=6000,
        heartbeat_interval_ms=500,
        **kp,
    )
    seen: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT
    while len(seen) < 6 and time.monotonic() < deadline:
        for records in kafka_consumer.poll(timeout_ms=500).values():
            seen.extend(record.value for record in records)
    kafka_consumer.commit()
    kafka_consumer.close()
    assert len(seen) == 6, seen


def main() -> int:
    """Records the capture; see the module docstring."""
    case = yaml.safe_load(CASE.read_text())
    with TansuBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        settings = broker.gateway_settings(port_count=1)
        env = {
            **os.environ,
            **{str(k): str(v) for k, v in (case.get("env") or {}).items()},
            **settings,
            "GATEWAY_FEATURE_FLAGS_AUDIT": "false",  # as in the replay: no audit topic traffic
            "GATEWAY_ADMIN_API_USERS": json.dumps(
                [{"username": ADMIN_USER, "password": ADMIN_PASSWORD, "admin": True}]
            ),
        }
        output = Path(tmp) / "capture.jsonl"
        argv = [str(KANAL), "capture", "--output", str(output)]
        print("record:", " ".join(f"{k}={v}" for k, v in settings.items()), *argv, flush=True)
        capture = spawn(argv, env=env)
        log = ProcessOutput(capture.stdout, name="kanal-capture")  # type: ignore[arg-type]
        try:
            base = f"http://127.0.0.1:{settings['GATEWAY_HTTP_PORT']}"
            _wait_for("the gateway's admin API READY", lambda: _ready(base) or capture.poll() is not None)
            if capture.poll() is not None:
                raise SystemExit(f"record: kanal capture exited:\n{log.text()}")
            manifests = Path(tmp) / "resources.yaml"
            manifests.write_text(yaml.safe_dump_all(case.get("resources") or [], sort_keys=False))
            apply = [str(KANAL), "apply", "-f", str(manifests), "--url", base, "--user", ADMIN_USER]
            subprocess.run([*apply, "--password", ADMIN_PASSWORD], check=True)
            token = _admin(
                base,
                "POST",
                "/gateway/v2/token",
                {"username": ACCOUNT, "vCluster": VCLUSTER, "lifeTimeSeconds": MAX_LIFETIME_SECONDS},
            )["token"]
            _run_clients(f"127.0.0.1:{settings['GATEWAY_PORT_START']}", token)
            time.sleep(1)  # the last responses reach the tap
        finally:
            capture.send_signal(signal.SIGINT)  # drains, flushes the file
            try:
                capture.wait(30)
            except subprocess.TimeoutExpired:
                terminate(capture, 5)
            log.close()
            print(log.text(), flush=True)
        if capture.returncode != 0:
            raise SystemExit(f"record: kanal capture exited with {capture.returncode}")
        CAPTURE.write_bytes(output.read_bytes())
    frames = CAPTURE.read_text().count("\n")
    print(f"record: {frames} frames written to {CAPTURE.relative_to(Path.cwd())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
