"""The remote services, one per catalogue agent: operations, payloads, deterministic results.

The catalogue (``catalogue.json``, ``shared.catalogue``) names the services: each agent is
a service, and it offers the do and undo operations of every workflow step it may do (as
the step's agent or one of its alternatives). The operations the simulator has always
known (reserve, charge, ship and their undos) keep their hand-written results; any other
operation gets a generic one built from the step's declared result fields.

Results are derived from a hash of the idempotency key only, so a repeat (even after a
restart, even if the ledger were lost) yields the same ids and agents can be checked
for passing the right result to the compensation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from shared.catalogue import catalogue_file, load
from shared.domain.workflow import Catalogue


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
    """Payload of the known do-operations; only what the simulated services look at."""

    model_config = ConfigDict(extra="allow")

    customer_id: str | None = Field(default=None, alias="customerId")
    items: list[OrderItem] = Field(min_length=1)

    @property
    def skus(self) -> list[str]:
        return [item.sku for item in self.items]


class StepPayload(BaseModel):
    """Payload of an operation known only from the catalogue: anything goes. It may carry
    the results of earlier steps (``inputs``) and the order; its items are read only for
    their SKUs (``permanentFailureSkus``), never required."""

    model_config = ConfigDict(extra="allow")

    inputs: dict[str, Any] | None = None
    items: list[Any] = Field(default_factory=list)

    @property
    def skus(self) -> list[str]:
        found = (item.get("sku") for item in self.items if isinstance(item, dict))
        return [sku for sku in found if isinstance(sku, str)]


DoPayload = OrderPayload | StepPayload


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


def _generic_do(results: tuple[str, ...]) -> Callable[[str, DoPayload], dict[str, Any]]:
    """One value per declared result field (``notificationId`` becomes
    ``notificationid-<hash>``), plus the request's ``inputs`` echoed when it has them, so
    a test sees what a step received from the earlier ones."""

    def build(key: str, payload: DoPayload) -> dict[str, Any]:
        digest = key_hash(key)
        result: dict[str, Any] = {name: f"{name.lower()}-{digest}" for name in results}
        if isinstance(payload, StepPayload) and payload.inputs is not None:
            result["inputs"] = payload.inputs
        return result

    return build


def _on_order(
    build: Callable[[str, OrderPayload], dict[str, Any]],
) -> Callable[[str, DoPayload], dict[str, Any]]:
    def built(key: str, payload: DoPayload) -> dict[str, Any]:
        assert isinstance(payload, OrderPayload), "known operations are parsed as orders"
        return build(key, payload)

    return built


KNOWN_DOS: Final[Mapping[str, Callable[[str, OrderPayload], dict[str, Any]]]] = {
    "reserve-inventory": _reserve,
    "charge-payment": _charge,
    "create-shipment": _ship,
}
"""Operations with hand-written results; they need an order (items) in the payload."""
KNOWN_UNDOS: Final[Mapping[str, Callable[[CompensationPayload], dict[str, Any]]]] = {
    "release-inventory": _undo("released", "reservationId", "skus"),
    "refund-payment": _undo("refunded", "paymentId", "amount"),
    "cancel-shipment": _undo("cancelled", "shipmentId"),
}
KNOWN_REJECTIONS: Final[Mapping[str, tuple[str, str]]] = {
    "inventory": ("out-of-stock", "Item out of stock"),
    "payment": ("card-declined", "Card declined"),
    "payment-secondary": ("card-declined", "Card declined"),
    "shipping": ("address-rejected", "Shipping address rejected"),
}
"""Problem code and title of a service's permanent failure (a blocked SKU)."""
REJECTED: Final[tuple[str, str]] = ("rejected", "Rejected")
"""Any other service's, and every ``permanentFailureOperations`` rejection."""


