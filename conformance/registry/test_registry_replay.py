"""Registry replay: the captured Karapace exchanges replayed through the registry proxy in front of the
test upstream, answers compared with the capture modulo the documented differences below.

Both scenarios of ``captures/registry/karapace.jsonl`` are replayed, each against a fresh upstream:

- ``no-auth`` (seq 1-126): every call made as the super user ``admin`` (Karapace had no
  authentication); the proxy's answer must be the captured one.
- ``authfile`` (seq 127-161): the proxy authenticates admin, alice and bob itself (basic provider)
  and authorizes them in reactive mode with permissions equivalent to Karapace's ACLs of the capture
  (admin: super user; alice: Read+Write on the prefix ``orders-``, Read on ``payments-value``; bob:
  Read on the prefix ``orders-value``, Karapace's regex being anchored at the start only).

Calls the proxy does not route (deletions, config and mode changes, exporters) must answer 404
without reaching the registry; where the capture shows them succeeding, the replay then sends them
to the registry directly, as an operator would ("administration goes to the registry directly"), so
that later exchanges see the same state. Every other difference is listed in :data:`EXPECTED` with
its reason. See docs/conformance.md, "Registry replay".
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kanal_registry_proxy import routes
from kanal_registry_proxy.authorization import ReactiveMode
from kanal_registry_proxy.reactive import PermissionStore, application_instance
from kanal_registry_proxy.testing import TestRegistry
from kanal_registry_proxy.testing.proxy import ProxyThread, credentials_file, license_pair
from kanal_registry_proxy.testing.replay import (
    CAPTURE_USERS,
    Exchange,
    Expectation,
    basic,
    compare,
    load,
    send,
    user_of,
)

CAPTURE = Path(__file__).resolve().parents[1] / "captures" / "registry" / "karapace.jsonl"

# Differences between Karapace in the capture and the proxy in front of the test upstream.
EXPECTED: dict[int, Expectation] = {
    # test upstream versus Karapace (see kanal_registry_proxy.testing.replay)
    45: Expectation("error_code", "unknown Avro type: fastavro's message text, not Avro's"),
    46: Expectation("error_code", "unparsable schema: orjson's message text"),
    51: Expectation("error_code", "malformed body: the pydantic error details differ"),
    # the proxy's own choices
    92: Expectation("status", "exporters are not routed: the proxy's 404 envelope, not Karapace's string", 404),
    93: Expectation("status", "exporters are not routed: the proxy's 404 envelope, not Karapace's string", 404),
    95: Expectation("status", "/v1/metadata is not routed: the proxy's 404 envelope", 404),
    96: Expectation("status", "/v1/metadata is not routed: the proxy's 404 envelope", 404),
    100: Expectation(
        "status", "a POST without Content-Type is sent with the registry's type: 200, not Karapace's 500", 200
    ),
    127: Expectation("status", "401 in the Confluent envelope with WWW-Authenticate, not Karapace's bare message", 401),
    128: Expectation("status", "401 in the Confluent envelope with WWW-Authenticate", 401),
    129: Expectation("status", "401 in the Confluent envelope with WWW-Authenticate", 401),
    137: Expectation("status", "a denial is 403 (40301), not disguised as 404 40401 like Karapace", 403),
    138: Expectation("status", "a denial is 403 (40301), not disguised as 404 40401", 403),
    141: Expectation("status", "a denial is 403 (40301), not disguised as 404 40401", 403),
    142: Expectation("status", "a schema id no readable subject holds is 403, not disguised as 404 40403", 403),
    146: Expectation("status", "a denial is 403 (40301), not disguised as 404 40401", 403),
    147: Expectation("status", "a denial is 403 (40301), not disguised as 404 40401", 403),
    148: Expectation("status", "GET /config is a global read: open to every authenticated principal", 200),
    149: Expectation("status", "GET /mode is a global read: open to every authenticated principal", 200),
    155: Expectation("status", "every proxied route needs authentication, /schemas/types included", 401),
    157: Expectation("status", "every proxied route needs authentication, the root included", 401),
}


def blocked(exchange: Exchange) -> bool:
    found = routes.match(exchange.method, exchange.path.encode())
    return found is not None and found.route.check == "blocked"


def run_scenario(scenario: str, tmp_path: Path) -> list[str]:
    token, public_key, _ = license_pair()
    credentials = credentials_file(tmp_path / f"{scenario}.json", CAPTURE_USERS)
    problems: list[str] = []
    with TestRegistry() as upstream:
        env = {
            "VENDOR_LICENSE": token,
            "VENDOR_LICENSE_PUBLIC_KEY": public_key,
            "AUTH_PROVIDER": "basic",
            "BASIC_AUTH_LOCATION": str(credentials),
            "AUTHORIZATION_MODE": "read-only",
            "AUTHORIZATION_SUPER_USERS": "admin",
            "SCHEMA_REGISTRY_URL": upstream.url,
            "SRP_ACCESS_LOG": "false",
        }
        with ProxyThread(env) as proxy:
            store = PermissionStore()
            store.apply(*application_instance("alice", "alice", [("PREFIXED", "orders-", ["Read", "Write"])]))
            store.apply(*application_instance("alice-payments", "alice", [("LITERAL", "payments-value", ["Read"])]))
            store.apply(*application_instance("bob", "bob", [("PREFIXED", "orders-value", ["Read"])]))
            proxy.service.authorization.mode = ReactiveMode(store, None)
            for exchange in load(CAPTURE):
                if exchange.scenario != scenario:
                    continue
                if scenario == "no-auth":
                    authorization: str | None = basic(f"admin:{CAPTURE_USERS['admin']}")
                else:
                    user = user_of(exchange)
                    authorization = basic(user) if user else None
                status, content_type, payload = send(proxy.url, exchange, authorization)
                if blocked(exchange):
                    if status != 404:
                        problems.append(f"seq {exchange.seq}: not routed, expected 404, got {status}")
                    if exchange.status < 400:  # it happened in the capture: the operator does it directly
                        status, content_type, payload = send(upstream.url, exchange, None)
                        problem = compare(exchange, status, content_type, payload, EXPECTED.get(exchange.seq))
                        if problem:
                            problems.append(f"seq {exchange.seq} ({exchange.label}), sent directly: {problem}")
                    continue
                problem = compare(exchange, status, content_type, payload, EXPECTED.get(exchange.seq))
                if problem:
                    problems.append(f"seq {exchange.seq} ({exchange.label}): {problem}")
    return problems


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


@pytest.mark.parametrize("scenario", ["no-auth", "authfile"])
def test_registry_capture_replays_through_the_proxy(scenario: str, workdir: Path) -> None:
    problems = run_scenario(scenario, workdir)
    assert not problems, "\n" + "\n".join(problems)


def test_every_documented_difference_is_used() -> None:
    seqs = {exchange.seq for exchange in load(CAPTURE)}
    assert set(EXPECTED) <= seqs
    assert all(expectation.reason for expectation in EXPECTED.values())
