"""The identity pages: service accounts (and a token minted for one, used to log a Kafka client in),
gateway groups and virtual clusters created, edited and deleted through the forms, a refused form
showing the admin API's message with the input kept, read-only users seeing everything but
changing nothing, hostile names shown as text, the audit log listing the console's own changes, and
the pages in a browser.

The node here has a SASL PLAIN listener and a user pool key: virtual clusters need clients the
gateway authenticates, and tokens need the key that signs them."""

from __future__ import annotations

import base64
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import quote

import httpx
import pytest
from confluent_kafka import Producer
from conftest import ADMIN, USERS, VIEWER, Browser, ConsoleNode, csrf_of
from markupsafe import escape

from kanal.embedded import GatewayProcess, TansuBroker
from kanal.identity.tokens import TokenClaims, verify

pytestmark = pytest.mark.integration

SECRET = os.urandom(32)
PAYLOAD = '<script>document.title="owned"</script><img src=x onerror=alert(1)>'


@pytest.fixture(scope="module")
def console_node(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConsoleNode]:
    """This module's node (it replaces the shared one): SASL PLAIN clients, a user pool key, and a
    cluster id of its own (so a state of its own)."""
    env = {
        **tansu.gateway_settings(),
        "GATEWAY_ADMIN_API_USERS": USERS,
        "GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "GATEWAY_USER_POOL_SECRET_KEY": base64.b64encode(SECRET).decode(),
        "GATEWAY_CLUSTER_ID": f"console-identity-{uuid.uuid4().hex[:8]}",
    }
    process = GatewayProcess(env, log_path=tmp_path_factory.mktemp("console-identity") / "gateway.log")
    process.start(timeout=30)
    try:
        yield ConsoleNode(process)
    finally:
        process.stop()


def escaped(text: str) -> str:
    """``text`` as the pages write it."""
    return str(escape(text))


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


def post(client: httpx.Client, path: str, data: dict[str, str]) -> httpx.Response:
    """A form posted as a browser would, with the session's CSRF token."""
    return client.post(path, data={"csrf": csrf_of(client.get("/console/audit").text), **data})


def saved(client: httpx.Client, path: str, data: dict[str, str]) -> str:
    """Posts a form that must be accepted, and answers the page it leads to (with its message)."""
    answer = post(client, f"/console/{path}/save", data)
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == f"/console/{path}"
    return client.get(answer.headers["location"]).text


def account(name: str, vcluster: str = "", kind: str = "LOCAL", external: str = "") -> dict[str, str]:
    return {"name": name, "vCluster": vcluster, "type": kind, "externalNames": external}


def cluster(name: str, acl: bool = False, mode: str = "KAFKA_API", acls: str = "") -> dict[str, str]:
    form = {"name": name, "aclMode": mode, "type": "Standard", "superUsers": "", "acls": acls}
    return {**form, "aclEnabled": "on"} if acl else form


