"""Large messages by claim check: big values (``large-message``) or whole big batches
(``large-batch``) kept in an object store (S3 or a directory) with a reference in Kafka, restored on
fetch."""

from __future__ import annotations

from kanal.api import Interceptor
from kanal_safeguards.claim_check.large_batches import LargeBatch
from kanal_safeguards.claim_check.large_messages import LargeMessage

__all__ = ["INTERCEPTORS"]

INTERCEPTORS: list[type[Interceptor]] = [LargeMessage, LargeBatch]
