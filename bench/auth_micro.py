"""How many client authentications one core verifies per second, in this process (no sockets).

    python bench/auth_micro.py [--seconds 2] [--repeats 5]

Each "connection" is a fresh :class:`Authenticator` fed the frames a client sends (SaslHandshake
v1, then SaslAuthenticate v2), responses encoded: the gateway's whole CPU cost of a SASL exchange
except reading and writing the socket.

- ``plain-token``: PLAIN whose password is a gateway token (HS256 JWT checked against the secret).
- ``scram-sha-512``: SCRAM-SHA-512 at 4096 iterations, the server side (the client's PBKDF2 is the
  client's cost; the server checks the proof with StoredKey and needs none). The server nonce is
  fixed so the client's messages can be computed once, outside the timing.
- ``scram-derive``: one PBKDF2 of 4096 iterations, what the server would pay per attempt if it
  kept passwords instead of StoredKey (it does not; the client pays this once per connection).

Prints the median rate of ``--repeats`` runs of ``--seconds`` each, with the minimum beside it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "core") not in sys.path:
    sys.path.insert(0, str(ROOT / "core"))

from kanal.identity.scram_credentials import derive  # noqa: E402
from kanal.identity.tokens import TokenClaims, mint, verify  # noqa: E402
from kanal.protocol.api import ApiKey, require_request_class  # noqa: E402
from kanal.protocol.messages import encode_request  # noqa: E402
from kanal.protocol.sasl import ScramMechanism  # noqa: E402
from kanal.protocol.sasl_mechanisms import Challenge, Identity, PlainServer, ScramServer  # noqa: E402
from kanal.protocol.sasl_server import Authenticator, MechanismFactory  # noqa: E402

SECRET = b"bench-secret-of-at-least-32-bytes!"
SERVER_NONCE = "server-nonce-fixed-for-the-bench"


def frame(api_key: int, version: int, correlation_id: int, **fields: object) -> bytes:
    return bytes(encode_request(require_request_class(api_key, version)(**fields), correlation_id, "bench"))


def plain_token_case() -> Callable[[], bool]:
    token = mint("app1", "tenant", 3600, SECRET)

    def validate(username: str, password: str) -> Identity | None:
        claims = verify(password, SECRET)
        if not isinstance(claims, TokenClaims) or claims.username != username:
            return None
        return Identity(claims.username, vcluster=claims.vcluster, expires_at_ms=claims.expires_at * 1000)

    frames = [
        frame(ApiKey.SASL_HANDSHAKE, 1, 1, mechanism="PLAIN"),
        frame(ApiKey.SASL_AUTHENTICATE, 2, 2, auth_bytes=b"\x00app1\x00" + token.encode()),
    ]
    mechanisms: dict[str, MechanismFactory] = {"PLAIN": lambda: PlainServer(validate)}
    return lambda: _connect(mechanisms, frames)


def scram_case() -> Callable[[], bool]:
    mechanism = "SCRAM-SHA-512"
    store = {"app1": derive("app1-password", mechanism)}
    mechanisms: dict[str, MechanismFactory] = {
        mechanism: lambda: ScramServer(mechanism, store.get, fake_salt_key=SECRET, nonce_factory=lambda: SERVER_NONCE)
    }
    # One exchange outside the timing gives the client's messages for the fixed nonce.
    client = ScramMechanism(mechanism, "app1", "app1-password", nonce="client-nonce")
    first = client.start()
    server = mechanisms[mechanism]()
    challenge = server.start(first)
    assert isinstance(challenge, Challenge)
    final = client.step(challenge.data)
    assert final is not None
    frames = [
        frame(ApiKey.SASL_HANDSHAKE, 1, 1, mechanism=mechanism),
        frame(ApiKey.SASL_AUTHENTICATE, 2, 2, auth_bytes=first),
        frame(ApiKey.SASL_AUTHENTICATE, 2, 3, auth_bytes=final),
    ]
    return lambda: _connect(mechanisms, frames)


def _connect(mechanisms: dict[str, MechanismFactory], frames: list[bytes]) -> bool:
    auth = Authenticator(mechanisms, max_reauth_ms=3_600_000)
    done = False
    for f in frames:
        done = auth.feed(f).authenticated
    return done


def derive_case() -> Callable[[], bool]:
    return lambda: bool(derive("app1-password", "SCRAM-SHA-512"))


def rate(case: Callable[[], bool], seconds: float) -> float:
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(50):
            if not case():
                raise SystemExit("an authentication the bench expects to succeed failed")
        count += 50
        now = time.perf_counter()
        if now >= deadline:
            return count / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cases = {"plain-token": plain_token_case(), "scram-sha-512": scram_case(), "scram-derive": derive_case()}
    print(f"{'case':<16}{'per second (median)':>22}{'min':>10}{'us each':>10}")
    for name, case in cases.items():
        rates = [rate(case, args.seconds) for _ in range(args.repeats)]
        median = statistics.median(rates)
        print(f"{name:<16}{median:>22,.0f}{min(rates):>10,.0f}{1e6 / median:>10.1f}")


if __name__ == "__main__":
    main()
