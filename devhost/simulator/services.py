"""The three remote services: their operations, payloads and deterministic results.

Results are derived from a hash of the idempotency key only, so a repeat (even after a
restart, even if the ledger were lost) yields the same ids and agents can be checked
for passing the right result to the compensation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field


class CallRequest(BaseModel):
    """Envelope of every service call; open to extra fields like a lenient real API."""

    model_config = ConfigDict(extra="allow")

    order_id: str = Field(alias="orderId", min_length=1)
    idempotency_key: str | None = Field(default=None, alias="idempotencyKey")
    payload: dict[str, Any] = Field(default_factory=dict)
    undoes: str | None = Field(default=None, min_length=1)
    """A compensation's do key: what it undoes (ignored on a do)."""


class OrderItem(BaseModel):
    model_config = ConfigDict(extra="allow")

    sku: str = Field(min_length=1)
    quantity: int = Field(ge=1)
    unit_price: Decimal = Field(alias="unitPrice", ge=0, allow_inf_nan=False)


class OrderPayload(BaseModel):
    """Payload of the do-operations; only what the simulated services look at."""

    model_config = ConfigDict(extra="allow")

    customer_id: str | None = Field(default=None, alias="customerId")
    items: list[OrderItem] = Field(min_length=1)


class CompensationPayload(BaseModel):
    """``result`` may be absent: a step that timed out is compensated without one."""

    model_config = ConfigDict(extra="allow")

    result: dict[str, Any] | None = None


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _reserve(key: str, order: OrderPayload) -> dict[str, Any]:
    return {"reservationId": f"res-{key_hash(key)}", "skus": [item.sku for item in order.items]}


def _charge(key: str, order: OrderPayload) -> dict[str, Any]:
    total = sum((item.unit_price * item.quantity for item in order.items), Decimal(0))
    return {"paymentId": f"pay-{key_hash(key)}", "amount": float(total)}


def _ship(key: str, order: OrderPayload) -> dict[str, Any]:
    digest = key_hash(key)
    return {"shipmentId": f"shp-{digest}", "trackingNumber": f"TRK{int(digest, 16) % 10**12:012d}"}


def _undo(flag: str, *echoed: str) -> Callable[[CompensationPayload], dict[str, Any]]:
    """Compensations echo the ids they undid, which makes a wrong ``result`` visible."""

    def build(payload: CompensationPayload) -> dict[str, Any]:
        original = payload.result or {}
        return {flag: True} | {name: original[name] for name in echoed if name in original}

    return build


@dataclass(frozen=True)
class DoOperation:
    name: str
    build_result: Callable[[str, OrderPayload], dict[str, Any]]


@dataclass(frozen=True)
class Compensation:
    name: str
    build_result: Callable[[CompensationPayload], dict[str, Any]]


Operation = DoOperation | Compensation


@dataclass(frozen=True)
class Service:
    name: str
    operations: Mapping[str, Operation]
    rejection_code: str
    """Problem code of this service's permanent failure."""
    rejection_title: str

    @property
    def do(self) -> DoOperation:
        """The one operation that makes an effect; the other undoes it."""
        return next(op for op in self.operations.values() if isinstance(op, DoOperation))

    def undone_key(self, order_id: str, undoes: str | None) -> str:
        """The do key a compensation undoes: the one it names, else (a client from before
        ``undoes``) the agents' own key shape, ``{orderId}:{do-operation}``."""
        return undoes if undoes is not None else f"{order_id}:{self.do.name}"


def _service(
    name: str, do: DoOperation, undo: Compensation, rejection_code: str, rejection_title: str
) -> Service:
    return Service(name, {do.name: do, undo.name: undo}, rejection_code, rejection_title)


SERVICES: Final[Mapping[str, Service]] = {
    service.name: service
    for service in (
        _service(
            "inventory",
            DoOperation("reserve-inventory", _reserve),
            Compensation("release-inventory", _undo("released", "reservationId", "skus")),
            "out-of-stock",
            "Item out of stock",
        ),
        _service(
            "payment",
            DoOperation("charge-payment", _charge),
            Compensation("refund-payment", _undo("refunded", "paymentId", "amount")),
            "card-declined",
            "Card declined",
        ),
        _service(
            "payment-secondary",
            DoOperation("charge-payment", _charge),
            Compensation("refund-payment", _undo("refunded", "paymentId", "amount")),
            "card-declined",
            "Card declined",
        ),
        _service(
            "shipping",
            DoOperation("create-shipment", _ship),
            Compensation("cancel-shipment", _undo("cancelled", "shipmentId")),
            "address-rejected",
            "Shipping address rejected",
        ),
    )
}
SERVICE_NAMES: Final[tuple[str, ...]] = tuple(SERVICES)
