"""What the protocol firewall (GATEWAY_FEATURE_FLAGS_VALIDATE_REQUESTS) costs per request, in this
process (no broker, no gateway).

    python bench/validate_micro.py [--number 20000] [--repeats 7]

Requests: the first Produce, Fetch and Metadata librdkafka sent in the repository's capture
(``conformance/captures/kafka/rdkafka.jsonl``), and a one-record Produce of 100 bytes as the
``request-rate`` scenario sends it. For each: :func:`validate_request` in microseconds (median of
``--repeats`` runs of ``--number`` calls, the minimum beside it), the same with the record-batch CRC
checked, kio's full decode of the body for comparison, and the share of a request's gateway CPU
(100 to 170 us per request, measured by ``request-rate``). Then large Produce requests (1 MiB of
records): the whole-frame check with and without CRCs, and the streamed check (:class:`RequestScan`
fed 64 KiB chunks, record bodies skipped unread), per request.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "core") not in sys.path:
    sys.path.insert(0, str(ROOT / "core"))

from kanal.protocol.api import require_request_class  # noqa: E402
from kanal.protocol.entities import build, nested  # noqa: E402
from kanal.protocol.headers import RequestHeader, parse_request_header  # noqa: E402
from kanal.protocol.messages import decode_request_body, encode_request  # noqa: E402
from kanal.protocol.records import Record, encode_batch  # noqa: E402
from kanal.protocol.validate import RequestScan, validate_request  # noqa: E402

CAPTURE = ROOT / "conformance" / "captures" / "kafka" / "rdkafka.jsonl"
GATEWAY_US = (100.0, 170.0)  # gateway CPU per one-record Produce today (request-rate scenario)
CHUNK = 64 * 1024


def captured(api_key: int) -> bytearray:
    """The first request of ``api_key`` librdkafka sent in the capture."""
    for line in CAPTURE.read_text().splitlines():
        o = json.loads(line)
        if o["dir"] == "c2s" and o["api_key"] == api_key:
            return bytearray(base64.b64decode(o["frame"]))
    raise LookupError(f"no api key {api_key} request in {CAPTURE.name}")


def produce(version: int, values: list[bytes]) -> bytearray:
    cls = require_request_class(0, version)
    topic_cls = nested(cls, "topic_data")
    part_cls = nested(topic_cls, "partition_data")
    batch = encode_batch([Record(i, 0, None, v) for i, v in enumerate(values)], base_timestamp=1_700_000_000_000)
    part = build(part_cls, index=0, records=bytes(batch))
    body = build(
        cls,
        acks=1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(build(topic_cls, name="bench", partition_data=(part,)),),
    )
    return encode_request(body, 1, "rdkafka")


def timed(fn: Callable[[], object], number: int, repeats: int) -> tuple[float, float]:
    """(median, minimum) microseconds per call."""
    runs = []
    for _ in range(repeats):
        began = time.perf_counter()
        for _ in range(number):
            fn()
        runs.append((time.perf_counter() - began) / number * 1e6)
    return statistics.median(runs), min(runs)


def streamed(frame: bytearray, header: RequestHeader) -> None:
    scan = RequestScan(header, len(frame))
    view = memoryview(frame)
    pos = 0
    while pos < len(frame):
        if scan.opaque:
            n = scan.opaque
            scan.skip(n)  # the relay forwards these unread
        else:
            n = min(CHUNK, len(frame) - pos)
            scan.feed(view[pos : pos + n])
        pos += n
    scan.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--number", type=int, default=20000, help="calls per run")
    parser.add_argument("--repeats", type=int, default=7, help="runs per figure")
    args = parser.parse_args()
    small = [
        ("Produce v9, 1 record of 100 B", produce(9, [b"x" * 100])),
        ("Produce (librdkafka capture)", captured(0)),
        ("Fetch (librdkafka capture)", captured(1)),
        ("Metadata (librdkafka capture)", captured(3)),
    ]
    print(
        f"{'request':34} {'bytes':>7} {'check us':>9} {'(min)':>6} {'+CRC us':>8} {'kio us':>7}  share of gateway CPU"
    )
    for name, frame in small:
        header = parse_request_header(frame)
        assert validate_request(frame, header, check_crc=True) is None, name
        version = header.api_version
        check, low = timed(partial(validate_request, frame, header), args.number, args.repeats)
        crc, _ = timed(partial(validate_request, frame, header, check_crc=True), args.number, args.repeats)
        decode = partial(decode_request_body, header.api_key, version, frame, header.body_offset)
        kio, _ = timed(decode, args.number, args.repeats)
        share = " to ".join(f"{check / us:.1%}" for us in reversed(GATEWAY_US))
        label = f"{name} v{version}" if "capture" in name else name
        print(f"{label:34} {len(frame):>7} {check:>9.2f} {low:>6.2f} {crc:>8.2f} {kio:>7.2f}  {share}")

    big = produce(9, [bytes(1000)] * 1000)  # about 1 MiB of records, one batch
    header = parse_request_header(big)
    number = max(args.number // 100, 10)
    whole, _ = timed(lambda: validate_request(big, header), number, args.repeats)
    crc, _ = timed(lambda: validate_request(big, header, check_crc=True), number, args.repeats)
    scan, _ = timed(lambda: streamed(big, header), number, args.repeats)
    print(f"\nProduce of {len(big) / 2**20:.2f} MiB (1000 records of 1000 B, one batch), per request:")
    print(f"  whole frame {whole:.2f} us; with CRC {crc:.1f} us; streamed (64 KiB reads, bodies skipped) {scan:.1f} us")


if __name__ == "__main__":
    main()
