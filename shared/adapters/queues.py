"""The queue of each destination (docs/contract.md#1-queues): the domain says where a
message goes in the pattern's words (shared/domain/destination.py), and the buses name
the queue here, once.

`destination_of` reads a queue name back, for outboxes stored before destinations
were: every queue name reads back to a destination whose queue is that same name, so
such a row still delivers to the queue it named.
"""

from __future__ import annotations

from shared.contract import HIGH_PRIORITY_SUFFIX, Queue, agent_queue
from shared.domain.destination import Destination, To

_AGENT_PREFIX = "agent-"


def queue_of(destination: Destination) -> str:
    high = destination.high
    match destination.to:
        case To.SCHEDULER:
            return Queue.SCHEDULER_HIGH if high else Queue.SCHEDULER
        case To.SCHEDULER_REPLIES:
            return Queue.AGENT_REPLIES_HIGH if high else Queue.AGENT_REPLIES
        case To.AGENT:
            return agent_queue(destination.agent or "", high)
        case To.CLIENT:
            return destination.reply_to or Queue.ORDER_STATUS
        case To.OPERATORS:
            return Queue.OPERATOR_ALERTS


_NAMED: dict[str, Destination] = {
    Queue.SCHEDULER: Destination.to_scheduler(),
    Queue.SCHEDULER_HIGH: Destination.to_scheduler(high=True),
    Queue.AGENT_REPLIES: Destination.to_scheduler_replies(),
    Queue.AGENT_REPLIES_HIGH: Destination.to_scheduler_replies(high=True),
    Queue.ORDER_STATUS: Destination.to_client(),
    Queue.OPERATOR_ALERTS: Destination.to_operators(),
}


def destination_of(queue: str) -> Destination:
    """The destination a stored queue name served; any other name is a client's own
    `replyTo`, the one destination whose queue the client names."""
    named = _NAMED.get(queue)
    if named is not None:
        return named
    if queue.startswith(_AGENT_PREFIX):
        agent = queue.removeprefix(_AGENT_PREFIX)
        high = agent.endswith(HIGH_PRIORITY_SUFFIX)
        return Destination.to_agent(agent.removesuffix(HIGH_PRIORITY_SUFFIX), high=high)
    return Destination.to_client(queue)
