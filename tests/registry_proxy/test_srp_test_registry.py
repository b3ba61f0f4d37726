"""The test upstream is pinned to Karapace: the whole capture replayed against it matches, except for
the parser message texts listed in TEST_REGISTRY_EXPECTATIONS."""

from __future__ import annotations

import json
import urllib.request

from kanal_registry_proxy.testing import TestRegistry
from kanal_registry_proxy.testing.replay import (
    CAPTURE_PERMISSIONS,
    CAPTURE_USERS,
    TEST_REGISTRY_EXPECTATIONS,
    basic,
    load,
    replay,
    report,
    user_of,
)


def test_the_capture_replays_against_the_test_registry() -> None:
    exchanges = load()
    assert len(exchanges) == 161
    with TestRegistry() as plain, TestRegistry(users=CAPTURE_USERS, permissions=CAPTURE_PERMISSIONS) as authfile:
        results = replay(
            lambda e: plain.url if e.scenario == "no-auth" else authfile.url,
            exchanges,
            TEST_REGISTRY_EXPECTATIONS,
            lambda e: basic(user) if (user := user_of(e)) else None,
        )
    assert len(results) == 161
    assert not report(results), "\n" + report(results)


def test_a_test_registry_in_a_process_of_its_own() -> None:
    registry = TestRegistry(mode="process").start()
    try:
        request = urllib.request.Request(
            registry.url + "/subjects/a-value/versions",
            data=json.dumps({"schema": '"string"'}).encode(),
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        )
        assert json.loads(urllib.request.urlopen(request).read()) == {"id": 1}
        assert json.loads(urllib.request.urlopen(registry.url + "/schemas/ids/1").read()) == {"schema": '"string"'}
    finally:
        registry.stop()
    assert registry.pid is None
