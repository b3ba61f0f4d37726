"""Per-record cost of the encryption plugin's batch functions, as its interceptors call them.

Standalone (no broker, no gateway, no KMS server)::

    python bench/encryption_plugin_micro.py [--seconds 1] [--repeats 5] [--batch 500]

What is timed is one whole call of ``kanal_encryption.encrypt.encrypt_batch`` (produce) or
``kanal_encryption.decrypt.decrypt_batch`` (fetch) on an uncompressed record batch of ``--batch``
records built with the gateway's codec, under ``trio.run``, divided by the records in the batch:
walking the records, sealing or opening each part, writing the records again and framing the batch
(codec, CRC). Calls are repeated for ``--seconds``; each of ``--repeats`` such runs gives one figure,
and the median is printed (the runs beside it).

The keys come from a key source shaped like the interceptors' own (``interceptors.py``): a
``DekManager`` over an ``InMemoryKms``, the key located once (a dict lookup, as ``Locator.locate``
caches it), and the ``dek_cache`` hit counted in a Prometheus counter per ``sealer_now`` /
``opener_now`` call as the interceptors count it (once per batch and key when encrypting, once per
envelope when decrypting). After the first call every key is a cache hit: no KMS call is timed.

Cases (AES128_GCM, the config's default algorithm; key id ``k``, key reference
``connection://VAULT/k`` as a KMS connection's):

- ``payload encrypt``: ``recordValue.payload``, 1 KB random values;
- ``payload decrypt``: the batch that produced, decrypted (``decryption`` with no field list);
- ``fields encrypt``: ``recordValue.fields`` ``name`` and ``pad``, the two string fields of the
  throughput harness's 200-byte JSON values (``kanalbench.worker.values(200, "json")``);
- ``fields decrypt``: that batch decrypted.

Each case checks its result first (ciphertext differs from the input; decrypting gives it back).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent
for sub in (ROOT.parent / "core", ROOT.parent / "plugins", ROOT):
    if str(sub) not in sys.path:
        sys.path.insert(0, str(sub))

import orjson  # noqa: E402
import trio  # noqa: E402
from kanal_encryption.crypto.ciphers import Algorithm  # noqa: E402
from kanal_encryption.crypto.deks import DekManager  # noqa: E402
from kanal_encryption.crypto.envelope import Envelope, Opener, Sealer, is_envelope  # noqa: E402
from kanal_encryption.decrypt import Selection, decrypt_batch  # noqa: E402
from kanal_encryption.encrypt import Plan, encrypt_batch  # noqa: E402
from kanal_encryption.kms.memory import InMemoryKms  # noqa: E402
from kanal_encryption.paths import parse_path  # noqa: E402
from kanal_encryption.targets import VALUE, Target, path_label  # noqa: E402
from kanal_encryption.templates import parse_template  # noqa: E402
from kanalbench.worker import values as bench_values  # noqa: E402
from prometheus_client import CollectorRegistry, Counter  # noqa: E402

from kanal.protocol.records import Record, RecordBatch, RecordSet, encode_batch  # noqa: E402

TOPIC = "bench-enc-micro"
KEY_ID = "k"
KEY_REF = "connection://VAULT/k"
ALGORITHM = "AES128_GCM"
FIELDS = ("name", "pad")


class Keys:
    """The interceptors' KeySource and OpenerSource over one DekManager and an in-memory KMS."""

    def __init__(self) -> None:
        self.kms = InMemoryKms(store={})
        self.deks = DekManager()
        self.located = {KEY_ID: (self.kms, KEY_ID, KEY_REF)}
        self.found: dict[str, tuple[InMemoryKms, str]] = {}
        self.dek_cache = Counter(
            "bench_dek_cache", "DEK lookups", ["operation", "result"], registry=CollectorRegistry()
        )

    # -- KeySource (EncryptionInterceptor.sealer_now / sealer)

    def sealer_now(self, target: Target, key_id: str, records: int) -> Sealer | None:
        kms, kid, ref = self.located[key_id]
        sealer = self.deks.sealer_now(kms, kid, target.algorithm, records, key_ref=ref)
        self.dek_cache.labels("encrypt", "hit" if sealer is not None else "miss").inc()
        return sealer

    async def sealer(self, target: Target, key_id: str, records: int) -> Sealer:
        kms, kid, ref = self.located[key_id]
        return await self.deks.sealer(kms, kid, target.algorithm, records, key_ref=ref)

    # -- OpenerSource (DecryptionInterceptor.opener_now / opener)

    def _find(self, envelope: Envelope) -> tuple[InMemoryKms, str]:
        found = self.found.get(envelope.key_ref)
        if found is None:
            found = self.found[envelope.key_ref] = (self.kms, envelope.key_ref.rsplit("/", 1)[1])
        return found

    def opener_now(self, envelope: Envelope) -> Opener | None:
        kms, key_id = self._find(envelope)
        opener = self.deks.opener_now(kms, key_id, envelope.edek)
        self.dek_cache.labels("decrypt", "hit" if opener is not None else "miss").inc()
        return opener

    async def opener(self, envelope: Envelope) -> Opener:
        kms, key_id = self._find(envelope)
        return await self.deks.opener(kms, key_id, envelope.edek)


