"""Backtests in the console, end to end: a gateway process in front of Tansu, a headless Chromium, and
topics whose records the tests write to the broker directly (confluent-kafka), so counts and offsets
are exact.

In the browser: start a backtest from a policy's page and read its report (evaluated count,
violations per rule, samples naming the bad records' offsets, an HTML and script payload in a record
value shown as text); watch a long backtest's progress refresh live until its time bound ends it;
cancel another one with its Cancel button. Over HTTP: a refused request shows the API's reason with the
form kept, a draft from the policy form is backtested without being stored, the jobs are the admin
API's, and a read-only user gets no form and is refused (403) everywhere. The finished job page is
saved as ``dq-backtest.png``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import ADMIN, USERS, VIEWER, Browser, csrf_of
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.support.ui import Select, WebDriverWait
from test_dq_console import XSS, DqNode, cel_rule, fill, flash, script_errors, unique, visit, wait_for

from kanal.embedded import GatewayProcess, TansuBroker

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
JOBS = "/console/data-quality/backtests"
API = "/gateway/v2/data-quality/backtest"


def order(amount: float, currency: str = "EUR", note: str = "") -> bytes:
    value: dict[str, Any] = {"amount": amount, "currency": currency}
    if note:
        value["note"] = note
    return json.dumps(value).encode()


# Partition 0: eight records; 2 is negative, 5 in dollars. Partition 1: four records; 1 is negative and
# in dollars, 3 is negative and carries a script in its value.
PARTITION_0 = [order(10 + i) for i in range(8)]
PARTITION_0[2] = order(-5)
PARTITION_0[5] = order(3, "USD")
PARTITION_1 = [order(20 + i) for i in range(4)]
PARTITION_1[1] = order(-1, "USD")
PARTITION_1[3] = order(-2, note=XSS)
#: A rule that costs a few milliseconds a record (every pair of a hundred items): a backtest of it
#: over SLOW_RECORDS records runs for seconds, long enough to watch it and cancel it.
SLOW_RULE = "value.items.all(x, value.items.all(y, x + y >= 0))"
SLOW_VALUE = json.dumps({"amount": 1, "items": list(range(100))}).encode()
SLOW_RECORDS = 4000


@pytest.fixture(scope="module")
def console_node(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DqNode]:
    """A gateway of a cluster of its own, with the data-quality plugin and the console's users."""
    cluster = f"dqb-{uuid.uuid4().hex[:8]}"
    env = {**tansu.gateway_settings(), "GATEWAY_ADMIN_API_USERS": USERS, "GATEWAY_CLUSTER_ID": cluster}
    process = GatewayProcess(env, log_path=tmp_path_factory.mktemp("dq-backtest") / "gateway.log")
    process.start(timeout=30)
    try:
        yield DqNode(process, cluster, tansu)
    finally:
        process.stop()


def create_topic(broker: TansuBroker, topic: str, partitions: int) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept while its future is pending
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])[topic].result(TIMEOUT)
    return topic


def write(broker: TansuBroker, topic: str, partitions: list[list[bytes]], per_batch: int = 100) -> None:
    """Writes each partition's values (keys ``k<index>``) to the broker directly, at most ``per_batch``
    records a batch, and checks that every one was acknowledged."""
    from confluent_kafka import Producer

    errors: list[Any] = []
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "linger.ms": 20,
            "batch.num.messages": per_batch,
            "enable.idempotence": False,
        }
    )
    for partition, values in enumerate(partitions):
        for i, value in enumerate(values):
            producer.produce(
                topic,
                value=value,
                key=f"k{i}".encode(),
                partition=partition,
                on_delivery=lambda e, _m: errors.append(e),
            )
    assert producer.flush(TIMEOUT) == 0
    assert errors == [None] * sum(len(values) for values in partitions)


def stored_policy(node: DqNode, topic: str, *rules: tuple[str, str, str | None]) -> str:
    """A stored policy on ``topic`` with rules (name suffix, CEL expression, violation text)."""
    name = unique("bt")
    names = []
    for suffix, expression, message in rules:
        rule = cel_rule(f"{name}-{suffix}", expression)
        if message:
            rule["spec"]["message"] = message
        node.apply(rule)
        names.append(f"{name}-{suffix}")
    node.apply(
        {
            "apiVersion": "v1",
            "kind": "DataQualityPolicy",
            "metadata": {"name": name, "group": "team-orders"},
            "spec": {"displayName": name, "rules": names, "targets": [{"cluster": node.cluster, "topic": topic}]},
        }
    )
    return name


