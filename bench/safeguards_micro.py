"""What a produce policy and a byte-rate limit add to one Produce request, in this process.

    python bench/safeguards_micro.py [--seconds 1] [--repeats 5]

The end-to-end figure (``bench/run.py safeguards``) is a difference of two noisy process CPU
measurements of about 200 us per request each; this isolates the checks. The chain is the
scenario's (``produce-policy``: acks, compressions, version; ``producer-rate-limiting`` far above
the traffic), run by the gateway's dispatcher over a decoded one-record Produce v9 request (100 B
value, acks=1), the traffic of that benchmark:

- ``checked``: the request's topic matches both interceptors (every rule evaluated, bytes counted);
- ``unchecked``: a topic neither matches (the hooks are called and pass over it), which is what
  the scenario's other column pays; the difference is the checks' own cost.

Prints the median cost in microseconds per request of ``--repeats`` runs, the minimum beside it.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT / "core", ROOT / "plugins"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import trio  # noqa: E402
from kanal_safeguards.limits.rate_limits import ProducerRateLimiting  # noqa: E402
from kanal_safeguards.policies.produce_policy import ProducePolicy  # noqa: E402

from kanal.api import ApiKey, Record, RequestContext, build, encode_batch, nested, request_class  # noqa: E402
from kanal.testing import Harness  # noqa: E402

POLICY = {
    "topic": "bench-sg-.*",
    "acks": {"value": 1},
    "compressions": {"values": ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD"]},
    "version": {"min": 3},
}
LIMIT = {"topic": "bench-sg-.*", "maximumBytesPerSecond": 10_000_000_000}


def produce_request(topic: str) -> object:
    cls = request_class(ApiKey.PRODUCE, 9)
    topic_cls = nested(cls, "topic_data")
    batch = encode_batch([Record(value=b"x" * 100)], base_timestamp=1)
    part = build(nested(topic_cls, "partition_data"), index=0, records=batch)
    return build(
        cls,
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(build(topic_cls, name=topic, partition_data=(part,)),),
    )


async def cost(topic: str, seconds: float) -> float:
    """Microseconds of CPU per request through the dispatcher's request stage."""
    harness = Harness()
    harness.add(ProducePolicy, POLICY)
    harness.add(ProducerRateLimiting, LIMIT)
    dispatcher, request = harness.dispatcher, produce_request(topic)
    names = harness.services.topic_names
    n, start = 0, time.process_time()
    while True:
        for _ in range(1000):
            ctx = RequestContext(harness.connection, ApiKey.PRODUCE, 9, n, "rdkafka", request, names)
            outcome = await dispatcher.request(ctx, True)
            assert outcome.request is not None  # forwarded, never refused
        n += 1000
        elapsed = time.process_time() - start
        if elapsed >= seconds:
            return elapsed / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"unchecked": [], "checked": []}
    for _ in range(args.repeats):  # alternating, to share the machine's drift
        runs["unchecked"].append(trio.run(cost, "plain-topic", args.seconds))
        runs["checked"].append(trio.run(cost, "bench-sg-topic", args.seconds))
    for case, values in runs.items():
        raw = ", ".join(f"{v:.2f}" for v in values)
        print(f"{case:>10}: {statistics.median(values):6.2f} us per request (min {min(values):.2f}; raw {raw})")
    diffs = [c - u for c, u in zip(runs["checked"], runs["unchecked"], strict=True)]
    each = ", ".join(f"{d:.2f}" for d in diffs)
    print(f"checks' own cost: {statistics.median(diffs):.2f} us per request (per repeat {each})")


if __name__ == "__main__":
    main()
