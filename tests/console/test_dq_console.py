"""The data-quality pages of the console, end to end: a gateway process in front of Tansu, a headless
Chromium, real producers (confluent-kafka) through the gateway.

In the browser: create a rule and test it (passed, failed, evaluation error), create a policy, enable
Block by typing BLOCK, produce a bad record and watch the violation reach the live history and chart,
toggle Mark, add an alert; HTML and script in a rule's name and description are shown as text. Over
HTTP: the typed BLOCK / UNBLOCK refusals, the admin API's validation messages in the forms, and a
read-only user who sees every page, gets no form to change anything and is refused when posting one.
Each page is saved as a screenshot (``dq-*.png`` in the console's artifacts folder).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from conftest import ADMIN, USERS, VIEWER, Browser, ConsoleNode, csrf_of
from selenium.webdriver.support.ui import Select

from kanal.embedded import GatewayProcess, TansuBroker

pytestmark = pytest.mark.integration

TIMEOUT = 20.0
GOOD = json.dumps({"amount": 10}).encode()
BAD = json.dumps({"amount": -5}).encode()
XSS = '<img src=x onerror="document.title=\'owned\'"><script>document.title="owned"</script>'


class DqNode(ConsoleNode):
    """The console's gateway, with the cluster name policies target and the broker behind it."""

    def __init__(self, process: GatewayProcess, cluster: str, broker: TansuBroker) -> None:
        super().__init__(process)
        self.cluster = cluster
        self.broker = broker

    def api(self, method: str, path: str, body: Any = None) -> httpx.Response:
        return httpx.request(method, self.base + path, json=body, auth=ADMIN, timeout=10)

    def apply(self, manifest: dict[str, Any]) -> None:
        path = {"DataQualityRule": "data-quality-rule", "DataQualityPolicy": "data-quality-policy"}[manifest["kind"]]
        answer = self.api("PUT", f"/gateway/v2/{path}", manifest)
        assert answer.status_code == 200, answer.text

    def policy(self, name: str) -> dict[str, Any]:
        answer = self.api("GET", f"/gateway/v2/data-quality-policy/{name}")
        assert answer.status_code == 200, answer.text
        return answer.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def console_node(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DqNode]:
    """A gateway of a cluster of its own (its own history topic), counts flushed every half second."""
    cluster = f"dqc-{uuid.uuid4().hex[:8]}"
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_CLUSTER_ID": cluster,
        "DATA_QUALITY_COUNTS_FLUSH_INTERVAL": "500ms",
    }
    process = GatewayProcess(env, log_path=tmp_path_factory.mktemp("dq") / "gateway.log")
    process.start(timeout=30)
    try:
        yield DqNode(process, cluster, tansu)
    finally:
        process.stop()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def wait_for(predicate: Callable[[], Any], timeout: float = TIMEOUT, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"not met within {timeout}s: {what}")
        time.sleep(0.1)


