"""Reconciliation: a finished order's claim against what each service says of its keys."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest

from shared.adapters.clock import FakeClock
from shared.adapters.memory.reconcile import InMemoryReconcileStore
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.adapters.queues import queue_of
from shared.contract import Queue, agent_queue
from shared.domain import reconcile as rules
from shared.domain.in_doubt import (
    ABANDONED,
    IN_PROGRESS,
    NEVER_SEEN,
    NOT_APPLIED,
    RemoteOutcome,
)
from shared.domain.machine import forward
from shared.domain.messages import AgentRequest
from shared.domain.model import (
    JsonObject,
    OrderProcess,
    Outgoing,
    Phase,
    ProcessState,
    StepStatus,
)
from shared.domain.reconcile import Expect, Verdict
from shared.domain.rest_index import rest_entry
from shared.domain.workflow import Workflow
from shared.ports import BusUnavailable, RemoteCall
from shared.resilience import CircuitBreaker
from shared.usecases.flow.outcomes import Asked, OutcomeQueries
from shared.usecases.operations.reconcile import Reconciler
from tests.builders import a_policy, an_order
from tests.workflows import CATALOGUE, EXPRESS_DELIVERY, ORDER_FULFILMENT

APPLIED = RemoteOutcome.applied({"ref": "r"})
UNKNOWN = RemoteOutcome.unknown("circuit open")
AGENTS = ("inventory", "payment-secondary", "shipping")


def finished(
    state: ProcessState, order_id: str = "o-1", dispatched: int = 3, clock: FakeClock | None = None
) -> OrderProcess:
    clock = clock or FakeClock()
    process = forward.start(an_order(order_id, clock=clock), ORDER_FULFILMENT, clock.now()).process
    steps = tuple(
        replace(s, agent=AGENTS[i], status=StepStatus.COMPLETED) if i < dispatched else s
        for i, s in enumerate(process.steps)
    )
    return replace(
        process,
        steps=steps,
        state=replace(process.state, process_state=state, updated_at=clock.now()),
    )


Said = dict[tuple[str, str], RemoteOutcome]
"""What each agent says of each key."""


def judge(
    check: rules.StepCheck, said: dict[str, RemoteOutcome]
) -> tuple[Verdict, list[str], rules.Mismatch | None]:
    """Ask as the use case does, with `said` per key at the step's one provider (never
    seen when absent): the keys asked, and the mismatch."""
    verdict, asked, found = judge_all(check, _at(check.agent, said))
    assert len(found) <= 1
    return verdict, [k for _, k in asked], found[0] if found else None


def _at(agent: str, said: dict[str, RemoteOutcome]) -> Said:
    return {(agent, key): outcome for key, outcome in said.items()}


def ask_all(check: rules.StepCheck, said: Said) -> Said:
    """The answers, asked in the order the rules ask them."""
    answers: Said = {}
    while (question := rules.next_question(check, answers)) is not None:
        answers[question] = said.get(question, NEVER_SEEN)
    return answers


def judge_all(
    check: rules.StepCheck, said: Said
) -> tuple[Verdict, list[tuple[str, str]], tuple[rules.Mismatch, ...]]:
    answers = ask_all(check, said)
    return rules.verdict(check, answers), list(answers), rules.mismatches(check, answers)


def charge(state: ProcessState) -> rules.StepCheck:
    return rules.checks(finished(state), ORDER_FULFILMENT)[1]


def test_only_orders_at_rest_and_dispatched_steps_are_checked() -> None:
    assert rules.checks(finished(ProcessState.PROCESSING), ORDER_FULFILMENT) == ()
    assert rules.checks(finished(ProcessState.COMPENSATING), ORDER_FULFILMENT) == ()
    assert rules.checks(finished(ProcessState.PENDING), ORDER_FULFILMENT) == ()
    partly = rules.checks(finished(ProcessState.COMPENSATED, dispatched=2), ORDER_FULFILMENT)
    assert [(c.step, c.agent, c.expect) for c in partly] == [
        ("reserve-inventory", "inventory", Expect.UNDONE),
        ("charge-payment", "payment-secondary", Expect.UNDONE),
    ]
    assert partly[1].do_key == "o-1:charge-payment"
    assert partly[1].undo_key == "o-1:refund-payment"


@pytest.mark.parametrize(
    ("said", "expected", "found"),
    [
        (APPLIED, Verdict.MATCH, None),
        (NOT_APPLIED, Verdict.MISMATCH, "not applied"),
        (NEVER_SEEN, Verdict.MISMATCH, "never seen"),
        (ABANDONED, Verdict.MISMATCH, "abandoned"),
        (UNKNOWN, Verdict.UNKNOWN, None),
        (IN_PROGRESS, Verdict.UNKNOWN, None),
    ],
)
def test_processed_asks_the_do_key_once(
    said: RemoteOutcome, expected: Verdict, found: str | None
) -> None:
    verdict, asked, mismatch = judge(charge(ProcessState.PROCESSED), {"o-1:charge-payment": said})
    assert (verdict, asked) == (expected, ["o-1:charge-payment"])
    assert (mismatch.found if mismatch else None) == found
    if mismatch is not None:
        assert mismatch.message == (
            f"Processed order o-1: charge-payment at payment-secondary: key o-1:charge-payment "
            f"{found}, expected applied"
        )


@pytest.mark.parametrize("state", [ProcessState.COMPENSATED, ProcessState.CANCELLED])
@pytest.mark.parametrize(
    ("undo", "do", "expected", "asked"),
    [
        (APPLIED, None, Verdict.MATCH, 1),
        (NEVER_SEEN, NOT_APPLIED, Verdict.MATCH, 2),
        (NOT_APPLIED, NEVER_SEEN, Verdict.MATCH, 2),
        (NEVER_SEEN, ABANDONED, Verdict.MATCH, 2),
        (NEVER_SEEN, APPLIED, Verdict.MISMATCH, 2),
        (NOT_APPLIED, APPLIED, Verdict.MISMATCH, 2),
        (UNKNOWN, APPLIED, Verdict.UNKNOWN, 2),
        (NEVER_SEEN, UNKNOWN, Verdict.UNKNOWN, 2),
        (UNKNOWN, NOT_APPLIED, Verdict.MATCH, 2),
    ],
)
def test_compensated_or_cancelled_asks_the_undo_then_the_do_key(
    state: ProcessState,
    undo: RemoteOutcome,
    do: RemoteOutcome | None,
    expected: Verdict,
    asked: int,
) -> None:
    said = {"o-1:refund-payment": undo, **({"o-1:charge-payment": do} if do else {})}
    verdict, keys, mismatch = judge(charge(state), said)
    assert verdict is expected
    assert keys == ["o-1:refund-payment", "o-1:charge-payment"][:asked]
    if expected is Verdict.MISMATCH:
        assert mismatch is not None
        assert mismatch.key == "o-1:charge-payment"
        assert "still" not in mismatch.message
        assert mismatch.message.startswith(f"{state.value} order o-1: charge-payment at ")
        assert "applied, its undo key o-1:refund-payment" in mismatch.message
        assert mismatch.message.endswith("expected not applied, or undone")
    else:
        assert mismatch is None


def test_the_alert_names_order_step_agent_and_key_once_per_key() -> None:
    check = charge(ProcessState.CANCELLED)
    _, _, mismatch = judge(check, {"o-1:charge-payment": APPLIED})
    assert mismatch is not None
    alert = mismatch.alert(2, FakeClock().now())
    assert queue_of(alert.destination) == Queue.OPERATOR_ALERTS
    assert alert.message_id == "alert:o-1:reconcile:payment-secondary:o-1:charge-payment"
    assert alert.body["reason"] == "reconciliation-mismatch"
    assert alert.body["failureCount"] == 2
    assert "payment-secondary" in alert.body["lastError"]


@dataclass
class Ledger:
    """Every service's read API from one table of keys (never seen when absent)."""

    said: dict[str, RemoteOutcome] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)

    async def invoke(self, call: RemoteCall, timeout: float) -> JsonObject:
        raise AssertionError("reconciliation never calls an operation")

    async def probe(self, timeout: float) -> None:
        return None

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        self.asked.append(key)
        return self.said.get(key, NEVER_SEEN)

    async def abandon(self, key: str, timeout: float) -> RemoteOutcome:
        raise AssertionError("reconciliation never abandons a key")


