"""Kafka's ssl.principal.mapping.rules, with the examples of Kafka's own documentation and tests, and
certificate subjects as Java prints them (the text Kafka's rules see)."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID

from kanal.api.errors import ConfigError
from kanal.config.settings import Settings, build_settings
from kanal.identity.principal_mapping import parse_rules, principal_for, subject_of
from kanal.net.tls import CertificateRefused, certificate_principal


def name(subject: str, rules: str | None) -> str | None:
    return principal_for(subject, parse_rules(rules))


@pytest.mark.parametrize(
    ("rules", "subject", "expected"),
    [
        (None, "CN=Duke,OU=ServiceUsers,O=Org,C=US", "CN=Duke,OU=ServiceUsers,O=Org,C=US"),
        ("DEFAULT", "CN=Duke,OU=ServiceUsers,O=Org,C=US", "CN=Duke,OU=ServiceUsers,O=Org,C=US"),
        ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT", "CN=Duke,OU=ServiceUsers,O=Org,C=US", "Duke"),
        ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT", "CN=Duke,OU=Other,O=Org", "CN=Duke,OU=Other,O=Org"),
        (
            "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
            "CN=Duke,OU=JavaSoft,O=Sun,L=Santa,ST=CA,C=US",
            "duke@javasoft",
        ),
        (
            "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/U",
            "CN=Duke,OU=JavaSoft,O=Sun,L=Santa,ST=CA,C=US",
            "DUKE@JAVASOFT",
        ),
        ("RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,DEFAULT", "CN=Duke.Example,OU=X", "duke.example"),
        ("RULE:^CN=([a-zA-Z0-9.-]*).*$/$1/", "CN=kafka-client-1,O=Org", "kafka-client-1"),
        ("RULE:^CN=(.*),O=(.*)$/$1\\/$2/", "CN=a,O=b", "a/b"),  # an escaped slash in the replacement
        ("RULE:^CN=(.*)$/$1 costs $5/", "CN=a", "a costs $5"),  # $5 beyond the groups is literal text
        ("RULE:^CN=(.*)$/$12/", "CN=a", "a2"),  # the longest group number the digits begin with, as Java
        ("RULE:^CN=(.*)$/[$0]/", "CN=a", "[CN=a]"),  # $0: the whole match
        ("RULE:^CN=(.*)$/$01/", "CN=a", "a"),
        ("  RULE:^CN=(.*)$/$1/ ,  DEFAULT  ", "CN=a", "a"),
        ("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/", "CN=a,OU=Elsewhere", None),  # no rule applies
    ],
)
def test_rules(rules: str | None, subject: str, expected: str | None) -> None:
    assert name(subject, rules) == expected


@pytest.mark.parametrize(
    ("rules", "named"),
    [
        ("RULE:^CN=(.*)$/$1/X", "RULE:^CN=(.*)$/$1/X"),
        ("DEFAULT,garbage", "garbage"),
        ("RULE:^CN=(.*$/$1/", "RULE:^CN=(.*$/$1/"),
        ("RULE:^CN=(.*)$/$x/", "RULE:^CN=(.*)$/$x/"),
        ("RULE:nothing", "RULE:nothing"),
        ("RULE:^CN=a$/$1/", "RULE:^CN=a$/$1/"),  # a group the pattern does not have
        ("RULE:^CN=(.*)$/$1\\/", "RULE:^CN=(.*)$/$1\\/"),  # a lone backslash ends the replacement
    ],
)
def test_a_bad_rule_is_named(rules: str, named: str) -> None:
    with pytest.raises(ValueError, match="Invalid rule") as caught:
        parse_rules(rules)
    assert named in str(caught.value)


def test_subject_of_a_certificate() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COUNTRY_NAME, "US"),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Org"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "ServiceUsers"),
            x509.NameAttribute(NameOID.COMMON_NAME, "app-1"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    dn = subject_of(cert.public_bytes(serialization.Encoding.DER))
    assert dn == "CN=app-1,OU=ServiceUsers,O=Org,C=US"
    assert name(dn, "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,DEFAULT") == "app-1"


def _certificate(subject: x509.Name) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.DER)


def _attr(oid: x509.ObjectIdentifier, value: str, kind: _ASN1Type | None = None) -> x509.NameAttribute[str]:
    return x509.NameAttribute(oid, value) if kind is None else x509.NameAttribute(oid, value, _type=kind)


# Each expected text is what Java's X500Principal.getName() gives for the same certificate.
@pytest.mark.parametrize(
    ("attributes", "expected"),
    [
        (  # types without an RFC 2253 keyword: dotted OID and the hex of the DER value
            [_attr(NameOID.COMMON_NAME, "app"), _attr(NameOID.EMAIL_ADDRESS, "ops@example.com")],
            "1.2.840.113549.1.9.1=#160f6f7073406578616d706c652e636f6d,CN=app",
        ),
        (
            [
                _attr(NameOID.SERIAL_NUMBER, "1234"),
                _attr(NameOID.TITLE, "boss"),
                _attr(NameOID.STATE_OR_PROVINCE_NAME, "CA"),
                _attr(NameOID.LOCALITY_NAME, "SF"),
                _attr(NameOID.STREET_ADDRESS, "1 Main St"),
            ],
            "STREET=1 Main St,L=SF,ST=CA,2.5.4.12=#0c04626f7373,2.5.4.5=#130431323334",
        ),
        ([_attr(NameOID.COMMON_NAME, 'a,b=c+d<e>f#g;h"i\\j')], 'CN=a\\,b\\=c\\+d\\<e\\>f\\#g\\;h\\"i\\\\j'),
        (
            [_attr(NameOID.COMMON_NAME, "  two lead, trail  "), _attr(NameOID.ORGANIZATION_NAME, "#hash")],
            "O=\\#hash,CN=\\ \\ two lead\\, trail\\ \\ ",
        ),
        ([_attr(NameOID.COMMON_NAME, "a\0b")], "CN=a\\00b"),
        ([_attr(NameOID.COMMON_NAME, "\rx\r")], "CN=\\\rx\\\r"),
        ([_attr(NameOID.COMMON_NAME, "Zoë ✓")], "CN=Zoë ✓"),
        ([_attr(NameOID.COMMON_NAME, "bmp", _ASN1Type.BMPString)], "CN=bmp"),  # Java 17 printed CN=\00b\00m\00p
        ([_attr(NameOID.COMMON_NAME, "ia5", _ASN1Type.IA5String)], "CN=ia5"),
        ([], ""),
    ],
    ids=["email", "other-types", "specials", "spaces", "nul", "carriage-returns", "utf8", "bmp", "ia5", "empty"],
)
def test_a_subject_reads_as_java_prints_it(attributes: list[x509.NameAttribute[str]], expected: str) -> None:
    assert subject_of(_certificate(x509.Name(attributes))) == expected


def test_a_multi_valued_rdn_keeps_its_order() -> None:
    name = x509.Name(
        [
            x509.RelativeDistinguishedName([_attr(NameOID.COMMON_NAME, "x"), _attr(NameOID.USER_ID, "42")]),
            x509.RelativeDistinguishedName([_attr(NameOID.DOMAIN_COMPONENT, "example")]),
        ]
    )
    assert subject_of(_certificate(name)) == "DC=example,CN=x+UID=42"


def _settings(protocol: str, client_auth: str, rules: str = "RULE:^CN=([^,]*),OU=Apps$/$1/") -> Settings:
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9092",
        "GATEWAY_SECURITY_PROTOCOL": protocol,
        "GATEWAY_SSL_CERTIFICATE_LOCATION": "gateway.pem",
        "GATEWAY_SSL_KEY_LOCATION": "gateway.key",
        "GATEWAY_SSL_CA_LOCATION": "ca.pem",
        "GATEWAY_SSL_CLIENT_AUTH": client_auth,
        "GATEWAY_SSL_PRINCIPAL_MAPPING_RULES": rules,
        "GATEWAY_USER_POOL_SECRET_KEY": "a2FuYWwtdGVzdC1rZXktb2YtMzItYnl0ZXMtbG9uZyE=",
    }
    return build_settings(env)


APP = _certificate(x509.Name([_attr(NameOID.ORGANIZATIONAL_UNIT_NAME, "Apps"), _attr(NameOID.COMMON_NAME, "orders")]))
OTHER = _certificate(x509.Name([_attr(NameOID.ORGANIZATIONAL_UNIT_NAME, "Else"), _attr(NameOID.COMMON_NAME, "orders")]))


def test_a_certificate_names_the_client_on_an_ssl_listener_that_asks_for_one() -> None:
    for client_auth in ("REQUESTED", "REQUIRED"):
        settings = _settings("SSL", client_auth)
        assert certificate_principal(settings, APP) == "orders"
        assert certificate_principal(settings, None) is None
        with pytest.raises(CertificateRefused, match="maps certificate subject 'CN=orders,OU=Else'"):
            certificate_principal(settings, OTHER)


def test_a_certificate_names_nobody_where_kafka_ignores_it() -> None:
    assert certificate_principal(_settings("SASL_SSL", "REQUIRED"), OTHER) is None
    assert certificate_principal(_settings("SSL", "NONE"), OTHER) is None


def test_a_subject_that_maps_to_nothing_is_refused() -> None:
    empty = _certificate(x509.Name([]))
    with pytest.raises(CertificateRefused, match="empty principal"):
        certificate_principal(_settings("SSL", "REQUIRED", "DEFAULT"), empty)


def test_rules_that_do_not_parse_stop_the_gateway_naming_the_variable_and_the_rule() -> None:
    with pytest.raises(ConfigError) as caught:
        _settings("SSL", "REQUIRED", "RULE:^CN=(.*)$/$1/,RULE:^CN=(.*$/$1/")
    assert "GATEWAY_SSL_PRINCIPAL_MAPPING_RULES" in str(caught.value)
    assert "RULE:^CN=(.*$/$1/" in str(caught.value)
