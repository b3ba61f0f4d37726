"""End to end: the installed plugin in a real gateway, topics created by real admin clients.

Given a Tansu broker and ``python -m kanal run --config kanal.yaml`` in front of it, with one
topic-quota interceptor per client library (each with its own prefix, limit 3), when
confluent-kafka's AdminClient and kafka-python's KafkaAdminClient create topics through the
gateway, then below the limit the topics are created (as the broker itself shows), past it the
client gets POLICY_VIOLATION with the interceptor's message and the broker has no such topic,
topics with other prefixes are created without limit, and ``/metrics`` counts the created ones.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kanal.embedded import GatewayProcess, TansuBroker, gateway_env
from topic_quota_helpers import CREATED, running_gateway, scrape, write_config

pytestmark = pytest.mark.integration

LIMIT = 3
TIMEOUT = 20.0
POLICY_VIOLATION = 44
RUN = uuid.uuid4().hex[:8]  # the broker lives for the whole session: names of this run only
CLIENTS = ["confluent", "kafka-python"]


def prefix_of(client: str) -> str:
    return f"quota-{RUN}-{client}."


INTERCEPTORS: list[dict[str, Any]] = [
    {
        "name": f"quota-{client}",
        "plugin": "topic-quota",
        "priority": 100,
        "config": {"maxTopics": LIMIT, "prefix": prefix_of(client)},
    }
    for client in CLIENTS
]


@dataclass(frozen=True)
class Gateway:
    process: GatewayProcess
    http_port: str


@pytest.fixture(scope="module")
def gateway(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    directory = tmp_path_factory.mktemp("kanal")
    settings = tansu.gateway_settings()
    with running_gateway(settings, write_config(directory, INTERCEPTORS), directory) as process:
        yield Gateway(process, settings["GATEWAY_HTTP_PORT"])


# -------------------------------------------------------------------------------- clients

# Each returns, per topic asked for, None when it was created, else (error code, error message).
Outcome = dict[str, tuple[int, str] | None]


def create_confluent(bootstrap: str, names: list[str]) -> Outcome:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1) for name in names])
    outcome: Outcome = {}
    for name, future in futures.items():
        try:
            future.result(TIMEOUT)
            outcome[name] = None
        except KafkaException as exc:
            error = exc.args[0]
            outcome[name] = (error.code(), error.str())
    return outcome


def create_kafka_python(bootstrap: str, names: list[str]) -> Outcome:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(TIMEOUT * 1000))
    try:
        result = admin.create_topics(
            {name: {"num_partitions": 1, "replication_factor": 1} for name in names}, raise_errors=False
        )
    finally:
        admin.close()
    return {
        t["name"]: None if t["error_code"] == 0 else (t["error_code"], t["error_message"]) for t in result["topics"]
    }


CREATE = {"confluent": create_confluent, "kafka-python": create_kafka_python}


def broker_topics(broker: TansuBroker) -> set[str]:
    """The topics the broker itself lists (not through the gateway)."""
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=TIMEOUT)
    return set(metadata.topics)


def refusal(prefix: str, existing: int, new: int) -> tuple[int, str]:
    return (
        POLICY_VIOLATION,
        f"topic quota exceeded for topics starting with {prefix!r}: {existing} exist, this request would create "
        f"{new} more, the limit is {LIMIT}",
    )


# -------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("client", CLIENTS)
def test_topics_are_created_up_to_the_limit_and_refused_past_it(
    client: str, tansu: TansuBroker, gateway: Gateway
) -> None:
    create, prefix = CREATE[client], prefix_of(client)
    bootstrap = gateway.process.bootstrap

    first = [f"{prefix}1", f"{prefix}2"]
    assert create(bootstrap, first) == dict.fromkeys(first)
    assert set(first) <= broker_topics(tansu)

    too_many = [f"{prefix}3", f"{prefix}4"]
    assert create(bootstrap, too_many) == dict.fromkeys(too_many, refusal(prefix, 2, 2))
    assert not set(too_many) & broker_topics(tansu)

    assert create(bootstrap, [f"{prefix}3"]) == {f"{prefix}3": None}  # exactly at the limit
    assert f"{prefix}3" in broker_topics(tansu)

    assert create(bootstrap, [f"{prefix}4"]) == {f"{prefix}4": refusal(prefix, 3, 1)}
    assert f"{prefix}4" not in broker_topics(tansu)
    assert sorted(t for t in broker_topics(tansu) if t.startswith(prefix)) == [f"{prefix}{i}" for i in (1, 2, 3)]

    metrics = scrape(gateway.http_port)
    assert f'{CREATED}{{prefix="{prefix}"}} 3.0' in metrics, metrics


@pytest.mark.parametrize("client", CLIENTS)
def test_other_prefixes_are_untouched(client: str, tansu: TansuBroker, gateway: Gateway) -> None:
    names = [f"free-{RUN}-{client}-{i}" for i in range(LIMIT + 2)]
    assert CREATE[client](gateway.process.bootstrap, names) == dict.fromkeys(names)
    assert set(names) <= broker_topics(tansu)


def test_bad_config_stops_the_gateway_with_the_interceptor_and_key(tansu: TansuBroker, tmp_path: Path) -> None:
    config = write_config(tmp_path, [{"name": "quota", "plugin": "topic-quota", "config": {"maxTopics": -1}}])
    proc = subprocess.run(
        [sys.executable, "-m", "kanal", "run", "--config", str(config)],
        env=gateway_env(tansu.gateway_settings()),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.getcwd(),
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "interceptor 'quota' (topic-quota): maxTopics: Expected `int` >= 0" in proc.stderr, proc.stderr