@dataclass
class Setup:
    clock: FakeClock = field(default_factory=FakeClock)
    store: InMemoryStateStore = field(default_factory=InMemoryStateStore)
    bus: InMemoryBus = field(default_factory=InMemoryBus)
    ledger: Ledger = field(default_factory=Ledger)
    """Every agent's, but those in `own`."""
    own: dict[str, Ledger] = field(default_factory=dict)

    def reconciler(self, sample_size: int = 50, start: str = "") -> Reconciler:
        queries = OutcomeQueries(
            {
                a: Asked(self.own.get(a, self.ledger), CircuitBreaker(a, self.clock))
                for a in (*AGENTS, "payment")
            },
            self.clock,
        )
        return Reconciler(
            InMemoryReconcileStore(self.store),
            queries,
            self.bus,
            self.clock,
            "test-1",
            a_policy(),
            sample_size=sample_size,
            start=lambda: start,
            catalogue=CATALOGUE,
        )

    async def add(
        self, process: OrderProcess, applied: bool = True, workflow: Workflow = ORDER_FULFILMENT
    ) -> None:
        await self.store.create(process, ())
        if process.state.process_state.is_at_rest:
            await self.store.put_rest(rest_entry(process, workflow))
        if applied:
            for c in rules.checks(process, workflow):
                if c.expect is Expect.APPLIED:
                    self.ledger.said[c.do_key] = APPLIED
                elif c.undo_key:
                    self.ledger.said[c.undo_key] = APPLIED


