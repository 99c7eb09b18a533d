"""Poison handling: what the queue-triggered functions do with a message no retry can fix."""

from __future__ import annotations

from dataclasses import dataclass

import azure.functions as func

from shared import jsonbounds
from shared.contract import PoisonProperty
from shared.domain.messages import OperatorAlert
from shared.ports import Clock, MessageBus, Poison
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.poison")

INVALID = "invalid-message"
UNKNOWN_ORDER = "unknown-order"
UNKNOWN_STEP = "unknown-step"
CONFLICT = "order-conflict"
OVER_QUOTA = "over-quota"
"""A queued order past IntakeMaxPendingPerCustomer: the queue's 429 (docs/fairness.md)."""

ALERT_BODY_BYTES = 2048
"""How much of a poison message its operator alert carries."""


def _order_id_of(body: bytes) -> str:
    try:
        data = jsonbounds.loads(body)
    except ValueError:
        return ""
    value = data.get("orderId") if isinstance(data, dict) else None
    return value if isinstance(value, str) else ""


@dataclass(frozen=True)
class DeadLetters:
    """Where a queue-triggered function parks what no retry can fix, and tells whom."""

    bus: MessageBus
    clock: Clock

    async def reject(
        self,
        queue: str,
        msg: func.ServiceBusMessage,
        detail: str,
        reason: str = INVALID,
    ) -> None:
        """Dead-letter on the first delivery (a redelivery would fail the same way), with
        the reason, and tell an operator when the message names an order.

        Returning completes the original; if parking fails the exception abandons it, so
        the message is retried rather than lost.
        """
        properties = msg.application_properties or {}
        if PoisonProperty.COPY_OF in properties:
            copy_of = properties[PoisonProperty.COPY_OF]
            log.warning("dropped expiring copy of poison message %s", copy_of)
            return
        body = msg.get_body()
        log.warning(
            "dead-lettering message %s on %s: %s: %s", msg.message_id, queue, reason, detail
        )
        await self.bus.park(
            Poison(
                queue=queue,
                message_id=msg.message_id or "",
                body=body,
                reason=reason,
                detail=detail,
                delivery_count=msg.delivery_count or 1,
            )
        )
        order_id = _order_id_of(body)
        if not order_id:
            return
        alert = OperatorAlert(
            order_id=order_id,
            reason=reason,
            failure_count=0,
            last_error=f"{queue} message {msg.message_id}: {detail}",
            at=self.clock.now(),
            queue=queue,
            body=body[:ALERT_BODY_BYTES].decode("utf-8", errors="replace"),
        )
        await self.bus.send([alert.outgoing(f"{queue}:{msg.message_id}")])
