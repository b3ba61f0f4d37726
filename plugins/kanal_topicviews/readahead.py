"""Read-ahead for consumers of views that are behind: the next chunk is fetched and transformed while the
consumer handles the current one.

Without it, a view's fetch is a chain: the consumer asks, the broker reads, the gateway runs the SQL
over every record, the consumer gets the answer and only then asks again (clients keep one fetch in
flight per broker). The broker and the gateway then take turns, each idle while the other works.
With it, when every partition a fetch named is a view partition whose answer was large (the consumer
is behind: at least :data:`MIN_BYTES` of records, and more below the high watermark), the gateway at
once asks the broker the consumer fetched from for the records that follow, on the gateway's own
connection to it (``services.kafka``), and runs the SQL over them; as soon as the broker has answered
a read-ahead, the chunk after it is asked for too (:data:`DEPTH` chunks per partition), so the broker
reads while the SQL runs. If the consumer's next fetch asks exactly for those offsets (for every
partition it names), the gateway answers it from the read-ahead; any other fetch is forwarded as
usual, and read-aheads behind the consumer are dropped (a seek forward or back finds no match and
goes to the broker). A read-ahead that failed, came back empty or with an error, or is older than
:data:`TTL` seconds is never used; after an error (the partition's leadership moved, the broker
cannot be reached) the partition is not read ahead for :data:`PAUSE` seconds. So a consumer that
caught up waits on the broker as before (``fetch.max.wait.ms``), and one that seeks gets what it
asked for.

The read-ahead fetch copies the consumer's request (version, isolation level, leader epoch, sizes,
wait) for one partition. Answers built from it carry no KIP-951 leader hints and no preferred read
replica.
``GATEWAY_FEATURE_FLAGS_TOPIC_VIEWS_READ_AHEAD=false`` turns it off.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Final

import trio

from kanal.api import ErrorCode

from .views import View

__all__ = ["DEPTH", "MIN_BYTES", "PAUSE", "PAUSED", "STATE", "TTL", "ReadAhead", "prepare_request", "serve"]

log = logging.getLogger("kanal_topicviews")

STATE: Final = "topic-views.read-ahead"
PAUSED: Final = "topic-views.read-ahead-paused"
PAUSE: Final = 60.0  # seconds without read-ahead for a partition whose read-ahead got an error
MIN_BYTES: Final = 256 * 1024
TTL: Final = 10.0
WAIT: Final = 5.0  # seconds a fetch waits for a read-ahead still in flight before it is forwarded
DEPTH: Final = 2  # read-aheads per partition: the broker reads the next chunk while the SQL runs
MAX_PARTITIONS: Final = 8  # partitions read ahead per connection


@dataclass(eq=False)
class ReadAhead:
    """One read-ahead: the answer to a fetch of ``view`` partition ``partition`` at ``offset``."""

    view: View
    partition: int
    offset: int
    request: Any  # the upstream request (input topic, one partition, this offset)
    key: Any = None  # the view's name or topic id, as the client names it
    physical: Any = None  # the input topic's name or topic id, as the request names it
    created: float = field(default_factory=time.monotonic)
    done: trio.Event = field(default_factory=trio.Event)
    response: Any = None  # the whole answer, rewritten for the client; None when unusable
    source: Any = None  # the broker's partition entry (records as read): where the next one starts
    node_id: int | None = None  # the broker the consumer fetched from (None: any)

    def usable(self, now: float) -> bool:
        return now - self.created < TTL


def prepare_request(upstream: Any, key_field: str, physical: Any, index: int, offset: int) -> Any:
    """The consumer's upstream request narrowed to one partition at ``offset``."""
    for topic in upstream.topics:
        if getattr(topic, key_field) != physical:
            continue
        for part in topic.partitions:
            if int(part.partition) == index:
                narrowed = replace(topic, partitions=(replace(part, fetch_offset=offset),))
                # The consumer's max wait is kept: records are there (the offset is below the high
                # watermark), and a broker may answer a zero wait before it reads anything (Tansu).
                changes: dict[str, Any] = {"topics": (narrowed,), "min_bytes": 1}
                if hasattr(upstream, "session_id"):
                    changes.update(session_id=0, session_epoch=-1, forgotten_topics_data=())
                return replace(upstream, **changes)
    return None


def clean_partition(part: Any) -> Any:
    """A partition entry the gateway answers itself: no leader hint, no preferred read replica."""
    changes: dict[str, Any] = {}
    if hasattr(part, "current_leader"):
        changes["current_leader"] = type(part.current_leader)()
    if hasattr(part, "preferred_read_replica"):
        changes["preferred_read_replica"] = -1
    return replace(part, **changes) if changes else part


def serve(read_aheads: list[ReadAhead], key_field: str) -> Any:
    """One Fetch response from finished read-aheads (one partition each)."""
    template = read_aheads[0].response
    topics: dict[Any, Any] = {}
    for ra in read_aheads:
        (topic,) = ra.response.responses
        key = getattr(topic, key_field)
        if key in topics:
            topics[key] = replace(topics[key], partitions=(*topics[key].partitions, *topic.partitions))
        else:
            topics[key] = topic
    changes: dict[str, Any] = {"responses": tuple(topics.values())}
    if hasattr(template, "error_code"):
        changes["error_code"] = ErrorCode.none
    if hasattr(template, "session_id"):
        changes["session_id"] = 0
    if hasattr(template, "node_endpoints"):
        changes["node_endpoints"] = ()
    return replace(template, **changes)