def _target(label: bytes, path: str | None) -> Target:
    return Target(
        VALUE,
        label if path is None else path_label(VALUE, parse_path(path)),
        None if path is None else parse_path(path),
        parse_template(KEY_ID),
        Algorithm.parse(ALGORITHM),
    )


def plan(fields: tuple[str, ...] | None) -> Plan:
    """The Plan ``compile_plan`` makes of ``recordValue.payload`` or ``recordValue.fields``."""
    payload = _target(VALUE.encode(), None) if fields is None else None
    return Plan(
        key_payload=None,
        key_fields=(),
        value_payload=payload,
        value_fields=tuple(_target(b"", f) for f in fields or ()),
        header_payload=None,
        header_fields=(),
        codec=0,
        skip_encrypted=False,
    )


def batch_of(values: list[bytes]) -> bytes:
    records = [Record(offset_delta=i, value=v) for i, v in enumerate(values)]
    return encode_batch(records, base_timestamp=1_700_000_000_000)


def one_batch(data: bytes) -> RecordBatch:
    batches = RecordSet.parse(data).batches
    assert len(batches) == 1
    return batches[0]


def values_of(data: bytes) -> list[bytes]:
    return [r.value or b"" for r in one_batch(data).records()]


def timed(call: Callable[[], Awaitable[object]], count: int, seconds: float, repeats: int) -> list[float]:
    """µs per record of each of ``repeats`` runs of ``seconds`` of back-to-back calls."""

    async def run() -> list[float]:
        await call()  # warm: keys made, caches filled
        samples = []
        for _ in range(repeats):
            calls, start = 0, time.perf_counter()
            deadline = start + seconds
            while True:
                await call()
                calls += 1
                now = time.perf_counter()
                if now >= deadline:
                    break
            samples.append((now - start) / (calls * count) * 1e6)
        return samples

    return trio.run(run)


def cases(size: int, batch: int, keys: Keys) -> dict[str, tuple[Callable[[], Awaitable[object]], int]]:
    """The four cases, each checked once before it is timed."""
    out: dict[str, tuple[Callable[[], Awaitable[object]], int]] = {}
    selection = Selection()

    def failed(label: str, error: Exception) -> None:
        raise AssertionError(f"{label} did not decrypt: {error}")

    for mode, values in (
        ("payload", [os.urandom(size) for _ in range(batch)]),
        ("fields", (bench_values(200, "json") * (batch // 1024 + 1))[:batch]),
    ):
        the_plan = plan(None if mode == "payload" else FIELDS)
        clear = one_batch(batch_of(values))
        sealed_data = trio.run(encrypt_batch, the_plan, TOPIC, clear, keys)
        sealed_values = values_of(sealed_data)
        opened_data, opened = trio.run(decrypt_batch, selection, TOPIC, one_batch(sealed_data), keys, failed)
        assert opened_data is not None
        if mode == "payload":
            assert all(is_envelope(v) for v in sealed_values) and opened == batch
            assert values_of(opened_data) == values
        else:
            documents = [orjson.loads(v) for v in sealed_values]
            assert all(d["name"].startswith("/KNL") and d["pad"].startswith("/KNL") for d in documents)
            assert opened == 2 * batch
            assert [orjson.loads(v) for v in values_of(opened_data)] == [orjson.loads(v) for v in values]
        sealed = one_batch(sealed_data)

        def encrypt(p: Plan = the_plan, b: RecordBatch = clear) -> Awaitable[bytes]:
            return encrypt_batch(p, TOPIC, b, keys)

        def decrypt(b: RecordBatch = sealed) -> Awaitable[tuple[bytes | None, int]]:
            return decrypt_batch(selection, TOPIC, b, keys, failed)

        width = f"{size} B" if mode == "payload" else f"2 fields of {len(values[0])} B JSON"
        out[f"{mode} encrypt ({width})"] = (encrypt, batch)
        out[f"{mode} decrypt ({width})"] = (decrypt, batch)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="seconds of calls per run")
    parser.add_argument("--repeats", type=int, default=5, help="runs per case; the median is printed")
    parser.add_argument("--batch", type=int, default=500, help="records per batch")
    parser.add_argument("--size", type=int, default=1024, help="value size of the payload cases")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    args = parser.parse_args()
    keys = Keys()
    print(
        f"{args.batch} records per batch (uncompressed), {ALGORITHM}, {args.repeats} runs of {args.seconds:g}s, "
        "µs per record (median; the runs)"
    )
    for name, (call, count) in cases(args.size, args.batch, keys).items():
        if args.only not in name:
            continue
        samples = timed(call, count, args.seconds, args.repeats)
        runs = " ".join(f"{s:.3f}" for s in samples)
        print(f"  {name:40} {statistics.median(samples):7.3f} µs   ({runs})", flush=True)
    stats = keys.deks.stats
    print(f"KMS calls: {stats.wraps} wraps, {stats.unwraps} unwraps (all before timing)")


if __name__ == "__main__":
    main()
