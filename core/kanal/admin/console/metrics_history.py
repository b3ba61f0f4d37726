"""The last hour of a few of the gateway's own metrics, for the console's charts.

Prometheus keeps history for a real deployment; the console's gateway page should show a trend
without one. Every :data:`SAMPLE_SECONDS` the node reads its registry's totals (requests, bytes in
and out, open client connections) and keeps :data:`SAMPLES` of them: a fixed, small amount of memory.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import Final

import trio
from prometheus_client import CollectorRegistry

__all__ = ["MetricsHistory", "Sample"]

SAMPLE_SECONDS: Final = 10.0
SAMPLES: Final = 360  # one hour

_TOTALS: Final = {
    "gateway_requests_total": "requests",
    "gateway_request_bytes_total": "bytes_in",
    "gateway_response_bytes_total": "bytes_out",
    "gateway_client_connections_active": "connections",
}


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # seconds since the epoch
    requests: float
    bytes_in: float
    bytes_out: float
    connections: float


def read(registry: CollectorRegistry, now: float | None = None) -> Sample:
    """The registry's totals now (a sum over every label set)."""
    totals = dict.fromkeys(_TOTALS.values(), 0.0)
    for family in registry.collect():
        for sample in family.samples:
            field = _TOTALS.get(sample.name)
            if field is not None:
                totals[field] += sample.value
    return Sample(time.time() if now is None else now, **totals)


class MetricsHistory:
    """Samples of one registry, oldest first."""

    def __init__(self, registry: CollectorRegistry, keep: int = SAMPLES) -> None:
        self.registry = registry
        self.samples: deque[Sample] = deque(maxlen=keep)

    def sample(self, now: float | None = None) -> None:
        self.samples.append(read(self.registry, now))

    def rates(self) -> list[tuple[float, float, float, float, float]]:
        """Per interval between samples: (end time, requests/s, bytes in/s, bytes out/s, connections)."""
        out = []
        for before, after in pairwise(self.samples):
            span = max(after.at - before.at, 1e-9)
            out.append(
                (
                    after.at,
                    max(0.0, after.requests - before.requests) / span,
                    max(0.0, after.bytes_in - before.bytes_in) / span,
                    max(0.0, after.bytes_out - before.bytes_out) / span,
                    after.connections,
                )
            )
        return out

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Samples every :data:`SAMPLE_SECONDS` until cancelled (a companion service of the gateway)."""
        self.sample()
        task_status.started()
        while True:
            await trio.sleep(SAMPLE_SECONDS)
            self.sample()
