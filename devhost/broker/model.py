"""What the engine keeps per message and per entity, and the settings it runs with."""

from __future__ import annotations

import enum
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from proton import timestamp

from . import codec

SCHEDULED_STATE = 2  # ServiceBusMessageState.SCHEDULED, shown on peeked messages


def wall_ms() -> int:
    """Wall clock, not monotonic: lock expiries and schedules are absolute timestamps that
    clients see and that must stay meaningful across a broker restart."""
    return time.time_ns() // 1_000_000


class State(enum.IntEnum):
    READY = 0
    SCHEDULED = 1
    LOCKED = 2


class Settlement(enum.Enum):
    COMPLETE = "complete"
    ABANDON = "abandon"
    RELEASE = "release"
    DEAD_LETTER = "dead-letter"


@dataclass(slots=True, eq=False)
class Entry:
    seq: int
    header: codec.Header
    annotations: dict[Any, Any]
    bare: bytes
    message_id: str | None
    enqueued_ms: int
    visible_ms: int
    delivery_count: int
    expires_ms: int | None
    state: State = State.READY
    lock_token: uuid.UUID | None = None
    locked_until_ms: int = 0
    stored: bytes = b""
    """The payload the store keeps, while it is still the message as sent (its counts and
    times are columns of their own); empty once the broker changed the message."""

    def encode(self, locked_until_ms: int | None = None, *, peeked: bool = False) -> bytes:
        annotations = dict(self.annotations)
        annotations[codec.SEQUENCE_NUMBER] = self.seq
        annotations[codec.ENQUEUED_TIME] = timestamp(self.enqueued_ms)
        if locked_until_ms is not None:
            annotations[codec.LOCKED_UNTIL] = timestamp(locked_until_ms)
        if peeked and self.state is State.SCHEDULED:
            annotations[codec.MESSAGE_STATE] = SCHEDULED_STATE
        return codec.encode_message(self.header, self.delivery_count, annotations, self.bare)


@dataclass(slots=True)
class QueueStats:
    sent: int = 0
    delivered: int = 0
    completed: int = 0
    abandoned: int = 0
    duplicates_suppressed: int = 0
    dropped: int = 0
    duplicated: int = 0
    delayed: int = 0


@dataclass(slots=True, eq=False)
class Entity:
    """A queue or its dead-letter sub-queue (which shares the queue's sequence numbers)."""

    name: str
    queue: str
    dead_letter: bool
    stats: QueueStats
    entries: dict[int, Entry] = field(default_factory=dict)
    ready: list[int] = field(default_factory=list)
    n_ready: int = 0
    n_scheduled: int = 0
    n_locked: int = 0


@dataclass(frozen=True, slots=True)
class Limits:
    lock_ms: int
    max_delivery_count: int
    dedupe_window_ms: int
