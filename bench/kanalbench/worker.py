"""The benchmark client, run in a process of its own: ``python -m kanalbench.worker JOB JSON-ARGS``.

Each job prints one JSON object on its last stdout line. The client is librdkafka (confluent-kafka);
the same code runs against the broker and against the gateway, only ``bootstrap`` differs.

- ``produce``: send ``records`` records of ``size`` bytes as fast as the client can (acks=1, batching).
- ``consume``: read the topic from the beginning until ``records`` records arrived (assign, no group).
- ``latency``: send at a fixed ``rate`` with a small linger.ms (1) and record each record's send-to-ack time;
  given ``pids``, also the CPU those processes used meanwhile and the Produce requests sent (request-rate).
- ``idle``: open ``count`` TCP connections, send ApiVersions on each, read the answers, hold them until
  stdin closes (the driver reads the gateway's memory meanwhile).
- ``clients``: many producers at a fixed total rate and many long-polling consumers at once, started
  together with the other worker processes of a run (pooled-clients).
- ``produce-together``: ``produce``, started at a time the driver sends, together with the other
  producer processes of a run (fleet).
"""

from __future__ import annotations

import json
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from kanalbench.cpu import machine_idle_seconds, tree_cpu_seconds

DISTINCT_VALUES = 1024


def values(size: int, payload: str) -> list[bytes]:
    """``DISTINCT_VALUES`` record values of ``size`` bytes: random (incompressible) or JSON objects."""
    if payload == "bytes":
        return [os.urandom(size) for _ in range(DISTINCT_VALUES)]
    if payload == "json":
        out = []
        for i in range(DISTINCT_VALUES):
            head = json.dumps({"id": i, "name": f"user-{i}", "amount": i * 7 % 1000, "pad": ""})
            pad = max(0, size - len(head))
            out.append(head.replace('"pad": ""', '"pad": "' + "x" * pad + '"').encode())
        return out
    raise ValueError(f"unknown payload {payload!r}")


def producer_config(bootstrap: str, **overrides: Any) -> dict[str, Any]:
    """Throughput producer settings (documented in docs/benchmarks.md)."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "acks": 1,
        "linger.ms": 5,
        "batch.size": 1_000_000,
        "batch.num.messages": 10_000,
        "compression.type": "none",
        "enable.idempotence": False,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "delivery.report.only.error": True,
    }
    config.update(overrides)
    return config


def produce(
    bootstrap: str, topic: str, size: int, records: int, payload: str = "bytes", client: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``client``: more librdkafka properties (security settings), for the producer and consumer alike."""
    producer, failed = _producer(bootstrap, topic, client or {})
    return _send_all(producer, failed, topic, values(size, payload), records, size)


def produce_together(
    bootstrap: str, topic: str, size: int, records: int, client_id: str, payload: str = "bytes"
) -> dict[str, Any]:
    """``produce`` as fast as the client can, from a start time the driver sends: prints
    ``{"ready": ...}`` once connected with its metadata, reads a Unix time from stdin, sends from then
    on and answers when every record is acknowledged, with its end as Unix time."""
    producer, failed = _producer(bootstrap, topic, {"client.id": client_id})
    vals = values(size, payload)
    print(json.dumps({"ready": True}), flush=True)
    start_wall = float(sys.stdin.readline())
    time.sleep(max(0.0, start_wall - time.time()))
    return {**_send_all(producer, failed, topic, vals, records, size), "end": time.time()}


