"""Who may see and change what through the console, over HTTP as a browser speaks it: the login
form and its session, HTTP Basic for reading, forms only with their CSRF token from a session, read-only
users refused any change, no open redirect, nothing secret logged, every value escaped, the security
headers. The page that changes something is the plugin author guide's notes example, installed as a
third-party plugin would be."""

from __future__ import annotations

import re

import httpx
import pytest
from conftest import ADMIN, VIEWER, ConsoleNode, csrf_of

pytestmark = pytest.mark.integration

PAYLOADS = ['<script>alert("x")</script>', '"><img src=x onerror=alert(1)>', "</textarea><b>bold</b>"]


def test_a_stranger_is_sent_to_the_login_form_and_comes_back(console_node: ConsoleNode) -> None:
    client = httpx.Client(base_url=console_node.base, follow_redirects=False, timeout=10)
    answer = client.get("/console/interceptors?username=a")
    assert answer.status_code == 303
    assert answer.headers["location"] == "/console/login?next=/console/interceptors%3Fusername%3Da"
    assert client.post("/console/notes/add", data={"text": "x"}).status_code == 401
    login = client.get(answer.headers["location"])
    token = csrf_of(login.text)
    answer = client.post(
        "/console/login?next=/console/interceptors%3Fusername%3Da",
        data={"csrf": token, "username": ADMIN[0], "password": ADMIN[1]},
    )
    assert (answer.status_code, answer.headers["location"]) == (303, "/console/interceptors?username=a")
    page = client.get("/console/interceptors?username=a")
    assert page.status_code == 200 and "<h1>Interceptors</h1>" in page.text


def test_a_wrong_password_is_refused_and_never_logged(console_node: ConsoleNode) -> None:
    client = httpx.Client(base_url=console_node.base, follow_redirects=False, timeout=10)
    token = csrf_of(client.get("/console/login").text)
    answer = client.post("/console/login", data={"csrf": token, "username": "ops", "password": "wrong-Pa55word"})
    assert answer.status_code == 401 and "Wrong user name or password" in answer.text
    assert client.get("/console/gateway").status_code == 303  # no session came of it
    assert console_node.process.wait_for_output("CONSOLE_LOGIN result=FAILURE user=ops")
    assert "wrong-Pa55word" not in console_node.process.output and ADMIN[1] not in console_node.process.output


def test_the_login_never_redirects_elsewhere(console_node: ConsoleNode) -> None:
    client = httpx.Client(base_url=console_node.base, follow_redirects=False, timeout=10)
    for target in ("http://evil.example/console", "//evil.example/console", "/gateway/v2/plugin"):
        token = csrf_of(client.get("/console/login").text)
        answer = client.post(
            "/console/login", params={"next": target}, data={"csrf": token, "username": "ops", "password": ADMIN[1]}
        )
        assert answer.headers["location"] == "/console", target


def test_basic_credentials_read_pages_but_change_nothing(console_node: ConsoleNode) -> None:
    page = httpx.get(f"{console_node.base}/console/gateway", auth=ADMIN, timeout=10)
    assert page.status_code == 200 and "<h1>Gateway</h1>" in page.text
    answer = httpx.post(f"{console_node.base}/console/notes/add", auth=ADMIN, data={"text": "x"}, timeout=10)
    assert answer.status_code == 403 and "console login" in answer.text


def test_a_form_needs_its_token(console_node: ConsoleNode) -> None:
    client = console_node.session(ADMIN)
    assert client.post("/console/notes/add", data={"text": "forged"}).status_code == 403
    assert client.post("/console/notes/add", data={"text": "forged", "csrf": "guess"}).status_code == 403
    assert "forged" not in client.get("/console/notes").text


def test_a_read_only_user_sees_everything_and_changes_nothing(console_node: ConsoleNode) -> None:
    viewer = console_node.session(VIEWER)
    page = viewer.get("/console/notes")
    assert page.status_code == 200 and "<textarea" not in page.text  # the template offers no form
    token = csrf_of(viewer.get("/console/gateway").text)  # (the log-out form's)
    answer = viewer.post("/console/notes/add", data={"text": "sneaky", "csrf": token})
    assert answer.status_code == 403 and "read-only" in answer.text
    assert "sneaky" not in viewer.get("/console/notes").text


def test_every_value_is_escaped_and_the_headers_forbid_foreign_scripts(console_node: ConsoleNode) -> None:
    client = console_node.session(ADMIN)
    for payload in PAYLOADS:
        token = csrf_of(client.get("/console/notes").text)
        answer = client.post("/console/notes/add", data={"text": payload, "csrf": token})
        assert (answer.status_code, answer.headers["location"]) == (303, "/console/notes")
    page = client.get("/console/notes")
    assert "Note added." in page.text  # the message after the form, shown once
    assert "Note added." not in client.get("/console/notes").text
    for payload in PAYLOADS:
        assert payload not in page.text
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page.text
    assert "&lt;/textarea&gt;&lt;b&gt;bold&lt;/b&gt;" in page.text
    assert not re.search(r"<script(?! src=\"/console/static/console.js\")", page.text)
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    cookie = client.cookies.jar
    assert any(c.name == "kanal_console" and c.has_nonstandard_attr("HttpOnly") for c in cookie)


def test_log_out_ends_the_session(console_node: ConsoleNode) -> None:
    client = console_node.session(ADMIN)
    token = csrf_of(client.get("/console/gateway").text)
    assert client.post("/console/logout", data={"csrf": token}).status_code == 303
    assert client.get("/console/gateway").status_code == 303  # to the login form again
