"""The topic pages: the cluster's topics (filtered), one topic's records — the latest N newest first,
from an offset, from a time, one partition or all — with JSON, text and binary values shown, a
plugin's decoder and column (the guide's notes example), every value escaped, and in a browser."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import ADMIN, Browser, ConsoleNode

from kanal.embedded import TansuBroker

pytestmark = pytest.mark.integration


def rows(html: str) -> list[str]:
    """The record rows of a topic page."""
    body = html.split('<table class="records">', 1)[1].split("</table>", 1)[0]
    return [r for r in re.findall(r"<tr>(.*?)</tr>", body, re.DOTALL) if "<td" in r]


def offsets(html: str) -> list[tuple[int, int]]:
    """(partition, offset) of each row, in page order."""
    return [tuple(int(x) for x in re.findall(r'<td class="num">(\d+)</td>', r)[:2]) for r in rows(html)]  # type: ignore[misc]


@pytest.fixture(scope="module")
def topic(tansu: TansuBroker) -> Iterator[tuple[str, float]]:
    """A two-partition topic: 30 JSON records on partition 0 (offsets 0-29), then, on partition 1,
    a text, a binary, a form-encoded and a hostile record; returns its name and the time between
    the JSON records 9 and 10 (produced 1.5 s apart)."""
    name = f"console-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})  # (kept: the future needs its client alive)
    admin.create_topics([NewTopic(name, 2, 1)])[name].result(15)
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 0})
    split = 0.0
    for i in range(30):
        if i == 10:
            assert producer.flush(10) == 0
            time.sleep(0.75)  # (records 0-9 and 10-29 get timestamps at least 1.5 s apart)
            split = time.time()
            time.sleep(0.75)
        producer.produce(name, f'{{"n": {i}, "tag": "r{i}"}}'.encode(), key=f"k{i}".encode(), partition=0)
    producer.produce(name, "plain text ünïcode".encode(), partition=1)
    producer.produce(name, bytes([0, 0, 0, 0, 7, 0xFF, 0xFE, 0x01]), partition=1)
    producer.produce(name, b"a=1&b=two", partition=1, headers=[("content-type", b"application/x-www-form-urlencoded")])
    producer.produce(
        name,
        b'{"html": "<script>alert(1)</script>"}',
        key=b"<b>key</b>",
        partition=1,
        headers=[("note", b"<img src=x onerror=alert(2)>"), ("x-h", b"<i>h</i>")],
    )
    assert producer.flush(10) == 0
    yield name, split


def test_the_topic_list_filters_and_links(console_node: ConsoleNode, topic: tuple[str, float]) -> None:
    client = console_node.session(ADMIN)
    page = client.get("/console/topics", params={"q": topic[0][-8:]})
    assert page.status_code == 200
    assert f'href="/console/topics/{topic[0]}"' in page.text and "1 topic(s)" in page.text
    assert client.get("/console/topics/no-such-topic-here").status_code == 404


def test_the_latest_records_newest_first_and_from_an_offset(
    console_node: ConsoleNode, topic: tuple[str, float]
) -> None:
    client = console_node.session(ADMIN)
    name = topic[0]
    latest = client.get(f"/console/topics/{name}", params={"partition": "0", "count": "5"}).text
    assert offsets(latest) == [(0, 29), (0, 28), (0, 27), (0, 26), (0, 25)]
    assert "partition 0: offsets 0 to 30" in latest
    params = {"partition": "0", "mode": "offset", "offset": "12", "count": "3"}
    page = client.get(f"/console/topics/{name}", params=params).text
    assert offsets(page) == [(0, 12), (0, 13), (0, 14)]
    assert "&#34;tag&#34;: &#34;r12&#34;" in page  # JSON, pretty-printed and escaped
    assert "offset=15" in page  # the next page
    everything = client.get(f"/console/topics/{name}", params={"count": "500"}).text
    assert len(rows(everything)) == 34  # both partitions, bounded by what is there


def test_from_a_time(console_node: ConsoleNode, topic: tuple[str, float]) -> None:
    client = console_node.session(ADMIN)
    name, split = topic
    params = {"partition": "0", "mode": "time", "time": str(int(split * 1000)), "count": "2"}
    page = client.get(f"/console/topics/{name}", params=params).text
    assert offsets(page) == [(0, 10), (0, 11)]
    bad = client.get(f"/console/topics/{name}", params={"mode": "time", "time": "yesterday"}).text
    assert "Not a time: &#39;yesterday&#39;" in bad


def test_values_are_shown_by_kind_and_escaped(console_node: ConsoleNode, topic: tuple[str, float]) -> None:
    client = console_node.session(ADMIN)
    page = client.get(f"/console/topics/{topic[0]}", params={"partition": "1", "mode": "offset", "offset": "0"}).text
    text, binary, form, hostile = rows(page)
    assert "plain text ünïcode" in text and ">text<" in text
    assert "schema id 7, 8 bytes: 00 00 00 00 07 ff fe 01" in binary
    assert "&#34;b&#34;: [\n    &#34;two&#34;" in form and ">form<" in form  # the plugin's decoder read it
    assert "<script>" not in hostile and "&lt;script&gt;alert(1)&lt;/script&gt;" in hostile
    assert "&lt;b&gt;key&lt;/b&gt;" in hostile and "&lt;i&gt;h&lt;/i&gt;" in hostile
    assert "&lt;img src=x onerror=alert(2)&gt;" in hostile and ">noted<" in hostile  # the plugin's column


def test_browsing_in_a_browser(browser: Browser, topic: tuple[str, float]) -> None:
    browser.log_in(ADMIN)
    browser.open(f"/console/topics/{topic[0]}?partition=1&mode=offset&offset=0")
    cells = browser.wait(lambda: browser.all("table.records tbody tr"), what="records shown")
    assert len(cells) == 4 and "<script>alert(1)</script>" in cells[3].text
    assert browser.all("table.records .badge") and not browser.all("table.records script, table.records img")
    browser.screenshot("topic")
    browser.open("/console/topics")
    browser.screenshot("topics")
    assert browser.errors() == []
