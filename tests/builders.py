"""Builders for test inputs: an order, a process in a given state, a reply for attempt N."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.messages import AgentReply
from shared.domain.model import (
    Action,
    ErrorInfo,
    ExhaustedPolicy,
    Order,
    OrderLine,
    Outcome,
    Outgoing,
    Priority,
)
from shared.domain.workflow import Catalogue
from shared.usecases.flow.deps import ProcessDeps
from tests.workflows import CATALOGUE

_ids: Iterator[int] = iter(range(1, 1_000_000))


def an_order(
    order_id: str | None = None,
    *,
    skus: tuple[str, ...] = ("sku-1",),
    reply_to: str | None = None,
    fingerprint: str = "fp",
    clock: FakeClock | None = None,
) -> Order:
    return Order(
        order_id=order_id or f"order-{next(_ids)}",
        customer_id="cust-1",
        items=tuple(OrderLine(sku, 2, 9.5) for sku in skus),
        priority=Priority.NORMAL,
        reply_to=reply_to,
        fingerprint=fingerprint,
        created_at=(clock or FakeClock()).now(),
    )


def a_policy(
    *,
    max_failure_count: int = 3,
    exhausted: ExhaustedPolicy = ExhaustedPolicy.HOLD,
    step_timeout: float = 30,
    pending_timeout: float = 60,
) -> ProcessPolicy:
    return ProcessPolicy(
        step_timeout=timedelta(seconds=step_timeout),
        pending_timeout=timedelta(seconds=pending_timeout),
        max_failure_count=max_failure_count,
        exhausted_policy=exhausted,
    )


def a_reply(
    request: Outgoing,
    outcome: Outcome = Outcome.SUCCEEDED,
    *,
    attempt: int | None = None,
    result: dict[str, object] | None = None,
    error: ErrorInfo | None = None,
) -> AgentReply:
    """The reply an agent would send to this request (optionally for another attempt)."""
    body = request.body
    return AgentReply(
        order_id=body["orderId"],
        step=body["step"],
        action=Action(body["action"]),
        attempt=attempt if attempt is not None else body["attempt"],
        outcome=outcome,
        result=result if result is not None else {"ref": f"{body['step']}-result"},
        error=error or (ErrorInfo("declined", "no") if outcome is Outcome.FAILED else None),
    )


@dataclass
class World:
    """In-memory adapters and a fake clock wired into ProcessDeps."""

    clock: FakeClock = field(default_factory=FakeClock)
    store: InMemoryStateStore = field(default_factory=InMemoryStateStore)
    bus: InMemoryBus = field(default_factory=InMemoryBus)
    policy: ProcessPolicy = field(default_factory=a_policy)
    catalogue: Catalogue = CATALOGUE
    """The catalogue the world's deps run; a test changes it to switch catalogues."""

    def deps(
        self, instance_id: str = "scheduler-1", *, claim_at_intake: bool = True
    ) -> ProcessDeps:
        """As the composed app has them; `claim_at_intake=False` for a test about the
        Scheduler's first claim (a nudged order, as past the intake's burst)."""
        return ProcessDeps(
            self.store,
            self.bus,
            self.clock,
            self.policy,
            instance_id,
            catalogue=self.catalogue,
            claim_at_intake=claim_at_intake,
        )
