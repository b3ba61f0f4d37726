"""What a virtual cluster's ACL checks and renaming add to one Produce request, in this process.

    python bench/tenancy_micro.py [--seconds 1] [--repeats 5]

The end-to-end figure (``bench/run.py tenancy``) is a difference of two noisy process CPU
measurements, each about 200 us per request; this isolates the built-ins' own work on a one-record
Produce v9 request (100 B value, acks=1) and its response, the traffic of that benchmark:

- ``wire, remembered``: a producer's repeated request (:class:`kanal.pipeline.wire.WirePath` renames
  it from memory) and its response (the names stage's fix, from memory too): the steady state.
- ``wire, walked``: the same request seen for the first time: names read from the frame, the ACLs
  asked, the prefix spliced in, the response's names walked and spliced.
- ``decoded``: what the built-ins cost as plain interceptors (before the wire stages): the request
  decoded, checked, renamed and encoded, the response decoded, renamed and encoded (the
  dispatcher's own overhead not counted).

Prints the median cost in microseconds of ``--repeats`` runs, the minimum beside it.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "core") not in sys.path:
    sys.path.insert(0, str(ROOT / "core"))

from kanalbench.micro import rate  # noqa: E402
from kio.schema.errors import ErrorCode  # noqa: E402

from kanal.api.context import Connection  # noqa: E402
from kanal.authz.enforcer import AclEnforcer  # noqa: E402
from kanal.authz.requests import Check, check  # noqa: E402
from kanal.authz.store import AclDirectory, acl_from_json  # noqa: E402
from kanal.pipeline.wire import WirePath, WireStage  # noqa: E402
from kanal.protocol.acl_codes import Operation, ResourceType  # noqa: E402
from kanal.protocol.api import ApiKey, require_request_class, response_class  # noqa: E402
from kanal.protocol.entities import build, nested  # noqa: E402
from kanal.protocol.headers import parse_request_header  # noqa: E402
from kanal.protocol.messages import (  # noqa: E402
    decode_request_body,
    decode_response,
    encode_request,
    encode_response,
)
from kanal.protocol.records import Record, encode_batch  # noqa: E402
from kanal.tenancy.interceptor import VirtualClusterNames  # noqa: E402
from kanal.tenancy.names import VirtualNames  # noqa: E402
from kanal.tenancy.rewrite import UNCHANGED, to_logical, to_physical  # noqa: E402
from kanal.testing import FakeServices  # noqa: E402

PREFIX = "bench."
TOPIC = "bench-topic-0123456789"
VERSION = 9


def frames(topic: str) -> tuple[bytearray, bytearray]:
    """A one-record Produce request as a client sends it, and the broker's response (physical)."""
    cls = require_request_class(ApiKey.PRODUCE, VERSION)
    topic_cls = nested(cls, "topic_data")
    batch = encode_batch([Record(0, 0, None, b"x" * 100, [])], base_timestamp=1)
    part = build(nested(topic_cls, "partition_data"), index=0, records=batch)
    request = build(
        cls,
        transactional_id=None,
        acks=1,
        timeout=datetime.timedelta(seconds=30),
        topic_data=(build(topic_cls, name=topic, partition_data=(part,)),),
    )
    response_cls = response_class(ApiKey.PRODUCE, VERSION)
    assert response_cls is not None
    r_topic = nested(response_cls, "responses")
    r_part = build(nested(r_topic, "partition_responses"), index=0, error_code=ErrorCode.none, base_offset=12345)
    response = build(response_cls, responses=(build(r_topic, name=PREFIX + topic, partition_responses=(r_part,)),))
    return encode_request(request, 1, "rdkafka"), encode_response(response, 1)


def stages() -> tuple[AclEnforcer, VirtualClusterNames]:
    acl = acl_from_json(
        {
            "resourcePattern": {"resourceType": "TOPIC", "name": "bench", "patternType": "PREFIXED"},
            "principal": "User:bench",
            "operation": "ALL",
        }
    )
    directory = AclDirectory()
    directory.configure({}, {PREFIX: [acl]})
    names = VirtualNames(PREFIX)
    services = FakeServices()
    return AclEnforcer(directory, services, PREFIX, names.logical_topic), VirtualClusterNames(names, services, PREFIX)


INFO = Connection(
    id=1, client_address="127.0.0.1:40000", listener_address="127.0.0.1:6969", node_id=0, principal="bench"
)


def wire_case(remembered: bool) -> Callable[[], object]:
    """Remembered: the same request again and again. Walked: two producers' requests in turn, so
    neither the request nor the response is the one remembered last."""
    exchanges = [(*frames(TOPIC), parse_request_header(frames(TOPIC)[0]))]
    if not remembered:
        exchanges.append((*frames(TOPIC + "-b"), parse_request_header(frames(TOPIC + "-b")[0])))
    chain: tuple[WireStage, ...] = stages()
    path = WirePath(INFO)
    turn = [0]

    def one() -> object:
        request, response, header = exchanges[turn[0] % len(exchanges)]
        turn[0] += 1
        outcome = path.run(chain, 1, header, request)
        assert outcome is not None
        out = response
        for fix in outcome[1]:
            out = fix(out)
        return out

    return one


def decoded_case() -> Callable[[], object]:
    request, response = frames(TOPIC)
    header = parse_request_header(request)
    acls, names_stage = stages()
    authorizer = acls.directory.authorizer(PREFIX)
    names = names_stage.names
    response_cls = response_class(ApiKey.PRODUCE, VERSION)

    def decide(operation: Operation, resource_type: ResourceType, name: str) -> bool:
        return authorizer.allows("User:bench", "127.0.0.1", operation, resource_type, name)

    def one() -> object:
        body = decode_request_body(ApiKey.PRODUCE, VERSION, request, header.body_offset)
        verdict = check(ApiKey.PRODUCE, body, response_cls, Check(decide, lambda *a: True), lambda t: str(t.name))
        assert verdict.allowed
        physical, _ = to_physical(ApiKey.PRODUCE, body, names)
        encode_request(physical, 1, "rdkafka")
        upstream = decode_response(ApiKey.PRODUCE, VERSION, response)
        return encode_response(to_logical(ApiKey.PRODUCE, upstream, UNCHANGED, names), 1)

    return one


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()
    cases = {
        "wire, remembered": wire_case(remembered=True),
        "wire, walked": wire_case(remembered=False),
        "decoded": decoded_case(),
    }
    for name, case in cases.items():
        runs = [rate(case, opts.seconds) for _ in range(opts.repeats)]
        print(f"{name:18} {statistics.median(runs):7.2f} us per request and response (min {min(runs):.2f})")


if __name__ == "__main__":
    main()