async def test_a_run_alerts_on_each_mismatch_and_keeps_the_run() -> None:
    s = Setup()
    await s.add(finished(ProcessState.PROCESSED, "a-ok"))
    await s.add(finished(ProcessState.PROCESSED, "b-missing"), applied=False)
    await s.add(finished(ProcessState.COMPENSATED, "c-undone"))
    await s.add(finished(ProcessState.ERROR, "d-error"))  # held: its done steps are checked
    await s.add(finished(ProcessState.PROCESSING, "e-running"), applied=False)
    run = await s.reconciler().run()
    assert run.orders == 4
    assert run.queries == 11
    assert [(m.order_id, m.step) for m in run.mismatches] == [
        ("b-missing", "reserve-inventory"),
        ("b-missing", "charge-payment"),
        ("b-missing", "create-shipment"),
    ]
    alerts = [m for m in s.bus.sent if queue_of(m.destination) == Queue.OPERATOR_ALERTS]
    assert {a.body["orderId"] for a in alerts} == {"b-missing"}
    assert len(alerts) == 3
    assert (await s.reconciler().run()).mismatches == run.mismatches
    assert len([m for m in s.bus.sent if queue_of(m.destination) == Queue.OPERATOR_ALERTS]) == 3, (
        "once per key"
    )


async def test_the_sample_is_bounded_and_starts_at_the_random_key() -> None:
    s = Setup()
    for name in ("a", "b", "c", "d", "e"):
        await s.add(finished(ProcessState.PROCESSED, f"{name}-order", clock=s.clock))
    reconciler = s.reconciler(sample_size=2, start="c")
    run = await reconciler.run()
    assert run.orders == 2
    assert run.queries <= 2 * len(ORDER_FULFILMENT.steps) * rules.MAX_QUESTIONS_PER_PROVIDER
    assert {k.split(":")[0] for k in s.ledger.asked} == {"c-order", "d-order"}
    s.ledger.asked.clear()
    await s.reconciler(sample_size=3, start="d").run()
    assert {k.split(":")[0] for k in s.ledger.asked} == {"d-order", "e-order", "a-order"}
    assert [r.orders for r in await reconciler.store.recent_runs(5)] == [2]


async def test_orders_finished_before_the_window_are_not_sampled() -> None:
    s = Setup()
    await s.add(finished(ProcessState.PROCESSED, "old", clock=s.clock), applied=False)
    s.clock.advance(25 * 3600)
    run = await s.reconciler().run()
    assert (run.orders, run.queries, run.mismatches) == (0, 0, ())


async def test_an_unanswered_query_is_unknown_not_a_mismatch() -> None:
    s = Setup()
    await s.add(finished(ProcessState.PROCESSED, "o-1"), applied=False)
    s.ledger.said.update(dict.fromkeys(("o-1:reserve-inventory", "o-1:create-shipment"), APPLIED))
    s.ledger.said["o-1:charge-payment"] = UNKNOWN
    run = await s.reconciler().run()
    assert (run.unknown, run.mismatches, s.bus.sent) == (1, (), [])


def failed_over(state: ProcessState) -> OrderProcess:
    """charge-payment went to payment first, then (its attempt in doubt) to the secondary,
    which the order holds it at."""
    process = finished(state)
    steps = list(process.steps)
    steps[1] = replace(steps[1], tried=("payment", "payment-secondary"))
    return replace(process, steps=tuple(steps))


