"""Kafka's ssl.principal.mapping.rules, with the examples of Kafka's own documentation and tests."""

from __future__ import annotations

import datetime

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kanal.identity.principal_mapping import parse_rules, principal_for, subject_of


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
