"""``large-message`` in a gateway in front of Tansu, with confluent-kafka clients and a real moto
S3 server (or a local directory): 20 MB values round-trip, the broker holds a small marked
reference and the store the value, small values pass untouched, and a store that is down fails
produce and fetch retriably, never losing a record nor handing out a reference as data."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kanal_safeguards.claim_check.large_messages import MARKER, Reference
from safeguard_clients import direct, read_to_end, safeguards_gateway, spec, through, wait_for

from kanal.embedded import TansuBroker
from kanal.gateway import Gateway

pytestmark = pytest.mark.integration

MB = 1024 * 1024
BIG = 20 * MB
LOGGER = "kanal_safeguards.claim_check.large_messages"
#: Producer settings for 20 MB records (librdkafka refuses to send more than 1 MB by default).
PRODUCER = {"message.max.bytes": 32 * MB, "linger.ms": 0}
#: Consumers need nothing: librdkafka takes responses up to 100 MB (``receive.message.max.bytes``).
# -- a moto S3 server of the test's own (stopped and restarted by the failure tests)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class MotoS3:
    """A moto server speaking S3 at ``endpoint``, with dummy credentials; ``stop`` and ``start``
    take it down and bring it back on the same port (empty: moto keeps nothing)."""

    log_dir: Path
    port: int = field(default_factory=_free_port)
    region: str = "us-east-1"
    access_key: str = "testing"
    secret_key: str = field(default="testing-secret", repr=False)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = Path(sys.executable).parent / "moto_server"
        log = self.log_dir / f"moto-{self.starts}.log"
        self.starts += 1
        self.process = subprocess.Popen(
            [str(binary), "-H", "127.0.0.1", "-p", str(self.port)], stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 30
        while True:
            assert self.process.poll() is None, f"moto_server exited:\n{log.read_text()[-3000:]}"
            try:
                httpx.get(f"{self.endpoint}/moto-api/", timeout=1.0)
                return
            except httpx.HTTPError:
                assert time.monotonic() < deadline, f"moto_server did not answer:\n{log.read_text()[-3000:]}"
                time.sleep(0.05)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def client(self) -> Any:
        """botocore's own S3 client (to set up buckets and look at objects)."""
        import botocore.session

        return botocore.session.Session().create_client(
            "s3",
            region_name=self.region,
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
        )

    def config(self, bucket: str) -> dict[str, Any]:
        """The interceptor's ``s3Config`` for ``bucket`` on this server."""
        return {
            "bucketName": bucket,
            "uri": self.endpoint,
            "region": self.region,
            "accessKey": self.access_key,
            "secretKey": self.secret_key,
        }


