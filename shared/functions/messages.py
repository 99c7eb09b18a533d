"""What the queue-triggered functions do with a message no retry can fix."""

from __future__ import annotations

import json
import logging

import azure.functions as func

from shared.bootstrap import Container
from shared.contract import Queue
from shared.domain.messages import iso
from shared.domain.model import Outgoing

log = logging.getLogger("orders.messages")


def _order_id_of(body: bytes) -> str:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return ""
    value = data.get("orderId") if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


async def reject(
    container: Container, queue: str, msg: func.ServiceBusMessage, reason: str
) -> None:
    """Complete the message (a redelivery would fail the same way) and tell an operator.

    The Python worker cannot dead-letter from a plain trigger, so the operator alert
    carries the reason and an excerpt of the body: nothing is dropped silently.
    """
    body = msg.get_body()
    log.warning("rejected message %s on %s: %s", msg.message_id, queue, reason)
    await container.process.bus.send(
        [
            Outgoing(
                queue=Queue.OPERATOR_ALERTS,
                message_id=f"invalid:{queue}:{msg.message_id}",
                body={
                    "orderId": _order_id_of(body),
                    "reason": "invalid-message",
                    "failureCount": 0,
                    "lastError": f"{queue} message {msg.message_id}: {reason}",
                    "at": iso(container.process.clock.now()),
                    "queue": queue,
                    "body": body[:2048].decode("utf-8", errors="replace"),
                },
            )
        ]
    )
