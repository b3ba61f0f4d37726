"""KMS external connections from environment variables: what works, and every startup error,
which must name the variable at fault."""

from __future__ import annotations

from pathlib import Path

import pytest
from kanal_encryption.kms.aws import AwsSettings
from kanal_encryption.kms.azure import AzureSettings
from kanal_encryption.kms.connections import (
    TYPES,
    check_kms_connections,
    parse_kms_connections,
)
from kanal_encryption.kms.gcp import GcpSettings
from kanal_encryption.kms.vault_client import VaultSettings

from kanal.api import ConfigError

P = "GATEWAY_EXTERNAL_CONNECTION_"


def vault(name: str = "VAULT1", **props: str) -> dict[str, str]:
    env = {f"{P}{name}_TYPE": "VAULT", f"{P}{name}_CONFIG_URI": "http://vault:8200", f"{P}{name}_CONFIG_TOKEN": "t0k3n"}
    env.update({f"{P}{name}_CONFIG_{k}": v for k, v in props.items()})
    return env


def error_of(env: dict[str, str], environ: dict[str, str] | None = None) -> ConfigError:
    """The ConfigError of ``env``; the startup check (placeholders from the process) fails alike."""
    with pytest.raises(ConfigError) as caught:
        parse_kms_connections(env, env if environ is None else environ)
    if environ is None:
        with pytest.raises(ConfigError) as again:
            check_kms_connections(env)
        assert again.value.key == caught.value.key
    return caught.value


def test_vault_defaults() -> None:
    connection = parse_kms_connections(vault(), {})["VAULT1"]
    settings = connection.settings
    assert isinstance(settings, VaultSettings)
    assert (connection.type, connection.kind, connection.engine) == ("VAULT", "vault-kms", "TRANSIT")
    assert (settings.uri, settings.mount, settings.auth.type, settings.timeout_ms) == (
        "http://vault:8200",
        "transit",
        "TOKEN",
        10_000,
    )
    assert "t0k3n" not in repr(connection) and "t0k3n" not in repr(settings)


def test_vault_every_auth_type() -> None:
    env = {
        **vault("A", AUTH_TYPE="APP_ROLE", ROLE_ID="r", SECRET_ID="s", PATH="my-approle"),
        **vault("U", AUTH_TYPE="USERNAME_PASSWORD", USERNAME="u", PASSWORD="p", USERPASS_AUTH_MOUNT="up"),
        **vault("K", AUTH_TYPE="KUBERNETES", ROLE="gw"),
        **vault("J", AUTH_TYPE="jwt", ROLE="gw", JWT_PATH="token.jwt", NAMESPACE="team", TIMEOUT_MS="2500"),
    }
    for name in "AUKJ":
        del env[f"{P}{name}_CONFIG_TOKEN"]
    connections = parse_kms_connections(env, {})
    auth = {name: c.settings.auth for name, c in connections.items() if isinstance(c.settings, VaultSettings)}
    assert (auth["A"].type, auth["A"].auth_mount()) == ("APP_ROLE", "my-approle")
    assert (auth["U"].type, auth["U"].auth_mount()) == ("USERNAME_PASSWORD", "up")
    assert (auth["K"].type, auth["K"].auth_mount(), auth["K"].jwt_path) == ("KUBERNETES", "kubernetes", None)
    assert (auth["J"].type, auth["J"].auth_mount(), auth["J"].jwt_path) == ("JWT", "jwt", "token.jwt")
    j = connections["J"].settings
    assert isinstance(j, VaultSettings) and (j.namespace, j.timeout_ms) == ("team", 2500)


def test_transform_engine() -> None:
    connection = parse_kms_connections(vault(ENGINE_TYPE="TRANSFORM"), {})["VAULT1"]
    assert connection.kind == "vault-transform"
    assert isinstance(connection.settings, VaultSettings) and connection.settings.mount == "transform"
    custom = parse_kms_connections(vault(ENGINE_TYPE="TRANSFORM", ENGINE_MOUNT="/tokens/"), {})["VAULT1"]
    assert isinstance(custom.settings, VaultSettings) and custom.settings.mount == "tokens"


@pytest.mark.parametrize(("old", "new"), [("ENGINE", "ENGINE_TYPE"), ("MOUNT", "ENGINE_MOUNT")])
def test_old_vault_names_stop_the_gateway(old: str, new: str) -> None:
    for env in (vault(**{old: "transit"}), {f"{P}OLD_CONFIG_URI": "http://v:8200", f"{P}OLD_CONFIG_{old}": "transit"}):
        error = error_of(env)
        assert error.key.endswith(f"_CONFIG_{old}")
        assert f"_CONFIG_{new}" in error.problem and "renamed" in error.problem


def test_unknown_property_names_the_closest() -> None:
    error = error_of(vault(NAMESPCE="x"))
    assert error.key == f"{P}VAULT1_CONFIG_NAMESPCE"
    assert "did you mean NAMESPACE" in error.problem


