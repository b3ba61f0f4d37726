"""The conformance suite: every case under this folder replayed through an in-process gateway
against a scripted broker (no live broker), plus proof that a broken rewrite is caught.

Run it alone with ``pytest conformance`` or ``kanal conformance run conformance``.
See docs/conformance.md for how to record, add and update a case.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import kanal.pipeline.core_rules
from kanal.conformance.replay import Case, discover_cases, load_case, run_case
from kanal.protocol.api import ApiKey

HERE = Path(__file__).parent
CASES = discover_cases(HERE)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_case_replays_green(case: Case) -> None:
    result = run_case(case)
    assert result.ok, "\n" + result.report()
    assert result.responses > 0


def test_the_kafka_captures_are_cases_and_the_registry_capture_is_not() -> None:
    names = {c.name for c in CASES}
    assert {"captures/kafka/rdkafka", "captures/kafka/kafkapython", "captures/kafka/aiokafka"} <= names
    assert not any("registry" in name for name in names)  # HTTP exchanges, replayed by the registry suite


def test_a_gateway_that_forgets_the_findcoordinator_rewrite_fails_with_a_readable_diff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The core's rewrite is broken for FindCoordinator only (monkeypatched in this process): the
    client would be sent to the upstream broker directly. The replay must fail on exactly those
    responses, naming the field, the captured value and what the client got."""
    rewrite = kanal.pipeline.core_rules.rewrite_addresses

    def forgets_find_coordinator(api_key: int, body: Any, address_of: Any) -> Any:
        return None if api_key == ApiKey.FIND_COORDINATOR else rewrite(api_key, body, address_of)

    monkeypatch.setattr(kanal.pipeline.core_rules, "rewrite_addresses", forgets_find_coordinator)
    result = run_case(load_case(HERE / "captures" / "kafka" / "rdkafka.jsonl"))

    assert not result.ok
    report = result.report()
    assert report.startswith("FAIL rdkafka:")
    # rdkafka asks for the group coordinator three times (FindCoordinator v2), on conns 13 and 14.
    # The client is sent to the scripted upstream broker's port instead of the gateway's:
    #   FindCoordinator v2 response #48 (conn 13 seq 5): port: expected 19194 (<broker:111>),
    #   got 41943 (<upstream address, not rewritten>)
    for where in ("#48 (conn 13 seq 5)", "#51 (conn 14 seq 6)", "#53 (conn 14 seq 9)"):
        prefix = f"FindCoordinator v2 response {where}: port: expected 19194 (<broker:111>), got "
        line = next(line for line in result.failures if line.startswith(prefix))
        assert line.endswith(" (<upstream address, not rewritten>)"), line
    assert len(result.failures) == 3, report  # nothing else differs


def test_a_golden_case_fails_when_the_policy_answers_otherwise() -> None:
    """The same golden file, replayed with a policy that answers error 88 instead of 87."""
    case = load_case(HERE / "cases" / "partition-policy" / "partition-policy.case.yaml")
    assert case.config is not None
    case.config["interceptors"][0]["config"]["errorCode"] = 88
    result = run_case(case)
    assert not result.ok
    assert (
        "Produce v9 response #10 (conn 4 seq 5): responses[name=cap-kafkapython].partition_responses[index=1]"
        ".error_code: expected 87, got 88 (unstable_offset_commit)"
    ) in result.failures