@dataclass(frozen=True)
class DoOperation:
    name: str
    build_result: Callable[[str, DoPayload], dict[str, Any]]
    needs_order: bool = True
    """Parse the payload as an order (items required) rather than leniently."""

    def parse(self, raw: dict[str, Any]) -> DoPayload:
        """The payload, or a pydantic ``ValidationError``."""
        if self.needs_order:
            return OrderPayload.model_validate(raw)
        return StepPayload.model_validate(raw)


@dataclass(frozen=True)
class Compensation:
    name: str
    build_result: Callable[[CompensationPayload], dict[str, Any]]
    do: str
    """The do operation it undoes (from the catalogue step that declares it)."""


Operation = DoOperation | Compensation


@dataclass(frozen=True)
class Service:
    name: str
    operations: Mapping[str, Operation]
    rejection_code: str
    """Problem code of this service's permanent failure for a blocked SKU."""
    rejection_title: str

    @property
    def dos(self) -> tuple[DoOperation, ...]:
        """The operations that make an effect (several when the agent does several steps)."""
        return tuple(op for op in self.operations.values() if isinstance(op, DoOperation))

    def undone_key(self, order_id: str, compensation: Compensation, undoes: str | None) -> str:
        """The do key a compensation undoes: the one it names, else (a client from before
        ``undoes``) the agents' own key shape, ``{orderId}:{do-operation}``, with the do
        the catalogue pairs with that undo."""
        return undoes if undoes is not None else f"{order_id}:{compensation.do}"


class ServicesError(ValueError):
    """The catalogue cannot be served: an operation name means two things."""


@dataclass
class _Collected:
    dos: dict[str, list[str]] = field(default_factory=dict)
    """Do operation -> its declared result fields (union over the steps naming it)."""
    undos: dict[str, str] = field(default_factory=dict)
    """Undo operation -> the do it undoes."""


def _collect(found: Catalogue, agent: str) -> _Collected:
    collected = _Collected()
    for workflow in found.workflows:
        for step in workflow.steps:
            if agent not in step.candidates:
                continue
            results = collected.dos.setdefault(step.name, [])
            results.extend(r for r in step.results if r not in results)
            undo = step.compensation
            if undo is None:
                continue
            if collected.undos.setdefault(undo, step.name) != step.name:
                raise ServicesError(
                    f"agent {agent}: {undo} undoes both {collected.undos[undo]} and {step.name}"
                )
    clash = set(collected.dos) & set(collected.undos)
    if clash:
        raise ServicesError(f"agent {agent}: {', '.join(sorted(clash))} is both a do and an undo")
    return collected


def _generic_undo(results: Iterable[str]) -> Callable[[CompensationPayload], dict[str, Any]]:
    """``undone: true`` plus the undone result's declared fields, echoed."""
    return _undo("undone", *results)


def service_for(found: Catalogue, agent: str) -> Service:
    """The simulated service of one catalogue agent."""
    collected = _collect(found, agent)
    operations: dict[str, Operation] = {}
    for name, results in collected.dos.items():
        known = KNOWN_DOS.get(name)
        if known is not None:
            operations[name] = DoOperation(name, _on_order(known))
        else:
            operations[name] = DoOperation(name, _generic_do(tuple(results)), needs_order=False)
    for name, do in collected.undos.items():
        build = KNOWN_UNDOS.get(name) or _generic_undo(collected.dos[do])
        operations[name] = Compensation(name, build, do)
    code, title = KNOWN_REJECTIONS.get(agent, REJECTED)
    return Service(agent, operations, code, title)


def services_from(found: Catalogue) -> dict[str, Service]:
    """One service per catalogue agent, named as the agent (contract section 12)."""
    return {agent: service_for(found, agent) for agent in found.agents}


SERVICES: Final[Mapping[str, Service]] = services_from(load(catalogue_file()))
"""The services of the catalogue the app runs (``CatalogueFile`` may point elsewhere)."""
SERVICE_NAMES: Final[tuple[str, ...]] = tuple(SERVICES)