def charged(state: ProcessState) -> rules.StepCheck:
    return rules.checks(failed_over(state), ORDER_FULFILMENT)[1]


CHARGE, REFUND = "o-1:charge-payment", "o-1:refund-payment"


def test_a_step_is_asked_at_every_provider_it_was_sent_to_with_the_same_keys() -> None:
    check = charged(ProcessState.PROCESSED)
    assert (check.agent, check.providers) == ("payment-secondary", ("payment-secondary", "payment"))
    verdict, asked, found = judge_all(check, {("payment-secondary", CHARGE): APPLIED})
    assert (verdict, found) == (Verdict.MATCH, ())
    assert asked == [("payment-secondary", CHARGE), ("payment", CHARGE)]


@pytest.mark.parametrize(
    ("at_payment", "asked", "expected"),
    [
        ({CHARGE: NEVER_SEEN}, [CHARGE], Verdict.MATCH),
        ({CHARGE: NOT_APPLIED}, [CHARGE], Verdict.MATCH),
        ({CHARGE: ABANDONED}, [CHARGE], Verdict.MATCH),
        ({CHARGE: APPLIED, REFUND: APPLIED}, [CHARGE, REFUND], Verdict.MATCH),
        ({CHARGE: UNKNOWN}, [CHARGE], Verdict.UNKNOWN),
        ({CHARGE: IN_PROGRESS}, [CHARGE], Verdict.UNKNOWN),
        ({CHARGE: APPLIED, REFUND: UNKNOWN}, [CHARGE, REFUND], Verdict.UNKNOWN),
        ({CHARGE: APPLIED, REFUND: NEVER_SEEN}, [CHARGE, REFUND], Verdict.MISMATCH),
    ],
)
def test_another_provider_is_judged_by_the_net_effect_there(
    at_payment: dict[str, RemoteOutcome], asked: list[str], expected: Verdict
) -> None:
    check = charged(ProcessState.PROCESSED)
    said = {("payment-secondary", CHARGE): APPLIED, **_at("payment", at_payment)}
    verdict, questions, _ = judge_all(check, said)
    assert verdict is expected
    assert [k for a, k in questions if a == "payment"] == asked
    assert len(questions) <= len(check.providers) * rules.MAX_QUESTIONS_PER_PROVIDER


async def test_an_effect_at_two_providers_is_alerted_and_undone_at_the_extra_one() -> None:
    s = Setup(own={"payment": Ledger({CHARGE: RemoteOutcome.applied({"ref": "p-1"})})})
    await s.add(failed_over(ProcessState.PROCESSED))
    run = await s.reconciler().run()
    assert [(m.agent, m.key, m.reason) for m in run.mismatches] == [
        ("payment", CHARGE, "applied-at-two-providers")
    ]
    assert run.mismatches[0].message == (
        f"Processed order o-1: charge-payment at payment: key {CHARGE} applied, its undo "
        f"key {REFUND} never seen, undoing it there, expected applied at payment-secondary only"
    )
    alerts = [m for m in s.bus.sent if queue_of(m.destination) == Queue.OPERATOR_ALERTS]
    assert [(a.message_id, a.body["reason"]) for a in alerts] == [
        (f"alert:o-1:reconcile:payment:{CHARGE}", "applied-at-two-providers")
    ]
    undos = [m for m in s.bus.sent if queue_of(m.destination) != Queue.OPERATOR_ALERTS]
    assert [queue_of(m.destination) for m in undos] == [agent_queue("payment")]
    assert undos[0].body["action"] == "compensate"
    assert undos[0].body["step"] == "charge-payment"
    assert undos[0].body["idempotencyKey"] == REFUND
    assert undos[0].body["undoes"] == CHARGE
    assert undos[0].body["payload"] == {"result": {"ref": "p-1"}}, "payment's own result"
    AgentRequest.parse(json.dumps(undos[0].body))

    await s.reconciler().run()
    assert len(s.bus.sent) == 2, "one alert and one undo per order, provider and key"


async def test_no_answer_at_the_extra_provider_is_unknown_and_undoes_nothing() -> None:
    s = Setup(own={"payment": Ledger({CHARGE: UNKNOWN})})
    await s.add(failed_over(ProcessState.PROCESSED))
    run = await s.reconciler().run()
    assert (run.unknown, run.mismatches, s.bus.sent) == (1, (), [])
    assert s.own["payment"].asked == [CHARGE]


