"""Topic ACLs of the backing cluster, read with DescribeAcls, cached per topic, looked up once at a time.

One lookup per topic asks the cluster for every binding that applies to that topic
(``pattern_type_filter=MATCH``: LITERAL bindings of the name, LITERAL ``*``, PREFIXED bindings that
prefix it); the decision is then made here:

- a binding counts when its principal is ``User:<name>`` or ``User:*`` and its operation is the one
  asked (READ for Read, WRITE for Write) or ALL; Write does not imply Read;
- LITERAL bindings apply to the exact name (or ``*``), PREFIXED ones to every topic they prefix;
- DENY beats ALLOW; no matching ALLOW denies;
- ALLOW bindings restricted to a host other than ``*`` do not grant (the proxy does not know a
  Kafka client address); DENY bindings apply whatever their host.

Results are cached ``AUTHORIZATION_TOPIC_ACL_CACHE_TTL``; failed lookups (broker error, timeout after
``AUTHORIZATION_TOPIC_ACL_LOOKUP_TIMEOUT``, no connection) are never cached and deny. Concurrent
lookups of one topic share one request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import trio

from kanal.api import ApiKey, ErrorCode, KafkaClient, build
from kanal_registry_proxy.metrics import ProxyMetrics

log = logging.getLogger(__name__)

# Kafka's enums (org.apache.kafka.common.acl / resource)
RESOURCE_TOPIC = 2
PATTERN_MATCH = 2
PATTERN_LITERAL = 3
PATTERN_PREFIXED = 4
OP_ANY = 1
OP_ALL = 2
OP_READ = 3
OP_WRITE = 4
PERMISSION_ANY = 1
PERMISSION_DENY = 2
PERMISSION_ALLOW = 3


class AclLookupError(Exception):
    """The cluster could not say which ACLs apply (the request is denied)."""


@dataclass(frozen=True, slots=True)
class AclBinding:
    pattern_type: int
    resource_name: str
    principal: str
    host: str
    operation: int
    permission: int

    def applies_to(self, topic: str) -> bool:
        if self.pattern_type == PATTERN_LITERAL:
            return self.resource_name in (topic, "*")
        if self.pattern_type == PATTERN_PREFIXED:
            return topic.startswith(self.resource_name)
        return False


def decide(bindings: list[AclBinding], principal: str, topic: str, operation: int) -> bool:
    """Whether ``User:<principal>`` may do ``operation`` (OP_READ or OP_WRITE) on ``topic``."""
    names = (f"User:{principal}", "User:*")
    allowed = False
    for binding in bindings:
        if binding.principal not in names or binding.operation not in (operation, OP_ALL):
            continue
        if not binding.applies_to(topic):
            continue
        if binding.permission == PERMISSION_DENY:
            return False
        if binding.permission == PERMISSION_ALLOW and binding.host == "*":
            allowed = True
    return allowed


def topic_of(subject: str) -> str | None:
    """The topic of a subject under the topic name strategy (``<topic>-value``, ``<topic>-key``)."""
    for suffix in ("-value", "-key"):
        if subject.endswith(suffix) and len(subject) > len(suffix):
            return subject[: -len(suffix)]
    return None


class _Flight:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: list[AclBinding] | None = None
        self.error: Exception | None = None


class AclLookup:
    """Bindings per topic, from DescribeAcls, cached and single-flight.

    ``kafka`` is the gateway's own client when the gateway hosts the proxy, the command line's alone.
    """

    def __init__(
        self,
        kafka: KafkaClient,
        cache_ttl: float = 0.5,
        timeout: float = 5.0,
        metrics: ProxyMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kafka = kafka
        self._versions_known = False
        self.cache_ttl = cache_ttl
        self.timeout = timeout
        self.metrics = metrics
        self.clock = clock
        self._cache: dict[str, tuple[list[AclBinding], float]] = {}
        self._flights: dict[str, _Flight] = {}
        self.requests_sent = 0

    async def bindings(self, topic: str) -> list[AclBinding]:
        cached = self._cache.get(topic)
        if cached is not None and cached[1] > self.clock():
            self._hit(True)
            return cached[0]
        self._hit(False)
        flight = self._flights.get(topic)
        if flight is not None:  # someone is asking already: share the answer
            await flight.done.wait()
            if flight.error is not None:
                raise AclLookupError(str(flight.error))
            assert flight.result is not None
            return flight.result
        flight = self._flights[topic] = _Flight()
        try:
            result = await self._describe(topic)
        except AclLookupError as exc:
            flight.error = exc
            raise
        except BaseException as exc:
            flight.error = AclLookupError(f"lookup interrupted: {type(exc).__name__}")
            raise
        else:
            flight.result = result
            self._cache[topic] = (result, self.clock() + self.cache_ttl)
            if len(self._cache) > 10_000:
                now = self.clock()
                self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
            return result
        finally:
            del self._flights[topic]
            flight.done.set()

    async def _describe(self, topic: str) -> list[AclBinding]:
        self.requests_sent += 1
        try:
            with trio.fail_after(self.timeout):
                if not self._versions_known:
                    # one call first, so that the request class below is at a version the broker speaks
                    await self.kafka.call(
                        build(
                            self.kafka.request_class(ApiKey.API_VERSIONS),
                            client_software_name="kanal-srp",
                            client_software_version="1",
                        ),
                        timeout=self.timeout,
                    )
                    self._versions_known = True
                request = build(
                    self.kafka.request_class(ApiKey.DESCRIBE_ACLS),  # v1-v3 (v0 knows no pattern types)
                    resource_type_filter=RESOURCE_TOPIC,
                    resource_name_filter=topic,
                    pattern_type_filter=PATTERN_MATCH,
                    principal_filter=None,
                    host_filter=None,
                    operation=OP_ANY,
                    permission_type=PERMISSION_ANY,
                )
                response = await self.kafka.call(request, timeout=self.timeout)
        except trio.TooSlowError:
            self._outcome("timeout")
            raise AclLookupError(f"ACL lookup of topic {topic!r} timed out after {self.timeout:g} s") from None
        except AclLookupError:
            self._outcome("error")
            raise
        except Exception as exc:
            self._outcome("error")
            raise AclLookupError(f"ACL lookup of topic {topic!r} failed: {exc}") from exc
        if response.error_code != ErrorCode.none:
            self._outcome("error")
            message = f" ({response.error_message})" if response.error_message else ""
            raise AclLookupError(f"ACL lookup of topic {topic!r}: {response.error_code.name}{message}")
        found: list[AclBinding] = []
        for resource in response.resources:
            if int(resource.resource_type) != RESOURCE_TOPIC:
                continue
            for acl in resource.acls:
                found.append(
                    AclBinding(
                        int(resource.pattern_type),
                        str(resource.resource_name),
                        str(acl.principal),
                        str(acl.host),
                        int(acl.operation),
                        int(acl.permission_type),
                    )
                )
        self._outcome("ok")
        return found

    def _hit(self, hit: bool) -> None:
        if self.metrics is not None:
            self.metrics.cache_lookup("topic_acl", hit)

    def _outcome(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.acl_lookups.labels(outcome).inc()
