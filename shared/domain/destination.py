"""Where a message goes, in the pattern's words: the Scheduler (a nudge, or an agent's
reply), one agent on one lane, the client that submitted the order, the operators.

The domain names the destination and the bus adapter names its queue
(shared/adapters/queues.py), so the domain reads no queue name and no catalogue. The
high-priority lane is the Scheduler's and each agent's own fast lane (docs/routing.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class To(StrEnum):
    SCHEDULER = "scheduler"
    """A nudge: the Scheduler looks at the order."""
    SCHEDULER_REPLIES = "scheduler-replies"
    """An agent's answer, for the Scheduler."""
    AGENT = "agent"
    """A request to do or undo a step, for one agent."""
    CLIENT = "client"
    """A status notification, for the application that submitted the order."""
    OPERATORS = "operators"
    """An operator alert."""


@dataclass(frozen=True)
class Destination:
    to: To
    high: bool = False
    """On the high-priority lane (the Scheduler's, an agent's)."""
    agent: str | None = None
    """To.AGENT only: the agent."""
    reply_to: str | None = None
    """To.CLIENT only: where the client asked its notifications to go (`replyTo`);
    None: where every client's go."""

    @classmethod
    def to_scheduler(cls, *, high: bool = False) -> Destination:
        return cls(To.SCHEDULER, high)

    @classmethod
    def to_scheduler_replies(cls, *, high: bool = False) -> Destination:
        return cls(To.SCHEDULER_REPLIES, high)

    @classmethod
    def to_agent(cls, agent: str, *, high: bool = False) -> Destination:
        return cls(To.AGENT, high, agent=agent)

    @classmethod
    def to_client(cls, reply_to: str | None = None) -> Destination:
        return cls(To.CLIENT, reply_to=reply_to)

    @classmethod
    def to_operators(cls) -> Destination:
        return cls(To.OPERATORS)
