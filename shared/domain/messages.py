"""Outgoing message bodies in wire form (camelCase, docs/contract.md#5-messages).

Names are mapped explicitly here so that snake_case stays inside and the contract's
field names live in one place. Message ids are deterministic for duplicate detection.
"""

from __future__ import annotations

from datetime import datetime

from shared.contract import Queue
from shared.domain.model import (
    Action,
    ErrorInfo,
    JsonObject,
    NotificationStatus,
    Outcome,
    Outgoing,
)


def iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def idempotency_key(order_id: str, operation: str) -> str:
    """Stable for the order and operation across every retry and every attempt."""
    return f"{order_id}:{operation}"


def nudge(
    order_id: str,
    version: int,
    reason: str,
    deliver_at: datetime | None = None,
    high: bool = False,
) -> Outgoing:
    return Outgoing(
        queue=Queue.SCHEDULER_HIGH if high else Queue.SCHEDULER,
        message_id=f"nudge:{order_id}:{version}",
        body={"orderId": order_id, "reason": reason},
        deliver_at=deliver_at,
    )


def agent_request(
    *,
    queue: str,
    order_id: str,
    step: str,
    action: Action,
    attempt: int,
    complete_by: datetime,
    operation: str,
    payload: JsonObject,
) -> Outgoing:
    return Outgoing(
        queue=queue,
        message_id=f"req:{order_id}:{step}:{action.value}:{attempt}",
        body={
            "orderId": order_id,
            "step": step,
            "action": action.value,
            "attempt": attempt,
            "completeBy": iso(complete_by),
            "idempotencyKey": idempotency_key(order_id, operation),
            "payload": dict(payload),
        },
    )


def agent_reply(
    *,
    order_id: str,
    step: str,
    action: Action,
    attempt: int,
    outcome: Outcome,
    result: JsonObject | None = None,
    error: ErrorInfo | None = None,
    high: bool = False,
) -> Outgoing:
    body: dict[str, object] = {
        "orderId": order_id,
        "step": step,
        "action": action.value,
        "attempt": attempt,
        "outcome": outcome.value,
    }
    if outcome is Outcome.SUCCEEDED:
        body["result"] = dict(result or {})
    else:
        failure = error or ErrorInfo("unknown", "no detail")
        body["error"] = {"code": failure.code, "message": failure.message}
    return Outgoing(
        queue=Queue.AGENT_REPLIES_HIGH if high else Queue.AGENT_REPLIES,
        message_id=f"rep:{order_id}:{step}:{action.value}:{attempt}",
        body=body,
    )


def status(
    order_id: str,
    version: int,
    status: NotificationStatus,
    at: datetime,
    reply_to: str | None,
    detail: str | None = None,
) -> Outgoing:
    body: dict[str, object] = {"orderId": order_id, "status": status.value, "at": iso(at)}
    if detail:
        body["detail"] = detail
    return Outgoing(
        queue=reply_to or Queue.ORDER_STATUS,
        message_id=f"status:{order_id}:{status.value}:{version}",
        body=body,
    )


def operator_alert(
    order_id: str,
    version: int,
    reason: str,
    failure_count: int,
    last_error: str | None,
    at: datetime,
) -> Outgoing:
    return Outgoing(
        queue=Queue.OPERATOR_ALERTS,
        message_id=f"alert:{order_id}:{version}",
        body={
            "orderId": order_id,
            "reason": reason,
            "failureCount": failure_count,
            "lastError": last_error,
            "at": iso(at),
        },
    )