def test_missing_uri() -> None:
    env = vault()
    del env[f"{P}VAULT1_CONFIG_URI"]
    assert error_of(env).key == f"{P}VAULT1_CONFIG_URI"


def test_bad_uri() -> None:
    assert error_of(vault(URI="vault:8200")).key == f"{P}VAULT1_CONFIG_URI"


def test_bad_auth_type_lists_the_allowed_values() -> None:
    error = error_of(vault(AUTH_TYPE="LDAP"))
    assert error.key == f"{P}VAULT1_CONFIG_AUTH_TYPE"
    for allowed in ("TOKEN", "APP_ROLE", "USERNAME_PASSWORD", "KUBERNETES", "JWT"):
        assert allowed in error.problem


def test_bad_engine_type() -> None:
    error = error_of(vault(ENGINE_TYPE="KV"))
    assert error.key.endswith("_CONFIG_ENGINE_TYPE") and "TRANSIT" in error.problem and "TRANSFORM" in error.problem


@pytest.mark.parametrize(
    ("props", "variable"),
    [
        ({"AUTH_TYPE": "APP_ROLE", "ROLE_ID": "r"}, "SECRET_ID"),
        ({"AUTH_TYPE": "USERNAME_PASSWORD", "PASSWORD": "p"}, "USERNAME"),
        ({"AUTH_TYPE": "KUBERNETES"}, "ROLE"),
        ({"AUTH_TYPE": "JWT", "ROLE": "r"}, "JWT"),
        ({}, "TOKEN"),
    ],
)
def test_missing_auth_property(props: dict[str, str], variable: str) -> None:
    env = vault(**props)
    del env[f"{P}VAULT1_CONFIG_TOKEN"]
    error = error_of(env)
    assert error.key == f"{P}VAULT1_CONFIG_{variable}" and "required" in error.problem


def test_property_of_another_auth_type() -> None:
    error = error_of(vault(USERNAME="u"))
    assert error.key.endswith("_CONFIG_USERNAME") and "USERNAME_PASSWORD" in error.problem


def test_bad_timeout() -> None:
    assert error_of(vault(TIMEOUT_MS="soon")).key.endswith("_CONFIG_TIMEOUT_MS")


def test_placeholder_default_applies_when_unset() -> None:
    env = vault(TOKEN="${KANAL_TEST_TOKEN}", NAMESPACE="${KANAL_TEST_NS|ops}")
    settings = parse_kms_connections(env, {**env, "KANAL_TEST_TOKEN": "from-env"})["VAULT1"].settings
    assert isinstance(settings, VaultSettings)
    assert (settings.auth.token, settings.namespace) == ("from-env", "ops")
    set_empty = parse_kms_connections(env, {**env, "KANAL_TEST_TOKEN": "x", "KANAL_TEST_NS": ""})["VAULT1"].settings
    assert isinstance(set_empty, VaultSettings) and set_empty.namespace is None  # set but empty: not the default


def test_plain_placeholder_unset_names_the_variable() -> None:
    env = vault(TOKEN="${KANAL_TEST_SURELY_UNSET_TOKEN}")
    error = error_of(env, environ=env)
    assert error.key == f"{P}VAULT1_CONFIG_TOKEN"
    assert "KANAL_TEST_SURELY_UNSET_TOKEN is not set" in error.problem


def test_aws_properties() -> None:
    env = {
        f"{P}AWS_TYPE": "AWS_KMS",
        f"{P}AWS_CONFIG_REGION": "eu-west-1",
        f"{P}AWS_CONFIG_ACCESS_KEY": "AKIAEXAMPLE",
        f"{P}AWS_CONFIG_SECRET_KEY": "secret",
        f"{P}AWS_CONFIG_SESSION_TOKEN": "session",
        f"{P}AWS_CONFIG_ENDPOINT": "http://localhost:4566/",
    }
    settings = parse_kms_connections(env, {})["AWS"].settings
    assert settings == AwsSettings("eu-west-1", "AKIAEXAMPLE", "secret", "session", "http://localhost:4566")
    chain = parse_kms_connections({f"{P}AWS_TYPE": "aws-kms"}, {})["AWS"].settings
    assert chain == AwsSettings()  # default credential chain, region from key ARNs


@pytest.mark.parametrize(
    ("props", "variable"),
    [
        ({"ACCESS_KEY": "a"}, "SECRET_KEY"),
        ({"SESSION_TOKEN": "s"}, "SESSION_TOKEN"),
        ({"REGION": "Europe"}, "REGION"),
        ({"ENDPOINT": "localhost:4566"}, "ENDPOINT"),
        ({"SECRET_ACCESS_KEY": "s"}, "SECRET_ACCESS_KEY"),
    ],
)
def test_aws_errors(props: dict[str, str], variable: str) -> None:
    env = {f"{P}AWS_TYPE": "AWS_KMS", **{f"{P}AWS_CONFIG_{k}": v for k, v in props.items()}}
    assert error_of(env).key == f"{P}AWS_CONFIG_{variable}"


