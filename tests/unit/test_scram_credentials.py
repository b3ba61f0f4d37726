"""Stored SCRAM credentials: derived once from the password, which is not kept."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from kanal.identity.scram_credentials import derive, from_dict, to_dict
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
        ({"iterations": 4095}, "at least 4096"),
    ],
)
def test_derive_refuses_weak_or_unknown_settings(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        derive("pw", **kwargs)  # type: ignore[arg-type]


def test_more_iterations_are_allowed() -> None:
    assert derive("pw", "SCRAM-SHA-256", iterations=8192).iterations == 8192


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"iterations": 100}, "iterations"),
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
