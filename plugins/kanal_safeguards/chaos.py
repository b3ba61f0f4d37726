"""Chaos interceptors, for testing how client applications cope with a misbehaving cluster (test
environments only): error codes (``chaos_errors``), delays (``chaos_latency``) and changed records
(``chaos_records``), collected for ``plugin.py``."""

from __future__ import annotations

from kanal.api import Interceptor

from .chaos_errors import BrokenBrokers, LeaderElectionErrors
from .chaos_latency import Latency, SlowBroker, SlowProducersConsumers
from .chaos_records import DuplicateMessages, InvalidSchemaId, MessageCorruption

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
