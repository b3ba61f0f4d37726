"""Stored SCRAM credentials: derived once from the password, which is not kept."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from kanal.identity.scram_credentials import ScramCredentials, derive, from_dict, matches, to_dict
from kanal.protocol.sasl import ScramMechanism
from kanal.protocol.sasl_mechanisms import Challenge, ScramServer, Success


def test_rfc7677_vector_follows_from_the_derived_keys() -> None:
    """The example's client proof checks against StoredKey and its server signature is ServerKey's."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = derive("pencil", "SCRAM-SHA-256", salt=salt)
    nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    auth_message = f"n=user,r=rOprNGfwEbeRWgbNEkqO,r={nonce},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r={nonce}"
    signature = hmac.new(credential.server_key, auth_message.encode(), "sha256").digest()
    assert base64.b64encode(signature) == b"6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    proof = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    client_signature = hmac.new(credential.stored_key, auth_message.encode(), "sha256").digest()
    client_key = bytes(a ^ b for a, b in zip(proof, client_signature, strict=True))
    assert hashlib.sha256(client_key).digest() == credential.stored_key


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_a_stored_credential_authenticates_the_password_after_a_json_round_trip(mechanism: str) -> None:
    stored = json.loads(json.dumps(to_dict(derive("hunter2", mechanism), mechanism)))
    assert "hunter2" not in json.dumps(stored)
    name, credential = from_dict(stored)
    assert name == mechanism and credential.iterations == 4096
    client = ScramMechanism(mechanism, "alice", "hunter2")
    server = ScramServer(mechanism, {"alice": credential}.get, fake_salt_key=b"k" * 32)
    first = server.start(client.start())
    assert isinstance(first, Challenge)
    final = server.step(client.step(first.data) or b"")
    assert isinstance(final, Success) and client.step(final.data) is None


def test_each_derivation_gets_its_own_salt() -> None:
    a, b = derive("same", "SCRAM-SHA-512"), derive("same", "SCRAM-SHA-512")
    assert a.salt != b.salt and a.stored_key != b.stored_key


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mechanism": "SCRAM-SHA-1"}, "unknown SCRAM mechanism"),
        ({"iterations": 4095}, "4096 to 16384 iterations, got 4095"),
        ({"iterations": 16385}, "4096 to 16384 iterations, got 16385"),
    ],
)
def test_derive_refuses_weak_or_unknown_settings(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        derive("pw", **kwargs)  # type: ignore[arg-type]


def test_more_iterations_are_allowed_up_to_kafkas_bound() -> None:
    assert derive("pw", "SCRAM-SHA-256", iterations=8192).iterations == 8192
    assert derive("pw", "SCRAM-SHA-256", iterations=16384).iterations == 16384


def test_a_password_matches_only_the_credential_derived_from_it() -> None:
    credential = derive("right", "SCRAM-SHA-512", iterations=4096)
    assert matches("right", credential, "SCRAM-SHA-512")
    assert not matches("wrong", credential, "SCRAM-SHA-512")
    assert not matches("", credential, "SCRAM-SHA-512")
    assert not matches("right", credential, "SCRAM-SHA-256")  # another hash, another key


def test_login_names_are_unique_and_a_lookup_gives_the_account_vcluster() -> None:
    sha512 = derive("pw", "SCRAM-SHA-512")
    store = ScramCredentials()
    refused = store.replace([("app", "tenant-a", {"SCRAM-SHA-512": sha512}), ("app", None, {"SCRAM-SHA-512": sha512})])
    assert refused == [("app", None, "the SCRAM user name 'app' already belongs to the account in vCluster tenant-a")]
    assert store.get("app", "SCRAM-SHA-512") == ("tenant-a", sha512)
    assert store.get("app", "SCRAM-SHA-256") is None  # no credential for that mechanism
    assert store.get("other", "SCRAM-SHA-512") is None
    store.replace([])
    assert store.get("app", "SCRAM-SHA-512") is None and len(store) == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"iterations": 100}, "iterations"),
        ({"iterations": 16385}, "iterations must be an integer from 4096 to 16384"),
        ({"iterations": True}, "iterations"),
        ({"storedKey": "AAAA"}, "storedKey must be 64 bytes"),
        ({"salt": "not base64!"}, "salt is not valid base64"),
        ({"mechanism": "PLAIN"}, "unknown SCRAM mechanism"),
        ({"serverKey": None}, "serverKey must be a base64 string"),
    ],
)
def test_from_dict_names_what_is_wrong(change: dict[str, object], message: str) -> None:
    data = to_dict(derive("pw", "SCRAM-SHA-512"), "SCRAM-SHA-512") | change
    with pytest.raises(ValueError, match=message):
        from_dict(data)
    with pytest.raises(ValueError, match="needs salt"):
        from_dict({k: v for k, v in data.items() if k != "salt"})