async def test_unknown_at_the_holder_undoes_nothing_at_the_other_provider() -> None:
    """One effect is not told from two: the only charge might be at payment."""
    s = Setup(own={"payment": Ledger({CHARGE: APPLIED})})
    await s.add(failed_over(ProcessState.PROCESSED))
    s.ledger.said[CHARGE] = UNKNOWN
    run = await s.reconciler().run()
    assert (run.unknown, run.mismatches, s.bus.sent) == (1, (), [])


def test_an_effect_at_the_other_provider_only_is_left_for_an_operator() -> None:
    check = charged(ProcessState.PROCESSED)
    said = {("payment-secondary", CHARGE): NEVER_SEEN, ("payment", CHARGE): APPLIED}
    verdict, _, found = judge_all(check, said)
    assert verdict is Verdict.MISMATCH
    assert [(m.agent, m.reason) for m in found] == [
        ("payment-secondary", "reconciliation-mismatch"),
        ("payment", "reconciliation-mismatch"),
    ]
    assert found[1].found.endswith("while payment-secondary has none: left for an operator")
    process = failed_over(ProcessState.PROCESSED)
    now = FakeClock().now()
    assert (
        rules.heals(process, ORDER_FULFILMENT, a_policy(), check, ask_all(check, said), now) == ()
    )


@pytest.mark.parametrize("state", [ProcessState.COMPENSATED, ProcessState.CANCELLED])
async def test_an_undone_order_with_the_effect_still_at_the_other_provider_is_a_mismatch(
    state: ProcessState,
) -> None:
    s = Setup(own={"payment": Ledger({CHARGE: APPLIED})})
    await s.add(failed_over(state))
    run = await s.reconciler().run()
    assert [(m.agent, m.reason, m.expected) for m in run.mismatches] == [
        ("payment", "reconciliation-mismatch", "not applied, or undone")
    ]
    assert s.own["payment"].asked == [CHARGE, REFUND]
    undos = [m for m in s.bus.sent if queue_of(m.destination) != Queue.OPERATOR_ALERTS]
    assert [(queue_of(m.destination), m.body["undoes"]) for m in undos] == [
        (agent_queue("payment"), CHARGE)
    ]


async def test_an_undone_order_with_the_effect_still_at_its_holder_is_undone_there() -> None:
    s = Setup()
    await s.add(finished(ProcessState.COMPENSATED), applied=False)
    s.ledger.said.update({"o-1:reserve-inventory": APPLIED, "o-1:release-inventory": APPLIED})
    s.ledger.said[CHARGE] = APPLIED
    run = await s.reconciler().run()
    assert [(m.step, m.agent) for m in run.mismatches] == [("charge-payment", "payment-secondary")]
    undos = [m for m in s.bus.sent if queue_of(m.destination) != Queue.OPERATOR_ALERTS]
    assert [(queue_of(m.destination), m.body["idempotencyKey"]) for m in undos] == [
        (agent_queue("payment-secondary"), REFUND)
    ]


@dataclass
class SlowLedger(Ledger):
    """A read API that takes `seconds` per answer on the fake clock: a run over many
    orders, in little."""

    clock: FakeClock | None = None
    seconds: float = 0.0

    async def outcome(self, key: str, timeout: float) -> RemoteOutcome:
        if self.clock is not None:
            self.clock.advance(self.seconds)
        return await super().outcome(key, timeout)


async def test_an_undo_is_built_when_sent_and_a_later_run_sends_it_again() -> None:
    """Found by a chaos run (1,000 orders): each undo took its complete-by from the check
    of its order, but the run sends at its end, 20 s later with a 4 s step timeout, so
    the agent dropped most as past their complete-by; and the next run's undos had the
    same message ids, which the broker dropped as duplicates, so 26 late charges stayed."""
    s = Setup()
    slow = SlowLedger({CHARGE: RemoteOutcome.applied({"ref": "p-1"})}, clock=s.clock, seconds=3)
    s.own["payment"] = slow
    s.ledger = SlowLedger(clock=s.clock, seconds=3)
    await s.add(failed_over(ProcessState.PROCESSED))
    for _ in range(5):
        await s.add(finished(ProcessState.PROCESSED, f"more-{_}"))

    await s.reconciler().run()
    sent_at = s.clock.now()
    first = [m for m in s.bus.sent if m.queue != Queue.OPERATOR_ALERTS]
    s.clock.advance(60)
    await s.reconciler().run()
    undos = [m for m in s.bus.sent if m.queue != Queue.OPERATOR_ALERTS]

    assert len(first) == 1 and len(undos) == 2
    request = AgentRequest.parse(json.dumps(first[0].body))
    assert request.complete_by > sent_at, "its whole step timeout ahead of the send"
    assert undos[0].message_id != undos[1].message_id
    assert undos[0].body["idempotencyKey"] == undos[1].body["idempotencyKey"] == REFUND


