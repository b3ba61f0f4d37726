"""TopicView resources through the admin API and the CLI of a real gateway process (``python -m kanal
run``), in front of a real broker: CRUD and 400s over HTTP, ``dryMode``, ``kanal apply -f``, and a view
(with its topic id and a ``<view>::`` group's offsets) surviving a gateway restart.

The plugin is found through its ``kanal.plugins`` entry point (``topic-views``); when the package is
not installed with it, a ``.dist-info`` declaring it is put on the gateway's PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kanal_topicviews.views import view_topic_id
from wire import WireClient, metadata_request

from kanal.cli import main as kanal_main
from kanal.embedded import GatewayProcess, TansuBroker
from kanal.embedded.admin_http import AdminHttp as Http

pytestmark = pytest.mark.integration

USERS = "[{username: admin, password: secret, admin: true}]"


def manifest(name: str, statement: str, on_error: str = "DROP") -> dict[str, Any]:
    return {
        "apiVersion": "gateway/v2",
        "kind": "TopicView",
        "metadata": {"name": name},
        "spec": {"transformation": {"type": "sql", "statement": statement}, "onError": {"type": on_error}},
    }


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    if any(ep.name == "topic-views" for ep in entry_points(group="kanal.plugins")):
        return ""
    root = tmp_path_factory.mktemp("topic-views-entry-point")
    info = root / "kanal_topicviews_entry-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kanal-topicviews-entry\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[kanal.plugins]\ntopic-views = kanal_topicviews.plugin\n")
    plugins = Path(__file__).resolve().parents[2] / "plugins"
    return f"{root}:{plugins}"


@pytest.fixture(scope="module")
def env(tansu: TansuBroker, plugin_path: str) -> dict[str, str]:
    values = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": f"views-{uuid.uuid4().hex[:8]}",
    }
    if plugin_path:
        values["PYTHONPATH"] = plugin_path
    return values


@contextlib.contextmanager
def running(env: dict[str, str], log: Path) -> Iterator[tuple[GatewayProcess, Http]]:
    process = GatewayProcess(env, log_path=log).start(timeout=30)
    try:
        yield process, Http(env["GATEWAY_HTTP_PORT"])
    finally:
        code = process.stop(timeout=15)
        assert code == 0, f"gateway exited with {code}:\n{process.tail()}"


@pytest.fixture(scope="module")
def topic(tansu: TansuBroker) -> str:
    name = f"payments-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(15)
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    for i in range(40):
        producer.produce(name, json.dumps({"id": i, "amount": i * 10, "country": "FR" if i % 2 else "DE"}).encode())
    assert producer.flush(15) == 0
    return name


def consume(bootstrap: str, topic: str, count: int, group: str | None = None) -> list[tuple[int, bytes]]:
    """From the group's committed offset (or the beginning), ``count`` records; commits when grouped."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group or "unused", "enable.auto.commit": False})
    try:
        start = OFFSET_BEGINNING
        if group is not None:
            (committed,) = consumer.committed([TopicPartition(topic, 0)], timeout=10)
            start = committed.offset if committed.offset >= 0 else OFFSET_BEGINNING
        consumer.assign([TopicPartition(topic, 0, start)])
        out: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 15
        while len(out) < count and time.monotonic() < deadline:
            for msg in consumer.consume(count - len(out), 0.5):
                assert msg.error() is None, msg.error()
                out.append((msg.offset(), msg.value()))
        if group is not None and out:
            consumer.commit(offsets=[TopicPartition(topic, 0, out[-1][0] + 1)], asynchronous=False)
        return out
    finally:
        consumer.close()


def topic_id_seen(bootstrap: str, name: str) -> uuid.UUID:
    client = WireClient(bootstrap)
    try:
        (entry,) = client.call(metadata_request([name])).topics
        assert entry.error_code == 0, entry
        return uuid.UUID(str(entry.topic_id))
    finally:
        client.close()


