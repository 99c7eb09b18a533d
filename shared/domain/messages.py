"""The messages on the queues, each defined once: its wire form, its destination, its
message-id rule, and the validation it gets when it arrives.

The camelCase field names of the contract (docs/contract.md#5-messages) are the fields' aliases,
so one declaration serves sending and receiving. Message ids are deterministic: a re-send
after a crash is dropped by the broker's duplicate detection. A body that fails `parse`
is a poison message (InvalidMessage), dead-lettered rather than redelivered.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from shared import jsonbounds
from shared.domain.destination import Destination
from shared.domain.model import (
    Action,
    ErrorInfo,
    JsonObject,
    NotificationStatus,
    Notify,
    Order,
    OrderLine,
    Outcome,
    Outgoing,
    Priority,
    StepRecord,
)
from shared.domain.rfc3339 import EXAMPLE, parse_date_time
from shared.domain.workflow import AgentName

MAX_MESSAGE_BYTES = 256 * 1024


class InvalidMessage(ValueError):
    """A message body that no retry can fix: it must be dead-lettered, not redelivered."""


def iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def idempotency_key(order_id: str, operation: str, key_round: int = 0) -> str:
    """Stable for the order and operation across every retry and every attempt.

    Round 0 is `{orderId}:{operation}`. A later round (`{orderId}:{operation}:r2`) exists
    only once an operator resubmits an operation whose provider refused the earlier key
    for good, which it would replay to the same key (machine/rekey.py); `r` and a number
    never meet reconciliation's heal key (`{undoKey}:heal`)."""
    key = f"{order_id}:{operation}"
    return key if key_round == 0 else f"{key}:r{key_round + 1}"


def do_key(order_id: str, operation: str, step: StepRecord) -> str:
    """The step's current do key."""
    return idempotency_key(order_id, operation, step.do_round)


def undo_key(order_id: str, operation: str, step: StepRecord) -> str:
    """The step's current undo key."""
    return idempotency_key(order_id, operation, step.undo_round)


def _utc(at: datetime) -> datetime:
    return at if at.tzinfo else at.replace(tzinfo=UTC)


_ERROR_LIMITS = {"code": 100, "message": 1000}


def _bounded_error(value: object) -> object:
    """A remote service's error text is kept, but bounded: it is stored with the order
    (state, history, notifications), and a reply must not be refused for its length."""
    if not isinstance(value, dict):
        return value
    return {
        key: text[: _ERROR_LIMITS[key]] if key in _ERROR_LIMITS and isinstance(text, str) else text
        for key, text in value.items()
    }


_ORDER_ID = StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$", strict=True)
OrderId = Annotated[str, _ORDER_ID, Field(alias="orderId")]
NO_CONTROL_CHARACTERS = r"^[^\x00-\x1f\x7f-\x9f]*$"
Text = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=128, strip_whitespace=True, pattern=NO_CONTROL_CHARACTERS
    ),
]
"""A name or key: no control characters, which no name needs and which Table Storage
refuses in a key (a customer's ledger row is keyed by its id) and a log would carry."""
QueueName = Annotated[
    str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,259}$", strict=True)
]
Attempt = Annotated[int, Field(strict=True, ge=1)]
UtcTime = Annotated[datetime, AfterValidator(_utc), PlainSerializer(iso, return_type=str)]


_adapters: dict[type[Any], TypeAdapter[Any]] = {}


def _adapter(kind: type[Any]) -> TypeAdapter[Any]:
    adapter = _adapters.get(kind)
    if adapter is None:
        adapter = _adapters[kind] = TypeAdapter(kind)
    return adapter


T = TypeVar("T")


