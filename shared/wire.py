"""Incoming wire formats, validated at the edge with pydantic (camelCase outside)."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
)

from shared.domain.model import (
    Action,
    ErrorInfo,
    Order,
    OrderLine,
    Outcome,
    Priority,
)
from shared.domain.process import AgentReply

OrderId = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", strict=True)
]
Text = Annotated[str, StringConstraints(min_length=1, max_length=128, strip_whitespace=True)]
QueueName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,259}$", strict=True)
]


class InvalidMessage(ValueError):
    """A message body that no retry can fix: it must be dead-lettered, not redelivered."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class OrderItemIn(_Wire):
    sku: Text
    quantity: Annotated[int, Field(strict=True, gt=0, le=1_000_000)]
    unit_price: Annotated[
        float, Field(alias="unitPrice", strict=True, ge=0, le=1e12, allow_inf_nan=False)
    ]


class OrderSubmissionIn(_Wire):
    order_id: OrderId | None = Field(default=None, alias="orderId")
    customer_id: Text = Field(alias="customerId")
    items: Annotated[list[OrderItemIn], Field(min_length=1, max_length=100)]
    priority: Literal["normal", "high"] = "normal"
    reply_to: QueueName | None = Field(default=None, alias="replyTo")

    def fingerprint(self) -> str:
        """Same body, same fingerprint: what makes a repeated submission idempotent."""
        canonical = self.model_dump(mode="json", by_alias=True, exclude={"order_id"})
        encoded = json.dumps(canonical, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(encoded.encode()).hexdigest()

    def to_order(self, now: datetime) -> Order:
        return Order(
            order_id=self.order_id or uuid.uuid4().hex,
            customer_id=self.customer_id,
            items=tuple(OrderLine(i.sku, i.quantity, i.unit_price) for i in self.items),
            priority=Priority(self.priority),
            reply_to=self.reply_to,
            fingerprint=self.fingerprint(),
            created_at=now,
        )


class NudgeIn(_Wire):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    order_id: OrderId = Field(alias="orderId")
    reason: str | None = None


class AgentRequestIn(_Wire):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    order_id: OrderId = Field(alias="orderId")
    step: Text
    action: Action
    attempt: Annotated[int, Field(strict=True, ge=1)]
    complete_by: datetime = Field(alias="completeBy")
    idempotency_key: Text = Field(alias="idempotencyKey")
    payload: dict[str, Any]

    def deadline(self) -> datetime:
        at = self.complete_by
        return at if at.tzinfo else at.replace(tzinfo=UTC)


def _cut(limit: int) -> BeforeValidator:
    """A remote service's error text is kept, but bounded: it is stored with the order
    (state, history, notifications), and a reply must not be refused for its length."""

    def cut(value: object) -> object:
        return value[:limit] if isinstance(value, str) else value

    return BeforeValidator(cut)


class ErrorIn(_Wire):
    model_config = ConfigDict(extra="ignore", frozen=True)
    code: Annotated[str, _cut(100)]
    message: Annotated[str, _cut(1000)]


class AgentReplyIn(_Wire):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    order_id: OrderId = Field(alias="orderId")
    step: Text
    action: Action
    attempt: Annotated[int, Field(strict=True, ge=1)]
    outcome: Outcome
    result: dict[str, Any] | None = None
    error: ErrorIn | None = None

    def to_reply(self) -> AgentReply:
        return AgentReply(
            order_id=self.order_id,
            step=self.step,
            action=self.action,
            attempt=self.attempt,
            outcome=self.outcome,
            result=self.result,
            error=ErrorInfo(self.error.code, self.error.message) if self.error else None,
        )


MAX_MESSAGE_BYTES = 256 * 1024
M = TypeVar("M", bound=BaseModel)


def parse(model: type[M], body: bytes | str) -> M:
    """Decode and validate a message body, or raise InvalidMessage with a short reason."""
    if len(body) > MAX_MESSAGE_BYTES:
        raise InvalidMessage(f"body of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise InvalidMessage(describe(exc)) from None


def describe(exc: ValidationError) -> str:
    """One line per problem, with the JSON path, for a problem+json detail or a DLQ reason."""
    parts = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{location}: {error['msg']}")
    return "; ".join(parts)
