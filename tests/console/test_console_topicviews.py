"""The topic-view pages: the list, the form, the preview of a statement over the input topic's
latest records (in the view, filtered out, an error as onError treats it), saving through the admin
API's validation, a read-only user previewing without saving, and in a browser the preview following
what is typed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import ADMIN, VIEWER, Browser, ConsoleNode, csrf_of

from kanal.embedded import TansuBroker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def orders(tansu: TansuBroker) -> Iterator[str]:
    """An input topic: 6 orders (amounts 50, 150, ..., 550) and one value that is not JSON."""
    name = f"orders_{uuid.uuid4().hex[:8]}"  # (a name SQL reads without quotes)
    admin = AdminClient({"bootstrap.servers": tansu.bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(15)
    producer = Producer({"bootstrap.servers": tansu.bootstrap, "linger.ms": 0})
    for i in range(6):
        producer.produce(name, f'{{"id": {i}, "amount": {50 + 100 * i}, "note": "<b>o{i}</b>"}}'.encode())
    producer.produce(name, b"not json")
    assert producer.flush(10) == 0
    yield name


def statement(topic: str) -> str:
    return f"SELECT id, amount FROM {topic} WHERE amount > 200"


def test_the_preview_shows_each_record_s_fate(console_node: ConsoleNode, orders: str) -> None:
    client = console_node.session(ADMIN)
    token = csrf_of(client.get("/console/topic-views/edit").text)
    form = {"csrf": token, "name": "big-orders", "statement": statement(orders), "onError": "DROP", "fragment": "1"}
    page = client.post("/console/topic-views/preview", data=form)
    assert page.status_code == 200, page.text
    assert "7 record(s): 4 in the view" in page.text
    assert page.text.count("filtered out") == 2 and "dropped: " in page.text
    assert "&#34;amount&#34;: 550" in page.text and "&lt;b&gt;o5&lt;/b&gt;" in page.text  # input shown, escaped
    strict = client.post("/console/topic-views/preview", data={**form, "onError": "FAIL_FETCH"}).text
    assert "the fetch fails here: " in strict
    broken = client.post("/console/topic-views/preview", data={**form, "statement": "SELECT FROM WHERE"}).text
    assert 'class="flash error"' in broken and "statement" in broken


def test_saving_goes_through_validation_and_the_view_serves(
    console_node: ConsoleNode, orders: str, tansu: TansuBroker
) -> None:
    client = console_node.session(ADMIN)
    token = csrf_of(client.get("/console/topic-views/edit").text)
    bad = client.post(
        "/console/topic-views/save",
        data={"csrf": token, "name": orders, "statement": statement(orders), "onError": "DROP"},
    )
    assert bad.status_code == 400 and "cannot read itself" in bad.text  # the admin API's message, the input kept
    assert f'value="{orders}"' in bad.text
    name = f"big-{uuid.uuid4().hex[:6]}"
    saved = client.post(
        "/console/topic-views/save",
        data={"csrf": token, "name": name, "statement": statement(orders), "onError": "DROP"},
    )
    assert (saved.status_code, saved.headers["location"]) == (303, "/console/topic-views")
    listing = client.get("/console/topic-views").text
    assert f"Topic view &#39;{name}&#39; created." in listing
    consumer = Consumer({"bootstrap.servers": console_node.process.bootstrap, "group.id": f"g-{name}"})
    consumer.assign([TopicPartition(name, 0, 0)])
    values = []
    try:
        for _ in range(40):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            if len(values) == 4:
                break
    finally:
        consumer.close()
    assert values[0] == b'{"id":2,"amount":250}' and len(values) == 4
    gone = client.post("/console/topic-views/delete", data={"csrf": csrf_of(listing), "name": name})
    assert gone.status_code == 303 and name not in client.get("/console/topic-views").text.split("</h1>")[1]


def test_a_read_only_user_previews_but_cannot_save(console_node: ConsoleNode, orders: str) -> None:
    viewer = console_node.session(VIEWER)
    page = viewer.get("/console/topic-views/edit")
    assert ">Save</button>" not in page.text and ">Preview</button>" in page.text
    token = csrf_of(page.text)
    form = {"csrf": token, "name": "v", "statement": statement(orders), "onError": "DROP"}
    assert "in the view" in viewer.post("/console/topic-views/preview", data=form).text
    refused = viewer.post("/console/topic-views/save", data=form)
    assert refused.status_code == 403 and "read-only" in refused.text


def test_the_preview_follows_the_typing(browser: Browser, orders: str) -> None:
    browser.log_in(ADMIN)
    browser.open("/console/topic-views/edit")
    browser.find("#name").send_keys("typed-view")
    browser.find("#statement").send_keys(statement(orders))
    preview = browser.find("#preview")
    browser.wait(lambda: "4 in the view" in preview.text, what="the live preview")
    browser.screenshot("topic-view-edit")
    browser.find("#statement").send_keys("0")  # amount > 2000: nothing left
    browser.wait(lambda: "0 in the view" in preview.text, what="the preview follows")
    browser.open("/console/topic-views")
    browser.screenshot("topic-views")
    assert browser.errors() == []
