"""A case's ``resources:`` (admin-API manifests applied to the replay's gateway) and the
virtual-cluster golden case that needs them: its token logins need the service account, and a
gateway that renames wrongly, either way, fails it naming the topic."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

import kanal.conformance.resources as resources_module
from kanal.api.resources import Key, KindRegistry, Manifest, ResourceKind, StateView, Status
from kanal.cli import main
from kanal.config.settings import build_settings
from kanal.conformance.frames import C2G, G2U, read_frames
from kanal.conformance.replay import CaseError, load_case, run_case
from kanal.conformance.resources import ManifestError, apply_resources, check_manifests, describe_manifest
from kanal.gateway import Gateway
from kanal.identity.accounts import AccountType
from kanal.pipeline.registry import PluginRegistry
from kanal.tenancy.names import VirtualNames

ROOT = Path(__file__).resolve().parents[2]
CASE = ROOT / "conformance" / "cases" / "virtual-cluster" / "virtual-cluster.case.yaml"
CAPTURE = CASE.with_name("virtual-cluster.jsonl")
VCLUSTER: Manifest = {"apiVersion": "gateway/v2", "kind": "VirtualCluster", "metadata": {"name": "team-a."}}
ACCOUNT: Manifest = {
    "apiVersion": "gateway/v2",
    "kind": "GatewayServiceAccount",
    "metadata": {"name": "orders-app", "vCluster": "team-a."},
    "spec": {"type": "LOCAL"},
}


def case_env() -> dict[str, str]:
    doc = yaml.safe_load(CASE.read_text())
    return {str(k): str(v) for k, v in doc["env"].items()}


def write_case(tmp_path: Path, resources: Any, env: dict[str, str] | None = None, timeout: float = 5) -> Path:
    """A case file replaying the virtual-cluster capture with other resources (or env)."""
    path = tmp_path / "variant.case.yaml"
    doc = {"capture": str(CAPTURE), "env": case_env() if env is None else env, "timeout": timeout}
    path.write_text(yaml.safe_dump({**doc, "resources": resources}, sort_keys=False))
    return path


# -- the golden case -------------------------------------------------------------------------------


def test_the_virtual_cluster_case_replays_green_with_its_resources() -> None:
    case = load_case(CASE)
    assert [m["kind"] for m in case.resources] == ["VirtualCluster", "GatewayServiceAccount"]
    assert "team-a." in case.description
    result = run_case(case)
    assert result.ok, result.report()
    assert result.responses > 50 and result.upstream_requests > 40


def test_the_capture_holds_logical_names_client_side_and_prefixed_ones_upstream() -> None:
    frames = read_frames(CAPTURE)
    assert 100 <= len(frames) <= 500
    client = b"".join(f.data for f in frames if f.dir == C2G and f.api_key != 36)  # (36: the login)
    upstream = b"".join(f.data for f in frames if f.dir == G2U)
    assert b"orders" in client and b"team-a." not in client
    for name in (b"orders", b"orders-tx", b"billing", b"audit"):  # topic, transactional id, groups
        assert b"team-a." + name in upstream
    assert {f.api_key for f in frames if f.dir == G2U} >= {0, 1, 3, 8, 9, 10, 11, 14, 19, 22, 24, 26}


def test_without_its_resources_the_token_logins_are_refused(tmp_path: Path) -> None:
    """No service account on the replay's gateway: every login fails, so the case needs them."""
    result = run_case(load_case(write_case(tmp_path, [], timeout=1)))
    assert not result.ok
    assert any(
        re.fullmatch(
            r"SaslAuthenticate v\d response #\d+ \(conn 1 seq \d+\): error_code: expected 0 \(none\), "
            r"got 58 \(sasl_authentication_failed\)",
            line,
        )
        for line in result.failures
    ), result.report()


@pytest.mark.parametrize("direction", ["to the cluster", "to the client"])
def test_a_broken_renaming_fails_the_case_naming_the_topic(monkeypatch: pytest.MonkeyPatch, direction: str) -> None:
    """The renaming broken in this process, one way at a time: the wrong prefix on the way to the
    cluster shows in the forwarded requests, a wrong logical name in the client's responses."""
    if direction == "to the cluster":
        monkeypatch.setattr(VirtualNames, "topic", lambda self, logical: "team-b." + logical)
        line = (
            r"Metadata v\d+ upstream request \(conn \d+ seq \d+\): topics\[topic_id=None\]\.name: "
            r'expected "team-a\.orders", got "team-b\.orders"'
        )
    else:

        def logical_topic(self: VirtualNames, physical: str) -> str | None:
            return "x-" + physical.removeprefix(self.prefix) if physical.startswith(self.prefix) else None

        monkeypatch.setattr(VirtualNames, "logical_topic", logical_topic)
        line = (
            r"Metadata v\d+ response #\d+ \(conn \d+ seq \d+\): topics\[error_code=0\]\.name: "
            r'expected "orders", got "x-orders"'
        )
    result = run_case(load_case(CASE))
    assert not result.ok
    assert any(re.fullmatch(line, failure) for failure in result.failures), result.report()
    assert all("orders" in failure for failure in result.failures), result.report()


