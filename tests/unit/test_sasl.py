import pytest

from kanal.protocol.sasl import PlainMechanism, SaslError, ScramMechanism


def test_scram_sha256_rfc7677_vector() -> None:
    m = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert m.start() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = m.step(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (
        b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
    )
    assert m.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None


def test_scram_rejects_a_forged_server_signature() -> None:
    m = ScramMechanism("SCRAM-SHA-256", "user", "pencil", nonce="abc")
    m.start()
    m.step(b"r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    with pytest.raises(SaslError, match="does not verify"):
        m.step(b"v=AAAA")


def test_scram_server_error_and_bad_nonce() -> None:
    m = ScramMechanism("SCRAM-SHA-512", "user", "pw", nonce="abc")
    with pytest.raises(SaslError, match="invalid-proof"):
        m.step(b"e=invalid-proof")
    with pytest.raises(SaslError, match="invalid SCRAM"):
        ScramMechanism("SCRAM-SHA-512", "u", "p", nonce="abc").step(b"r=zzz,s=AA==,i=1")


def test_plain() -> None:
    m = PlainMechanism("alice", "secret")
    assert m.start() == b"\x00alice\x00secret" and m.step(b"") is None
