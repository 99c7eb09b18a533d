"""An operation refused for good goes again under a fresh key (issue #37 item 3,
docs/in-doubt.md "An operation refused for good", shared/domain/machine/rekey.py).

The provider here keeps what it answered each key and replays it, as the simulator and
most payment APIs do: once a key is refused, every repeat of it is refused too, however
the provider is mended. So a resubmit (or a cancel of a held compensation) that sent
the same key again would leave the order in Error for good; the refused operation goes
under the step's next round instead. A key in doubt is never moved."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from datetime import timedelta

from shared.contract import Queue, agent_queue
from shared.domain.in_doubt import ABANDONED, NEVER_SEEN, NOT_APPLIED, RemoteOutcome
from shared.domain.messages import AgentReply, AgentRequest
from shared.domain.model import Action, JsonObject, OrderProcess, Phase, ProcessState, StepStatus
from shared.ports import PermanentRemoteError, RemoteCall, RemoteService
from shared.resilience import CircuitBreaker
from shared.usecases.flow import scheduler
from shared.usecases.flow.agent import AgentDeps, perform_step
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.operator import cancel_order, inspect_order, resubmit_order
from tests.builders import World, an_order
from tests.workflows import CATALOGUE, EXPRESS_DELIVERY

AGENTS = ("inventory", "payment", "payment-secondary", "shipping", "notifications")


@dataclass
class Ledger:
    """Every service's record of its keys: an applied key answers its result again, a
    refused one its refusal again. `faults` names the operations refused for good while
    the fault lasts; `silent` the ones that never answer (a timeout)."""

    faults: set[str] = field(default_factory=set)
    silent: set[str] = field(default_factory=set)
    applied: dict[str, JsonObject] = field(default_factory=dict)
    refused: set[str] = field(default_factory=set)
    keys: list[tuple[str, str]] = field(default_factory=list)
    """(operation, key) of every call, in order."""

    def service(self) -> Service:
        return Service(self)


@dataclass
class Service:
    ledger: Ledger

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        ledger = self.ledger
        ledger.keys.append((call.operation, call.idempotency_key))
        if call.idempotency_key in ledger.refused:
            raise PermanentRemoteError("rejected", "account closed")
        if call.idempotency_key in ledger.applied:
            return ledger.applied[call.idempotency_key]
        if call.operation in ledger.faults:
            ledger.refused.add(call.idempotency_key)
            raise PermanentRemoteError("rejected", "account closed")
        result: JsonObject = {"ref": call.idempotency_key, "undone": True}
        ledger.applied[call.idempotency_key] = result
        return result

    async def probe(self, timeout: float) -> None:
        return None

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        if key in self.ledger.applied:
            return RemoteOutcome.applied(self.ledger.applied[key])
        return NOT_APPLIED if key in self.ledger.refused else NEVER_SEEN

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        if key in self.ledger.applied:
            return RemoteOutcome.applied(self.ledger.applied[key])
        self.ledger.refused.add(key)
        return ABANDONED


def _agents(world: World, remote: Callable[[str], RemoteService]) -> dict[str, AgentDeps]:
    return {
        agent: AgentDeps(
            agent=agent,
            bus=world.bus,
            clock=world.clock,
            remote=remote(agent),
            breaker=CircuitBreaker(agent, world.clock),
            catalogue=CATALOGUE,
        )
        for agent in AGENTS
    }


async def _run(world: World, ledger: Ledger) -> None:
    await serve(world, lambda agent: ledger.service(), ledger.silent)


async def serve(
    world: World, remote: Callable[[str], RemoteService], silent: Collection[str] = ()
) -> None:
    """Deliver every message due, in the order sent, until none is left: requests to
    their agent, which calls `remote(agent)` (a `silent` operation's request is lost, as
    a timeout would leave it), nudges and replies to the Scheduler."""
    agents = _agents(world, remote)
    queues = {agent_queue(a): a for a in AGENTS}
    while True:
        now = world.clock.now()
        due = [
            m
            for m in world.bus.sent
            if (m.queue in queues or m.queue in (Queue.SCHEDULER, Queue.AGENT_REPLIES))
            and (m.deliver_at is None or m.deliver_at <= now)
        ]
        if not due:
            return
        message = due[0]
        world.bus.sent.remove(message)
        body = json.dumps(dict(message.body))
        if message.queue == Queue.SCHEDULER:
            await scheduler.on_nudge(world.deps(), str(message.body["orderId"]))
        elif message.queue == Queue.AGENT_REPLIES:
            await scheduler.on_reply(world.deps(), AgentReply.parse(body))
        else:
            request = AgentRequest.parse(body)
            if request.operation not in silent:
                await perform_step(agents[queues[message.queue]], request)


async def _order(world: World, ledger: Ledger, workflow: str = "express-delivery") -> None:
    flow = EXPRESS_DELIVERY if workflow == "express-delivery" else CATALOGUE.get(workflow)
    await submit_order(world.deps(), an_order("o-1", clock=world.clock), workflow=flow)
    await _run(world, ledger)


async def _load(world: World) -> OrderProcess:
    return await inspect_order(world.deps(), "o-1")


def _keys(ledger: Ledger, operation: str) -> list[str]:
    return [key for op, key in ledger.keys if op == operation]


async def test_a_held_retriable_step_resubmitted_once_mended_ends_processed() -> None:
    world, ledger = World(), Ledger(faults={"notify-customer"})
    await _order(world, ledger)
    held = await _load(world)
    assert held.state.process_state is ProcessState.ERROR
    ledger.faults.clear()  # mended: the account reopened; the refused key stays refused
    await resubmit_order(world.deps(), "o-1", "op")
    await _run(world, ledger)
    process = await _load(world)
    assert process.state.process_state is ProcessState.PROCESSED
    assert _keys(ledger, "notify-customer") == ["o-1:notify-customer", "o-1:notify-customer:r2"]
    (resubmitted,) = [h for h in process.history if h.detail.startswith("by op")]
    assert resubmitted.detail == (
        "by op; notify-customer refused for good under o-1:notify-customer: "
        "sent again under o-1:notify-customer:r2"
    )


async def test_a_resubmit_before_the_provider_is_mended_moves_the_key_once_more() -> None:
    world, ledger = World(), Ledger(faults={"notify-customer"})
    await _order(world, ledger)
    await resubmit_order(world.deps(), "o-1", "op")
    await _run(world, ledger)
    assert (await _load(world)).state.process_state is ProcessState.ERROR
    ledger.faults.clear()
    await resubmit_order(world.deps(), "o-1", "op")
    await _run(world, ledger)
    assert (await _load(world)).state.process_state is ProcessState.PROCESSED
    assert _keys(ledger, "notify-customer")[-1] == "o-1:notify-customer:r3"


async def _refund_held(world: World, ledger: Ledger) -> None:
    """order-fulfilment: inventory reserved, payment charged, the shipment declined for
    good, and the refund refused for good: held in compensation."""
    ledger.faults |= {"create-shipment", "refund-payment"}
    await _order(world, ledger, "order-fulfilment")
    held = await _load(world)
    assert (held.state.process_state, held.state.phase) == (ProcessState.ERROR, Phase.COMPENSATE)
    ledger.faults.discard("refund-payment")  # mended


async def test_a_held_refund_resubmitted_once_mended_ends_compensated() -> None:
    world, ledger = World(), Ledger()
    await _refund_held(world, ledger)
    await resubmit_order(world.deps(), "o-1", "op")
    await _run(world, ledger)
    process = await _load(world)
    assert process.state.process_state is ProcessState.COMPENSATED
    assert _keys(ledger, "refund-payment") == ["o-1:refund-payment", "o-1:refund-payment:r2"]
    assert "o-1:refund-payment:r2" in ledger.applied
    assert process.steps[1].status is StepStatus.COMPENSATED


async def test_a_held_refund_cancelled_once_mended_ends_cancelled() -> None:
    world, ledger = World(), Ledger()
    await _refund_held(world, ledger)
    await cancel_order(world.deps(), "o-1", "op")
    await _run(world, ledger)
    process = await _load(world)
    assert process.state.process_state is ProcessState.CANCELLED
    assert _keys(ledger, "refund-payment") == ["o-1:refund-payment", "o-1:refund-payment:r2"]
    (cancelled,) = [h for h in process.history if h.detail.startswith("by op")]
    assert "sent again under o-1:refund-payment:r2" in cancelled.detail


async def test_a_key_in_doubt_keeps_its_key_on_a_resubmit() -> None:
    """notify-customer never answers: its retries time out until the order is held. The
    provider may have applied that key, so the resubmit sends the same one."""
    world, ledger = World(), Ledger(silent={"notify-customer"})
    await _order(world, ledger)
    for _ in range(20):
        if (await _load(world)).state.process_state is ProcessState.ERROR:
            break
        world.clock.advance(timedelta(seconds=40).total_seconds())
        await sweep(world.deps())
        await _run(world, ledger)
    held = await _load(world)
    assert held.state.process_state is ProcessState.ERROR
    assert held.steps[-1].refused is None
    assert len(ledger.keys) == 3, "the silent notify-customer was never called"
    ledger.silent.clear()
    await resubmit_order(world.deps(), "o-1", "op")
    await _run(world, ledger)
    process = await _load(world)
    assert process.state.process_state is ProcessState.PROCESSED
    assert set(_keys(ledger, "notify-customer")) == {"o-1:notify-customer"}
    assert process.steps[-1].do_round == 0


async def test_an_order_held_before_refusals_were_kept_resends_its_key_once_and_is_safe() -> None:
    """Held on a refused notify-customer by a version that kept no refusal: the resubmit
    cannot know the key was refused, so it sends the same key. The provider replays its
    refusal (a key refused for good never applies), the order is held again, now with the
    refusal kept, and the next resubmit moves the key. One more operator move, no second
    effect, and the step's record says what the provider did at each step."""
    world, ledger = World(), Ledger(faults={"notify-customer"})
    await _order(world, ledger)
    held = await _load(world)
    steps = (*held.steps[:-1], replace(held.steps[-1], refused=None))
    await world.store.save(replace(held, steps=steps), ())
    ledger.faults.clear()

    await resubmit_order(world.deps(), "o-1", "op")
    await _run(world, ledger)
    again = await _load(world)
    assert again.state.process_state is ProcessState.ERROR
    step = again.steps[-1]
    assert (step.status, step.refused, step.do_round) == (StepStatus.FAILED, Action.DO, 0)
    assert not any(key.startswith("o-1:notify-customer") for key in ledger.applied)

    await resubmit_order(world.deps(), "o-1", "op")
    await _run(world, ledger)
    process = await _load(world)
    assert process.state.process_state is ProcessState.PROCESSED
    assert _keys(ledger, "notify-customer") == ["o-1:notify-customer"] * 2 + [
        "o-1:notify-customer:r2"
    ]
    applied = [key for key in ledger.applied if key.startswith("o-1:notify-customer")]
    assert applied == ["o-1:notify-customer:r2"]