NOTHING = RemoteOutcome.applied({"undone": False, "reason": "nothing-to-undo"})
"""An undo key's answer when the undo found its do not applied (docs/contract.md 8.1)."""
HEAL = "o-1:refund-payment:heal"
HEALED = RemoteOutcome.applied({"refunded": True, "paymentId": "p-1"})


@pytest.mark.parametrize("state", [ProcessState.COMPENSATED, ProcessState.CANCELLED])
@pytest.mark.parametrize(
    ("do", "heal", "expected", "asked"),
    [
        (APPLIED, None, Verdict.MISMATCH, 3),
        (APPLIED, NEVER_SEEN, Verdict.MISMATCH, 3),
        (APPLIED, NOTHING, Verdict.MISMATCH, 3),
        (APPLIED, HEALED, Verdict.MATCH, 3),
        (APPLIED, UNKNOWN, Verdict.UNKNOWN, 3),
        (NOT_APPLIED, None, Verdict.MATCH, 2),
        (NEVER_SEEN, None, Verdict.MATCH, 2),
        (UNKNOWN, None, Verdict.UNKNOWN, 2),
    ],
)
def test_an_undo_that_found_nothing_to_undo_is_no_undo_of_a_do_applied_after_it(
    state: ProcessState,
    do: RemoteOutcome,
    heal: RemoteOutcome | None,
    expected: Verdict,
    asked: int,
) -> None:
    """The chaos run's order c1-9748-00175: the charge's request held on the network, its
    key expired, the cancel's refund found nothing to undo, then the charge applied. The
    refund key's record is no undo of that charge, so the charge key is asked, and the
    heal key's answer is what says whether reconciliation has undone it since."""
    said = {REFUND: NOTHING, CHARGE: do, **({HEAL: heal} if heal else {})}
    verdict, keys, mismatch = judge(charge(state), said)
    assert verdict is expected
    assert keys == [REFUND, CHARGE, HEAL][:asked]
    if expected is Verdict.MISMATCH:
        assert mismatch is not None and mismatch.reason == "reconciliation-mismatch"
        assert mismatch.found.startswith(
            f"applied, its undo key {REFUND} found nothing to undo, its heal key {HEAL} "
        )
    else:
        assert mismatch is None


def test_the_heal_of_a_do_applied_after_its_undo_found_nothing_goes_under_its_own_key() -> None:
    check = charge(ProcessState.CANCELLED)
    process = finished(ProcessState.CANCELLED)
    said = _at(check.agent, {REFUND: NOTHING, CHARGE: RemoteOutcome.applied({"ref": "p-1"})})
    answers = ask_all(check, said)
    now = FakeClock().now()

    (undo,) = rules.heals(process, ORDER_FULFILMENT, a_policy(), check, answers, now)

    request = AgentRequest.parse(json.dumps(undo.body))
    assert queue_of(undo.destination) == agent_queue(check.agent)
    assert (request.idempotency_key, request.undoes) == (HEAL, CHARGE)
    assert request.payload == {"result": {"ref": "p-1"}}
    assert rules.heal_key(REFUND) == HEAL != REFUND
    again = rules.heals(process, ORDER_FULFILMENT, a_policy(), check, answers, now)
    assert [AgentRequest.parse(json.dumps(u.body)).idempotency_key for u in again] == [HEAL]


def test_an_effect_at_another_provider_whose_undo_found_nothing_is_healed_there() -> None:
    check = charged(ProcessState.PROCESSED)
    said = {
        ("payment-secondary", CHARGE): APPLIED,
        ("payment", CHARGE): APPLIED,
        ("payment", REFUND): NOTHING,
    }
    verdict, questions, found = judge_all(check, said)
    assert verdict is Verdict.MISMATCH
    assert [k for a, k in questions if a == "payment"] == [CHARGE, REFUND, HEAL]
    assert [(m.agent, m.reason) for m in found] == [("payment", "applied-at-two-providers")]
    process = failed_over(ProcessState.PROCESSED)
    answers = ask_all(check, said)
    (undo,) = rules.heals(process, ORDER_FULFILMENT, a_policy(), check, answers, FakeClock().now())
    assert undo.body["idempotencyKey"] == HEAL
    healed = {**said, ("payment", HEAL): HEALED}
    assert judge_all(check, healed)[0] is Verdict.MATCH


