"""The traffic-control pages of the safeguards plugin: the interceptors by what they do, a byte-rate
limit with this node's share (a fleet of one: the whole limit) and its counted bytes growing live
in the browser as a client produces through the gateway, a request limit, the chargeback counts by
client id, a read-only user reading the pages, and a script in an interceptor's config shown as
text; and, as plain data, secrets kept out of the config shown, the chargeback sums and the rates."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from conftest import ADMIN, VIEWER, Browser, ConsoleNode
from kanal_safeguards.console.traffic import TrafficHistory, config_summary
from kanal_safeguards.console.usage import usage_rows

from kanal.embedded import TansuBroker

LIMIT = 200_000  # bytes per second
PAYLOAD = "<b>x</b>|<script>document.title='owned'</script>"
CLIENT_ID = "traffic-console-test"


def put(node: ConsoleNode, name: str, plugin: str, config: dict[str, object], priority: int = 10) -> None:
    manifest = {
        "apiVersion": "gateway/v2",
        "kind": "Interceptor",
        "metadata": {"name": name},
        "spec": {"pluginClass": plugin, "priority": priority, "config": config},
    }
    answer = httpx.put(f"{node.base}/gateway/v2/interceptor", json=manifest, auth=ADMIN, timeout=10)
    assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def topic(tansu: TansuBroker, console_node: ConsoleNode) -> Iterator[str]:
    """A topic, and the interceptors of the tests: a produce quota and a produce policy on it, a
    fetch quota whose topic regex carries a script, a commit limit, chargeback."""
    name = f"traffic-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(15)
    put(console_node, "produce-quota", "producer-rate-limiting", {"maximumBytesPerSecond": LIMIT, "topic": name})
    put(console_node, "produce-rules", "produce-policy", {"topic": name, "acks": {"value": -1, "action": "BLOCK"}})
    put(console_node, "fetch-quota", "consumer-rate-limiting", {"maximumBytesPerSecond": 10**6, "topic": PAYLOAD})
    put(console_node, "commit-limit", "limit-commit-offset", {"maximumCommitsPerMinute": 100, "groupId": "t-.*"})
    put(console_node, "usage", "chargeback", {"topicName": f"_usage_{name}"}, priority=1)
    yield name


def produce(node: ConsoleNode, topic: str, count: int) -> None:
    """``count`` records of 1000 bytes through the gateway (acks=all, as the policy wants)."""
    producer = Producer(
        {"bootstrap.servers": node.process.bootstrap, "client.id": CLIENT_ID, "acks": "all", "linger.ms": 5}
    )
    for n in range(count):
        producer.produce(topic, b"v" * 1000, key=str(n))
        producer.poll(0)
    assert producer.flush(30) == 0


def counted(browser: Browser) -> int:
    """The bytes the produce quota's row says were counted (the live region is re-read each time)."""
    text = browser.find('tr[data-interceptor="produce-quota"] .counted .total').text
    return int(re.sub(r"\D", "", text.split(" bytes")[0]))


@pytest.mark.integration
def test_a_limit_shows_its_share_and_its_bytes_growing_live(
    browser: Browser, console_node: ConsoleNode, topic: str
) -> None:
    browser.log_in(ADMIN)
    browser.open("/console/traffic")
    assert browser.find("h1").text == "Traffic control"
    assert browser.find("nav a[aria-current=page]").text == "Traffic control"
    row = browser.find('tr[data-interceptor="produce-quota"]')
    assert row.find_element("css selector", ".limit").text == "200,000 bytes per second"
    share = row.find_element("css selector", ".share").text
    assert share == "200,000 bytes per second (the whole limit: this node is alone)"
    link = row.find_element("css selector", "a").get_attribute("href")
    assert link.endswith("/gateway/v2/interceptor/produce-quota")
    before = counted(browser)
    produce(console_node, topic, 300)  # 300 KB: over the burst, so held a little
    region = browser.find("#limits")
    browser.wait(lambda: counted(browser) >= before + 300_000, 20, "the counted bytes grow in the live region")
    assert region.get_attribute("data-refreshed")  # refreshed in place, not reloaded
    browser.wait(lambda: "lately" in browser.find('tr[data-interceptor="produce-quota"] .counted').text, 10)
    points = "figure.producer-rate-limiting svg.chart circle.point"
    browser.wait(lambda: len(browser.all(points)) >= 6, 30, "the rate chart drawn, a point every 2 s")
    # the request limit, the policy and chargeback in their groups
    commit = browser.find('tr[data-interceptor="commit-limit"]').text
    assert "100 offset commits per minute per group" in commit and "0 in the last 60 s" in commit
    policies = browser.find("#area-policies").find_element("xpath", "following-sibling::table[1]").text
    assert "produce-rules" in policies and "produce-policy" in policies and "everyone" in policies
    assert "Chargeback usage" in browser.find("main").text
    # a script in a config string is text
    fetch = browser.find('tr[data-interceptor="fetch-quota"]')
    assert PAYLOAD in fetch.text and not fetch.find_elements("css selector", "script, b")
    assert browser.driver.title != "owned"
    browser.screenshot("traffic")
    assert browser.errors() == []


