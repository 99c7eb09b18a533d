"""Reconciliation against the real simulator: a charge that applied after its refund had
found nothing to undo (docs/in-doubt.md, the residual risk) is found, undone under a key
of its own, and found undone by the next run."""

from __future__ import annotations

import json
from dataclasses import replace

import aiohttp

from devhost.simulator import SimulatorServer
from devhost.simulator.judge import LedgerEntry, OrderToJudge, Step, judge
from shared.adapters.clock import FakeClock
from shared.adapters.http_remote import HttpRemoteService
from shared.adapters.memory.reconcile import InMemoryReconcileStore
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.adapters.queues import queue_of
from shared.contract import Queue
from shared.domain.machine import forward
from shared.domain.messages import AgentRequest
from shared.domain.model import OrderProcess, ProcessState, StepStatus
from shared.domain.rest_index import rest_entry
from shared.ports import RemoteCall
from shared.resilience import CircuitBreaker
from shared.usecases.flow.outcomes import Asked, OutcomeQueries
from shared.usecases.operations.reconcile import Reconciler
from tests.builders import a_policy, an_order
from tests.simulator.conftest import SimClient
from tests.workflows import CATALOGUE, ORDER_FULFILMENT

ORDER_ID = "late-1"
CHARGE, REFUND = f"{ORDER_ID}:charge-payment", f"{ORDER_ID}:refund-payment"


def cancelled_with_the_charge_at_payment(clock: FakeClock) -> OrderProcess:
    """Cancelled once its charge (held at payment, its key expired) was refunded."""
    process = forward.start(an_order(ORDER_ID, clock=clock), ORDER_FULFILMENT, clock.now()).process
    steps = list(process.steps)
    steps[1] = replace(steps[1], agent="payment", status=StepStatus.COMPENSATED)
    return replace(
        process,
        steps=tuple(steps),
        state=replace(
            process.state,
            process_state=ProcessState.CANCELLED,
            cancel_requested=True,
            current_step=1,
            updated_at=clock.now(),
        ),
    )


def reconciler(
    clock: FakeClock, store: InMemoryStateStore, bus: InMemoryBus, payment: HttpRemoteService
) -> Reconciler:
    return Reconciler(
        InMemoryReconcileStore(store),
        OutcomeQueries({"payment": Asked(payment, CircuitBreaker("payment", clock))}, clock),
        bus,
        clock,
        "test-1",
        a_policy(),
        catalogue=CATALOGUE,
    )


async def test_a_charge_applied_after_its_refund_found_nothing_is_healed(
    simulator: SimulatorServer, session: aiohttp.ClientSession, sim: SimClient
) -> None:
    refund = await sim.request(
        "POST",
        "/payment/refund-payment",
        json={"orderId": ORDER_ID, "idempotencyKey": REFUND, "undoes": CHARGE, "payload": {}},
    )
    assert refund.body == {"undone": False, "reason": "nothing-to-undo"}
    assert (await sim.call("payment", "charge-payment", ORDER_ID, CHARGE)).status == 200

    clock, store, bus = FakeClock(), InMemoryStateStore(), InMemoryBus()
    process = cancelled_with_the_charge_at_payment(clock)
    await store.create(process, ())
    await store.put_rest(rest_entry(process, ORDER_FULFILMENT))
    payment = HttpRemoteService(f"{simulator.url}/payment", session)

    first = await reconciler(clock, store, bus, payment).run()

    assert [(m.step, m.agent, m.key) for m in first.mismatches] == [
        ("charge-payment", "payment", CHARGE)
    ]
    (heal,) = [m for m in bus.sent if queue_of(m.destination) != Queue.OPERATOR_ALERTS]
    request = AgentRequest.parse(json.dumps(heal.body))
    assert request.idempotency_key not in (REFUND, CHARGE)
    assert request.undoes == CHARGE

    # What the payment agent does with it.
    operation = request.operation or "refund-payment"
    call = RemoteCall(ORDER_ID, operation, request.idempotency_key, request.payload, request.undoes)
    assert "refunded" in await payment.invoke(call, 5)

    clock.advance(3600)
    second = await reconciler(clock, store, bus, payment).run()
    assert (second.mismatches, second.unknown) == ((), 0)

    effects = [LedgerEntry.from_json(e) for e in await sim.effects(f"?orderId={ORDER_ID}")]
    verdict = judge(
        effects,
        [OrderToJudge(ORDER_ID, "Cancelled", settles_at=None)],
        [Step("charge-payment", "refund-payment")],
        now=None,
    )
    assert verdict.passed, verdict.violations