def test_crud_dry_mode_and_400s_over_http(
    env: dict[str, str], topic: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    log = tmp_path_factory.mktemp("views-admin") / "gateway.log"
    view = f"big-{uuid.uuid4().hex[:6]}"
    body = manifest(view, f"SELECT id, amount FROM \"{topic}\" WHERE amount >= 300 AND country = 'FR'")
    with running(env, log) as (gateway, http):
        status, answer = http.call("PUT", "/gateway/v2/topic-view?dryMode=true", body)
        assert (status, answer["upsertResult"]) == (200, "CREATED")
        assert http.call("GET", f"/gateway/v2/topic-view/{view}")[0] == 404

        status, answer = http.call("PUT", "/gateway/v2/topic-view", body)
        assert (status, answer["upsertResult"], answer["resource"]["status"]) == (200, "CREATED", {"status": "Ready"})
        assert http.call("PUT", "/gateway/v2/topic-view", body)[1]["upsertResult"] == "NOT_CHANGED"
        status, listed = http.call("GET", "/gateway/v2/topic-view")
        assert status == 200 and [m["metadata"]["name"] for m in listed] == [view]
        assert consume(gateway.bootstrap, view, 5) == [
            (i, json.dumps({"id": i, "amount": i * 10}, separators=(",", ":")).encode()) for i in range(31, 40, 2)
        ]

        for statement, construct in (
            (f'SELECT a FROM "{topic}" JOIN other ON x = y', "JOIN"),
            (f'SELECT COUNT(*) AS n FROM "{topic}"', "COUNT"),
            (f'SELECT a FROM "{topic}" ORDER BY a', "ORDER BY"),
            ("DELETE FROM x", "DELETE"),
        ):
            status, error = http.call("PUT", "/gateway/v2/topic-view", manifest("bad", statement))
            assert status == 400 and construct in error["msg"], (statement, error)
            assert set(error) == {"title", "msg", "cause"}
        status, error = http.call("PUT", "/gateway/v2/topic-view", manifest("bad", f'SELECT * FROM "{topic}"', "SKIP"))
        assert status == 400 and "onError" in error["msg"]
        status, error = http.call("PUT", "/gateway/v2/topic-view", manifest("bad", f'SELECT * FROM "{view}"'))
        assert status == 400 and "is a topic view" in error["msg"]

        assert http.call("DELETE", f"/gateway/v2/topic-view/{view}", {})[0] == 204
        client = WireClient(gateway.bootstrap)
        try:
            (entry,) = client.call(metadata_request([view])).topics
            assert entry.error_code != 0  # gone: an unknown topic again
        finally:
            client.close()


def test_kanal_apply_and_a_view_survives_a_restart(
    env: dict[str, str], topic: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    view = f"fr-{uuid.uuid4().hex[:6]}"
    group = f"{view}::billing"
    (tmp_path / "view.yaml").write_text(
        textwrap.dedent(
            f"""\
            apiVersion: gateway/v2
            kind: TopicView
            metadata:
              name: {view}
            spec:
              transformation:
                type: sql
                statement: SELECT id FROM "{topic}" WHERE country = 'FR'
              onError:
                type: FAIL_FETCH
            """
        )
    )
    logs = tmp_path_factory.mktemp("views-restart")
    expected_id = view_topic_id(env["GATEWAY_CLUSTER_ID"], view)
    with running(env, logs / "first.log") as (gateway, http):
        out, err = io.StringIO(), io.StringIO()
        url = ["--url", http.base, "--user", "admin", "--password", "secret"]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = kanal_main(["apply", "-f", str(tmp_path / "view.yaml"), *url])
        assert code == 0 and f"TopicView/{view}: CREATED [Ready]" in out.getvalue(), (out.getvalue(), err.getvalue())
        assert topic_id_seen(gateway.bootstrap, view) == expected_id
        first = consume(gateway.bootstrap, view, 5, group)
        assert [o for o, _ in first] == [1, 3, 5, 7, 9]
    with running(env, logs / "second.log") as (gateway, http):
        status, stored = http.call("GET", f"/gateway/v2/topic-view/{view}")
        assert status == 200 and stored["status"] == {"status": "Ready"}
        assert topic_id_seen(gateway.bootstrap, view) == expected_id
        second = consume(gateway.bootstrap, view, 5, group)  # resumes after the committed offset
        assert second == [(o, json.dumps({"id": o}, separators=(",", ":")).encode()) for o in (11, 13, 15, 17, 19)]