async def test_a_run_heals_a_charge_applied_after_its_refund_found_nothing() -> None:
    """Through the run on the in-memory fakes: the first run alerts and sends the heal
    under its own key; once the provider has applied it, the next run finds the order
    right and sends nothing more."""
    s = Setup()
    await s.add(finished(ProcessState.CANCELLED))
    s.ledger.said[REFUND] = NOTHING
    s.ledger.said[CHARGE] = RemoteOutcome.applied({"ref": "p-1"})

    first = await s.reconciler().run()

    assert [(m.step, m.agent, m.reason) for m in first.mismatches] == [
        ("charge-payment", "payment-secondary", "reconciliation-mismatch")
    ]
    undos = [m for m in s.bus.sent if queue_of(m.destination) != Queue.OPERATOR_ALERTS]
    assert [(queue_of(m.destination), m.body["idempotencyKey"]) for m in undos] == [
        (agent_queue("payment-secondary"), HEAL)
    ]
    assert undos[0].body["undoes"] == CHARGE
    charge_asked = [k for k in s.ledger.asked if k.endswith(("payment", "payment:heal"))]
    assert charge_asked == [REFUND, CHARGE, HEAL]

    s.ledger.said[HEAL] = HEALED
    s.clock.advance(3600)
    sent = len(s.bus.sent)
    second = await s.reconciler().run()

    assert (second.mismatches, second.unknown, len(s.bus.sent)) == ((), 0, sent)


class AlertsLost(InMemoryBus):
    """The port's send as the Service Bus adapter does it: each queue on its own, so the
    undo's queue may take its message while operator-alerts does not (its link still
    opening when the process died, in chaos)."""

    async def send(self, messages: Sequence[Outgoing]) -> None:
        alerts = [m for m in messages if queue_of(m.destination) == Queue.OPERATOR_ALERTS]
        await super().send([m for m in messages if m not in alerts])
        if alerts:
            raise BusUnavailable("send to operator-alerts failed")


async def test_an_undo_goes_only_once_its_alert_was_taken() -> None:
    """An undo sent without its alert heals silently: the next run finds the order right
    and never alerts (chaos, 200 orders, seed 1: a Cancelled order's late charge refunded
    with no alert, the runtime killed while its alert was still being sent). So the
    alerts go first and the undos only once they were taken; the next run sends both."""
    s = Setup(bus=AlertsLost())
    await s.add(finished(ProcessState.CANCELLED))
    s.ledger.said[REFUND] = NOTHING
    s.ledger.said[CHARGE] = RemoteOutcome.applied({"ref": "p-1"})

    first = await s.reconciler().run()

    assert len(first.mismatches) == 1
    assert s.bus.sent == [], "nothing undone before the operator is told"
    s.bus = InMemoryBus()
    s.clock.advance(60)
    await s.reconciler().run()
    assert [m.queue for m in s.bus.sent] == [
        Queue.OPERATOR_ALERTS,
        agent_queue("payment-secondary"),
    ]


EXPRESS_AGENTS = ("inventory", "payment-secondary", "shipping", "notifications")


def held_past_pivot(
    state: ProcessState = ProcessState.ERROR,
    statuses: tuple[StepStatus, ...] = (
        StepStatus.COMPLETED,
        StepStatus.COMPLETED,
        StepStatus.COMPLETED,
        StepStatus.FAILED,
    ),
    current: int = 3,
    phase: Phase = Phase.FORWARD,
) -> OrderProcess:
    """The chaos run's order: express-delivery held past its pivot (shipped, the
    notification failed). Its charge went to payment first (no abandon there: the key
    settled not applied once its live time passed), then to payment-secondary, which
    holds it; the request held on the network reached payment later and applied."""
    clock = FakeClock()
    process = forward.start(an_order("o-1", clock=clock), EXPRESS_DELIVERY, clock.now()).process
    steps = [
        replace(s, agent=agent, status=status)
        for s, agent, status in zip(process.steps, EXPRESS_AGENTS, statuses, strict=True)
    ]
    steps[1] = replace(steps[1], tried=("payment", "payment-secondary"))
    return replace(
        process,
        steps=tuple(steps),
        state=replace(
            process.state,
            process_state=state,
            current_step=current,
            phase=phase,
            attempt=4,
            updated_at=clock.now(),
        ),
    )