def _producer(bootstrap: str, topic: str, client: dict[str, Any]) -> tuple[Any, list[str]]:
    """A producer connected, with the topic's metadata (before any clock starts), and the list its
    delivery errors go to (only errors are reported: delivery.report.only.error)."""
    from confluent_kafka import Producer

    failed: list[str] = []

    def on_error(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    producer = Producer(producer_config(bootstrap, **client), on_delivery=on_error)
    producer.list_topics(topic, timeout=10)
    return producer, failed


def _send_all(
    producer: Any, failed: list[str], topic: str, vals: list[bytes], records: int, size: int
) -> dict[str, Any]:
    """Sends ``records`` values as fast as the client takes them and waits for every acknowledgement."""
    mask = DISTINCT_VALUES - 1
    send = producer.produce
    start = time.perf_counter()
    for i in range(records):
        try:
            send(topic, vals[i & mask])
        except BufferError:
            producer.poll(0.01)
            send(topic, vals[i & mask])
    left = producer.flush(120)
    seconds = time.perf_counter() - start
    if left or failed:
        raise RuntimeError(f"produce failed: {left} undelivered, {len(failed)} errors, first: {failed[:1]}")
    return {"seconds": seconds, "records": records, "bytes": records * size}


def consume(
    bootstrap: str,
    topic: str,
    records: int,
    partitions: int = 1,
    timeout: float = 120.0,
    client: dict[str, Any] | None = None,
) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kanalbench",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": False,
            # The default 1000 ms pause after the prefetch queue fills (Tansu answers 5 MB fetches) would
            # dominate a run of a second or two.
            "fetch.queue.backoff.ms": 10,
            **(client or {}),
        }
    )
    try:
        consumer.list_topics(topic, timeout=10)
        count = 0
        nbytes = 0
        start = time.perf_counter()
        cpu_start, busy_start = time.process_time(), machine_busy()
        deadline = start + timeout
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        while count < records:
            batch = consumer.consume(min(10_000, records - count), 1.0)
            for msg in batch:
                if msg.error() is not None:
                    raise RuntimeError(f"consume failed: {msg.error()}")
                nbytes += len(msg)
            count += len(batch)
            if time.perf_counter() > deadline:
                raise RuntimeError(f"consume timed out with {count} of {records} records")
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu_start  # every thread of the client, librdkafka's included
        busy = (machine_busy() - busy_start) / seconds
    finally:
        consumer.close()
    return {"seconds": seconds, "records": count, "bytes": nbytes, "cpu": cpu, "machine_busy": busy}