def _decode(adapter: TypeAdapter[T], body: bytes | str) -> T:
    if len(body) > MAX_MESSAGE_BYTES:
        raise InvalidMessage(f"body of {len(body)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        jsonbounds.check(body)
        return adapter.validate_json(body)
    except ValidationError as exc:
        raise InvalidMessage(describe(exc)) from None
    except ValueError as exc:  # too deep, against the rule, or not JSON at all
        raise InvalidMessage(str(exc)) from None


def describe(exc: ValidationError) -> str:
    """One line per problem, with the JSON path, for a problem+json detail or a DLQ reason."""
    parts = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{location}: {error['msg']}")
    return "; ".join(parts)


class _Message:
    """Both directions of a frozen dataclass message; unknown fields are ignored."""

    _optional: frozenset[str] = frozenset()
    """Fields left out of the body when None (the others are sent, null or not)."""

    @classmethod
    def parse(cls, body: bytes | str) -> Self:
        """Decode and validate a body, or raise InvalidMessage with a short reason."""
        parsed: Self = _decode(_adapter(cls), body)
        return parsed

    def to_body(self) -> dict[str, Any]:
        return self._dump({name for name in self._optional if getattr(self, name) is None})

    def _dump(self, leave_out: set[str]) -> dict[str, Any]:
        body: dict[str, Any] = _adapter(type(self)).dump_python(
            self, mode="json", by_alias=True, exclude=leave_out
        )
        return body


@dataclass(frozen=True)
class Nudge(_Message):
    """Asks the Scheduler to look at an order; the reason is for the log."""

    order_id: OrderId
    reason: str | None = None

    _optional = frozenset({"reason"})

    def outgoing(
        self, version: int, *, high: bool = False, deliver_at: datetime | None = None
    ) -> Outgoing:
        return Outgoing(
            destination=Destination.to_scheduler(high=high),
            message_id=f"nudge:{self.order_id}:{version}",
            body=self.to_body(),
            deliver_at=deliver_at,
        )


@dataclass(frozen=True)
class AgentRequest(_Message):
    """The Scheduler asks an Agent to do or undo one step before its complete-by."""

    order_id: OrderId
    step: Text
    action: Action
    attempt: Attempt
    """The claim's attempt number: the fencing token the reply must carry back."""
    complete_by: Annotated[UtcTime, Field(alias="completeBy")]
    idempotency_key: Annotated[Text, Field(alias="idempotencyKey")]
    payload: JsonObject
    undoes: Text | None = None
    """A compensation names the do key it undoes: a provider applies an undo only
    against that key applied (docs/contract.md, section 11)."""
    operation: Text | None = None
    """The remote operation, from the workflow version the order is pinned to: one step
    name may have another undo in another version, which the agent must not guess.
    None only in a request sent before requests named it."""
    start_at: Annotated[UtcTime | None, Field(alias="startAt")] = None
    """The agent's own rate slot for this request's first call, taken when it handed the
    request back to wait in the broker (usecases/flow/rate_slot.py); None: book one."""

    _optional = frozenset({"undoes", "operation", "start_at"})

    def answer(
        self,
        outcome: Outcome,
        *,
        result: JsonObject | None = None,
        error: ErrorInfo | None = None,
        agent: str | None = None,
    ) -> AgentReply:
        """The reply to this request: it names the same step, action and attempt, and
        the agent that answers, so a late success at a provider the order has left is
        seen for what it is (an effect at two providers). A key other than the
        operation's first (a later round, a heal key) is named in the reply's id."""
        own = idempotency_key(self.order_id, self.operation or "")
        plain = self.operation is None or self.idempotency_key == own
        key = None if plain else self.idempotency_key
        return AgentReply(
            self.order_id, self.step, self.action, self.attempt, outcome, result, error, agent, key
        )

    def outgoing(self, agent: AgentName, *, high: bool = False) -> Outgoing:
        return Outgoing(
            destination=Destination.to_agent(agent, high=high),
            message_id=f"req:{self.order_id}:{self.step}:{self.action.value}:{self.attempt}",
            body=self.to_body(),
        )


@dataclass(frozen=True)
class AgentReply(_Message):
    """An Agent's answer: a result when it succeeded, an error when it failed."""

    order_id: OrderId
    step: Text
    action: Action
    attempt: Attempt
    outcome: Outcome
    result: JsonObject | None = None
    error: Annotated[ErrorInfo | None, BeforeValidator(_bounded_error)] = None
    agent: Text | None = None
    """The agent that answers; None from agents older than the field."""
    key: Text | None = None
    """The idempotency key answered where it is not the operation's first (a later round
    of a key refused for good, reconciliation's heal key): it names the reply's message
    id only, and is not sent."""

    def to_body(self) -> dict[str, Any]:
        unsent = {"key"} if self.agent is not None else {"agent", "key"}
        if self.outcome is Outcome.SUCCEEDED:
            succeeded = replace(self, result=dict(self.result or {}), error=None)
            return succeeded._dump({"error", *unsent})
        failure = self.error or ErrorInfo("unknown", "no detail")
        return replace(self, result=None, error=failure)._dump({"result", *unsent})

    def outgoing(self, *, high: bool = False) -> Outgoing:
        """Every agent's replies share one queue, whose duplicate detection drops an id
        it took: the id names the agent, as two agents may answer one step and attempt
        (the order's undo at the holder, reconciliation's at another provider). The
        same reply sent again keeps its id; an agent older than the field keeps the id
        it had. An undo under a key other than the operation's own (reconciliation's heal
        key, at the holder whose own undo found nothing) names that key too."""
        by = "" if self.agent is None else f":{self.agent}"
        by += "" if self.key is None else f":{self.key.removeprefix(f'{self.order_id}:')}"
        return Outgoing(
            destination=Destination.to_scheduler_replies(high=high),
            message_id=f"rep:{self.order_id}:{self.step}:{self.action.value}:{self.attempt}{by}",
            body=self.to_body(),
        )


@dataclass(frozen=True)
class StatusNotification(_Message):
    """Where the order is, for the submitting application."""

    order_id: OrderId
    status: NotificationStatus
    at: UtcTime
    detail: str | None = None
    """With Failed: the reason; absent otherwise."""

    _optional = frozenset({"detail"})

    def outgoing(self, version: int, reply_to: str | None) -> Outgoing:
        return Outgoing(
            destination=Destination.to_client(reply_to),
            message_id=f"status:{self.order_id}:{self.status.value}:{version}",
            body=self.to_body(),
        )


@dataclass(frozen=True)
class OperatorAlert(_Message):
    """An order needs a person: held in Error, compensating, or named by a poison message."""

    order_id: OrderId
    reason: str
    failure_count: Annotated[int, Field(alias="failureCount")]
    last_error: Annotated[str | None, Field(alias="lastError")]
    at: UtcTime
    queue: str | None = None
    """Poison alerts only: the queue the message came from."""
    body: str | None = None
    """Poison alerts only: the start of the message."""

    _optional = frozenset({"queue", "body"})

    def outgoing(self, occasion: int | str) -> Outgoing:
        """`occasion` makes the id once per cause: the order's state version, or for a
        poison message its queue and message id."""
        return Outgoing(
            destination=Destination.to_operators(),
            message_id=f"alert:{self.order_id}:{occasion}",
            body=self.to_body(),
        )


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


def _whole_float(value: object) -> object:
    """JSON Schema's integer includes 9799.0; strings and 9799.5 stay refused."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


EARLIEST_STORED = datetime(1601, 1, 1, tzinfo=UTC)
"""Table Storage's Edm.DateTime starts here; earlier, its SDK writes a year of fewer than
four digits that it cannot read back, and the order could never be loaded again."""


def _date_time_text(value: object) -> object:
    """An RFC 3339 date-time string with an offset, as the document publishes it:
    pydantic alone also takes a number or a digit string as Unix time, a space for the
    `T` and no seconds, which a client built from the document never sends."""
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        return parse_date_time(value)
    raise ValueError(f"a date-time string, e.g. {EXAMPLE}")


class OrderItem(_Wire):
    sku: Text
    quantity: Annotated[int, Field(strict=True, gt=0, le=1_000_000), BeforeValidator(_whole_float)]
    unit_price: Annotated[
        float, Field(alias="unitPrice", strict=True, ge=0, le=1e12, allow_inf_nan=False)
    ]


class OrderSubmission(_Wire):
    """An order, as POST /api/orders takes it and as a message on the `orders` queue
    (where the sender picks the message id); unknown fields are refused."""

    order_id: Annotated[str, _ORDER_ID] | None = Field(default=None, alias="orderId")
    customer_id: Text = Field(alias="customerId")
    items: Annotated[list[OrderItem], Field(min_length=1, max_length=100)]
    priority: Literal["normal", "high"] = "normal"
    reply_to: QueueName | None = Field(default=None, alias="replyTo")
    workflow: Annotated[str, Field(min_length=1, max_length=40)] | None = None
    """A workflow of the catalogue by name; None: the catalogue's default."""
    not_before: Annotated[AwareDatetime, BeforeValidator(_date_time_text)] | None = Field(
        default=None, alias="notBefore"
    )
    """For a timer step waiting on it: the order goes on no earlier than this."""
    notify: Literal["all", "final"] | None = Field(
        default=None,
        description=(
            "Which status notifications the client hears on its response queue: `all` "
            "(the default), or `final`, only the one that ends the order (Processed, "
            "Compensated, Cancelled)."
        ),
    )
    """None: every status, as `all` (left out of the fingerprint either way)."""

    @field_validator("not_before")
    @classmethod
    def _in_utc(cls, value: datetime | None) -> datetime | None:
        """In UTC, as every time is stored; an offset that leaves the calendar is refused
        here, as a 400, rather than failing later."""
        if value is None:
            return None
        try:
            utc = value.astimezone(UTC)
        except OverflowError:
            raise ValueError("outside the range of dates in UTC") from None
        if utc < EARLIEST_STORED:
            raise ValueError("before 1601-01-01T00:00:00Z, the earliest time Table Storage keeps")
        return utc

    @classmethod
    def parse(cls, body: bytes | str) -> Self:
        parsed: Self = _decode(_adapter(cls), body)
        return parsed

    def to_body(self) -> dict[str, Any]:
        body: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return body

    def fingerprint(self) -> str:
        """Same body, same fingerprint: what makes a repeated submission idempotent."""
        unset = {"order_id"} | {
            name for name in ("workflow", "not_before") if getattr(self, name) is None
        }
        if self.notify in (None, Notify.ALL.value):
            unset.add("notify")  # the default however said: bodies from before it keep theirs
        canonical = self.model_dump(mode="json", by_alias=True, exclude=unset)
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
            not_before=self.not_before,
            notify=Notify(self.notify or Notify.ALL),
        )
