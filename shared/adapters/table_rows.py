"""How an order process maps onto Table Storage rows (one partition per order).

RowKeys sort so that one range read gets order, state and steps without the history:
`hist-…` < `order` < `state` < `step-NN`.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from shared.domain.model import (
    ErrorInfo,
    HistoryEntry,
    Order,
    OrderLine,
    OrderProcess,
    Outgoing,
    Phase,
    Priority,
    ProcessState,
    StateRecord,
    StepRecord,
    StepStatus,
)

ORDER_ROW = "order"
STATE_ROW = "state"
STEP_PREFIX = "step-"
HISTORY_PREFIX = "hist-"
WATCH_SHARDS = 16
"""Watch entries spread over partitions so that no one partition takes every write."""

Entity = dict[str, Any]


def step_key(index: int) -> str:
    return f"{STEP_PREFIX}{index:02d}"


def history_key(version: int, index: int) -> str:
    return f"{HISTORY_PREFIX}{version:010d}-{index:02d}"


def watch_partition(order_id: str) -> str:
    return f"~watch-{zlib.crc32(order_id.encode()) % WATCH_SHARDS:02d}"


def watch_partitions() -> list[str]:
    return [f"~watch-{shard:02d}" for shard in range(WATCH_SHARDS)]


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value))


def _required_utc(value: Any) -> datetime:
    at = _utc(value)
    if at is None:
        raise ValueError("a required timestamp is missing")
    return at


def _without_nulls(entity: Entity) -> Entity:
    """Table Storage has no null: an absent property is the null."""
    return {k: v for k, v in entity.items() if v is not None}


def order_entity(order: Order) -> Entity:
    return _without_nulls(
        {
            "PartitionKey": order.order_id,
            "RowKey": ORDER_ROW,
            "OrderID": order.order_id,
            "CustomerId": order.customer_id,
            "Items": json.dumps(
                [
                    {"sku": i.sku, "quantity": i.quantity, "unitPrice": i.unit_price}
                    for i in order.items
                ]
            ),
            "Priority": order.priority.value,
            "ReplyTo": order.reply_to,
            "Fingerprint": order.fingerprint,
            "CreatedAt": order.created_at,
        }
    )


def state_entity(state: StateRecord) -> Entity:
    return _without_nulls(
        {
            "PartitionKey": state.order_id,
            "RowKey": STATE_ROW,
            "OrderID": state.order_id,
            "LockedBy": state.locked_by,
            "CompleteBy": state.complete_by,
            "ProcessState": state.process_state.value,
            "FailureCount": state.failure_count,
            "Attempt": state.attempt,
            "Phase": state.phase.value,
            "CurrentStep": state.current_step,
            "LastError": state.last_error,
            "Version": state.version,
            "CreatedAt": state.created_at,
            "UpdatedAt": state.updated_at,
            "Workflow": state.workflow,
            "Outbox": json.dumps([_outgoing_json(m) for m in state.outbox]),
            "OutboxCause": state.outbox_cause,
        }
    )


def step_entity(order_id: str, index: int, step: StepRecord) -> Entity:
    return _without_nulls(
        {
            "PartitionKey": order_id,
            "RowKey": step_key(index),
            "OrderID": order_id,
            "Step": step.name,
            "Status": step.status.value,
            "Attempts": step.attempts,
            "CompleteBy": step.complete_by,
            "Result": json.dumps(dict(step.result)) if step.result is not None else None,
            "ErrorCode": step.error.code if step.error else None,
            "ErrorMessage": step.error.message if step.error else None,
            "CompensationAttempts": step.compensation_attempts,
        }
    )


def history_entities(order_id: str, version: int, history: list[HistoryEntry]) -> list[Entity]:
    return [
        _without_nulls(
            {
                "PartitionKey": order_id,
                "RowKey": history_key(version, i),
                "At": entry.at,
                "Event": entry.event,
                "Detail": entry.detail or None,
                "ProcessState": entry.process_state.value,
                "FailureCount": entry.failure_count,
                "Attempt": entry.attempt,
            }
        )
        for i, entry in enumerate(history)
    ]


def _outgoing_json(message: Outgoing) -> dict[str, Any]:
    return {
        "queue": message.queue,
        "messageId": message.message_id,
        "body": dict(message.body),
        "deliverAt": message.deliver_at.isoformat() if message.deliver_at else None,
    }


def _outgoing(data: Mapping[str, Any]) -> Outgoing:
    return Outgoing(
        queue=data["queue"],
        message_id=data["messageId"],
        body=data["body"],
        deliver_at=_utc(data.get("deliverAt")),
    )


def to_order(entity: Mapping[str, Any]) -> Order:
    return Order(
        order_id=entity["OrderID"],
        customer_id=entity["CustomerId"],
        items=tuple(
            OrderLine(i["sku"], int(i["quantity"]), float(i["unitPrice"]))
            for i in json.loads(entity["Items"])
        ),
        priority=Priority(entity.get("Priority", Priority.NORMAL.value)),
        reply_to=entity.get("ReplyTo"),
        fingerprint=entity["Fingerprint"],
        created_at=_required_utc(entity["CreatedAt"]),
    )


def to_state(entity: Mapping[str, Any]) -> StateRecord:
    return StateRecord(
        order_id=entity["OrderID"],
        process_state=ProcessState(entity["ProcessState"]),
        locked_by=entity.get("LockedBy"),
        complete_by=_utc(entity.get("CompleteBy")),
        failure_count=int(entity.get("FailureCount", 0)),
        attempt=int(entity.get("Attempt", 0)),
        phase=Phase(entity.get("Phase", Phase.FORWARD.value)),
        current_step=int(entity.get("CurrentStep", 0)),
        last_error=entity.get("LastError"),
        version=int(entity.get("Version", 0)),
        created_at=_required_utc(entity["CreatedAt"]),
        updated_at=_required_utc(entity["UpdatedAt"]),
        workflow=entity["Workflow"],
        outbox=tuple(_outgoing(m) for m in json.loads(entity.get("Outbox", "[]"))),
        outbox_cause=entity.get("OutboxCause"),
    )


def to_step(entity: Mapping[str, Any]) -> StepRecord:
    code = entity.get("ErrorCode")
    return StepRecord(
        name=entity["Step"],
        status=StepStatus(entity["Status"]),
        attempts=int(entity.get("Attempts", 0)),
        complete_by=_utc(entity.get("CompleteBy")),
        result=json.loads(entity["Result"]) if "Result" in entity else None,
        error=ErrorInfo(code, entity.get("ErrorMessage", "")) if code else None,
        compensation_attempts=int(entity.get("CompensationAttempts", 0)),
    )


def to_history(entity: Mapping[str, Any]) -> HistoryEntry:
    return HistoryEntry(
        at=_required_utc(entity["At"]),
        event=entity["Event"],
        detail=entity.get("Detail", ""),
        process_state=ProcessState(entity["ProcessState"]),
        failure_count=int(entity.get("FailureCount", 0)),
        attempt=int(entity.get("Attempt", 0)),
    )


def to_process(entities: list[Mapping[str, Any]], etag: str | None) -> OrderProcess | None:
    """Assemble an order from its partition's rows; None while its rows are incomplete."""
    by_key = {e["RowKey"]: e for e in entities}
    if ORDER_ROW not in by_key or STATE_ROW not in by_key:
        return None
    steps = [to_step(by_key[k]) for k in sorted(by_key) if k.startswith(STEP_PREFIX)]
    return OrderProcess(
        order=to_order(by_key[ORDER_ROW]),
        state=to_state(by_key[STATE_ROW]),
        steps=tuple(steps),
        etag=etag,
    )
