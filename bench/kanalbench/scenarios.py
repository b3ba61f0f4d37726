"""The scenarios: one measurement with one gateway config each, and their CLI defaults.

Adding a plugin scenario is one function: put the gateway config (with its ``interceptors``) in
``bench/configs/`` and register a measurement with it, for example::

    @scenario("validation-throughput", "1 KB JSON records through the data-quality interceptor",
              payload="json")
    def validation_throughput(opts: Options, name: str) -> Report:
        return measure.throughput(opts, name, config=CONFIGS / "validation.yaml")

It is then ``python bench/run.py validation-throughput`` and part of ``all``. Any scenario also takes
``--config FILE`` to run its measurement against a gateway configured by another YAML file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kanalbench import measure
from kanalbench.measure import Options
from kanalbench.report import Report

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

Runner = Callable[[Options, str], Report]


@dataclass(frozen=True)
class Scenario:
    name: str
    help: str
    run: Runner
    defaults: dict[str, Any] = field(default_factory=dict)
    #: Extra option sets ``all`` runs this scenario with (besides its defaults).
    variants: tuple[dict[str, Any], ...] = ()


SCENARIOS: dict[str, Scenario] = {}


def scenario(
    name: str, help: str, *, variants: tuple[dict[str, Any], ...] = (), **defaults: Any
) -> Callable[[Runner], Runner]:
    """Registers a scenario; ``defaults`` are its CLI defaults (size, records, rate, payload, ...)."""

    def register(run: Runner) -> Runner:
        SCENARIOS[name] = Scenario(name, help, run, defaults, variants)
        return run

    return register


# ------------------------------------------------------------------------------------ passthrough


@scenario(
    "passthrough-throughput",
    "produce then consume N records, no interceptors",
    size=1024,
    records=200_000,
    variants=({"size": 100},),
)
def passthrough_throughput(opts: Options, name: str) -> Report:
    return measure.throughput(opts, name)


@scenario(
    "passthrough-latency", "produce latency at a steady rate, no interceptors", size=1024, rate=5000.0, seconds=10.0
)
def passthrough_latency(opts: Options, name: str) -> Report:
    return measure.latency(opts, name)


@scenario("idle-connections", "hold N idle client connections; the gateway's RSS", count=1000)
def idle_connections(opts: Options, name: str) -> Report:
    return measure.idle_connections(opts, name)


# Plugin scenarios kept in modules of their own register themselves on import.
import kanalbench.dataquality_scenario  # noqa: E402  (dataquality-throughput)
import kanalbench.encryption_scenario  # noqa: E402  (encryption)
import kanalbench.fleet_scenario  # noqa: E402  (fleet)
import kanalbench.pooling_scenario  # noqa: E402  (pooled-clients)
import kanalbench.request_rate_scenario  # noqa: E402  (request-rate)
import kanalbench.safeguards_scenario  # noqa: E402  (safeguards)
import kanalbench.sasl_scenario  # noqa: E402  (sasl-throughput)
import kanalbench.tenancy_scenario  # noqa: E402  (tenancy)
import kanalbench.traffic_scenario  # noqa: E402, F401  (rate-limit, cache)
from kanalbench import topicview_scenario  # noqa: E402, F401  (topicview-throughput)