# -- resources: -----------------------------------------------------------------------------------


def test_resources_are_applied_to_the_gateway_as_the_admin_api_applies_them() -> None:
    settings = build_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", **case_env()})
    gateway = Gateway(settings, PluginRegistry())
    trio.run(apply_resources, gateway, [VCLUSTER, ACCOUNT])
    cluster = gateway.virtual_clusters.get("team-a.")
    assert cluster is not None and not cluster.acl_enabled  # the kind's defaults
    account = gateway.service_accounts.get("orders-app", "team-a.")
    assert account is not None and account.type is AccountType.LOCAL
    assert gateway.service_accounts.get("orders-app") is None


@pytest.mark.parametrize(
    ("resources", "env", "message"),
    [
        (
            [VCLUSTER, {**ACCOUNT, "spec": {"type": "BOGUS"}}],
            None,
            "resources[1] (GatewayServiceAccount 'orders-app', vCluster 'team-a.'): spec.type is required:"
            " LOCAL or EXTERNAL, got 'BOGUS' (400 Invalid resource)",
        ),
        (
            [{**VCLUSTER, "kind": "VirtualClustr"}],
            None,
            "resources[0] (VirtualClustr 'team-a.'): unknown kind (this gateway knows ",
        ),
        (
            [VCLUSTER, {**VCLUSTER, "metadata": {"name": "team-a.b."}}],
            None,
            "resources[1] (VirtualCluster 'team-a.b.'): virtual cluster 'team-a.b.' and 'team-a.': one name starts"
            " with the other",
        ),
        (
            [VCLUSTER],
            {},
            "resources[0] (VirtualCluster 'team-a.'): virtual clusters need clients the gateway authenticates",
        ),
    ],
    ids=["bad-field", "unknown-kind", "checked-against-earlier-ones", "checked-against-the-settings"],
)
def test_a_manifest_the_gateway_refuses_fails_the_case_naming_it(
    tmp_path: Path, resources: list[Manifest], env: dict[str, str] | None, message: str
) -> None:
    path = write_case(tmp_path, resources, env)
    with pytest.raises(CaseError) as refused:
        run_case(load_case(path))
    assert str(refused.value).startswith(f"{path}: {message}"), refused.value


def test_a_manifest_its_kind_fails_to_apply_fails_the_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind that validates a resource but reports it Failed once applied (as an interceptor whose
    constructor refuses its config does)."""

    def apply(resources: Sequence[Manifest], state: StateView) -> dict[Key, Status]:
        return {("broken",): Status("Failed", "the constructor refused its config")}

    def validate(manifest: Manifest, state: StateView) -> Manifest:
        return {"apiVersion": "gateway/v2", "kind": "Fragile", "metadata": dict(manifest["metadata"]), "spec": {}}

    def kinds(gateway: Any) -> KindRegistry:
        registry = KindRegistry()
        registry.add(ResourceKind("Fragile", "fragile", validate, apply))
        return registry

    monkeypatch.setattr(resources_module, "collect_kinds", kinds)
    settings = build_settings({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9"})
    manifests = [{"kind": "Fragile", "metadata": {"name": "fine"}}, {"kind": "Fragile", "metadata": {"name": "broken"}}]
    with pytest.raises(ManifestError, match=r"^resources\[1\] \(Fragile 'broken'\): failed to apply: the constructor"):
        trio.run(apply_resources, Gateway(settings, PluginRegistry()), manifests)


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"kind": "VirtualCluster"}, "resources must be a list of admin-API manifests"),
        (["VirtualCluster"], "resources[0] must be a manifest (a mapping), got str"),
        ([VCLUSTER, {"metadata": {"name": "x"}}], "resources[1] (no kind 'x'): kind is required"),
        ([{**VCLUSTER, "kind": 7}], "resources[0] (7 'team-a.'): kind must be a kind's name, got 7"),
    ],
)
def test_resources_that_are_not_manifests_make_the_case_file_invalid(
    tmp_path: Path, resources: Any, message: str
) -> None:
    path = write_case(tmp_path, resources)
    with pytest.raises(CaseError) as invalid:
        load_case(path)
    assert str(invalid.value) == f"{path}: {message}" or str(invalid.value).startswith(f"{path}: {message}")


def test_check_manifests_and_describe_manifest() -> None:
    assert check_manifests(None) == []
    assert check_manifests([VCLUSTER]) == [VCLUSTER]
    assert describe_manifest(0, ACCOUNT) == "resources[0] (GatewayServiceAccount 'orders-app', vCluster 'team-a.')"
    interceptor = {"kind": "Interceptor", "metadata": {"name": "x", "scope": {"vCluster": "b."}}}
    assert describe_manifest(2, interceptor) == "resources[2] (Interceptor 'x', vCluster 'b.')"


def test_kanal_conformance_run_prints_the_refused_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_case(tmp_path, [VCLUSTER, {**ACCOUNT, "spec": {"type": "BOGUS"}}])
    assert main(["conformance", "run", str(path)]) == 1
    out = capsys.readouterr().out
    assert f"ERROR variant: {path}: resources[1] (GatewayServiceAccount 'orders-app', vCluster 'team-a.')" in out
