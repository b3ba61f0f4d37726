"""Helpers of the tests: a fake cluster for unit tests; gateway config and process for integration.

The unit tests run the interceptor in :class:`kanal.testing.Harness`, with :class:`FakeCluster` as
the broker: it answers the Metadata request the interceptor sends and the CreateTopics request it
forwards. The integration tests start the gateway as a child process (``kanal.embedded``), which
finds this plugin the way a production gateway would: through the ``kanal.plugins`` entry point of
the installed ``kanal-topic-quota`` distribution.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kanal.api import ApiKey, ErrorCode, build, nested, require_request_class, response_class
from kanal.embedded import GatewayProcess

CREATED = "kanal_topic_quota_created_total"  # the sample name Prometheus exposes


class FakeCluster:
    """A broker holding topic names: answers Metadata (listing them) and CreateTopics (creating the
    new ones; ``TOPIC_ALREADY_EXISTS`` for the others; the error in ``failures`` for names there)."""

    def __init__(self, topics: Iterable[str] = (), failures: Mapping[str, ErrorCode] | None = None) -> None:
        self.topics: list[str] = list(topics)
        self.failures = dict(failures or {})
        self.unreadable: set[str] = set()  # listed by Metadata with an error code

    def __call__(self, request: Any) -> Any:
        api_key, version = int(request.__api_key__), int(request.__version__)
        cls = response_class(api_key, version)
        assert cls is not None, f"kio knows no response class for {api_key} v{version}"
        if api_key == ApiKey.METADATA:
            assert request.topics is None, "the interceptor asks for every topic"
            topic_cls = nested(cls, "topics")
            listed = [*self.topics, *sorted(self.unreadable)]
            return build(
                cls,
                topics=tuple(
                    build(
                        topic_cls,
                        name=name,
                        error_code=ErrorCode.topic_authorization_failed if name in self.unreadable else ErrorCode.none,
                    )
                    for name in listed
                ),
            )
        if api_key == ApiKey.CREATE_TOPICS:
            topic_cls = nested(cls, "topics")
            results = []
            for topic in request.topics:
                error = self.failures.get(topic.name, ErrorCode.none)
                if topic.name in self.topics:
                    error = ErrorCode.topic_already_exists
                elif error == ErrorCode.none and not request.validate_only:
                    self.topics.append(topic.name)
                results.append(build(topic_cls, name=topic.name, error_code=error))
            return build(cls, topics=tuple(results))
        raise AssertionError(f"unexpected request {type(request).__name__}")


def create_topics(*names: str, validate_only: bool = False, version: int = 7) -> Any:
    """A CreateTopics request as a client sends it."""
    cls = require_request_class(ApiKey.CREATE_TOPICS, version)
    topic_cls = nested(cls, "topics")
    topics = tuple(build(topic_cls, name=name, num_partitions=1, replication_factor=1) for name in names)
    return build(cls, topics=topics, validate_only=validate_only)


def write_config(directory: Path, interceptors: Sequence[Mapping[str, Any]]) -> Path:
    """Writes a gateway config file holding ``interceptors``; returns its path."""
    path = directory / "kanal.yaml"
    path.write_text(yaml.safe_dump({"interceptors": interceptors}, sort_keys=False))
    return path


@contextmanager
def running_gateway(settings: Mapping[str, str], config: Path, log_dir: Path) -> Iterator[GatewayProcess]:
    """``python -m kanal run --config <config>`` with ``settings`` (from ``TansuBroker.gateway_settings``);
    must stop cleanly."""
    process = GatewayProcess(settings, args=("run", "--config", str(config)), log_path=log_dir / "gateway.log")
    process.start(timeout=30)
    try:
        yield process
    finally:
        code = process.stop(timeout=15)
    assert code == 0, f"gateway exited with {code} on SIGTERM:\n{process.tail()}"


def scrape(http_port: str) -> str:
    """The gateway's ``/metrics`` text (the admin API serves it without credentials)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as answer:
        text: str = answer.read().decode()
    return text
