"""The plugin author guide (docs/plugin-author-guide.md) is executable: this file keeps it honest.

* Code blocks whose first line is ``# example: NAME`` are extracted and run: the CreateTopics
  policy against decoded CreateTopics requests built with kio, the require-key record hook
  against record sets built with ``encode_batch``, and both inside a real gateway in front of
  Tansu, loaded through a ``kanal.plugins`` entry point, with real admin clients and producers.
* Code blocks whose first line is ``# file: PATH`` must equal that file of the repository (the
  header-injection plugin, quoted in full).
* Every hookspec of ``kanal.api.hookspecs`` has its own section in the guide.
"""

from __future__ import annotations

import re
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import trio
import yaml
from kio.schema.create_topics.v4 import request as create_topics_v4
from kio.schema.create_topics.v7 import request as create_topics_v7
from kio.static.primitive import i16, i32

from kanal.api import ConfigError, hookspecs
from kanal.api.context import Connection
from kanal.api.interceptor import InterceptorConfigError, InterceptorSpec
from kanal.api.results import PartitionError
from kanal.embedded import GatewayProcess, TansuBroker
from kanal.pipeline.chain import Pipeline
from kanal.pipeline.registry import PluginRegistry
from kanal.protocol.api import ApiKey
from kanal.protocol.messages import decode_request, encode_request
from kanal.protocol.records import GZIP, HEADER_SIZE, Record, RecordBatch, encode_batch
from kanal.testing import Exchange, FakeServices, Harness

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "plugin-author-guide.md"
FENCE = re.compile(r"^```[\w-]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
POLICY_VIOLATION = 44
INVALID_RECORD = 87
TIMEOUT = 20.0


# ------------------------------------------------------------------------------ the guide's code


def code_blocks() -> list[str]:
    return FENCE.findall(GUIDE.read_text(encoding="utf-8"))


def example_source(name: str) -> str:
    """The code of the blocks marked ``# example: NAME``, in order."""
    parts = [b for b in code_blocks() if b.splitlines()[0].strip() == f"# example: {name}"]
    assert parts, f"no code block marked '# example: {name}' in {GUIDE}"
    return "\n".join(parts)


def load_example(name: str) -> ModuleType:
    """Runs an example as a module named after it (registered in sys.modules, as an import would)."""
    module = ModuleType(f"guide_example_{name.replace('-', '_')}")
    module.__file__ = f"{GUIDE}#{name}"
    sys.modules[module.__name__] = module
    exec(compile(example_source(name), module.__file__, "exec"), module.__dict__)
    return module


@pytest.fixture(scope="module")
def policy() -> ModuleType:
    return load_example("create-topic-policy")


@pytest.fixture(scope="module")
def require_key() -> ModuleType:
    return load_example("require-key")


def test_quoted_files_are_the_repository_files() -> None:
    quoted = 0
    for block in code_blocks():
        first, _, body = block.partition("\n")
        match = re.fullmatch(r"# file: (\S+)", first.strip())
        if match:
            path = REPO / match.group(1)
            assert path.is_file(), f"the guide quotes {match.group(1)}, which does not exist"
            assert body.rstrip("\n") == path.read_text(encoding="utf-8").rstrip("\n"), (
                f"the guide's copy of {match.group(1)} differs from the file: update the guide"
            )
            quoted += 1
    assert quoted >= 3  # the header-injection plugin: pyproject.toml, __init__.py, interceptor.py


def test_every_hookspec_has_a_section() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    names = [
        n for cls in (hookspecs.PluginHooks, hookspecs.InterceptorHooks) for n in vars(cls) if n.startswith("kanal_")
    ]
    assert len(names) >= 7
    missing = [n for n in names if f"### `{n}`" not in text]
    assert not missing, f"hookspecs without a section in the guide: {missing}"


def test_record_values_example() -> None:
    json_values = load_example("record-values").json_values
    records = [Record(offset_delta=0, value=b'{"a": 1}'), Record(offset_delta=1), Record(offset_delta=2, value=b"x")]
    batch = RecordBatch(encode_batch(records, base_timestamp=1, compression=GZIP))
    assert json_values(batch) == [{"a": 1}, None, b"x"]
    damaged = bytearray(encode_batch(records, base_timestamp=1))
    damaged[HEADER_SIZE] += 2  # the first record's length, one byte too long
    with pytest.raises(ValueError):
        json_values(RecordBatch(bytes(damaged)))


# ------------------------------------------------------------------ create-topic-policy, unit level


def connection() -> Connection:
    return Connection(id=1, client_address="127.0.0.1:50000", listener_address="127.0.0.1:9092", node_id=111)


def decoded_create_topics(version: int, topics: list[tuple[str, int, int]]) -> Any:
    """A CreateTopics request built with kio, encoded and decoded as the core does;
    ``topics`` holds (name, num_partitions, explicit assignments)."""
    schema = {4: create_topics_v4, 7: create_topics_v7}[version]
    request = schema.CreateTopicsRequest(
        topics=tuple(
            schema.CreatableTopic(
                name=name,
                num_partitions=i32(partitions),
                replication_factor=i16(-1 if assigned else 1),
                assignments=tuple(
                    schema.CreatableReplicaAssignment(partition_index=i32(p), broker_ids=(i32(111),))
                    for p in range(assigned)
                ),
                configs=(),
            )
            for name, partitions, assigned in topics
        ),
        validate_only=False,
    )
    header, body = decode_request(encode_request(request, 7, "guide-test"))
    assert (header.api_key, header.api_version) == (ApiKey.CREATE_TOPICS, version)
    return body


def exchange(policy: ModuleType, request: Any, limit: int = 12) -> Exchange:
    """The request through a chain holding the policy, as the gateway runs it (harness, no sockets):
    what reaches the broker and what the client gets."""
    harness = Harness()
    harness.add(policy.MaxPartitions, {"maxPartitions": limit})
    return trio.run(partial(harness.request, request, upstream=lambda forwarded: OK))


OK: Any = object()  # stands for the broker's answer: a test that sees it knows the request went upstream


def test_settings_family_example_reads_its_connections_and_hints_the_others() -> None:
    vault = load_example("vault-settings")
    [family] = vault.kanal_settings()
    assert family.prefix == "GATEWAY_EXTERNAL_CONNECTION_"
    env = {
        "GATEWAY_EXTERNAL_CONNECTION_KEYS_TYPE": "VAULT",
        "GATEWAY_EXTERNAL_CONNECTION_KEYS_CONFIG_URI": "http://vault:8200",
        "GATEWAY_EXTERNAL_CONNECTION_REG_TYPE": "SCHEMA_REGISTRY",
        "GATEWAY_EXTERNAL_CONNECTION_REG_CONFIG_URL": "http://registry:8081",
    }
    checked = family.check(env)
    assert sorted(checked.read) == [
        "GATEWAY_EXTERNAL_CONNECTION_KEYS_CONFIG_URI",
        "GATEWAY_EXTERNAL_CONNECTION_KEYS_TYPE",
    ]
    assert set(checked.hints) == {"GATEWAY_EXTERNAL_CONNECTION_REG_TYPE"}
    with pytest.raises(ConfigError, match="unknown vault connection property TOKN") as error:
        family.check({**env, "GATEWAY_EXTERNAL_CONNECTION_KEYS_CONFIG_TOKN": "t"})
    assert error.value.key == "GATEWAY_EXTERNAL_CONNECTION_KEYS_CONFIG_TOKN"


@pytest.mark.parametrize("version", [4, 7])
def test_policy_rejects_too_many_partitions(policy: ModuleType, version: int) -> None:
    request = decoded_create_topics(version, [("small", 3, 0), ("huge", 50, 0)])
    result = exchange(policy, request)
    assert result.forwarded is None  # the broker never sees it
    message = "at most 12 partitions per topic: huge (50)"
    # what the client receives: POLICY_VIOLATION on every topic, with the message
    assert [(t.name, int(t.error_code), t.error_message) for t in result.response.topics] == [
        ("small", POLICY_VIOLATION, message),
        ("huge", POLICY_VIOLATION, message),
    ]


@pytest.mark.parametrize(
    ("topics", "rejected"),
    [
        ([("a", 12, 0)], False),  # at the limit
        ([("a", 13, 0)], True),
        ([("a", -1, 0)], False),  # the broker's default partition count
        ([("a", -1, 13)], True),  # explicit assignments count
        ([("a", -1, 12)], False),
        ([("a", 1, 0), ("b", 2, 0), ("c", 100, 0)], True),
    ],
)
def test_policy_decisions(policy: ModuleType, topics: list[tuple[str, int, int]], rejected: bool) -> None:
    request = decoded_create_topics(7, topics)
    result = exchange(policy, request)
    if rejected:
        assert result.forwarded is None
        assert {int(t.error_code) for t in result.response.topics} == {POLICY_VIOLATION}
    else:
        assert result.forwarded is request and result.response is OK


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({}, "maxPartitions"),
        ({"maxPartitions": 0}, "maxPartitions"),
        ({"maxPartitions": True}, "maxPartitions"),
        ({"maxPartitions": "12"}, "maxPartitions"),
        ({"maxPartitions": 3, "max": 4}, "max"),
    ],
)
def test_policy_config_errors_name_the_key(policy: ModuleType, config: dict[str, Any], key: str) -> None:
    with pytest.raises(InterceptorConfigError, match=rf"^{key}: "):
        Harness().add(policy.MaxPartitions, config)