@pytest.fixture(scope="module")
def orders(console_node: DqNode) -> str:
    topic = create_topic(console_node.broker, unique("bt-orders"), partitions=2)
    write(console_node.broker, topic, [PARTITION_0, PARTITION_1])
    return topic


@pytest.fixture(scope="module")
def orders_policy(console_node: DqNode, orders: str) -> str:
    """Two rules: a positive amount, and euros (with a violation text of its own)."""
    return stored_policy(
        console_node, orders, ("positive", "value.amount > 0", None), ("eur", "value.currency == 'EUR'", "only euros")
    )


@pytest.fixture(scope="module")
def slow_policy(console_node: DqNode) -> tuple[str, str]:
    """(policy, topic): a topic of SLOW_RECORDS records in batches of ten, and a policy whose rule is
    slow on them."""
    topic = create_topic(console_node.broker, unique("bt-slow"), partitions=1)
    write(console_node.broker, topic, [[SLOW_VALUE] * SLOW_RECORDS], per_batch=10)
    return stored_policy(console_node, topic, ("pairs", SLOW_RULE, None)), topic


def settle(browser: Browser, condition: Callable[[], Any], what: str) -> Any:
    """Waits for ``condition``; a page being replaced (its live region, or the page reloading once
    its backtest finished) only means "not yet"."""
    wait = WebDriverWait(browser.driver, TIMEOUT, ignored_exceptions=(WebDriverException,))
    return wait.until(lambda _: condition(), message=what)


def press(browser: Browser, css: str) -> None:
    """Clicks a form's button (found again when the live region replaced it meanwhile) and waits for
    the page it leads to."""
    old = browser.find("main")
    for _ in range(5):
        try:
            browser.find(css).click()
            break
        except StaleElementReferenceException:
            continue
    else:
        pytest.fail(f"{css} was replaced at every try")
    settle(browser, lambda: _gone(old), f"the page after {css}")


def _gone(element: Any) -> bool:
    try:
        element.is_enabled()
    except WebDriverException:  # stale, or its document is being replaced
        return True
    return False


def finished_page(browser: Browser) -> bool:
    """The job page as it stays once its backtest finished: loaded, without a live region."""
    loaded = browser.driver.execute_script("return document.readyState") == "complete"
    return bool(loaded and browser.all("#backtest-live") and not browser.all("[data-refresh]"))


def job_id(browser: Browser) -> str:
    found = re.search(r"/data-quality/backtests/([0-9a-f]+)$", browser.driver.current_url)
    assert found is not None, browser.driver.current_url
    return found.group(1)


def text(browser: Browser, css: str) -> str:
    """An element's text, or "" while it is absent (a live region being replaced)."""
    found = browser.all(css)
    try:
        return str(found[0].text) if found else ""
    except Exception:  # replaced between the lookup and the read: the next round reads it
        return ""


def start_from_policy_page(browser: Browser, policy: str, **fields: str) -> str:
    """Fills the policy page's backtest form (the defaults but ``fields``), runs it, and answers the
    backtest's id once its page is shown."""
    visit(browser, f"/console/data-quality/policies/{policy}")
    for name, value in fields.items():
        if name == "range":
            Select(browser.find("#bt-range")).select_by_value(value)
        else:
            fill(browser, f"#bt-{name}", value)
    press(browser, "form.backtest-form button[type=submit]")
    return job_id(browser)


# -- in the browser ---------------------------------------------------------------------------------


