"""What ``kanal_cli_commands`` gets beside the subparsers: the cluster and the admin API as the
command line reaches them (from the same environment variables as the gateway)."""

from __future__ import annotations

from typing import Any, Protocol

from kanal.api.services import KafkaClient, StateLog

__all__ = ["AdminClient", "CliContext", "CliError"]


class CliError(Exception):
    """A command failed in a way the user can mend; ``kanal`` prints the message and exits 1."""


class AdminClient(Protocol):
    """An admin API client (``--url``, ``--user``, ``--password`` or ``KANAL_ADMIN_*``)."""

    def call(self, method: str, path: str, body: Any = None, query: dict[str, str] | None = None) -> Any:
        """One call; the decoded JSON answer. Raises :class:`CliError` with the API's message."""


class CliContext(Protocol):
    """The command line's way to the gateway's world."""

    def admin_client(self, url: str | None, user: str | None, password: str | None) -> AdminClient:
        """A client of a gateway's admin API."""

    def kafka(self) -> KafkaClient:
        """A Kafka client for the cluster that ``KAFKA_BOOTSTRAP_SERVERS`` (and the other ``KAFKA_*``
        variables) name; raises ``ConfigError`` naming a missing or bad variable. Close it with
        ``aclose()``."""

    def configure_logging(self, fmt: str = "text", level: str = "info") -> None:
        """Sends every log line to standard error as the gateway writes them: ``text``, or one JSON
        object per line (``time``, ``level``, ``logger``, ``message`` and the record's fields)."""

    def state_log(self, topic: str) -> StateLog:
        """A state log on ``topic`` of the cluster that ``KAFKA_BOOTSTRAP_SERVERS`` (and the other
        ``KAFKA_*`` variables) name; raises ``ConfigError`` naming what is missing."""
