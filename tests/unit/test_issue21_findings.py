"""Issue 21, findings 1, 2a, 2b and 10: "never leave money behind", by net effect.

Each test drives one order of order-fulfilment through the use cases (submit, the
Scheduler's claims and replies, the Supervisor's sweep asking the provider, operator
cancel, suspend and resume) on the in-memory adapters and a fake clock, with the
providers played by the ledger of tests/model/provider.py: a request reaches its
service and may apply there up to its complete-by plus the clock-skew margin; an undo
applies only against its do applied (it waits while the do runs there, and otherwise
records nothing-to-undo, which does not stop the do from applying later). The
Supervisor's questions (outcome, abandon) are answered truthfully from that ledger.

The verdict is the net effect, judged from outside the domain:

- no undo is sent while a request of its do may still apply and its key is unsettled;
- no undo is sent for a do its provider told the order was not applied;
- the order ends, and its end state agrees with what the providers applied (Cancelled
  or Compensated: nothing in force anywhere).

Every test here fails on commit 0da3a08 (the last commit with the old domain, before
shared/domain/machine/settle.py), and passes since.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

import pytest

from shared.adapters.memory.store import InMemoryBus, Sent
from shared.adapters.queues import queue_of
from shared.contract import Queue, agent_queue
from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.model import (
    ExhaustedPolicy,
    JsonObject,
    OrderProcess,
    Outgoing,
    ProcessState,
)
from shared.ports import BusUnavailable, RemoteCall
from shared.resilience import CircuitBreaker
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.outcomes import Asked, OutcomeQueries
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.operator import cancel_order, resume_order, suspend_order
from tests.builders import World, a_policy, a_reply, an_order
from tests.model.provider import KeyStatus, Provider

SKEW = 5
"""The world's clock-skew margin: a request may apply up to this long after its
complete-by (the domain's ClockSkewSeconds default)."""

AGENTS = ("inventory", "payment", "payment-secondary", "shipping")
DO_STEPS = ("reserve-inventory", "charge-payment", "create-shipment")
CHARGE, RESERVE = "o-1:charge-payment", "o-1:reserve-inventory"
SETTLED = (KeyStatus.APPLIED, KeyStatus.REJECTED, KeyStatus.ABANDONED)
NOT_APPLIED_ANSWERS = (
    RemoteOutcomeKind.NOT_APPLIED,
    RemoteOutcomeKind.NEVER_SEEN,
    RemoteOutcomeKind.ABANDONED,
)


class PartialBus(InMemoryBus):
    """A bus whose next send fails once after its first queue's messages went out (as a
    send queue by queue does when the second queue's send fails), or after every message
    went out (only the acknowledgement lost)."""

    cut: str | None = None
    """None, "after-first-queue" or "ack-lost": how the next send fails."""

    async def send(self, messages: Sequence[Outgoing]) -> None:
        cut, self.cut = self.cut, None
        if cut is None or not messages:
            await super().send(messages)
            return
        first = queue_of(messages[0].destination)
        delivered = [m for m in messages if queue_of(m.destination) == first]
        await super().send(delivered if cut == "after-first-queue" else messages)
        raise BusUnavailable(f"injected: the send failed {cut}")


@dataclass
class Ledgered:
    """A provider's read API (outcome and abandon), answering from the ledger."""

    services: Services
    agent: str

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        raise AssertionError("the Supervisor never calls an operation")

    async def probe(self, timeout: float) -> None:
        return None

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        return self.services.said(self.agent, key, self.services.answer(self.agent, key))

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        """Applied stays applied and a running key answers in progress (409); any other
        key is abandoned for good."""
        services = self.services
        services.expire()
        services.ledger, status = services.ledger.abandon(self.agent, key)
        if status is KeyStatus.ABANDONED:
            return services.said(self.agent, key, RemoteOutcome(RemoteOutcomeKind.ABANDONED))
        return services.said(self.agent, key, services.answer(self.agent, key))


@dataclass
class Services:
    """One order, its use cases, and the providers' ledger; the agents serve every request
    at once except those of the steps the test holds, which it moves by hand."""

    world: World
    ledger: Provider = field(default_factory=Provider)
    t0: datetime = field(init=False)
    windows: dict[tuple[str, str], int] = field(default_factory=dict)
    """(agent, key): until when a request sent with the key may still apply."""
    held_steps: set[str] = field(default_factory=set)
    held: list[Outgoing] = field(default_factory=list)
    waiting: list[Outgoing] = field(default_factory=list)
    """Undos an agent keeps calling while their do runs at the provider."""
    told_not_applied: set[tuple[str, str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.t0 = self.world.clock.now()

    # --- time, ledger -------------------------------------------------------------------

    def now(self) -> int:
        return int((self.world.clock.now() - self.t0).total_seconds())

    def at(self, tick: int) -> None:
        """Move the clock to t0 + `tick` seconds (never back)."""
        assert tick >= self.now(), f"t={tick} is in the past (now t={self.now()})"
        self.world.clock.advance(tick - self.now())
        self.expire()

    def expire(self) -> None:
        self.ledger = self.ledger.expire(self.now())

    def answer(self, agent: str, key: str) -> RemoteOutcome:
        self.expire()
        status = self.ledger.get(agent, key).status
        if status is KeyStatus.APPLIED:
            return RemoteOutcome.applied({"ref": f"{key}-result"})
        kinds = {
            KeyStatus.NEVER_SEEN: RemoteOutcomeKind.NEVER_SEEN,
            KeyStatus.RUNNING: RemoteOutcomeKind.IN_PROGRESS,
            KeyStatus.NOT_APPLIED: RemoteOutcomeKind.NOT_APPLIED,
            KeyStatus.REJECTED: RemoteOutcomeKind.NOT_APPLIED,
            KeyStatus.ABANDONED: RemoteOutcomeKind.ABANDONED,
        }
        return RemoteOutcome(kinds[status])

    def said(self, agent: str, key: str, answer: RemoteOutcome) -> RemoteOutcome:
        if answer.kind in NOT_APPLIED_ANSWERS:
            self.told_not_applied.add((agent, key))
        return answer

    # --- the order's side ---------------------------------------------------------------

    def deps(self) -> ProcessDeps:
        return self.world.deps()

    def queries(self) -> OutcomeQueries:
        clock = self.world.clock
        services = {a: Asked(Ledgered(self, a), CircuitBreaker(a, clock)) for a in AGENTS}
        return OutcomeQueries(services, clock)

    async def sweep(self) -> None:
        self.expire()
        await sweep(self.deps(), queries=self.queries())
        await self.run()

    async def process(self) -> OrderProcess:
        process = await self.world.store.load("o-1")
        assert process is not None
        return process

    async def claims(self) -> bool:
        """Deliver the Scheduler's due nudges (a delayed one waits on the queue)."""
        bus, moved = self.world.bus, False
        for nudge in bus.take(Queue.SCHEDULER):
            if nudge.deliver_at is not None and nudge.deliver_at > self.world.clock.now():
                bus.sent.append(nudge)
                continue
            moved = True
            await scheduler.on_nudge(self.deps(), nudge.body["orderId"], nudge.message_id)
        return moved

    # --- the agents' and providers' side ------------------------------------------------

    def requests(self) -> list[Sent]:
        """Take what the agents were sent; an undo is judged the moment it is sent."""
        taken = [m for a in AGENTS for m in self.world.bus.take(agent_queue(a))]
        for request in taken:
            agent, key = _agent(request), request.body["idempotencyKey"]
            window = _tick(self, request.body["completeBy"]) + SKEW
            self.windows[(agent, key)] = max(self.windows.get((agent, key), 0), window)
            if request.body["action"] == "compensate":
                self._judge_undo(request)
        return taken

    def _judge_undo(self, undo: Outgoing) -> None:
        agent, now = _agent(undo), self.now()
        do_key = _do_key(undo)
        status = self.ledger.get(agent, do_key).status
        window = self.windows.get((agent, do_key), 0)
        if status not in SETTLED and now < window:
            self.problems.append(
                f"t={now}: undo {undo.body['idempotencyKey']} sent while a request of "
                f"{do_key} may still apply at {agent} (until t={window}, key {status.value})"
            )
        if (agent, do_key) in self.told_not_applied and status is not KeyStatus.APPLIED:
            self.problems.append(
                f"t={now}: undo {undo.body['idempotencyKey']} sent after {agent} said "
                f"{do_key} was not applied"
            )

    def reach(self, request: Outgoing, *, until: int | None = None) -> None:
        """The request reaches its provider, which runs it until `until` (default: its
        window) unless it applies sooner."""
        agent, key = _agent(request), request.body["idempotencyKey"]
        window = until if until is not None else self.windows[(agent, key)]
        undoes = _do_key(request) if request.body["action"] == "compensate" else None
        self.ledger = self.ledger.register(agent, key, window, undoes)

    def apply(self, request: Outgoing) -> bool:
        agent, key = _agent(request), request.body["idempotencyKey"]
        self.expire()
        if not self.ledger.can_apply(agent, key, self.now()):
            return False
        self.ledger = self.ledger.apply(agent, key)
        return True

    async def answer_succeeded(self, request: Outgoing) -> None:
        await scheduler.on_reply(self.deps(), a_reply(request))

    async def serve(self, request: Outgoing) -> None:
        """An agent calls its provider at once and answers the order when it applied; it
        keeps calling an undo its provider holds back, until the undo's window ends."""
        if self.now() >= self.windows[(_agent(request), request.body["idempotencyKey"])]:
            return
        self.reach(request)
        if self.apply(request):
            await self.answer_succeeded(request)
        elif self.ledger.get(_agent(request), request.body["idempotencyKey"]).status is (
            KeyStatus.RUNNING
        ):
            self.waiting.append(request)

    async def run(self) -> None:
        """Everything that happens at once: claims, and the agents serving what they got."""
        for _ in range(50):
            moved = await self.claims()
            retries, self.waiting = self.waiting, []
            for request in retries:
                await self.serve(request)
            moved = moved or self.waiting != retries
            for request in self.requests():
                moved = True
                if request.body["action"] == "do" and request.body["step"] in self.held_steps:
                    self.held.append(request)
                else:
                    await self.serve(request)
            if not moved:
                return
        raise AssertionError("the order does not come to rest")

    async def finish(self, *, until: int = 300) -> None:
        """Let time pass, sweeping, until the order ends (or `until`)."""
        await self.run()
        while not (await self.process()).state.process_state.is_final and self.now() < until:
            self.at(self.now() + 1)
            await self.sweep()

    async def verdict(self) -> list[str]:
        process = await self.process()
        state = process.state.process_state
        problems = list(self.problems)
        if not state.is_final:
            problems.append(f"the order did not end: {state.value}")
        for step in DO_STEPS:
            key = f"o-1:{step}"
            at = [a for a in AGENTS if self.ledger.in_force(a, key)]
            if state in (ProcessState.CANCELLED, ProcessState.COMPENSATED) and at:
                problems.append(f"the order is {state.value} but {step} is in force at {at}")
            if state is ProcessState.PROCESSED and len(at) != 1:
                problems.append(f"the order is Processed but {step} is in force at {at}")
        if problems:
            problems.append(f"ledger: {self.ledger.describe()}")
        return problems


def _agent(request: Outgoing) -> str:
    return queue_of(request.destination).removeprefix("agent-").removesuffix("-high")


def _do_key(undo: Outgoing) -> str:
    return f"{undo.body['orderId']}:{undo.body['step']}"


def _tick(services: Services, iso: str) -> int:
    at = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return int((at - services.t0).total_seconds())


async def at_charge(world: World | None = None) -> tuple[Services, Outgoing]:
    """Order o-1 submitted, its inventory reserved, its charge sent at t0 and held."""
    services = Services(world or World())
    services.held_steps.add("charge-payment")
    await submit_order(services.deps(), an_order("o-1", clock=services.world.clock))
    await services.run()
    (charge,) = services.held
    assert charge.body["idempotencyKey"] == CHARGE
    assert services.ledger.in_force("inventory", RESERVE)
    return services, charge


# --- finding 1 ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["cancel-waiting", "exhausted-compensate", "cancel-in-error"])
async def test_finding_1_an_in_progress_answer_sends_no_undo_while_the_charge_runs(
    how: str,
) -> None:
    """Finding 1: the charge runs at payment past its complete-by; the Supervisor asks at
    t0+31 and payment answers 409 operation-in-progress. No refund may go while the charge
    can still apply (it does, at t0+34): the order waits for it, then refunds it. The same
    with ExhaustedPolicy=compensate, and with an operator cancelling the Error order the
    answer left.

    The ledger's payment holds a refund back while its charge runs, so here the early
    refund still undoes the charge once it applies; a provider that answered it
    nothing-to-undo would leave the charge in force (the finding's end state). What is
    judged is the rule: no refund while the charge may still apply."""
    policy = {
        "cancel-waiting": a_policy(),
        "exhausted-compensate": a_policy(max_failure_count=1, exhausted=ExhaustedPolicy.COMPENSATE),
        "cancel-in-error": a_policy(max_failure_count=1),
    }[how]
    services, charge = await at_charge(World(policy=policy))
    services.reach(charge)  # payment runs it: "in progress" until it applies
    if how == "cancel-waiting":
        services.at(1)
        await cancel_order(services.deps(), "o-1", "op")
        await services.run()

    services.at(31)
    await services.sweep()
    assert services.answer("payment", CHARGE).kind is RemoteOutcomeKind.IN_PROGRESS
    if how == "cancel-in-error":
        services.at(32)
        await cancel_order(services.deps(), "o-1", "op")
    services.at(33)
    await services.run()
    services.at(34)
    assert services.apply(charge)
    await services.answer_succeeded(charge)
    await services.finish()

    assert await services.verdict() == []
    expected = ProcessState.COMPENSATED if how == "exhausted-compensate" else ProcessState.CANCELLED
    assert (await services.process()).state.process_state is expected


# --- finding 2 ---------------------------------------------------------------------------


async def test_finding_2a_suspend_resume_cancel_waits_for_the_charge_still_on_the_wire() -> None:
    """Finding 2a: the charge goes out at t0; suspend at t0+1, resume at t0+2, cancel at
    t0+3 before the resume's nudge is claimed. The attempt-1 charge request may apply
    until t0+35; it applies at t0+29. No refund may go before then, and the charge that
    applied is refunded: the order ends Cancelled with nothing in force."""
    services, charge = await at_charge()
    services.at(1)
    await suspend_order(services.deps(), "o-1", "op")
    services.at(2)
    await resume_order(services.deps(), "o-1", "op")
    services.at(3)
    await cancel_order(services.deps(), "o-1", "op")
    await services.run()
    services.at(29)
    services.reach(charge)
    assert services.apply(charge)
    await services.answer_succeeded(charge)  # attempt 1's answer
    await services.finish()

    assert await services.verdict() == []
    assert (await services.process()).state.process_state is ProcessState.CANCELLED


@pytest.mark.parametrize("cut", ["after-first-queue", "ack-lost"])
async def test_finding_2b_a_partly_sent_claim_is_not_taken_for_never_sent(cut: str) -> None:
    """Finding 2b: the claim's reserve-inventory request is delivered, then the send fails
    (the Processing notification to order-status, or only the acknowledgement). The
    agent runs the request; a cancel at t0+1 must not send the release before the
    reserve (which applies at t0+10) can no longer apply: the order ends Cancelled with
    the reservation released."""
    bus = PartialBus()
    services = Services(World(bus=bus))
    services.held_steps.add("reserve-inventory")
    nudged = replace(services.deps(), claim_at_intake=False)  # the Scheduler's claim
    await submit_order(nudged, an_order("o-1", clock=services.world.clock))
    (nudge,) = bus.take(Queue.SCHEDULER)
    bus.cut = cut
    with pytest.raises(BusUnavailable):
        await scheduler.on_nudge(services.deps(), "o-1", nudge.message_id)
    bus.sent.append(nudge)  # not settled: the broker delivers it again
    (reserve,) = services.requests()  # the agent has it, and runs it
    assert reserve.body["idempotencyKey"] == RESERVE
    services.at(1)
    await cancel_order(services.deps(), "o-1", "op")
    await services.run()
    services.at(10)
    services.reach(reserve)
    assert services.apply(reserve)
    await services.answer_succeeded(reserve)  # the first claim's answer
    await services.finish()

    assert await services.verdict() == []
    assert (await services.process()).state.process_state is ProcessState.CANCELLED


# --- finding 10 --------------------------------------------------------------------------


async def test_finding_10_no_refund_for_a_charge_payment_says_never_applied() -> None:
    """Finding 10: payment hangs the charge for 30 s and never applies it; the order is
    cancelled at t0+2. Told the charge was not applied, the order must not refund it:
    it releases the inventory and ends Cancelled, and payment never sees a refund."""
    services, charge = await at_charge()
    services.reach(charge, until=30)  # payment hangs it 30 s, then gives up
    services.at(2)
    await cancel_order(services.deps(), "o-1", "op")
    await services.finish()

    assert await services.verdict() == []
    assert (await services.process()).state.process_state is ProcessState.CANCELLED
    assert services.ledger.get("payment", "o-1:refund-payment").status is KeyStatus.NEVER_SEEN
    assert services.ledger.in_force("inventory", RESERVE) is False