@pytest.mark.integration
def test_chargeback_counts_by_client_id(browser: Browser, console_node: ConsoleNode, topic: str) -> None:
    produce(console_node, topic, 20)
    browser.open("/console/traffic/usage?by=client")
    assert browser.find("h1").text == "Chargeback usage"
    cells = [td.text for td in browser.all("table.usage tbody tr td")]
    assert CLIENT_ID in cells
    row = cells[cells.index(CLIENT_ID) :]
    assert int(row[1].replace(",", "")) >= 320_000  # the two tests' records, and their framing
    browser.open("/console/traffic/usage")  # by principal, topic and client id
    first = browser.find("table.usage tbody tr").text
    assert "anonymous" in first and topic in first and CLIENT_ID in first
    browser.find("table.usage th a[href*='sort=requests']").click()
    browser.wait(lambda: "sort=requests" in browser.driver.current_url, what="sorted by requests")
    assert browser.find("table.usage th[aria-sort=descending]").text.startswith("Requests")
    assert browser.all("figure.usage-chart svg.chart rect.bar")
    assert int(browser.find("dd.bytes-in").text.split(" ")[0].replace(",", "")) >= 320_000
    browser.screenshot("traffic-usage")
    assert browser.errors() == []


@pytest.mark.integration
def test_a_read_only_user_reads_the_pages(console_node: ConsoleNode, topic: str) -> None:
    viewer = console_node.session(VIEWER)
    page = viewer.get("/console/traffic")
    assert page.status_code == 200
    assert "produce-quota" in page.text and "200,000 bytes per second" in page.text
    assert "&lt;script&gt;document.title=&#39;owned&#39;&lt;/script&gt;" in page.text
    assert "<script>document.title" not in page.text
    assert viewer.get("/console/traffic/live").status_code == 200
    usage = viewer.get("/console/traffic/usage?by=principal&sort=out&page=9")
    assert usage.status_code == 200 and "anonymous" in usage.text


def test_secrets_of_a_config_are_never_shown() -> None:
    config = {"bucket": "claims", "s3Config": {"accessKey": "AK", "secretKey": "SK", "region": "eu"}, "password": "p"}
    shown = dict(config_summary(config))
    assert shown["password"] == "(hidden)" and "SK" not in shown["s3Config"] and '"region": "eu"' in shown["s3Config"]


def test_usage_sums_by_what_is_asked_and_sorts() -> None:
    counts = {
        ("in", "alice", "passthrough", "orders", "app-1"): (5_000, 5),
        ("out", "alice", "passthrough", "orders", "app-2"): (9_000, 3),
        ("in", "bob", "passthrough", "payments", "app-1"): (7_000, 9),
    }
    by_principal = [(r.principal, r.bytes_in, r.bytes_out) for r in usage_rows(counts, "principal")]
    assert by_principal == [("alice", 5_000, 9_000), ("bob", 7_000, 0)]
    assert [r.client_id for r in usage_rows(counts, "client", "requests")] == ["app-1", "app-2"]
    assert [r.topic for r in usage_rows(counts, "owner", "in", "PAY")] == ["payments"]


def test_the_rates_come_from_consecutive_samples() -> None:
    now = [100.0]
    counts = {"producer-rate-limiting": 0.0}
    history = TrafficHistory(lambda: counts, clock=lambda: now[0])
    for total in (0.0, 20_000.0, 60_000.0):
        counts["producer-rate-limiting"] = total
        history.sample()
        now[0] += 2.0
    assert history.rates("producer-rate-limiting")[0] == [10_000.0, 20_000.0]
    now[0] = 112.0  # 12 s after the first sample: the rate since it
    assert history.recent({"producer-rate-limiting": 120_000.0}) == {"producer-rate-limiting": 10_000.0}