@pytest.mark.parametrize("state", [ProcessState.ERROR, ProcessState.SUSPENDED])
def test_a_held_order_is_checked_for_its_completed_steps_only(state: ProcessState) -> None:
    checks = rules.checks(held_past_pivot(state), EXPRESS_DELIVERY)
    assert [(c.step, c.agent, c.providers, c.expect) for c in checks] == [
        ("reserve-inventory", "inventory", ("inventory",), Expect.APPLIED),
        ("charge-payment", "payment-secondary", ("payment-secondary", "payment"), Expect.APPLIED),
        ("create-shipment", "shipping", ("shipping",), Expect.APPLIED),
    ], "not the failed step, which the order still owns (a resubmit retries it)"


def test_a_held_order_undoing_its_steps_leaves_the_step_it_is_undoing_alone() -> None:
    """Held while compensating: what it undid is checked as undone, what it has still to
    undo as in force at its holder, and the step whose undo it awaits not at all (an undo
    sent by reconciliation would answer for it)."""
    process = finished(ProcessState.ERROR)
    statuses = (StepStatus.COMPLETED, StepStatus.COMPLETED, StepStatus.COMPENSATED)
    steps = tuple(replace(s, status=t) for s, t in zip(process.steps, statuses, strict=True))
    state = replace(process.state, current_step=1, phase=Phase.COMPENSATE)
    undoing = replace(process, steps=steps, state=state)
    assert [(c.step, c.expect) for c in rules.checks(undoing, ORDER_FULFILMENT)] == [
        ("reserve-inventory", Expect.APPLIED),
        ("create-shipment", Expect.UNDONE),
    ]


def test_a_charge_at_two_providers_on_an_order_held_past_its_pivot_is_undone_at_the_extra() -> None:
    process = held_past_pivot()
    (_, check, _) = rules.checks(process, EXPRESS_DELIVERY)
    said = {
        ("payment-secondary", CHARGE): APPLIED,
        ("payment", CHARGE): RemoteOutcome.applied({"ref": "p-1"}),
    }
    answers = ask_all(check, said)
    assert rules.verdict(check, answers) is Verdict.MISMATCH
    (found,) = rules.mismatches(check, answers)
    assert (found.agent, found.reason) == ("payment", "applied-at-two-providers")
    assert found.message.startswith("Error order o-1: charge-payment at payment:")
    (undo,) = rules.heals(process, EXPRESS_DELIVERY, a_policy(), check, answers, FakeClock().now())
    assert queue_of(undo.destination) == agent_queue("payment")
    assert (undo.body["idempotencyKey"], undo.body["undoes"]) == (REFUND, CHARGE)


async def test_reconciliation_heals_an_order_held_in_error_past_its_pivot() -> None:
    """Found by a chaos run (1,000 orders): such an order was never checked, since
    reconciliation sampled finished orders only, and one held in Error may wait days
    for an operator. Its charge stays at the provider that holds it; the one at payment
    is alerted and undone; nothing goes to any provider for the step it still owns."""
    s = Setup(own={"payment": Ledger({CHARGE: RemoteOutcome.applied({"ref": "p-1"})})})
    await s.add(held_past_pivot(), workflow=EXPRESS_DELIVERY)
    run = await s.reconciler().run()
    assert run.orders == 1
    assert [(m.state, m.step, m.agent, m.reason) for m in run.mismatches] == [
        (ProcessState.ERROR, "charge-payment", "payment", "applied-at-two-providers")
    ]
    assert "o-1:notify-customer" not in s.ledger.asked
    alerts = [m for m in s.bus.sent if queue_of(m.destination) == Queue.OPERATOR_ALERTS]
    assert [a.body["reason"] for a in alerts] == ["applied-at-two-providers"]
    undos = [m for m in s.bus.sent if queue_of(m.destination) != Queue.OPERATOR_ALERTS]
    assert [(queue_of(m.destination), m.body["undoes"]) for m in undos] == [
        (agent_queue("payment"), CHARGE)
    ]
    assert undos[0].body["payload"] == {"result": {"ref": "p-1"}}

    s.own["payment"].said[REFUND] = APPLIED  # the undo applied there
    again = await s.reconciler().run()
    assert (again.orders, again.mismatches) == (1, ())