def test_policy_decodes_create_topics_only(policy: ModuleType) -> None:
    registry = PluginRegistry()
    registry.register(policy, "guide-create-topic-policy")
    pipeline = Pipeline(registry, lambda plugin: FakeServices())
    pipeline.configure([InterceptorSpec("partition-limit", "max-partitions", 10, config={"maxPartitions": 12})])
    chain = pipeline.resolve()
    assert [key for key in ApiKey if chain.decode_request(key)] == [ApiKey.CREATE_TOPICS]
    assert not any(chain.decode_response(key) for key in ApiKey)


# -------------------------------------------------------------------------- require-key, unit level


def test_require_key(require_key: ModuleType) -> None:
    harness = Harness()
    harness.add(require_key.RequireKey)
    keyed = encode_batch([Record(offset_delta=i, key=b"k", value=b"v") for i in range(3)], base_timestamp=1)
    records, error = trio.run(harness.records, "orders", 0, keyed)
    assert error is None
    assert records.to_bytes() is keyed  # untouched: forwarded as is

    keyless = encode_batch([Record(key=b"k", value=b"v"), Record(offset_delta=1, value=b"v")], base_timestamp=1)
    records, error = trio.run(harness.records, "orders", 0, keyless)
    assert error == PartitionError(INVALID_RECORD, "records of orders need a key")
    assert harness.connection.state == {"require-key.refused": 1}
    trio.run(harness.close)
    assert harness.connection.state == {}


