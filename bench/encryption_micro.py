"""What the encryption plugin's crypto core costs per record, in this process.

    python bench/encryption_micro.py [--seconds 1] [--repeats 5]

Each case is one record's work on the hot path, with a DEK already at hand (the DEK manager's
cache hit is measured on its own), a realistic key reference and a Vault-sized EDEK (89 bytes):

- ``seal 1 KB, <algorithm>``: a 1 KB value sealed into an envelope (nonce, AEAD, concatenations).
- ``seal 1 KB <codec>``: the same, compressed first (AES128_GCM; a JSON-like, compressible value).
- ``2 fields of 20 B, <algorithm>``: two JSON field values sealed into base64 text
  (``Sealer.seal_text``).
- ``open 1 KB, <algorithm>``: an envelope parsed and opened back into the 1 KB value.
- ``parse``: an envelope's header read (no decryption).
- ``sealer_now`` / ``opener_now``: the DEK manager's synchronous cache hits (once per batch or
  record, as the plugin calls them).

Prints the median cost in microseconds of ``--repeats`` runs, the minimum beside it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "core", ROOT / "plugins"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import trio  # noqa: E402
from kanal_encryption.crypto import (  # noqa: E402
    Algorithm,
    Codec,
    DekManager,
    Opener,
    Sealer,
    parse,
)
from kanalbench.micro import rate  # noqa: E402

KEY_REF = "vault-kms://vault:8200/transit/keys/orders"
EDEK = b"vault:v1:" + b"Q" * 80
AAD = b"orders\x00\x00\x00\x00\x00\x00\x00\x30\x39value"
VALUE = (b'{"id": 12345, "customer": "c-0042", "items": [{"sku": "A-1", "qty": 2}], "note": "' + b"x" * 1024)[:1024]
FIELD = b'"4111-1111-1111-1111"'[:20]


def pair(algorithm: Algorithm) -> tuple[Sealer, Opener]:
    dek = os.urandom(algorithm.key_size)
    return Sealer(algorithm, dek, KEY_REF, EDEK), Opener(dek)


def seal_case(algorithm: Algorithm, codec: Codec = Codec.NONE) -> Callable[[], object]:
    seal = pair(algorithm)[0].seal

    def one() -> object:
        return seal(VALUE, AAD, codec)

    return one


def fields_case(algorithm: Algorithm) -> Callable[[], object]:
    seal_text = pair(algorithm)[0].seal_text
    aad_a, aad_b = AAD + b"/card", AAD + b"/iban"

    def one() -> object:
        return seal_text(FIELD, aad_a), seal_text(FIELD, aad_b)

    return one


def open_case(algorithm: Algorithm) -> Callable[[], object]:
    sealer, opener = pair(algorithm)
    data = sealer.seal(VALUE, AAD)
    open_ = opener.open

    def one() -> object:
        envelope = parse(data)
        assert envelope is not None
        return open_(envelope, AAD)

    return one


def parse_case() -> Callable[[], object]:
    data = pair(Algorithm.AES128_GCM)[0].seal(VALUE, AAD)

    def one() -> object:
        return parse(data)

    return one


class _Kms:
    kind = "bench"

    async def wrap(self, key_id: str, dek: bytes) -> bytes:
        return EDEK

    async def unwrap(self, key_id: str, edek: bytes) -> bytes:
        raise AssertionError("not reached: the manager keeps its own DEKs")

    async def check(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def manager_cases() -> tuple[Callable[[], object], Callable[[], object]]:
    kms = _Kms()
    deks = DekManager(max_records=1 << 62)
    trio.run(lambda: deks.sealer(kms, "orders", Algorithm.AES128_GCM, key_ref=KEY_REF))
    sealer_now, opener_now = deks.sealer_now, deks.opener_now
    aes = Algorithm.AES128_GCM

    def seal_hit() -> object:
        return sealer_now(kms, "orders", aes, 1, key_ref=KEY_REF)

    def open_hit() -> object:
        return opener_now(kms, "orders", EDEK)

    return seal_hit, open_hit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    cases: dict[str, Callable[[], object]] = {}
    for algorithm in Algorithm:
        cases[f"seal 1 KB, {algorithm.name}"] = seal_case(algorithm)
    for codec in (Codec.SNAPPY, Codec.LZ4, Codec.GZIP, Codec.ZSTD):
        cases[f"seal 1 KB {codec.name.lower()}, AES128_GCM"] = seal_case(Algorithm.AES128_GCM, codec)
    for algorithm in Algorithm:
        cases[f"2 fields of 20 B, {algorithm.name}"] = fields_case(algorithm)
    for algorithm in Algorithm:
        cases[f"open 1 KB, {algorithm.name}"] = open_case(algorithm)
    cases["parse"] = parse_case()
    cases["sealer_now"], cases["opener_now"] = manager_cases()
    for name, case in cases.items():
        runs = [rate(case, opts.seconds) for _ in range(opts.repeats)]
        print(f"{name:36} {statistics.median(runs):7.2f} us per record (min {min(runs):.2f})")


if __name__ == "__main__":
    main()
