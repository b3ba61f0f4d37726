"""Child processes Kanal starts for development and tests: a Tansu broker and the gateway itself.

``kanal dev`` and the test-suite share these launchers::

    from kanal.embedded import GatewayProcess, TansuBroker

    with TansuBroker() as broker:
        with GatewayProcess(broker.gateway_settings()) as gateway:
            ...  # clients connect to gateway.bootstrap
"""

from kanal.embedded.gateway_process import READY_PATTERN, GatewayProcess, gateway_env
from kanal.embedded.tansu import (
    SHORT_MEMBERSHIP_TIMINGS,
    TANSU_NODE_ID,
    EmbeddedProcessError,
    ProcessOutput,
    TansuBroker,
    find_tansu_binary,
    free_port,
    free_port_block,
    probe_kafka,
)

__all__ = [
    "READY_PATTERN",
    "SHORT_MEMBERSHIP_TIMINGS",
    "TANSU_NODE_ID",
    "EmbeddedProcessError",
    "GatewayProcess",
    "ProcessOutput",
    "TansuBroker",
    "find_tansu_binary",
    "free_port",
    "free_port_block",
    "gateway_env",
    "probe_kafka",
]