@pytest.fixture
def moto_s3(tmp_path: Path) -> Iterator[MotoS3]:
    server = MotoS3(log_dir=tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


# -- clients


def new_topic(tansu: TansuBroker) -> str:
    topic = f"lm-{uuid.uuid4().hex[:10]}"
    admin = AdminClient(direct(tansu))
    for future in admin.create_topics([NewTopic(topic, 1)], request_timeout=15).values():
        future.result(20)
    return topic


def produce(config: dict[str, Any], topic: str, values: list[bytes], timeout: float = 60) -> list[KafkaError | None]:
    """Produces ``values`` to partition 0; the delivery report of each."""
    producer = Producer({**config, **PRODUCER})
    reports: list[KafkaError | None] = []
    for value in values:
        producer.produce(topic, value, partition=0, on_delivery=lambda e, _: reports.append(e))
    assert producer.flush(timeout) == 0
    return reports


def end_offset(tansu: TansuBroker, topic: str) -> int:
    consumer = Consumer({**direct(tansu), "group.id": "lm-offsets"})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(high)
    finally:
        consumer.close()


def big_value(seed: int = 0) -> bytes:
    """20 MB that a truncation or a mix-up would show (not one repeated byte)."""
    return bytes((i * 7 + seed) & 0xFF for i in range(256)) * (BIG // 256)


def large_message(config: dict[str, Any], topic: str = ".*", minimum: int = MB) -> Any:
    return spec("large", "large-message", {"topic": topic, "minimumSizeInBytes": minimum, **config})


def check_reference(message: Message, size: int) -> Reference:
    """The record on the broker is a small reference with the marker header; returns it."""
    headers = dict(message.headers() or [])
    assert MARKER in headers, message.headers()
    value = message.value()
    assert value is not None and len(value) < 200
    reference = Reference.decode(value, headers[MARKER])
    assert reference is not None
    assert reference.size == size
    assert reference.key.startswith(f"{message.topic()}/0/")
    return reference


def check_round_trip(gateway: Gateway, tansu: TansuBroker, topic: str) -> tuple[list[Message], bytes]:
    """Produces a 20 MB and a small value through the gateway; checks what consumers of the gateway
    get; returns what the broker holds and the big value."""
    big, small = big_value(), b"small value"
    assert produce(through(gateway), topic, [big, small]) == [None, None]
    got = read_to_end(through(gateway), topic, timeout=60)
    assert [m.value() for m in got] == [big, small]
    assert [m.headers() for m in got] == [None, None]
    on_broker = read_to_end(direct(tansu), topic, timeout=60)
    assert len(on_broker) == 2
    assert on_broker[1].value() == small and on_broker[1].headers() is None
    return on_broker, big


# -- round trips


def test_20mb_round_trip_with_s3(tansu: TansuBroker, moto_s3: MotoS3) -> None:
    bucket = f"lm-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    topic = new_topic(tansu)
    with safeguards_gateway(tansu, [large_message({"s3Config": moto_s3.config(bucket)})]) as gw:
        on_broker, big = check_round_trip(gw, tansu, topic)
    reference = check_reference(on_broker[0], BIG)
    stored = moto_s3.client().get_object(Bucket=bucket, Key=reference.key)["Body"].read()
    assert stored == big


def test_20mb_round_trip_with_a_local_directory(tansu: TansuBroker, tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    topic = new_topic(tansu)
    with safeguards_gateway(tansu, [large_message({"localDiskDirectory": str(store)})]) as gw:
        on_broker, big = check_round_trip(gw, tansu, topic)
    reference = check_reference(on_broker[0], BIG)
    assert (store / reference.key).read_bytes() == big
    assert [p.name for p in (store / topic / "0").iterdir()] == [reference.key.rsplit("/", 1)[1]]


def test_other_topics_and_small_values_pass_untouched(tansu: TansuBroker, tmp_path: Path) -> None:
    topic, other = new_topic(tansu), new_topic(tansu)
    config = {"localDiskDirectory": str(tmp_path)}
    with safeguards_gateway(tansu, [large_message(config, topic=topic, minimum=1000)]) as gw:
        values = [b"x" * 999, b"", b"y" * 10]
        assert produce(through(gw), topic, values) == [None] * 3
        assert produce(through(gw), other, [b"z" * 5000]) == [None]
        assert [m.value() for m in read_to_end(direct(tansu), topic, timeout=60)] == values
        assert [m.value() for m in read_to_end(direct(tansu), other, timeout=60)] == [b"z" * 5000]
        assert all(m.headers() is None for m in read_to_end(direct(tansu), topic, timeout=60))
    assert list(tmp_path.iterdir()) == []


def test_values_past_the_restore_budget_come_in_the_next_fetches(tansu: TansuBroker, tmp_path: Path) -> None:
    topic = new_topic(tansu)
    config = {"localDiskDirectory": str(tmp_path), "maximumRestoredBytesPerPartition": 5000}
    values = [bytes([65 + i]) * 3000 for i in range(6)] + [b"small"]
    with safeguards_gateway(tansu, [large_message(config, minimum=1000)]) as gw:
        producer = Producer({**through(gw), **PRODUCER})
        for value in values:  # one batch each: a fetch answers with several, the budget cuts after one
            producer.produce(topic, value, partition=0)
            assert producer.flush(30) == 0
        assert [m.value() for m in read_to_end(through(gw), topic, timeout=60)] == values
    assert len(list((tmp_path / topic / "0").iterdir())) == 6


def test_a_client_cannot_send_the_marker_header(tansu: TansuBroker, tmp_path: Path) -> None:
    """A forged reference would make the gateway read any object of the store for the client."""
    topic = new_topic(tansu)
    with safeguards_gateway(tansu, [large_message({"localDiskDirectory": str(tmp_path)})]) as gw:
        producer = Producer({**through(gw), **PRODUCER})
        reports: list[KafkaError | None] = []
        producer.produce(
            topic,
            b"v",
            partition=0,
            headers=[(MARKER, b"x/0/" + b"0" * 32)],
            on_delivery=lambda e, _: reports.append(e),
        )
        assert producer.flush(30) == 0
    assert reports[0] is not None and reports[0].code() == KafkaError.INVALID_RECORD
    assert end_offset(tansu, topic) == 0


# -- the store down


def test_s3_down_on_produce_fails_retriably_and_delivers_once_when_back(
    tansu: TansuBroker, moto_s3: MotoS3, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    bucket = f"lm-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    topic = new_topic(tansu)
    with safeguards_gateway(tansu, [large_message({"s3Config": moto_s3.config(bucket)})]) as gw:
        moto_s3.stop()
        producer = Producer({**through(gw), **PRODUCER, "message.timeout.ms": 120_000, "retry.backoff.ms": 200})
        reports: list[KafkaError | None] = []
        producer.produce(topic, big_value(1), partition=0, on_delivery=lambda e, _: reports.append(e))

        def store_failures() -> int:
            producer.poll(0.05)
            return sum("not written, the store failed" in r.getMessage() for r in caplog.records)

        wait_for(lambda: store_failures() >= 2, what="the producer retrying while S3 is down")
        assert reports == [], "the producer gave up instead of retrying"
        assert end_offset(tansu, topic) == 0

        moto_s3.start()  # back, but empty: the bucket is made again
        moto_s3.client().create_bucket(Bucket=bucket)
        assert producer.flush(60) == 0
        assert reports == [None]
        on_broker = read_to_end(direct(tansu), topic, timeout=60)
        assert len(on_broker) == 1
        reference = check_reference(on_broker[0], BIG)
        assert [m.value() for m in read_to_end(through(gw), topic, timeout=60)] == [big_value(1)]
    listed = moto_s3.client().list_objects_v2(Bucket=bucket).get("Contents", [])
    assert [o["Key"] for o in listed] == [reference.key]


def test_s3_down_on_produce_with_a_short_timeout_reports_an_error(tansu: TansuBroker, moto_s3: MotoS3) -> None:
    bucket = f"lm-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    topic = new_topic(tansu)
    with safeguards_gateway(tansu, [large_message({"s3Config": moto_s3.config(bucket)})]) as gw:
        moto_s3.stop()
        reports = produce({**through(gw), "message.timeout.ms": 3000}, topic, [big_value()])
    assert len(reports) == 1 and reports[0] is not None
    assert reports[0].code() in (KafkaError.KAFKA_STORAGE_ERROR, KafkaError._MSG_TIMED_OUT), reports[0]
    assert end_offset(tansu, topic) == 0


def test_s3_down_on_fetch_hands_out_no_reference(
    tansu: TansuBroker, moto_s3: MotoS3, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    bucket = f"lm-{uuid.uuid4().hex[:8]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    topic = new_topic(tansu)
    with safeguards_gateway(tansu, [large_message({"s3Config": moto_s3.config(bucket)})]) as gw:
        big = big_value(2)
        assert produce(through(gw), topic, [big]) == [None]
        reference = check_reference(read_to_end(direct(tansu), topic, timeout=60)[0], BIG)
        moto_s3.stop()
        consumer = Consumer({**through(gw), "group.id": f"lm-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            got: list[Message] = []

            def fetch_failures() -> int:
                message = consumer.poll(0.05)
                if message is not None and message.error() is None:
                    got.append(message)
                return sum("fetch failed, the store failed" in r.getMessage() for r in caplog.records)

            wait_for(lambda: fetch_failures() >= 3, what="the consumer fetching again while S3 is down")
            assert got == [], "the consumer got a record while S3 was down"

            moto_s3.start()  # back (empty: the object is put back as it was)
            moto_s3.client().create_bucket(Bucket=bucket)
            moto_s3.client().put_object(Bucket=bucket, Key=reference.key, Body=big)

            def restored() -> bool:
                fetch_failures()
                return bool(got)

            wait_for(restored, what="the record once S3 is back")
            assert [m.value() for m in got] == [big] and got[0].headers() is None
        finally:
            consumer.close()