def test_a_backtest_from_a_policy_page_reports_exact_counts(
    browser: Browser, console_node: DqNode, orders: str, orders_policy: str
) -> None:
    visit(browser, f"/console/data-quality/policies/{orders_policy}")
    assert browser.find("#bt-topic").get_attribute("value") == orders  # the policy's target topic
    assert browser.find("#bt-latest").get_attribute("value") == "1000"
    backtest = start_from_policy_page(browser, orders_policy)
    assert f"Backtest {backtest} started." in flash(browser)
    assert browser.find("h1").text == f"Backtest of policy {orders_policy}"
    settle(browser, lambda: "done" in text(browser, "dd.state"), "the backtest's report")
    settle(browser, lambda: finished_page(browser), "the finished page (no live region)")
    assert orders in browser.find("dd.topic").text
    assert browser.find("dd.range").text == "the latest 1,000 records of each partition"
    assert browser.find("dd.records-read").text == "12"
    partitions = [row.text.split() for row in browser.all("table.partitions tbody tr")]
    assert partitions == [["0", "0", "8", "8", "8", "yes"], ["1", "0", "4", "4", "4", "yes"]]
    assert browser.find("dd.evaluated").text == "12" and browser.find("#summary ~ dl dd.violations").text == "4"
    assert browser.find("dd.stopped").text == "read to its end"
    assert float(browser.find("dd.elapsed").text.split()[0]) > 0
    rules = [row.text for row in browser.all("table.report-rules tbody tr")]
    assert rules == [f"{orders_policy}-positive 3", f"{orders_policy}-eur 2"]
    chart = browser.find("figure.rules-chart svg.chart")
    assert chart.get_attribute("aria-label") == "Violations per rule (max 3)"
    assert [float(bar.get_attribute("height")) > 0 for bar in browser.all("figure.rules-chart rect.bar")] == [True] * 2

    samples = {
        (cells[0].text, cells[1].text): row
        for row in browser.all("table.samples tbody tr")
        for cells in [row.find_elements("css selector", "td")]
    }
    assert sorted(samples) == [("0", "2"), ("0", "5"), ("1", "1"), ("1", "3")]
    negative = samples[("0", "2")].text
    assert "k2" in negative and '"amount": -5' in negative and f"{orders_policy}-positive did not pass" in negative
    assert "only euros" in samples[("0", "5")].text
    assert f"{orders_policy}-positive, {orders_policy}-eur" in samples[("1", "1")].text
    # the script in a record's value is shown as text, and never runs
    value = samples[("1", "3")].find_element("css selector", "td.value pre").text
    assert json.loads(value)["note"] == XSS
    assert browser.driver.title != "owned" and not browser.all("main img, main script")
    browser.screenshot("dq-backtest")
    assert script_errors(browser) == []

    # the job is the admin API's too, and the start was audited
    api = console_node.api("GET", f"{API}/{backtest}").json()
    assert api["state"] == "done" and api["user"] == ADMIN[0] and api["report"]["evaluated"] == 12
    wait_for(lambda: f"backtest={backtest}" in console_node.process.output, what="the BACKTEST audit line")
    browser.open(JOBS)
    row = browser.find(f"table.backtests a[href$='/{backtest}']").find_element("xpath", "./ancestor::tr")
    assert "done" in row.text and orders_policy in row.text and orders in row.text


def test_a_running_backtest_shows_its_progress_live_until_its_time_bound(
    browser: Browser, slow_policy: tuple[str, str]
) -> None:
    policy, _ = slow_policy
    start_from_policy_page(browser, policy, latest=str(SLOW_RECORDS), **{"max-seconds": "3"})
    assert "running" in browser.find("dd.state").text
    assert browser.find("dd.bounds").text.startswith("at most 100,000 records and 3 s")
    live = browser.find("#backtest-live[data-refresh]")

    def progress_shown() -> bool:
        read = int(text(browser, "dd.records-read").replace(",", "") or 0)
        return bool(live.get_attribute("data-refreshed")) and "running" in text(browser, "dd.state") and read > 0

    settle(browser, progress_shown, "the records read so far, refreshed while it runs")
    assert "no" in text(browser, "table.partitions tbody tr") and browser.all("form.cancel-form")
    # finished: the page shows the report and is no longer refreshed
    settle(browser, lambda: "stopped on the time bound" in text(browser, "dd.stopped"), "the time bound")
    settle(browser, lambda: finished_page(browser), "the page without its live region")
    assert "done" in browser.find("dd.state").text and not browser.all("form.cancel-form")
    evaluated = int(browser.find("dd.evaluated").text.replace(",", ""))
    assert 0 < evaluated < SLOW_RECORDS
    assert script_errors(browser) == []


def test_cancel_a_running_backtest(browser: Browser, console_node: DqNode, slow_policy: tuple[str, str]) -> None:
    policy, _ = slow_policy
    backtest = start_from_policy_page(browser, policy, latest=str(SLOW_RECORDS), **{"max-seconds": "60"})
    assert "running" in browser.find("dd.state").text
    press(browser, "form.cancel-form button")
    assert "Backtest cancelled." in flash(browser)
    assert "cancelled" in browser.find("dd.state").text and browser.find("#summary").text == "Cancelled"
    assert browser.find("dd.stopped").text == "cancelled before its end"
    assert int(browser.find("dd.evaluated").text.replace(",", "")) < SLOW_RECORDS
    assert console_node.api("GET", f"{API}/{backtest}").json()["state"] == "cancelled"
    assert script_errors(browser) == []


# -- over HTTP --------------------------------------------------------------------------------------