# ------------------------------------------------------------------------- both, in a real gateway


@dataclass
class ExampleGateway:
    process: GatewayProcess
    broker: TansuBroker
    names: list[str] = field(default_factory=list)


def install_examples(directory: Path) -> None:
    """Makes the examples an installed distribution for a child process whose PYTHONPATH holds
    ``directory``: one module per example and a dist-info declaring their entry points."""
    entry_points = ["[kanal.plugins]"]
    for name in ("create-topic-policy", "require-key"):
        module = f"guide_{name.replace('-', '_')}"
        (directory / f"{module}.py").write_text(example_source(name), encoding="utf-8")
        entry_points.append(f"guide-{name} = {module}")
    dist_info = directory / "kanal_guide_examples-0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: kanal-guide-examples\nVersion: 0\n")
    (dist_info / "entry_points.txt").write_text("\n".join(entry_points) + "\n")


@pytest.fixture(scope="module")
def example_gateway(tansu: TansuBroker, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExampleGateway]:
    directory = tmp_path_factory.mktemp("guide-examples")
    install_examples(directory)
    config = directory / "kanal.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "interceptors": [
                    {
                        "name": "partition-limit",
                        "plugin": "max-partitions",
                        "priority": 10,
                        "config": {"maxPartitions": 4},
                    },
                    {"name": "keys-required", "plugin": "require-key", "priority": 20},
                ]
            }
        )
    )
    env = {**tansu.gateway_settings(), "PYTHONPATH": str(directory)}
    process = GatewayProcess(env, args=("run", "--config", str(config)), log_path=directory / "gateway.log")
    process.start(timeout=30)
    try:
        yield ExampleGateway(process, tansu)
    finally:
        code = process.stop(timeout=15)
    assert code == 0, f"gateway exited with {code} on SIGTERM:\n{process.tail()}"


