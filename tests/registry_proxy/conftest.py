"""Fixtures of the registry proxy tests: a license, a credentials file, the test upstream, proxies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kanal_registry_proxy.testing import TestRegistry
from kanal_registry_proxy.testing.proxy import ProxyThread, credentials_file, license_pair

from registry_proxy.srp_helpers import USERS, command_line


@pytest.fixture(scope="session")
def license_keys() -> tuple[str, str, str]:
    """(token without expiry, public key PEM, private key PEM)."""
    return license_pair()


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    return credentials_file(tmp_path / "basic-auth.json", USERS)


@pytest.fixture
def upstream() -> Iterator[TestRegistry]:
    with TestRegistry() as registry:
        yield registry


@pytest.fixture
def base_env(license_keys: tuple[str, str, str], credentials: Path, upstream: TestRegistry) -> dict[str, str]:
    token, public_key, _ = license_keys
    return {
        "VENDOR_LICENSE": token,
        "VENDOR_LICENSE_PUBLIC_KEY": public_key,
        "AUTH_PROVIDER": "basic",
        "BASIC_AUTH_LOCATION": str(credentials),
        "AUTHORIZATION_MODE": "read-only",
        "SCHEMA_REGISTRY_URL": upstream.url,
        "AUTHORIZATION_SUPER_USERS": "root",
        "SRP_ACCESS_LOG": "false",
    }


@pytest.fixture
def make_proxy(base_env: dict[str, str]) -> Iterator[Callable[..., ProxyThread]]:
    started: list[ProxyThread] = []

    def make(**overrides: str) -> ProxyThread:
        env = {**base_env, **overrides}
        proxy = ProxyThread(env, cli=command_line(env)).start()
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.stop()
