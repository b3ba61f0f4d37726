from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest

from kanal.api import FamilyCheck, Hint, SettingsFamily, external_connections, hookimpl
from kanal.api.errors import ConfigError
from kanal.api.placeholders import expand_placeholders as expand
from kanal.config.loader import load_settings
from kanal.config.settings import KnownSettings, build_settings
from kanal.config.upstream import parse_jaas
from kanal.pipeline.registry import PluginRegistry


def test_defaults() -> None:
    s = build_settings({})
    assert (s.port_start, s.port_count, s.min_broker_id, s.http_port, s.cluster_id) == (
        6969,
        None,
        None,
        8888,
        "gateway",
    )
    assert s.upstream.bootstrap_servers == (("127.0.0.1", 9092),)
    assert s.max_frame_size == 100 * 1024 * 1024


def test_environment_wins_over_file() -> None:
    s = build_settings({"GATEWAY_PORT_START": "7000"}, {"gateway": {"portStart": 8000, "portCount": 5}})
    assert (s.port_start, s.port_count) == (7000, 5)


@pytest.mark.parametrize(
    "env,key,problem",
    [
        ({"GATEWAY_PORT_START": "abc"}, "GATEWAY_PORT_START", "expected an integer"),
        ({"GATEWAY_PORT_START": "70000"}, "GATEWAY_PORT_START", "between 1 and 65535"),
        ({"GATEWAY_PORT_STRAT": "1"}, "GATEWAY_PORT_STRAT", "did you mean GATEWAY_PORT_START"),
        ({"GATEWAY_LOG_FORMAT": "xml"}, "GATEWAY_LOG_FORMAT", "expected one of text, json"),
        (
            {"GATEWAY_FEATURE_FLAGS_LIFECYCLE_METRICS": "maybe"},
            "GATEWAY_FEATURE_FLAGS_LIFECYCLE_METRICS",
            "expected true",
        ),
        (
            {"GATEWAY_FEATURE_FLAGS_LIFECYCLE_METRIC": "true"},
            "GATEWAY_FEATURE_FLAGS_LIFECYCLE_METRIC",
            "unknown feature flag (did you mean GATEWAY_FEATURE_FLAGS_LIFECYCLE_METRICS?)",
        ),
        ({"GATEWAY_ADMIN_API_USER": "[]"}, "GATEWAY_ADMIN_API_USER", "did you mean GATEWAY_ADMIN_API_USERS"),
        (
            {"GATEWAY_EXTERNAL_CONNECTION_REGISTRY_URL": "http://r"},
            "GATEWAY_EXTERNAL_CONNECTION_REGISTRY_URL",
            "unknown setting",  # no plugin declared the family
        ),
        ({"KAFKA_BOOTSTRAP_SERVERS": "nohost"}, "KAFKA_BOOTSTRAP_SERVERS", "expected host:port"),
        ({"KAFKA_SECURITY_PROTOCOL": "TLS"}, "KAFKA_SECURITY_PROTOCOL", "expected one of"),
        (
            {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_MECHANISM": "GSSAPI"},
            "KAFKA_SASL_MECHANISM",
            "expected one of",
        ),
        ({"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"}, "KAFKA_SASL_JAAS_CONFIG", "needs a username"),
        ({"GATEWAY_SECURITY_PROTOCOL": "SSL"}, "GATEWAY_SSL_CERTIFICATE_LOCATION", "required"),
    ],
)
def test_bad_settings_name_the_key(env: dict[str, str], key: str, problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_settings(env)
    assert info.value.key == key
    assert problem in str(info.value)


def test_feature_flags() -> None:
    s = build_settings({"GATEWAY_FEATURE_FLAGS_LIFECYCLE_METRICS": "true"})
    assert s.feature("lifecycle_metrics") and not s.feature("audit")


def test_settings_plugins_declare_are_known() -> None:
    known = KnownSettings(["GATEWAY_EXTERNAL_CONNECTION_*", "GATEWAY_FEATURE_FLAGS_MY_FLAG", "GATEWAY_MY_LIMIT"])
    env = {
        "GATEWAY_EXTERNAL_CONNECTION_REGISTRY_URL": "http://r",
        "GATEWAY_FEATURE_FLAGS_MY_FLAG": "false",
        "GATEWAY_MY_LIMIT": "3",
    }
    s = build_settings(env, known=known)
    assert s.feature("my_flag", True) is False
    with pytest.raises(ConfigError, match=r"GATEWAY_MY_LIMT: unknown setting \(did you mean GATEWAY_MY_LIMIT\?\)"):
        build_settings({"GATEWAY_MY_LIMT": "3"}, known=known)


THING = "GATEWAY_THING_"


def thing_plugin(kind: str, properties: tuple[str, ...]) -> SimpleNamespace:
    """A fake plugin reading the ``GATEWAY_THING_<NAME>_TYPE=<kind>`` things of the family it shares with
    others (``GATEWAY_THING_<NAME>_CONFIG_<PROPERTY>``), as connection types of two plugins would."""

    def check(variables: Mapping[str, str]) -> FamilyCheck:
        mine = {
            v[len(THING) : -len("_TYPE")] for v, value in variables.items() if v.endswith("_TYPE") and value == kind
        }
        read, hints = [], {}
        for variable in variables:
            name, _, prop = variable[len(THING) :].partition("_CONFIG_")
            if variable.endswith("_TYPE") and "_CONFIG_" not in variable:
                if variable[len(THING) : -len("_TYPE")] in mine:
                    read.append(variable)
                else:
                    hints[variable] = Hint(values=[kind], what="thing type")
            elif name in mine:
                if prop not in properties:
                    raise ConfigError(variable, f"unknown {kind} property {prop}")
                read.append(variable)
            elif prop:
                hints[variable] = Hint(names=[f"{THING}{name}_CONFIG_{p}" for p in properties])
        return FamilyCheck(read=read, hints=hints)

    @hookimpl
    def kanal_settings() -> list[str | SettingsFamily]:
        return [SettingsFamily(THING + "*", check)]

    return SimpleNamespace(kanal_settings=kanal_settings)


def two_plugins() -> Callable[[dict[str, str]], object]:
    registry = PluginRegistry()
    registry.register(thing_plugin("ALPHA", ("HOST", "PORT")), "alpha")
    registry.register(thing_plugin("BETA", ("TOKEN",)), "beta")
    known = KnownSettings(registry.declared_settings())
    return lambda env: build_settings(env, known=known)


def test_two_plugins_check_the_family_they_share() -> None:
    build = two_plugins()
    build(
        {
            "GATEWAY_THING_A_TYPE": "ALPHA",
            "GATEWAY_THING_A_CONFIG_HOST": "h",
            "GATEWAY_THING_B_TYPE": "BETA",
            "GATEWAY_THING_B_CONFIG_TOKEN": "t",
        }
    )
    with pytest.raises(ConfigError) as info:
        build({"GATEWAY_THING_A_TYPE": "BETTA", "GATEWAY_THING_A_CONFIG_HOST": "h"})
    assert str(info.value) == (
        "GATEWAY_THING_A_TYPE: unknown thing type 'BETTA' (did you mean BETA?); known: ALPHA, BETA"
    )
    with pytest.raises(ConfigError) as info:  # the owner of the type names what is wrong
        build({"GATEWAY_THING_A_TYPE": "ALPHA", "GATEWAY_THING_A_CONFIG_TOKEN": "t"})
    assert str(info.value) == "GATEWAY_THING_A_CONFIG_TOKEN: unknown ALPHA property TOKEN"
    with pytest.raises(ConfigError) as info:  # a thing without a type: hints of both plugins
        build({"GATEWAY_THING_C_CONFIG_TOKN": "t"})
    assert (
        str(info.value) == "GATEWAY_THING_C_CONFIG_TOKN: unknown setting (did you mean GATEWAY_THING_C_CONFIG_TOKEN?)"
    )
    with pytest.raises(ConfigError) as info:  # not of the family's shape: no plugin reads it, none has a hint
        build({"GATEWAY_THING_C": "x"})
    assert str(info.value) == "GATEWAY_THING_C: unknown setting (no plugin reads it)"


def test_a_family_declared_without_a_check_accepts_its_variables() -> None:
    checked = KnownSettings([SettingsFamily("GATEWAY_THING_", lambda variables: FamilyCheck())])
    with pytest.raises(ConfigError, match=r"^GATEWAY_THING_X: unknown setting"):
        build_settings({"GATEWAY_THING_X": "1"}, known=checked)
    for declared in ("GATEWAY_THING_*", SettingsFamily("GATEWAY_THING_*")):
        assert build_settings({"GATEWAY_THING_X": "1"}, known=KnownSettings([declared]))
    with pytest.raises(ConfigError, match=r"did you mean GATEWAY_THING_\*"):
        build_settings({"GATEWAY_THINGS": "1"}, known=checked)


def test_kanal_run_requires_a_cluster(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^KAFKA_BOOTSTRAP_SERVERS: required"):
        load_settings(env={}, require_upstream=True)
    assert load_settings(env={"KAFKA_BOOTSTRAP_SERVERS": "b:9092"}, require_upstream=True).upstream
    config = tmp_path / "kanal.yaml"
    config.write_text("kafka:\n  bootstrap.servers: b:9092\n")
    assert load_settings(config, env={}, require_upstream=True).upstream.bootstrap_servers == (("b", 9092),)


def test_upstream_sasl_from_jaas() -> None:
    s = build_settings(
        {
            "KAFKA_BOOTSTRAP_SERVERS": "b1:9092, SASL_SSL://b2:9093",
            "KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
            "KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "KAFKA_SASL_JAAS_CONFIG": "org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="alice" password="p\\"w";',
            "KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM": "",
            "GATEWAY_SECURITY_PROTOCOL": "PLAINTEXT",
        }
    )
    u = s.upstream
    assert u.bootstrap_servers == (("b1", 9092), ("b2", 9093))
    assert (u.security_protocol, u.sasl_mechanism, u.sasl_username, u.sasl_password) == (
        "SASL_SSL",
        "SCRAM-SHA-512",
        "alice",
        'p"w',
    )
    assert u.uses_tls and u.uses_sasl and not u.ssl_check_hostname
    assert u.properties["ssl.endpoint.identification.algorithm"] == ""


def test_an_unset_listener_protocol_is_the_clusters_and_a_sasl_cluster_keeps_authenticating() -> None:
    s = build_settings(
        {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"}
    )
    assert (s.security_protocol, s.security_mode) == ("sasl_plaintext", "kafka_managed")
    plain = build_settings({})
    assert (plain.security_protocol, plain.security_mode) == ("plaintext", None)
    chosen = build_settings(
        {
            "KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            "KAFKA_SASL_USERNAME": "u",
            "KAFKA_SASL_PASSWORD": "p",
            "GATEWAY_SECURITY_PROTOCOL": "PLAINTEXT",
        }
    )
    assert (chosen.security_protocol, chosen.security_mode) == ("plaintext", None)


def test_an_inferred_tls_listener_without_certificates_fails_saying_where_the_protocol_came_from() -> None:
    with pytest.raises(ConfigError) as failure:
        build_settings({"KAFKA_SECURITY_PROTOCOL": "SSL"})
    message = str(failure.value)
    assert message.startswith("GATEWAY_SSL_CERTIFICATE_LOCATION")
    assert "KAFKA_SECURITY_PROTOCOL" in message and "set GATEWAY_SECURITY_PROTOCOL" in message


def test_explicit_sasl_user_password_variables() -> None:
    s = build_settings(
        {"KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "KAFKA_SASL_USERNAME": "u", "KAFKA_SASL_PASSWORD": "p"}
    )
    assert (s.upstream.sasl_mechanism, s.upstream.sasl_username, s.upstream.sasl_password) == ("PLAIN", "u", "p")


def test_jaas_parsing() -> None:
    assert parse_jaas('x required username="a b" password="c";') == {"username": "a b", "password": "c"}


def test_placeholders() -> None:
    env = {"A": "1"}
    assert expand({"x": ["${A}", "${B|two}", "${A|x}-${B|}"]}, env, "config") == {"x": ["1", "two", "1-"]}
    with pytest.raises(ConfigError) as info:
        expand({"x": {"y": "${MISSING}"}}, env, "config")
    assert info.value.key == "config.x.y" and "MISSING is not set" in str(info.value)


def test_yaml_file_with_interceptors(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "kanal.yaml"  # type: ignore[operator]
    path.write_text(
        "gateway:\n  portStart: ${PORT|7100}\nkafka:\n  bootstrap.servers: ${BROKER}\n"
        "interceptors:\n  - name: inject\n    plugin: header-injection\n    priority: 5\n"
        "    scope: {username: '${USER_NAME}'}\n    config: {headers: {a: '${SECRET}'}}\n"
    )
    s = load_settings(path, {"BROKER": "k:1", "USER_NAME": "bob", "SECRET": "${NOT_AGAIN}"})
    assert s.port_start == 7100 and s.upstream.bootstrap_servers == (("k", 1),)
    (spec,) = s.interceptors
    assert (spec.name, spec.plugin, spec.priority, spec.scope.username, spec.config) == (
        "inject",
        "header-injection",
        5,
        "bob",
        {"headers": {"a": "${SECRET}"}},  # expanded once, when the interceptor is made
    )


@pytest.mark.parametrize(
    "doc,key",
    [
        ({"interceptors": [{"plugin": "x"}]}, "interceptors[0].name"),
        ({"interceptors": [{"name": "a"}]}, "interceptors[0].plugin"),
        ({"interceptors": [{"name": "a", "plugin": "x", "priority": "high"}]}, "interceptors[0].priority"),
        ({"interceptors": [{"name": "a", "plugin": "x", "scope": {"team": 1}}]}, "interceptors[0].scope.team"),
        (
            {"interceptors": [{"name": "a", "plugin": "x", "scope": {"group": "g", "username": "u"}}]},
            "interceptors[0].scope",
        ),
        ({"gateway": {"portStrat": 1}}, "gateway.portStrat"),
        ({"gatway": {}}, "gatway"),
    ],
)
def test_bad_file_names_the_path(doc: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        build_settings({}, doc)
    assert info.value.key == key


def test_unreadable_file(tmp_path: pytest.TempPathFactory) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(str(tmp_path / "missing.yaml"), {})  # type: ignore[operator]


def test_a_config_file_key_error_names_the_file_and_suggests_a_yaml_key(tmp_path: Path) -> None:
    config = tmp_path / "kanal.yaml"
    config.write_text("gateway:\n  portStrat: 7000\n")
    with pytest.raises(ConfigError) as info:
        load_settings(config, env={})
    assert str(info.value) == f"{config}: gateway.portStrat: unknown setting (did you mean gateway.portStart?)"
    config.write_text("kafka:\n  bootstrap.servers: nohost\n")
    with pytest.raises(ConfigError, match=rf"^{config}: kafka.bootstrap.servers: expected host:port"):
        load_settings(config, env={})


KEY = "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWY="  # base64 of 32 bytes


def test_a_sasl_listener_is_gateway_managed_unless_told_and_then_needs_the_token_key() -> None:
    s = build_settings({"GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "GATEWAY_USER_POOL_SECRET_KEY": KEY})
    assert s.security_protocol == "sasl_plaintext" and s.security_mode is None  # GATEWAY_MANAGED
    with pytest.raises(ConfigError) as info:
        build_settings({"GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    assert info.value.key == "GATEWAY_USER_POOL_SECRET_KEY" and "SASL_PLAINTEXT" in str(info.value)
    relayed = {"GATEWAY_SECURITY_PROTOCOL": "SASL_PLAINTEXT", "GATEWAY_SECURITY_MODE": "KAFKA_MANAGED"}
    assert build_settings(relayed).security_mode == "kafka_managed"  # the cluster checks: no key needed


def test_kafka_managed_needs_a_sasl_listener_and_both_variables_are_named() -> None:
    with pytest.raises(ConfigError) as info:
        build_settings({"GATEWAY_SECURITY_MODE": "KAFKA_MANAGED"})
    assert info.value.key == "GATEWAY_SECURITY_MODE" and "GATEWAY_SECURITY_PROTOCOL is PLAINTEXT" in str(info.value)


def test_sasl_ssl_needs_the_listener_certificate() -> None:
    with pytest.raises(ConfigError) as info:
        build_settings({"GATEWAY_SECURITY_PROTOCOL": "SASL_SSL", "GATEWAY_USER_POOL_SECRET_KEY": KEY})
    assert info.value.key == "GATEWAY_SSL_CERTIFICATE_LOCATION"


def test_external_connections_reads_each_connection_and_names_the_malformed() -> None:
    env = {
        "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_CONFIG_URI": "http://vault:8200",
        "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_CONFIG_TOKEN": "t",
        "GATEWAY_EXTERNAL_CONNECTION_REG_CONFIG_URL": "http://registry:8081",
        "GATEWAY_EXTERNAL_CONNECTION_ODD": "x",
        "GATEWAY_OTHER": "y",
    }
    connections, malformed = external_connections(env)
    assert set(connections) == {"MY_VAULT", "REG"}
    vault = connections["MY_VAULT"]
    assert vault.type == ("VAULT", "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_TYPE")
    assert vault.props["URI"] == ("http://vault:8200", "GATEWAY_EXTERNAL_CONNECTION_MY_VAULT_CONFIG_URI")
    assert sorted(vault.variables) == sorted(k for k in env if "MY_VAULT" in k)
    assert connections["REG"].type is None and connections["REG"].variables == [
        "GATEWAY_EXTERNAL_CONNECTION_REG_CONFIG_URL"
    ]
    assert malformed == ["GATEWAY_EXTERNAL_CONNECTION_ODD"]