def test_azure_properties_and_errors() -> None:
    env = {
        f"{P}AZ_TYPE": "AZURE_KEY_VAULT",
        f"{P}AZ_CONFIG_VAULT_URL": "https://my-vault.vault.azure.net/",
        f"{P}AZ_CONFIG_TENANT_ID": "t",
        f"{P}AZ_CONFIG_CLIENT_ID": "c",
        f"{P}AZ_CONFIG_CLIENT_SECRET": "s",
    }
    settings = parse_kms_connections(env, {})["AZ"].settings
    assert isinstance(settings, AzureSettings) and settings.vault_url == "https://my-vault.vault.azure.net"
    assert settings.authority_host == "https://login.microsoftonline.com"
    for missing in ("VAULT_URL", "TENANT_ID", "CLIENT_ID", "CLIENT_SECRET"):
        partial = {k: v for k, v in env.items() if not k.endswith(f"_CONFIG_{missing}")}
        assert error_of(partial).key == f"{P}AZ_CONFIG_{missing}"


def test_gcp_properties_and_errors(tmp_path: Path) -> None:
    key_file = tmp_path / "sa.json"
    key_file.write_text('{"type": "service_account", "client_email": "a@b", "private_key": "k"}')
    env = {f"{P}G_TYPE": "GCP_KMS", f"{P}G_CONFIG_CREDENTIALS_FILE": str(key_file)}
    settings = parse_kms_connections(env, {})["G"].settings
    assert isinstance(settings, GcpSettings) and settings.endpoint == "https://cloudkms.googleapis.com"
    assert error_of({f"{P}G_TYPE": "GCP_KMS"}).key == f"{P}G_CONFIG_CREDENTIALS_FILE"
    bad = {**env, f"{P}G_CONFIG_CREDENTIALS_FILE": str(tmp_path / "missing.json")}
    assert error_of(bad).key == f"{P}G_CONFIG_CREDENTIALS_FILE"
    ring = {**env, f"{P}G_CONFIG_KEY_RING": "projects/p/keyRings/r"}
    assert error_of(ring).key == f"{P}G_CONFIG_KEY_RING"
    token = parse_kms_connections({f"{P}G_TYPE": "GCP_KMS", f"{P}G_CONFIG_ACCESS_TOKEN": "ya29"}, {})["G"].settings
    assert isinstance(token, GcpSettings) and token.access_token == "ya29"


def test_schema_registry_connections_are_left_alone() -> None:
    env = {
        f"{P}SR_TYPE": "SCHEMA_REGISTRY",
        f"{P}SR_CONFIG_URL": "http://registry:8081",
        f"{P}SR2_CONFIG_URL": "http://registry:8081",
        f"{P}SR2_CONFIG_BASIC_AUTH_USERNAME": "u",
        **vault(),
    }
    assert set(parse_kms_connections(env, {})) == {"VAULT1"}
    check = check_kms_connections(env)
    assert set(check.read) == {k for k in env if "VAULT1" in k}
    assert set(check.hints[f"{P}SR_TYPE"].values) == set(TYPES)


def test_connection_without_type_is_read_when_clearly_a_kms_one() -> None:
    env = {f"{P}V_CONFIG_URI": "http://vault:8200", f"{P}V_CONFIG_TOKEN": "t"}
    assert parse_kms_connections(env, {})["V"].type == "VAULT"
    aws = {f"{P}A_CONFIG_REGION": "eu-west-1"}
    assert parse_kms_connections(aws, {})["A"].type == "AWS_KMS"
    assert set(check_kms_connections({**env, **aws}).read) == {*env, *aws}


def test_misspelt_type_and_malformed_variables_get_hints() -> None:
    env = {f"{P}V_TYPE": "VALT", f"{P}V_CONFIG_URI": "http://vault:8200", f"{P}V_CONFIG_TOKN": "t", f"{P}V_TOKEN": "x"}
    assert parse_kms_connections(env, {}) == {}
    check = check_kms_connections(env)
    assert not check.read
    assert "VAULT" in check.hints[f"{P}V_TYPE"].values
    assert f"{P}V_CONFIG_TOKEN" in check.hints[f"{P}V_CONFIG_TOKN"].names
    assert f"{P}V_CONFIG_TOKEN" in check.hints[f"{P}V_TOKEN"].names


def test_names_are_normalized() -> None:
    assert set(parse_kms_connections(vault("my_Vault"), {})) == {"MY_VAULT"}


def test_built_clients_match_the_type() -> None:
    from kanal_encryption.kms.vault import VaultTransitKms

    assert isinstance(parse_kms_connections(vault(), {})["VAULT1"].build(), VaultTransitKms)
