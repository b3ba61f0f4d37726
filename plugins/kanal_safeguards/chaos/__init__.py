"""Chaos interceptors, for testing how client applications cope with a misbehaving cluster (test
environments only): error codes (``errors``), delays (``latency``) and changed records
(``records``), collected for ``plugin.py``."""

from __future__ import annotations

from kanal.api import Interceptor
from kanal_safeguards.chaos.errors import BrokenBrokers, LeaderElectionErrors
from kanal_safeguards.chaos.latency import Latency, SlowBroker, SlowProducersConsumers
from kanal_safeguards.chaos.records import DuplicateMessages, InvalidSchemaId, MessageCorruption

INTERCEPTORS: list[type[Interceptor]] = [
    BrokenBrokers,
    Latency,
    SlowBroker,
    SlowProducersConsumers,
    DuplicateMessages,
    MessageCorruption,
    InvalidSchemaId,
    LeaderElectionErrors,
]