def broker_topics(broker: TansuBroker) -> set[str]:
    from confluent_kafka.admin import AdminClient

    return set(AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=TIMEOUT).topics)


@pytest.mark.integration
def test_policy_in_a_gateway_confluent(example_gateway: ExampleGateway) -> None:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": example_gateway.process.bootstrap})
    huge, small = f"guide-huge-{uuid.uuid4().hex[:8]}", f"guide-small-{uuid.uuid4().hex[:8]}"
    futures = admin.create_topics([NewTopic(huge, num_partitions=5, replication_factor=1)], request_timeout=TIMEOUT)
    with pytest.raises(KafkaException) as info:
        futures[huge].result(TIMEOUT)
    error = info.value.args[0]
    assert error.code() == KafkaError.POLICY_VIOLATION
    assert "at most 4 partitions per topic" in error.str()

    futures = admin.create_topics([NewTopic(small, num_partitions=4, replication_factor=1)], request_timeout=TIMEOUT)
    futures[small].result(TIMEOUT)
    topics = broker_topics(example_gateway.broker)  # checked on the broker, not through the gateway
    assert small in topics
    assert huge not in topics


@pytest.mark.integration
def test_policy_in_a_gateway_kafka_python(example_gateway: ExampleGateway) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import PolicyViolationError

    admin = KafkaAdminClient(
        bootstrap_servers=example_gateway.process.bootstrap, request_timeout_ms=int(TIMEOUT * 1000)
    )
    try:
        huge = f"guide-huge-{uuid.uuid4().hex[:8]}"
        with pytest.raises(PolicyViolationError):
            admin.create_topics([NewTopic(huge, num_partitions=10, replication_factor=1)])
        small = f"guide-small-{uuid.uuid4().hex[:8]}"
        admin.create_topics([NewTopic(small, num_partitions=2, replication_factor=1)])
    finally:
        admin.close()
    topics = broker_topics(example_gateway.broker)
    assert small in topics
    assert huge not in topics


@pytest.mark.integration
def test_require_key_in_a_gateway(example_gateway: ExampleGateway) -> None:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"guide-keys-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": example_gateway.broker.bootstrap})  # keep it alive until done
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(TIMEOUT)

    reports: list[tuple[bytes | None, int | None]] = []

    def on_delivery(err: Any, msg: Any) -> None:
        reports.append((msg.value(), None if err is None else err.code()))

    producer = Producer({"bootstrap.servers": example_gateway.process.bootstrap, "linger.ms": 5})
    for i in range(3):
        producer.produce(topic, key=f"k{i}".encode(), value=f"keyed-{i}".encode(), partition=0, on_delivery=on_delivery)
    assert producer.flush(TIMEOUT) == 0
    producer.produce(topic, value=b"keyless", partition=1, on_delivery=on_delivery)
    assert producer.flush(TIMEOUT) == 0
    assert reports == [
        (b"keyed-0", None),
        (b"keyed-1", None),
        (b"keyed-2", None),
        (b"keyless", KafkaError.INVALID_RECORD),
    ]

    consumer = Consumer(
        {
            "bootstrap.servers": example_gateway.broker.bootstrap,
            "group.id": f"guide-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(2)])
        values: list[bytes | None] = []
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # read for a while: the keyless record must never show up
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                values.append(msg.value())
    finally:
        consumer.close()
    assert sorted(v or b"" for v in values) == [b"keyed-0", b"keyed-1", b"keyed-2"]