def create_topic(broker: TansuBroker, topic: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(TIMEOUT)
    return topic


def produce(bootstrap: str, topic: str, values: list[bytes]) -> list[Any]:
    """One batch through the gateway; the delivery errors (None where delivered)."""
    from confluent_kafka import Producer

    errors: list[Any] = []
    producer = Producer(
        {"bootstrap.servers": bootstrap, "client.id": "dq-console", "linger.ms": 50, "enable.idempotence": False}
    )
    for value in values:
        producer.produce(topic, value=value, on_delivery=lambda err, _msg: errors.append(err))
    assert producer.flush(TIMEOUT) == 0
    return errors


def cel_rule(name: str, expression: str = "value.amount > 0") -> dict[str, Any]:
    spec = {"type": "Cel", "displayName": name, "celExpression": expression}
    return {"apiVersion": "v1", "kind": "DataQualityRule", "metadata": {"name": name}, "spec": spec}


def policy(name: str, rule: str, topic: str, cluster: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "DataQualityPolicy",
        "metadata": {"name": name, "group": "team-orders"},
        "spec": {"displayName": name, "rules": [rule], "targets": [{"cluster": cluster, "topic": topic}]},
    }


def fill(browser: Browser, css: str, text: str) -> None:
    field = browser.find(css)
    field.clear()
    field.send_keys(text)


def submit(browser: Browser, css: str) -> None:
    """Clicks a button and waits for the next page (the old one goes stale)."""
    old = browser.find("main")
    browser.find(css).click()
    browser.wait(lambda: _stale(old), what=f"the page after {css}")


def _stale(element: Any) -> bool:
    from selenium.common.exceptions import WebDriverException

    try:
        element.is_enabled()
    except WebDriverException:  # stale, or its document is being replaced (the navigation is under way)
        return True
    return False


def visit(browser: Browser, path: str) -> None:
    """Opens a page, logging in first when the browser has no session yet."""
    browser.open(path)
    if "/console/login" in browser.driver.current_url:
        browser.log_in(ADMIN)
        browser.open(path)


def row_with(browser: Browser, text: str) -> Any:
    """The first table row that shows ``text`` (waited for)."""
    return browser.wait(
        lambda: next((r for r in browser.all("tbody tr") if text in r.text), None), what=f"a row with {text}"
    )


def script_errors(browser: Browser) -> list[str]:
    """What the browser reported, but the refusals the tests provoke (a form refused with a 400 or
    409 is logged as a failed load)."""
    return [e for e in browser.errors() if not re.search(r"responded with a status of 40[09]", e)]


def flash(browser: Browser) -> str:
    return " ".join(p.text for p in browser.all("p.flash"))


# -- in the browser ---------------------------------------------------------------------------------


def test_create_a_rule_and_test_it(browser: Browser, console_node: DqNode) -> None:
    name = unique("positive")
    visit(browser, "/console/data-quality/rules")
    assert browser.find("h1").text == "Data quality rules"
    assert browser.find("nav a[aria-current=page]").text == "Quality rules"
    browser.find("main a[href$='/data-quality/new-rule']").click()
    browser.wait(lambda: browser.find("h1").text == "New rule", what="the new rule form")
    fill(browser, "#displayName", "Positive amount")
    fill(browser, "#name", name)
    fill(browser, "#description", "Amounts are above zero.")
    Select(browser.find("#type")).select_by_value("Cel")
    fill(browser, "#expression", "value.amount > 0")
    submit(browser, "form.rule-form button.save")
    assert browser.driver.current_url.endswith(f"/console/data-quality/rules/{name}")
    assert f"Rule {name} created." in flash(browser)
    assert console_node.api("GET", f"/gateway/v2/data-quality-rule/{name}").json()["spec"]["celExpression"] == (
        "value.amount > 0"
    )

    # the test: failed, passed, then an evaluation error for bad syntax (on the draft, not saved)
    fill(browser, "#value", '{"amount": -1}')
    submit(browser, "form.rule-form button.test")
    assert "Failed" in browser.find(".test-result").text and f"{name} did not pass" in browser.find(".test-result").text
    assert browser.find("#value").get_attribute("value") == '{"amount": -1}'  # the sample is kept
    fill(browser, "#value", '{"amount": 3}')
    submit(browser, "form.rule-form button.test")
    assert "Passed" in browser.find(".test-result").text
    fill(browser, "#expression", "value.amount >")
    submit(browser, "form.rule-form button.test")
    assert "Evaluation error" in browser.find(".test-result").text
    assert browser.find("#expression").get_attribute("value") == "value.amount >"  # the draft is kept
    fill(browser, "#expression", "value.amount > 0")
    fill(browser, "#value", '{"amount": 0}')
    submit(browser, "form.rule-form button.test")
    browser.screenshot("dq-rule")
    assert script_errors(browser) == []

    browser.open("/console/data-quality/rules")
    row = row_with(browser, name)
    assert "Positive amount" in row.text and "value.amount > 0" in row.text and "no policy" in row.text
    browser.screenshot("dq-rules")


def test_a_policy_blocks_once_block_is_typed_and_shows_the_violation(browser: Browser, console_node: DqNode) -> None:
    rule, name = unique("positive"), unique("orders")
    topic = create_topic(console_node.broker, unique("orders"))
    console_node.apply(cel_rule(rule))
    visit(browser, "/console/data-quality/policies")
    browser.find("main a[href$='/data-quality/new-policy']").click()
    browser.wait(lambda: browser.find("h1").text == "New policy", what="the new policy form")
    fill(browser, "#displayName", "Orders")
    fill(browser, "#name", name)
    fill(browser, "#group", "team-orders")
    fill(browser, "#description", "Orders have a positive amount.")
    browser.find(f"input[type=checkbox][name='rule:{rule}']").click()
    fill(browser, "#targets", topic)
    browser.screenshot("dq-policy-form")
    submit(browser, "form.policy-form button[type=submit]")
    assert browser.driver.current_url.endswith(f"/console/data-quality/policies/{name}"), flash(browser)
    assert f"Policy {name} created." in flash(browser)
    assert browser.find("dd.status").text.startswith("Ready")
    assert "report only" in browser.find("dd.actions").text  # created without actions
    assert rule in browser.find("table.rules").text and topic in browser.find("table.targets").text
    assert "Orders have a positive amount." in browser.find("p.description").text

    # Block: the wrong word is refused, BLOCK enables it
    fill(browser, "#confirm", "block")
    submit(browser, "form.block-form button[type=submit]")
    assert "Type BLOCK (in capitals) to enable Block" in browser.find("#action-error").text
    assert console_node.policy(name)["spec"]["actions"]["block"] == {"enabled": False}
    fill(browser, "#confirm", "BLOCK")
    submit(browser, "form.block-form button[type=submit]")
    assert f"Block enabled on policy {name}." in flash(browser)
    assert "BLOCK" in browser.find("dd.actions").text
    assert console_node.policy(name)["spec"]["actions"]["block"] == {"enabled": True}

    # a bad record through the gateway is rejected, and the page shows it without a reload
    from confluent_kafka import KafkaError

    errors = produce(console_node.process.bootstrap, topic, [GOOD, BAD])
    assert [e.code() if e else None for e in errors] == [KafkaError.INVALID_RECORD] * 2
    history = browser.find("#live")
    browser.wait(lambda: topic in browser.find("table.history").text, 30, "the violation in the live history")
    row = browser.find("table.history tbody tr").text
    assert "BLOCKED" in row and rule in row and f"{rule} did not pass" in row and "dq-console" in row
    browser.wait(
        lambda: (browser.find("#live svg.chart").get_attribute("aria-label") or "").endswith("(max 1)"),
        30,
        "the violation in the chart",
    )
    assert browser.find("#live dd.violations").text == "1" and history.get_attribute("data-refreshed")
    assert [float(b.get_attribute("height")) > 0 for b in browser.all("#live rect.bar")].count(True) == 1
    browser.screenshot("dq-policy")

    # the range selector: the same counts over 7 days
    browser.find("nav.ranges a[href$='range=7d']").click()
    browser.wait(lambda: "range=7d" in browser.driver.current_url, what="the 7-day range")
    assert browser.find("nav.ranges a[aria-current=page]").text == "7 days"
    assert browser.find("#live dd.violations").text == "1" and "7 days" in browser.find("#counts").text

    # Mark toggles with one button
    submit(browser, "form.mark-form button")
    assert f"Mark enabled on policy {name}." in flash(browser)
    assert console_node.policy(name)["spec"]["actions"]["mark"] == {"enabled": True}

    browser.open("/console/data-quality/policies")
    row = row_with(browser, name)
    assert "Ready" in row.text and "BLOCK" in row.text and "MARK" in row.text
    assert row.find_elements("css selector", "td.num")[1].text == "1"  # violations
    browser.screenshot("dq-policies")
    assert script_errors(browser) == []


def test_add_an_alert_to_a_policy(browser: Browser, console_node: DqNode) -> None:
    rule, name, alert = unique("positive"), unique("payments"), unique("payments-alert")
    console_node.apply(cel_rule(rule))
    console_node.apply(policy(name, rule, unique("payments"), console_node.cluster))
    visit(browser, f"/console/data-quality/alerts?policy={name}")
    assert Select(browser.find("#alert-policy")).first_selected_option.text == name
    assert browser.find("#alert-group").get_attribute("value") == "team-orders"  # the policy's group
    fill(browser, "#alert-name", alert)
    fill(browser, "#alert-trigger", "5")
    fill(browser, "#alert-within", "2")
    Select(browser.find("#alert-unit")).select_by_value("minutes")
    submit(browser, "form.alert-form button[type=submit]")
    assert f"Alert {alert} created." in flash(browser)
    stored = console_node.api("GET", f"/gateway/v2/alert/{alert}").json()
    assert stored["spec"]["triggerAfter"] == 5 and stored["spec"]["withinInSeconds"] == 120
    assert stored["spec"]["destination"] == {"type": "AuditLog"}
    assert browser.driver.current_url.endswith(f"/console/data-quality/alerts/{alert}")
    browser.screenshot("dq-alert")

    # edited on its page (the window shown in the unit it was given in), then deleted
    assert browser.find("#alert-within").get_attribute("value") == "2"
    fill(browser, "#alert-trigger", "7")
    submit(browser, "form.alert-form button[type=submit]")
    assert f"Alert {alert} saved." in flash(browser)
    assert console_node.api("GET", f"/gateway/v2/alert/{alert}").json()["spec"]["triggerAfter"] == 7
    browser.open("/console/data-quality/alerts")
    assert alert in browser.find("table.alerts").text and "quiet" in browser.find("table.alerts").text
    browser.screenshot("dq-alerts")
    browser.open(f"/console/data-quality/policies/{name}")
    assert alert in browser.find("table.alerts").text
    browser.open(f"/console/data-quality/alerts/{alert}")
    submit(browser, "form.delete-form button")
    assert f"Alert {alert} deleted." in flash(browser)
    assert console_node.api("GET", f"/gateway/v2/alert/{alert}").status_code == 404


def test_a_script_in_a_rule_is_shown_as_text(browser: Browser, console_node: DqNode) -> None:
    name = unique("xss")
    visit(browser, "/console/data-quality/new-rule")
    fill(browser, "#displayName", XSS)
    fill(browser, "#name", XSS)  # not a valid technical id: refused, the input kept as typed
    fill(browser, "#expression", "true")
    submit(browser, "form.rule-form button.save")
    assert "metadata.name is required" in browser.find("#form-error").text
    assert browser.find("#name").get_attribute("value") == XSS
    fill(browser, "#name", name)
    fill(browser, "#description", XSS)
    submit(browser, "form.rule-form button.save")
    assert f"Rule {name} created." in flash(browser)
    assert browser.find("#displayName").get_attribute("value") == XSS
    browser.open("/console/data-quality/rules")
    row = row_with(browser, name)
    assert row.find_element("css selector", ".display-name").text == XSS
    assert row.find_element("css selector", ".description").text == XSS
    assert browser.driver.title != "owned" and not browser.all("main img, main script")
    assert script_errors(browser) == []


# -- over HTTP --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def blocking(console_node: DqNode) -> str:
    """A policy without actions (its rule and topic need not exist on the broker)."""
    rule, name = unique("positive"), unique("typed")
    console_node.apply(cel_rule(rule))
    console_node.apply(policy(name, rule, unique("typed"), console_node.cluster))
    return name


def test_block_and_unblock_need_the_typed_word(console_node: DqNode, blocking: str) -> None:
    client = console_node.session(ADMIN)
    path = f"/console/data-quality/policies/{blocking}"
    token = csrf_of(client.get(path).text)

    def post(enable: bool, word: str) -> httpx.Response:
        return client.post(f"{path}/block", data={"csrf": token, "enable": str(enable).lower(), "confirm": word})

    def block() -> bool:
        return bool(console_node.policy(blocking)["spec"]["actions"]["block"]["enabled"])

    for word, shown in (("", "the field was empty"), ("block", "you typed &#39;block&#39;"), ("UNBLOCK", "UNBLOCK")):
        answer = post(True, word)
        assert answer.status_code == 400 and "Type BLOCK (in capitals) to enable Block" in answer.text, word
        assert shown in answer.text
    assert not block()
    assert post(False, "UNBLOCK").status_code == 400  # already disabled: nothing to do
    answer = post(True, " BLOCK ")
    assert answer.status_code == 303 and not answer.headers["location"].endswith("/block")
    assert block()
    assert "Block enabled" in client.get(answer.headers["location"]).text
    answer = post(True, "BLOCK")
    assert answer.status_code == 400 and "Block is already enabled" in answer.text  # a stale page
    answer = post(False, "BLOCK")
    assert answer.status_code == 400 and "Type UNBLOCK (in capitals) to disable Block" in answer.text
    assert block()
    assert post(False, "UNBLOCK").status_code == 303
    assert not block()


def test_the_forms_show_the_api_s_validation(console_node: DqNode) -> None:
    client = console_node.session(ADMIN)
    token = csrf_of(client.get("/console/data-quality/new-rule").text)
    form = {"csrf": token, "displayName": "Broken", "name": unique("broken"), "type": "Cel", "expression": "value.>"}
    answer = client.post("/console/data-quality/new-rule", data=form)
    assert answer.status_code == 400 and "CEL" in answer.text and "value.&gt;" in answer.text
    schema = {**form, "type": "JsonSchema", "expression": "{not json"}
    answer = client.post("/console/data-quality/new-rule", data=schema)
    assert answer.status_code == 400 and "invalid JSON schema" in answer.text
    form = {"csrf": token, "displayName": "Nothing", "group": "g", "targets": "orders", "name": unique("p")}
    answer = client.post("/console/data-quality/new-policy", data=form)
    assert answer.status_code == 400 and "a policy needs at least one rule" in answer.text
    rule = unique("positive")
    console_node.apply(cel_rule(rule))
    answer = client.post(
        "/console/data-quality/new-policy", data={**form, f"rule:{rule}": "on", "targets": "other-cluster:orders"}
    )
    assert answer.status_code == 400 and "unknown cluster &#39;other-cluster&#39;" in answer.text
    assert f'name="rule:{rule}" value="on" checked' in answer.text  # the ticked rule stays ticked


def test_editing_a_policy_keeps_its_actions(console_node: DqNode) -> None:
    first, second, name = unique("positive"), unique("small"), unique("edited")
    console_node.apply(cel_rule(first))
    console_node.apply(cel_rule(second, "value.amount < 1000"))
    console_node.apply(policy(name, first, "orders", console_node.cluster))
    client = console_node.session(ADMIN)
    token = csrf_of(client.get(f"/console/data-quality/policies/{name}").text)
    answer = client.post(f"/console/data-quality/policies/{name}/mark", data={"csrf": token, "enable": "true"})
    assert answer.status_code == 303
    page = client.get(f"/console/data-quality/policies/{name}/edit").text
    assert f'name="rule:{first}" value="on" checked' in page and f'name="rule:{second}" value="on">' in page
    assert '<textarea id="targets" name="targets">orders</textarea>' in page
    form = {
        "csrf": token,
        "displayName": "Edited",
        "group": "team-orders",
        "description": "Now two rules",
        f"rule:{first}": "on",
        f"rule:{second}": "on",
        "targets": "orders\npayments-*",
    }
    answer = client.post(f"/console/data-quality/policies/{name}/edit", data=form)
    assert answer.status_code == 303, answer.text
    spec = console_node.policy(name)["spec"]
    assert spec["rules"] == [first, second] and spec["description"] == "Now two rules"
    assert spec["targets"] == [
        {"cluster": console_node.cluster, "topic": "orders", "patternType": "LITERAL"},
        {"cluster": console_node.cluster, "topic": "payments-", "patternType": "PREFIXED"},
    ]
    assert spec["actions"]["mark"] == {"enabled": True}  # the form does not touch the actions
    answer = client.post(f"/console/data-quality/policies/{name}/edit", data=form)
    assert "nothing changed" in client.get(answer.headers["location"]).text


def test_a_read_only_user_sees_the_pages_and_changes_nothing(console_node: DqNode, blocking: str) -> None:
    viewer = console_node.session(VIEWER)
    rule = console_node.policy(blocking)["spec"]["rules"][0]
    pages = {
        "/console/data-quality/policies": "New policy",
        f"/console/data-quality/policies/{blocking}": "block-form",
        "/console/data-quality/rules": "New rule",
        f"/console/data-quality/rules/{rule}": "rule-form",
        "/console/data-quality/alerts": "alert-form",
    }
    for path, offer in pages.items():
        page = viewer.get(path)
        assert page.status_code == 200, path
        assert offer not in page.text and "mark-form" not in page.text, path
        assert set(re.findall(r'<form class="([^"]+)"', page.text)) - {"logout"} <= {"stack test-form"}, path
    token = csrf_of(viewer.get("/console/data-quality/policies").text)
    refused = {
        f"/console/data-quality/policies/{blocking}/block": {"enable": "true", "confirm": "BLOCK"},
        f"/console/data-quality/policies/{blocking}/mark": {"enable": "true"},
        "/console/data-quality/new-rule": {"displayName": "x", "expression": "true"},
        f"/console/data-quality/rules/{rule}": {"displayName": "x", "expression": "false"},
    }
    for path, data in refused.items():
        answer = viewer.post(path, data={"csrf": token, **data})
        assert answer.status_code == 403 and "read-only" in answer.text, path
    assert console_node.policy(blocking)["spec"]["actions"] == {
        "block": {"enabled": False},
        "mark": {"enabled": False},
        "report": {"enabled": True},
    }
    # the rule test changes nothing: every user may run it
    answer = viewer.post(f"/console/data-quality/rules/{rule}/test", data={"csrf": token, "value": '{"amount": 1}'})
    assert answer.status_code == 200 and "Passed" in answer.text


def test_a_marked_record_shows_its_policy_on_the_topic_page(browser: Browser, console_node: DqNode) -> None:
    """Spec 01: the topic page shows a marked record's policy badge, the Marking violations column and
    the violation details (the marking header, written by a Mark policy through the gateway)."""
    rule, name = unique("positive"), unique("marking")
    topic = create_topic(console_node.broker, unique("marked"))
    console_node.apply(cel_rule(rule))
    manifest = policy(name, rule, topic, console_node.cluster)
    manifest["spec"]["actions"] = {"mark": {"enabled": True}}
    console_node.apply(manifest)
    wait_for(lambda: console_node.policy(name).get("status", {}).get("status") == "Ready", what="the policy applied")
    assert produce(console_node.process.bootstrap, topic, [GOOD, BAD]) == [None, None]
    visit(browser, f"/console/topics/{topic}?mode=offset&offset=0")
    rows = browser.wait(
        lambda: len(browser.all("table.records tbody tr")) == 2 and browser.all("table.records tbody tr")
    )
    headings = [th.text for th in browser.all("table.records thead th")]
    column = headings.index("Marking violations")
    good, bad = (r.find_elements("css selector", "td") for r in rows)
    assert good[column].text == "" and not rows[0].find_elements("css selector", ".badge")
    assert bad[column].text.startswith(f"{name}: {rule}")
    assert rows[1].find_element("css selector", ".badge").text == name  # the policy badge
    assert rule in bad[column].find_element("css selector", "details pre").get_attribute("textContent")
    browser.screenshot("topic-marked")