def machine_busy() -> float:
    """CPU seconds the whole machine (every core, every process) has been busy so far (Linux)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))  # ceil(n*q/100), at least 1
    return sorted_values[int(rank) - 1]


def latency(
    bootstrap: str,
    topic: str,
    size: int,
    rate: float,
    seconds: float,
    warmup: float = 1.0,
    payload: str = "bytes",
    linger_ms: float = 1.0,
    pids: dict[str, int] | None = None,
    client: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Fixed-rate producer; latency = librdkafka's produce()-to-ack time of each record, read in its
    delivery callback, which a dedicated thread serves as soon as the ack arrives.

    With ``pids`` (name: pid of a process on the path), the CPU each process tree used from the first
    record sent (warm-up included) to the last one acknowledged, and the number of Produce requests
    librdkafka sent meanwhile (its statistics), so that CPU per request is exact even if a slow path
    makes librdkafka put several records in one request; also this client's CPU and the whole
    machine's, to tell how busy other processes kept the cores. ``client``: more librdkafka
    properties (security settings), as for ``produce``."""
    from confluent_kafka import Producer

    stats: list[dict[str, Any]] = []
    extra: dict[str, Any] = {"linger.ms": linger_ms, "delivery.report.only.error": False}
    if pids:
        extra.update({"statistics.interval.ms": 100, "stats_cb": lambda text: stats.append(json.loads(text))})
    producer = Producer(producer_config(bootstrap, **extra, **(client or {})))
    producer.list_topics(topic, timeout=10)
    cpu_start = {name: tree_cpu_seconds(pid) for name, pid in (pids or {}).items()}
    window_start, client_start, idle_start = time.perf_counter(), time.process_time(), machine_idle_seconds()
    measured: list[float] = []
    errors: list[str] = []

    def on_warm(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    def on_measured(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            measured.append(msg.latency() * 1000.0)  # ms

    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            producer.poll(0.05)

    poller = threading.Thread(target=serve, daemon=True)
    poller.start()
    vals = values(size, payload)
    mask = DISTINCT_VALUES - 1
    warm_n = int(rate * warmup)
    total = warm_n + int(rate * seconds)
    interval = 1.0 / rate
    start = time.perf_counter()
    measure_start = start
    for i in range(total):
        due = start + i * interval
        delay = due - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        if i == warm_n:
            measure_start = time.perf_counter()
        producer.produce(topic, vals[i & mask], on_delivery=on_warm if i < warm_n else on_measured)
    measure_end = time.perf_counter()
    producer.flush(30)
    cpu = {name: tree_cpu_seconds(pid) - cpu_start[name] for name, pid in (pids or {}).items()}
    window = time.perf_counter() - window_start
    client_cpu, idle = time.process_time() - client_start, machine_idle_seconds() - idle_start
    requests = _produce_requests(stats, time.perf_counter() + 5.0) if pids else 0
    stop.set()
    poller.join()
    producer.poll(0)
    if errors:
        raise RuntimeError(f"latency run failed: {len(errors)} errors, first: {errors[0]}")
    lat = sorted(measured)
    sent = total - warm_n
    return {
        "records": len(lat),
        "achieved_rate": sent / (measure_end - measure_start),
        "p50_ms": percentile(lat, 50),
        "p99_ms": percentile(lat, 99),
        "p999_ms": percentile(lat, 99.9),
        "max_ms": lat[-1] if lat else float("nan"),
        "mean_ms": sum(lat) / len(lat) if lat else float("nan"),
        "records_total": total,
        "produce_requests": requests,
        "cpu": cpu,
        "window_s": window,
        "client_cpu": client_cpu,  # every thread of this client, librdkafka's included
        "machine_busy_cpu": window * (os.cpu_count() or 1) - idle,  # every process on the machine
    }


def _produce_requests(stats: list[dict[str, Any]], deadline: float) -> int:
    """Produce requests sent to the brokers, from a statistics report emitted after the last ack
    (the poller thread appends one every 100 ms)."""
    seen = len(stats)
    while len(stats) <= seen + 1 and time.perf_counter() < deadline:  # the next one may be half made
        time.sleep(0.02)
    if len(stats) <= seen:
        raise RuntimeError("librdkafka emitted no statistics after the last ack")
    return sum(int(b.get("req", {}).get("Produce", 0)) for b in stats[-1]["brokers"].values())


def api_versions_request(correlation_id: int, client_id: bytes = b"kanalbench") -> bytes:
    """An ApiVersions v0 request frame (with its length prefix)."""
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def raise_nofile(wanted: int) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft < limit:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def _answers(sockets: list[socket.socket], deadline: float) -> int:
    """How many sockets answered their ApiVersions (correlation id = index, no error) by ``deadline``.

    All are read at once (epoll): a gateway that cannot serve some connections (out of file
    descriptors for their upstream ones, say) closes them or leaves them unanswered, and that must
    show as a count rather than stall the run on the first of them."""
    sel = selectors.DefaultSelector()
    buffers: list[bytearray] = []
    for i, sock in enumerate(sockets):
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ, i)
        buffers.append(bytearray())
    answered, pending = 0, len(sockets)
    while pending and (left := deadline - time.perf_counter()) > 0:
        for key, _ in sel.select(min(left, 1.0)):
            i = key.data
            sock = sockets[i]
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            buf = buffers[i]
            buf += chunk
            done = not chunk
            if len(buf) >= 4 and len(buf) >= 4 + struct.unpack(">i", buf[:4])[0]:
                corr, error = struct.unpack(">ih", buf[4:10])
                answered += corr == i and error == 0
                done = True
            if done:
                sel.unregister(sock)
                pending -= 1
    sel.close()
    return answered


def idle(bootstrap: str, count: int, timeout: float = 60.0) -> dict[str, Any]:
    """Opens ``count`` connections, one ApiVersions each, then holds them until stdin closes.

    Prints a ``{"holding": n, ...}`` line when all connections are open and answered (or ``timeout``
    passed: unanswered ones are counted, not waited for)."""
    raise_nofile(count + 100)
    host, port = bootstrap.rsplit(":", 1)
    sockets: list[socket.socket] = []
    start = time.perf_counter()
    for _ in range(count):
        sock = socket.create_connection((host, int(port)), timeout=timeout)
        sockets.append(sock)
    for i, sock in enumerate(sockets):
        sock.sendall(api_versions_request(i))
    answered = _answers(sockets, time.perf_counter() + timeout)
    opened = time.perf_counter() - start
    print(json.dumps({"holding": len(sockets), "answered": answered, "seconds": opened}), flush=True)
    sys.stdin.read()  # until the driver closes our stdin
    alive = 0
    for sock in sockets:  # still open? a closed peer reads as b"" at once
        try:
            alive += sock.recv(1) != b""
        except BlockingIOError:
            alive += 1
        except OSError:
            pass
        sock.close()
    return {"connections": len(sockets), "answered": answered, "open_seconds": opened, "alive_at_end": alive}


def clients(
    bootstrap: str,
    topic: str,
    producers: int,
    consumers: int,
    partitions: list[int],
    rate: float,
    seconds: float,
    warmup: float = 1.0,
    size: int = 100,
    fetch_wait_ms: int = 500,
    group_prefix: str = "kanalbench",
) -> dict[str, Any]:
    """Many small clients at once, as behind a gateway that pools upstream connections.

    ``producers`` producers (acks=1, linger.ms 0: one record per Produce request) send ``rate``
    records/s between them, in turn; ``consumers`` consumers long-poll (``fetch_wait_ms``), consumer
    ``j`` assigned ``partitions[j % len(partitions)]`` from its end, each in a group of its own. No
    Python thread serves the consumers: librdkafka fetches into its queue on its own threads, which
    is drained and counted at the end. Each producer has a thread serving its delivery callbacks, so
    a record's latency (produce() to callback) is read as its ack arrives.

    Prints ``{"ready": ...}`` once every client has fetched metadata, then waits for a start time
    (Unix time, one line on stdin) so that every worker process starts sending together. Latencies
    are those of records sent from ``warmup`` seconds after the start for ``seconds``. Once every
    record is acknowledged it prints ``{"sent": ...}`` and keeps its clients connected until the
    next line on stdin."""
    from confluent_kafka import OFFSET_END, Consumer, Producer, TopicPartition

    raise_nofile(4096)
    prods = [
        Producer(producer_config(bootstrap, **{"linger.ms": 0, "delivery.report.only.error": False}))
        for _ in range(producers)
    ]
    cons = [
        Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"{group_prefix}-{j}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "fetch.wait.max.ms": fetch_wait_ms,
            }
        )
        for j in range(consumers)
    ]
    for producer in prods:
        producer.list_topics(topic, timeout=30)
    for consumer in cons:
        consumer.list_topics(topic, timeout=30)
    for j, consumer in enumerate(cons):
        consumer.assign([TopicPartition(topic, partitions[j % len(partitions)], OFFSET_END)])

    measured: list[float] = []
    errors: list[str] = []
    stop = threading.Event()

    def on_warm(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    def on_measured(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            measured.append(msg.latency() * 1000.0)  # ms

    def serve(producer: Any) -> None:
        while not stop.is_set():
            producer.poll(0.05)

    pollers = [threading.Thread(target=serve, args=(p,), daemon=True) for p in prods]
    for t in pollers:
        t.start()
    print(json.dumps({"ready": True, "producers": producers, "consumers": consumers}), flush=True)
    start_wall = float(sys.stdin.readline())
    start = time.perf_counter() + (start_wall - time.time())
    vals = values(size, "bytes")
    mask = DISTINCT_VALUES - 1
    interval = 1.0 / rate if rate > 0 and prods else 0.0
    warm_n = int(rate * warmup) if prods else 0
    total = warm_n + int(rate * seconds) if prods else 0
    for i in range(total):
        delay = start + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        prods[i % producers].produce(topic, vals[i & mask], on_delivery=on_warm if i < warm_n else on_measured)
    if not prods:
        delay = start + warmup + seconds - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    send_end = time.perf_counter()
    left = sum(p.flush(30) for p in prods)
    stop.set()
    for t in pollers:
        t.join()
    print(json.dumps({"sent": total}), flush=True)
    sys.stdin.readline()  # every client stays connected until the driver has counted connections
    consumed = 0
    for consumer in cons:
        while batch := consumer.consume(10_000, 0):
            consumed += sum(1 for msg in batch if msg.error() is None)
    closers = [threading.Thread(target=c.close) for c in cons]  # each waits for its fetch in flight
    for t in closers:
        t.start()
    for t in closers:
        t.join()
    if errors or left:
        raise RuntimeError(f"clients run failed: {left} undelivered, {len(errors)} errors, first: {errors[:1]}")
    return {
        "latencies_ms": [round(x, 4) for x in measured],
        "sent": total,
        "measured": total - warm_n,
        "send_seconds": send_end - start,
        "consumed": consumed,
    }


def fetch_loop(bootstrap: str, topic: str, records: int, partition_bytes: int = 1_048_576) -> dict[str, Any]:
    """How fast the path serves partition 0 of ``topic`` (offset 0 to ``records`` records) to raw
    Fetch v12 requests (read_uncommitted, ``partition_bytes`` per fetch, as librdkafka's default),
    one at a time on one connection, with no client library in the way.

    A first pass decodes each response (kio) to learn the offsets the path's answers end at; the
    timed pass sends the same Fetch requests again and only receives the answers (their length,
    then their bytes): the time is the path's serving time, not the client's decoding."""
    import datetime

    from kanal.protocol.api import require_request_class
    from kanal.protocol.entities import build, nested
    from kanal.protocol.messages import decode_response, encode_request
    from kanal.protocol.records import RecordSet

    cls = require_request_class(1, 12)
    topic_cls = nested(cls, "topics")
    part_cls = nested(topic_cls, "partitions")
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=30)

    def exactly(n: int) -> bytes:
        chunks = []
        while n:
            chunk = sock.recv(min(n, 1 << 20))
            if not chunk:
                raise ConnectionError("closed by the peer")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def request(offset: int, correlation_id: int) -> bytes:
        part = build(
            part_cls, partition=0, current_leader_epoch=-1, fetch_offset=offset, partition_max_bytes=partition_bytes
        )
        body = build(
            cls,
            replica_id=-1,
            max_wait=datetime.timedelta(milliseconds=500),  # (the data is there: answered at once)
            min_bytes=1,
            max_bytes=64 << 20,
            isolation_level=0,
            session_epoch=-1,
            topics=(build(topic_cls, topic=topic, partitions=(part,)),),
        )
        frame = encode_request(body, correlation_id, "kanalbench-fetch")
        return struct.pack(">i", len(frame)) + frame

    try:
        offsets, count = [0], 0
        while count < records:  # learning pass
            sock.sendall(request(offsets[-1], len(offsets)))
            (size,) = struct.unpack(">i", exactly(4))
            answer = decode_response(1, 12, exactly(size)).responses[0].partitions[0]
            if answer.error_code != 0:
                raise RuntimeError(f"fetch failed: error {answer.error_code}")
            batches = RecordSet.parse(answer.records).batches
            if not batches:
                raise RuntimeError(f"no records at offset {offsets[-1]} after {count} of {records}")
            count += sum(b.records_count for b in batches)
            offsets.append(batches[-1].base_offset + batches[-1].last_offset_delta + 1)
        frames = [request(offset, i + 1) for i, offset in enumerate(offsets[:-1])]
        received = 0
        start = time.perf_counter()
        for frame in frames:  # timed pass
            sock.sendall(frame)
            (size,) = struct.unpack(">i", exactly(4))
            received += len(exactly(size))
        seconds = time.perf_counter() - start
    finally:
        sock.close()
    return {"seconds": seconds, "records": count, "fetches": len(frames), "bytes": received}


JOBS: dict[str, Callable[..., dict[str, Any]]] = {
    "produce": produce,
    "produce-together": produce_together,
    "fetch-loop": fetch_loop,
    "consume": consume,
    "latency": latency,
    "idle": idle,
    "clients": clients,
}


def main(argv: list[str]) -> int:
    job, args = argv[0], json.loads(argv[1])
    result = JOBS[job](**args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