def test_a_refused_backtest_shows_why_with_the_form_kept(console_node: DqNode, orders_policy: str) -> None:
    client = console_node.session(ADMIN)
    path = f"/console/data-quality/policies/{orders_policy}"
    token = csrf_of(client.get(path).text)
    missing = unique("no-such-topic")
    answer = client.post(f"{path}/backtest", data={"csrf": token, "topic": missing, "latest": "10"})
    assert answer.status_code == 404 and "does not exist on the cluster" in answer.text
    assert f'id="bt-topic" name="topic" value="{missing}"' in answer.text
    answer = client.post(f"{path}/backtest", data={"csrf": token, "topic": "x", "range": "time"})
    assert answer.status_code == 400 and "a time range needs a from time" in answer.text
    answer = client.post(f"{path}/backtest", data={"csrf": token, "topic": "x", "maxSeconds": "9999"})
    assert answer.status_code == 400 and "maxSeconds must be" in answer.text


def test_a_time_range_from_the_form(console_node: DqNode, orders: str, orders_policy: str) -> None:
    client = console_node.session(ADMIN)
    path = f"/console/data-quality/policies/{orders_policy}"
    form = {"csrf": csrf_of(client.get(path).text), "topic": orders, "range": "time", "from": "2001-02-03 04:05:06"}
    answer = client.post(f"{path}/backtest", data={**form, "to": "", "maxRecords": "5"})
    assert answer.status_code == 303, answer.text
    backtest = answer.headers["location"].rsplit("/", 1)[1]
    job = wait_for(lambda: (j := console_node.api("GET", f"{API}/{backtest}").json())["report"] and j, what="a report")
    assert job["range"] == {"from": "2001-02-03T04:05:06.000Z", "to": None}
    assert job["report"]["evaluated"] == 5 and job["report"]["stoppedOn"] == "maxRecords"
    page = client.get(answer.headers["location"]).text
    assert "from 2001-02-03 04:05:06 to the end (UTC)" in page
    assert "stopped on the record bound (5 records)" in page


def test_backtest_a_draft_from_the_policy_form(console_node: DqNode, orders: str, orders_policy: str) -> None:
    client = console_node.session(ADMIN)
    token = csrf_of(client.get("/console/data-quality/new-policy").text)
    name = unique("draft")
    form = {
        "csrf": token,
        "displayName": "Draft",
        "name": name,
        "group": "team-orders",
        f"rule:{orders_policy}-eur": "on",
        "targets": f"{orders}\nothers-*",
        "latest": "3",
        "backtest": "draft",
    }
    answer = client.post("/console/data-quality/new-policy", data=form)
    assert answer.status_code == 303, answer.text
    backtest = answer.headers["location"].rsplit("/", 1)[1]
    job = wait_for(
        lambda: (j := console_node.api("GET", f"{API}/{backtest}").json())["report"] and j,
        what="the draft's report",
    )
    assert job["draft"] is True and job["topic"] == orders and job["range"] == {"latest": 3}
    assert (job["report"]["evaluated"], job["report"]["violations"]) == (6, 2)  # 5, 6, 7 and 1, 2, 3
    assert console_node.api("GET", f"/gateway/v2/data-quality-policy/{name}").status_code == 404  # not stored
    page = client.get(answer.headers["location"]).text
    assert "draft" in page and "as written in the form, not saved" in page
    # a draft the API refuses: the form again, as typed, with its reason
    refused = {key: value for key, value in form.items() if not key.startswith("rule:")}
    answer = client.post("/console/data-quality/new-policy", data=refused)
    assert answer.status_code == 400 and "a policy needs at least one rule" in answer.text
    assert 'name="latest" type="number" min="1" value="3"' in answer.text


def test_a_read_only_user_cannot_backtest(console_node: DqNode, orders: str, orders_policy: str) -> None:
    backtest = console_node.api("POST", f"{API}?wait=true", {"policy": orders_policy, "topic": orders}).json()["id"]
    viewer = console_node.session(VIEWER)
    page = viewer.get(f"/console/data-quality/policies/{orders_policy}")
    assert page.status_code == 200 and "backtest-form" not in page.text and "bt-topic" not in page.text
    token = csrf_of(page.text)
    for path in (JOBS, f"{JOBS}/{backtest}", f"{JOBS}/{backtest}/live"):
        answer = viewer.get(path)
        assert answer.status_code == 403 and "for admin users" in answer.text, path
        assert "k2" not in answer.text, path
    for path, data in (
        (f"/console/data-quality/policies/{orders_policy}/backtest", {"topic": orders}),
        (f"{JOBS}/{backtest}/cancel", {}),
        ("/console/data-quality/new-policy", {"displayName": "x", "targets": orders, "backtest": "draft"}),
    ):
        answer = viewer.post(path, data={"csrf": token, **data})
        assert answer.status_code == 403 and "read-only" in answer.text, path
    jobs = console_node.api("GET", API).json()
    assert all(j["user"] != VIEWER[0] for j in jobs)
