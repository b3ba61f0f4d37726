"""The console in a real browser (headless Chromium): log in, the gateway and interceptors pages,
keyboard navigation, no JavaScript errors, a screenshot of each page."""

from __future__ import annotations

import httpx
import pytest
from conftest import ADMIN, Browser, ConsoleNode
from selenium.webdriver.common.keys import Keys

pytestmark = pytest.mark.integration


def test_log_in_and_see_the_gateway(browser: Browser, console_node: ConsoleNode) -> None:
    browser.open("/console/gateway")
    assert "/console/login" in browser.driver.current_url  # a stranger is asked to log in
    browser.log_in(ADMIN)
    assert browser.driver.current_url.endswith("/console/gateway")  # and comes back where they were going
    assert browser.find("h1").text == "Gateway"
    facts = browser.find("dl.facts").text
    assert "Ready" in facts and "0.1.0" in facts
    assert "this node" in browser.find("#fleet").find_element("xpath", "..").text
    plugin_types = [td.text for td in browser.all("table tbody tr td:first-child code")]
    assert "data-quality-policy" in plugin_types or len(plugin_types) > 5
    # the charts fill in as samples come (one every 10 s): the live region refreshes by itself
    region = browser.find("[data-refresh]")
    browser.wait(lambda: region.get_attribute("data-refreshed"), 30, "the live region refreshed")
    browser.wait(lambda: browser.all("svg.chart"), 30, "a chart drawn")
    browser.screenshot("gateway")
    assert browser.errors() == []


def test_interceptors_and_the_effective_chain(browser: Browser, console_node: ConsoleNode) -> None:
    payload = "<b>x-secret</b>|<script>document.title='owned'</script>"
    manifest = {
        "apiVersion": "gateway/v2",
        "kind": "Interceptor",
        "metadata": {"name": "strip-internal-headers"},
        "spec": {"pluginClass": "header-removal", "priority": 100, "config": {"headerKeyRegex": payload}},
    }
    answer = httpx.put(f"{console_node.base}/gateway/v2/interceptor", json=manifest, auth=ADMIN, timeout=10)
    assert answer.status_code == 200, answer.text
    browser.open("/console/interceptors")
    assert browser.find("h1").text == "Interceptors"
    row = browser.wait(lambda: browser.all("tbody tr"), what="the interceptor listed")[0]
    assert "strip-internal-headers" in row.text and "header-removal" in row.text
    assert payload in row.text  # shown as text, not run
    assert browser.driver.title != "owned"
    field = browser.find("#username")
    field.clear()
    field.send_keys("alice", Keys.ENTER)  # the keyboard alone submits the form
    browser.wait(lambda: "username=alice" in browser.driver.current_url, what="the resolve form submitted")
    chain = browser.find("ol.chain").text
    assert "strip-internal-headers" in chain  # a global interceptor applies to everyone
    browser.screenshot("interceptors")
    assert browser.errors() == []


def test_the_navigation_works_from_the_keyboard(browser: Browser) -> None:
    browser.open("/console/gateway")
    body = browser.find("body")
    body.send_keys(Keys.TAB)  # the first stop is the skip link
    assert browser.driver.switch_to.active_element.text == "Skip to content"
    links = [a.text for a in browser.all("nav a")]
    assert links[:2] == ["Gateway", "Interceptors"]
    assert browser.find("nav a[aria-current=page]").text == "Gateway"


def test_a_script_in_a_value_is_shown_as_text(browser: Browser) -> None:
    browser.open("/console/notes")
    payload = '<img src=x onerror="document.title=\'owned\'"><script>document.title="owned"</script>'
    browser.find("#text").send_keys(payload)
    browser.find("form.stack button[type=submit]").click()
    browser.wait(lambda: browser.all("p.flash"), what="the note added")
    assert payload in [li.text for li in browser.all("ul.notes li")]
    assert browser.driver.title != "owned" and not browser.all("ul.notes img, ul.notes script")