def eventually(condition: Callable[[], object], timeout: float = 10, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_accounts_groups_and_virtual_clusters_through_the_forms(console_node: ConsoleNode) -> None:
    client = console_node.session(ADMIN)
    tenant = f"t{uuid.uuid4().hex[:6]}."
    acl = (
        '[{"resourcePattern": {"resourceType": "TOPIC", "name": "orders-", "patternType": "PREFIXED"},'
        ' "principal": "User:orders-app", "operation": "READ"}]'
    )
    page = saved(client, "virtual-clusters", cluster(tenant, acl=True, mode="REST_API", acls=acl))
    assert f"Virtual cluster {escaped(repr(tenant))} created." in page
    app, partner, group = unique("orders-app"), unique("partner"), unique("payments")
    page = saved(client, "service-accounts", account(app, tenant))
    assert f"Service account {escaped(repr(app))} (vCluster={tenant}) created." in page
    saved(client, "service-accounts", account(partner, kind="EXTERNAL", external="0oa-sub-1\n0oa-sub-2"))
    page = client.get("/console/service-accounts").text
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", page, re.DOTALL) if partner in r)
    assert "EXTERNAL" in row and "<code>0oa-sub-1</code><br><code>0oa-sub-2</code>" in row and "Ready" in row

    members = f"{app} @ {tenant}\nalice"
    page = saved(client, "groups", {"name": group, "members": members, "externalGroups": "payments-team"})
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", page, re.DOTALL) if group in r)
    assert f'{app} <span class="kind">in {tenant}</span>' in row and "alice" in row and "payments-team" in row

    listing = client.get("/console/virtual-clusters").text
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", listing, re.DOTALL) if tenant in r)
    assert app in row and ">on<" in row and "REST_API" in row
    detail = client.get(f"/console/virtual-clusters/{tenant}").text
    assert "User:orders-app" in detail and "PREFIXED" in detail and app in detail
    assert "security.protocol=SASL_PLAINTEXT" in detail
    assert client.get("/console/virtual-clusters/nothing-here.").status_code == 404

    # edit: the form of the existing group, its name fixed; then delete it
    form = client.get("/console/groups", params={"name": group}).text
    assert f"Edit group {group}" in form and re.search(rf'name="name" value="{group}" readonly', form)
    assert escaped(members) in form
    page = saved(client, "groups", {"name": group, "members": "alice", "externalGroups": "", "editing": "1"})
    assert f"Group {escaped(repr(group))} updated." in page
    answer = post(client, "/console/groups/delete", {"name": group})
    assert answer.status_code == 303
    page = client.get("/console/groups").text
    assert f"Group {escaped(repr(group))} deleted." in page and f">{group}<" not in page
    # and what the console stored is what the admin API shows
    api = httpx.get(f"{console_node.base}/gateway/v2/service-account/{app}", params={"vCluster": tenant}, auth=ADMIN)
    assert api.status_code == 200 and api.json()["spec"] == {"type": "LOCAL"}


def test_a_refused_form_shows_the_api_message_with_the_input_kept(console_node: ConsoleNode) -> None:
    client = console_node.session(ADMIN)
    name = unique("local-app")
    answer = post(client, "/console/service-accounts/save", account(name, external="someone-else"))
    assert answer.status_code == 400
    assert "spec.externalNames is only for EXTERNAL accounts" in answer.text
    assert f'value="{name}"' in answer.text and ">someone-else</textarea>" in answer.text  # as typed

    tenant = f"t{uuid.uuid4().hex[:6]}."
    answer = post(client, "/console/virtual-clusters/save", cluster(tenant, mode="REST_API", acls="[{oops"))
    assert answer.status_code == 400 and "spec.acls: not JSON" in answer.text and "[{oops</textarea>" in answer.text
    saved(client, "virtual-clusters", cluster(tenant))
    answer = post(client, "/console/virtual-clusters/save", cluster(tenant + "x."))
    assert answer.status_code == 409 and "one name starts with the other" in answer.text
    answer = post(client, "/console/virtual-clusters/save", cluster(tenant, mode="REST_API"))
    assert answer.status_code == 409 and "cannot change" in answer.text
    answer = post(client, "/console/groups/delete", {"name": "no-such-group"})
    assert "does not exist" in client.get(answer.headers["location"]).text


def test_a_token_minted_in_the_console_logs_a_kafka_client_in(console_node: ConsoleNode) -> None:
    client = console_node.session(ADMIN)
    tenant, app = f"t{uuid.uuid4().hex[:6]}.", unique("billing-app")
    saved(client, "virtual-clusters", cluster(tenant))
    saved(client, "service-accounts", account(app, tenant))
    mint = {"name": app, "vCluster": tenant, "lifeTimeSeconds": "600"}
    answer = post(client, "/console/service-accounts/token", mint)
    assert answer.status_code == 200 and "no-store" in answer.headers["cache-control"]
    found = re.search(r'<pre id="token"[^>]*>([^<]+)</pre>', answer.text)
    assert found is not None
    token = found.group(1)
    claims = verify(token, SECRET)
    assert isinstance(claims, TokenClaims) and (claims.username, claims.vcluster) == (app, tenant)

    gateway = console_node.process.env
    config = {
        "bootstrap.servers": f"127.0.0.1:{gateway['GATEWAY_PORT_START']}",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": app,
    }
    Producer({**config, "sasl.password": token}).list_topics(timeout=10)  # logged in: it answers
    logins = {"type": "AUTHENTICATION", "principal": app}
    eventually(lambda: "SUCCESS" in client.get("/console/audit", params=logins).text, what="the login audited")
    assert tenant in client.get("/console/audit", params=logins).text  # in its virtual cluster

    # audited (the account, never the token), and the token nowhere but on its page
    audit = client.get("/console/audit", params={"type": "ADMIN_API_CALL", "principal": ADMIN[0]}).text
    assert "MINT_TOKEN" in audit and app in audit and token not in audit
    assert console_node.process.wait_for_output("MINT_TOKEN")
    assert token not in console_node.process.output
    answer = post(client, "/console/service-accounts/token", {**mint, "lifeTimeSeconds": "0"})
    assert "lifeTimeSeconds is required" in client.get(answer.headers["location"]).text


def test_read_only_users_see_the_pages_but_no_forms(console_node: ConsoleNode) -> None:
    admin, viewer = console_node.session(ADMIN), console_node.session(VIEWER)
    tenant, app = f"t{uuid.uuid4().hex[:6]}.", unique("viewer-sees")
    saved(admin, "virtual-clusters", cluster(tenant))
    saved(admin, "service-accounts", account(app, tenant))
    for path in ("service-accounts", "groups", "virtual-clusters", f"virtual-clusters/{tenant}", "audit"):
        page = viewer.get(f"/console/{path}")
        assert page.status_code == 200, path
        assert 'method="post"' not in page.text.replace('method="post" action="/console/logout"', ""), path
    assert app in viewer.get("/console/service-accounts").text
    for path, data in (
        ("service-accounts/save", account(unique("sneaky"))),
        ("service-accounts/delete", {"name": app, "vCluster": tenant}),
        ("service-accounts/token", {"name": app, "vCluster": tenant, "lifeTimeSeconds": "600"}),
        ("groups/save", {"name": unique("g"), "members": "", "externalGroups": ""}),
        ("virtual-clusters/delete", {"name": tenant}),
    ):
        answer = post(viewer, f"/console/{path}", data)
        assert answer.status_code == 403 and "read-only" in answer.text, path
        assert '<pre id="token"' not in answer.text
    assert app in viewer.get("/console/service-accounts").text  # nothing changed


def test_hostile_names_are_shown_as_text(console_node: ConsoleNode) -> None:
    client = console_node.session(ADMIN)
    name, group = unique("hostile"), unique("hostile")
    page = saved(client, "service-accounts", account(name, kind="EXTERNAL", external=PAYLOAD))
    assert PAYLOAD not in page and escaped(PAYLOAD) in page
    page = saved(client, "groups", {"name": group, "members": PAYLOAD, "externalGroups": PAYLOAD})
    assert PAYLOAD not in page and page.count(escaped(PAYLOAD)) >= 2
    edit = client.get("/console/groups", params={"name": group}).text
    assert PAYLOAD not in edit and "&lt;script&gt;" in edit
    answer = client.get("/console/audit", params={"principal": PAYLOAD, "from": PAYLOAD})
    assert answer.status_code == 400 and "from:" in answer.text and PAYLOAD not in answer.text
    # (gone again: the screenshots show the pages as an operator would see them)
    assert post(client, "/console/groups/delete", {"name": group}).status_code == 303
    assert post(client, "/console/service-accounts/delete", {"name": name}).status_code == 303


def test_the_audit_log_lists_the_console_changes(console_node: ConsoleNode) -> None:
    client = console_node.session(ADMIN)
    group = unique("audited")
    saved(client, "groups", {"name": group, "members": "alice", "externalGroups": ""})

    def listed(**params: str) -> str:
        answer = client.get("/console/audit", params=params)
        assert answer.status_code == 200
        return answer.text

    eventually(lambda: group in listed(type="ADMIN_API_CALL"), what="the change in the audit log")
    page = listed(type="ADMIN_API_CALL", principal=ADMIN[0])
    assert "UPSERT" in page and "GatewayGroup" in page and "/console/groups/save" in page
    assert group not in listed(principal=VIEWER[0])
    assert group not in listed(type="AUTHENTICATION")
    future = str(int(time.time() * 1000) + 3_600_000)
    assert "No events match these filters." in listed(**{"from": future})
    assert group in listed(**{"from": "2020-01-01T00:00:00Z", "to": future})


def test_the_pages_in_a_browser(browser: Browser, console_node: ConsoleNode) -> None:
    client = console_node.session(ADMIN)
    tenant = f"t{uuid.uuid4().hex[:6]}."
    saved(client, "virtual-clusters", cluster(tenant, acl=True))
    saved(client, "service-accounts", account(unique("inventory-app"), tenant))
    browser.log_in(ADMIN)
    browser.open("/console/groups")
    group = unique("payments")
    browser.find("#groups-name").send_keys(group)
    browser.find("#groups-members").send_keys("alice\nbob @ team-a.")
    browser.find("#groups-externalGroups").send_keys("payments-team")
    browser.find("form.stack button[type=submit]").click()
    browser.wait(lambda: browser.all("p.flash"), what="the group created")
    assert f"Group '{group}' created." in browser.find("p.flash").text
    for path, title, shot in (
        ("service-accounts", "Service accounts", "service-accounts"),
        ("groups", "Groups", "groups"),
        ("virtual-clusters", "Virtual clusters", "virtual-clusters"),
        ("audit", "Audit log", "audit"),
    ):
        browser.open(f"/console/{path}")
        assert browser.find("h1").text == title
        assert browser.find("nav a[aria-current=page]").text == title
        browser.screenshot(shot)
        assert browser.errors() == [], path
    browser.open("/console/virtual-clusters")
    assert browser.find(f'tbody a[href="/console/virtual-clusters/{tenant}"]').text == tenant  # listed, linked
    browser.open(f"/console/virtual-clusters/{tenant}")
    assert browser.find("h1").text == f"Virtual cluster {tenant}"
    assert "security.protocol=SASL_PLAINTEXT" in browser.find("#client").find_element("xpath", "..").text
    assert browser.errors() == []
    browser.open("/console/audit?principal=" + quote(PAYLOAD))  # a hostile filter comes back as text
    assert browser.find("#principal").get_attribute("value") == PAYLOAD
    assert browser.driver.title != "owned" and not browser.all("main img, main script")
