"""The checker is shown to fail when it should: a toy machine with a lost update, an
order whose cancel is made to undo at once (before the step's request settles), and the
provider model's ordering rules on their own.

A checker that found nothing on the real code would prove little without these.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, replace
from datetime import datetime

import pytest

from shared.domain.in_doubt import RemoteOutcome
from shared.domain.machine import dispatch, forward, operator
from shared.domain.machine.transition import Builder, ProcessPolicy, Transition
from shared.domain.model import Notify, OrderProcess, Phase, ProcessState
from shared.domain.workflow import Workflow
from tests.model import driver, liveness, starts
from tests.model.explorer import Invariant, explore, replay
from tests.model.invariants import INVARIANTS, signature
from tests.model.provider import KeyStatus, Provider
from tests.model.setups import SETUPS
from tests.model.wire import Effects, Request
from tests.model.world import BOUNDS, Bounds, OrderWorld, World

# --- a toy machine: two workers increment a shared counter by read, then write ---------


@dataclass(frozen=True)
class Counter:
    value: int = 0
    read: tuple[int | None, int | None] = (None, None)
    done: tuple[bool, bool] = (False, False)


class LostUpdate:
    """Each worker reads the counter, then writes what it read plus one."""

    def initial(self) -> Counter:
        return Counter()

    def key(self, state: Counter) -> Hashable:
        return state

    def successors(self, state: Counter) -> Iterator[tuple[str, Counter]]:
        for w in (0, 1):
            if state.done[w]:
                continue
            seen = state.read[w]
            if seen is None:
                read = list(state.read)
                read[w] = state.value
                yield f"read {w}", replace(state, read=(read[0], read[1]))
            else:
                done = list(state.done)
                done[w] = True
                yield f"write {w}", replace(state, value=seen + 1, done=(done[0], done[1]))


def both_counted(state: Counter) -> str | None:
    if all(state.done) and state.value != 2:
        return f"both wrote, counter is {state.value}"
    return None


def test_the_explorer_finds_the_shortest_interleaving_that_loses_an_update() -> None:
    found = explore(LostUpdate(), [Invariant("both-counted", both_counted)], max_depth=10)

    assert found.complete
    assert found.depth == 4
    [violation] = found.violations.values()
    assert violation.trace == ("read 0", "read 1", "write 0", "write 1")
    assert [label for label, _ in replay(LostUpdate(), violation.trace)][1:] == list(
        violation.trace
    )


# --- the real order, with a cancel that undoes at once ---------------------------------

ONLY_CANCEL = Bounds(
    rejectable=frozenset(),
    drainable=(),
    operator_actions=1,
    operator=frozenset({"cancel"}),
    send_failures=False,
    duplicates=False,
    lost_replies=False,
    events=0,
    late_applies=0,
)


@pytest.fixture
def hasty_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancel as the domain does, then also send the first step's undo straight away,
    as a naive implementation would."""
    cancel = driver.Domain.cancel

    def hasty(
        self: driver.Domain, process: OrderProcess, now: int, gone: bool = False
    ) -> Effects | None:
        effects = cancel(self, process, now, gone)
        if effects is None:
            return None
        step = self.steps[0]
        assert step.undo_key is not None
        undo = Request(step.agents[0], step.name, True, step.undo_key, 99, now + 30, step.do_key)
        return replace(effects, requests=(*effects.requests, undo))

    monkeypatch.setattr(driver.Domain, "cancel", hasty)


@pytest.mark.usefixtures("hasty_cancel")
def test_an_undo_sent_while_the_do_is_on_the_wire_is_seen_at_once() -> None:
    found = explore(OrderWorld(ONLY_CANCEL), INVARIANTS, 2, signature)

    traces = {v.trace for v in found.violations.values() if v.invariant == "undo-while-live"}
    assert ("claim", "cancel") in traces


@pytest.mark.usefixtures("hasty_cancel")
def test_an_undo_that_overtakes_its_do_leaves_the_do_in_force() -> None:
    """The undo reaches the service first and records nothing-to-undo; the do applies
    after it; the order still ends Cancelled. Only the order of effects tells (8 events:
    claim, cancel, the undo served, the do served, both replies, time past the windows)."""
    found = explore(OrderWorld(ONLY_CANCEL), INVARIANTS, 9, signature)

    judged = [v for v in found.violations.values() if v.invariant == "net-effect"]
    assert judged, "the judge did not see the do applied after its undo"
    assert "reserve-inventory still in force" in judged[0].message


# --- a late charge after its refund found nothing, and reconciliation ------------------

LATE_AFTER_NOTHING = Bounds(
    rejectable=frozenset(),
    drainable=(),
    operator_actions=1,
    operator=frozenset({"cancel"}),
    send_failures=False,
    duplicates=False,
    lost_replies=False,
    events=0,
)
"""A cancel, the sweep's every answer (none included), and one late apply; liveness
brings reconciliation in. Enough for the full chaos run's c1-9748-00175."""
LATE_DEPTH = 8
"""With liveness: depth 10 costs about four times as much (10,676 states, docs/explorer.md
Cost), so CI runs that depth with the safety invariants only (`TOLD_DEPTH`)."""
TOLD_DEPTH = 10
"""The refund found nothing, the charge applied late and its reply came: told-late."""
HELD_DEPTH = 12
"""The order held in Error or releasing the inventory when the charge applies late:
reconciliation of held orders (the slow suite)."""


class ChargeRunning(OrderWorld):
    """The order from its charge running at payment (the service without abandon, in
    `order-fulfilment/hold/no-abandon`): the first four events of the story, walked, so
    the exploration spends its depth on what follows."""

    def initial(self) -> World:
        world = super().initial()
        for start in ("claim", "serve reserve", "deliver reserve", "arrive charge"):
            world = next(
                after for label, after in self.successors(world) if label.startswith(start)
            )
        return world


@pytest.fixture
def undo_read_as_undid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reconciliation as it was before it told the two apart: any applied undo key is an
    undo that undid its do."""
    monkeypatch.setattr(RemoteOutcome, "found_nothing_to_undo", property(lambda _: False))


def late_after_nothing(depth: int = LATE_DEPTH, live: bool = True) -> list[str]:
    """Every violation's trace (tests/model/test_exploration.py asserts there is none)."""
    setup = SETUPS["order-fulfilment/hold/no-abandon"]
    model = ChargeRunning(LATE_AFTER_NOTHING, setup)
    invariants = (*INVARIANTS, liveness.invariant(setup)) if live else INVARIANTS
    found = explore(model, invariants, depth, signature)
    return [f"{v.invariant}: {' / '.join(v.trace)}" for v in found.violations.values()]


@pytest.mark.usefixtures("undo_read_as_undid")
def test_a_charge_applied_after_its_refund_found_nothing_is_seen_when_left_unhealed() -> None:
    """The charge's request held past its live time at payment (no abandon), the sweep
    unanswered, so the key expired and the cancel's refund went and found nothing to
    undo; then the charge applied. Read as undone, reconciliation finds nothing, and no
    continuation reaches a right end: liveness fails."""
    found = late_after_nothing()

    assert any(
        v.startswith("liveness:")
        and "sweep: no-answer" in v
        and v.endswith("apply charge-payment@payment late")
        for v in found
    ), found


# --- the provider's ordering rules ------------------------------------------------------

INVENTORY, DO, UNDO = "inventory", "o-1:reserve-inventory", "o-1:release-inventory"


def test_an_undo_waits_while_its_do_runs_and_undoes_it_once_applied() -> None:
    running = Provider().register(INVENTORY, DO, 35, None).register(INVENTORY, UNDO, 65, DO)

    assert not running.can_apply(INVENTORY, UNDO, 10)
    applied = running.apply(INVENTORY, DO)
    undone = applied.apply(INVENTORY, UNDO)
    assert undone.get(INVENTORY, UNDO).undone
    assert not undone.in_force(INVENTORY, DO)


def test_nothing_to_undo_does_not_stop_the_do_from_applying_later() -> None:
    early = Provider().register(INVENTORY, UNDO, 65, DO).apply(INVENTORY, UNDO)
    late = early.register(INVENTORY, DO, 35, None).apply(INVENTORY, DO)

    assert not late.get(INVENTORY, UNDO).undone
    assert late.in_force(INVENTORY, DO)


def test_abandon_settles_a_key_that_is_not_running_for_good() -> None:
    provider, status = Provider().abandon(INVENTORY, DO)
    assert status is KeyStatus.ABANDONED
    assert provider.register(INVENTORY, DO, 35, None).get(INVENTORY, DO).status is status
    running = Provider().register(INVENTORY, DO, 35, None)
    assert running.abandon(INVENTORY, DO) == (running, KeyStatus.RUNNING)


def test_a_running_key_is_not_applied_once_its_windows_end() -> None:
    running = Provider().register(INVENTORY, DO, 35, None)

    assert running.expire(34).get(INVENTORY, DO).status is KeyStatus.RUNNING
    assert running.expire(35).get(INVENTORY, DO).status is KeyStatus.NOT_APPLIED


# --- the intake's claim (issue #39) -------------------------------------------------------


def test_a_supervisor_that_never_resends_the_intakes_outbox_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The intake died between its insert and its sends: without the Supervisor's resend
    (`_as_stored_by_intake` never true), the step's timeout is counted against a request
    that was never sent."""
    monkeypatch.setattr(driver, "_as_stored_by_intake", lambda process, now: False)
    found = explore(OrderWorld(BOUNDS["intake"]), INVARIANTS, 5, signature)
    violation = min(
        (v for v in found.violations.values() if v.invariant == "intake-resend"),
        key=lambda v: len(v.trace),
    )
    assert violation.trace[0].endswith("claimed, died before its sends")
    assert violation.trace[-1].startswith("sweep")


def test_a_final_only_client_told_every_status_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Notify, "hears", lambda self, status: True)
    found = explore(OrderWorld(BOUNDS["intake"]), INVARIANTS, 1, signature)
    messages = {v.message for v in found.violations.values() if v.invariant == "final-only"}
    assert messages == {"a final-only client heard Received"}


# --- an operation refused for good (issue #37, liveness) ------------------------------

REFUSALS = BOUNDS["refusals"]


def _refusals(setup: str, depth: int) -> list[str]:
    """Every violation, with its trace."""
    model = OrderWorld(REFUSALS, SETUPS[setup])
    invariants = (*INVARIANTS, liveness.invariant(model.setup))
    found = explore(model, invariants, depth, signature)
    return [
        f"{v.invariant}: {v.message} / {' / '.join(v.trace)}" for v in found.violations.values()
    ]


def test_an_order_held_on_a_refused_undo_without_its_alert_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The declined charge's compensation meets a release refused for good: held, but
    nobody is told what to mend."""

    def silent(b: Builder, reason: str) -> None:
        b.set(process_state=ProcessState.ERROR, locked_by=None, complete_by=None)
        b.note("error", reason)

    monkeypatch.setattr(forward, "hold_for_operator", silent)
    found = _refusals("order-fulfilment/hold", 7)
    assert any(
        v.startswith("refused-held: release-inventory@inventory refused for good, held without")
        and v.endswith("deliver release-inventory@inventory #1 failed")
        for v in found
    ), found


def test_a_resubmit_that_takes_a_held_cancel_forward_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancel's release refused for good, the provider mended, and the resubmit going
    forward instead of compensating: the charge and the pivot's shipment go out on a
    cancelled order. The operator's other action (a cancel) still ends right, so only
    liveness's every-action check for a held refusal sees it."""
    resubmit = operator.resubmit

    def onward(
        process: OrderProcess, policy: ProcessPolicy, now: datetime, workflow: Workflow
    ) -> Transition:
        moved = resubmit(process, policy, now, workflow=workflow)
        state = replace(moved.process.state, phase=Phase.FORWARD)
        return replace(moved, process=replace(moved.process, state=state))

    monkeypatch.setattr(operator, "resubmit", onward)
    found = _refusals("express-delivery/hold", 6)
    assert any(
        v.startswith("liveness: the provider mended, a resubmit reaches no right end")
        and " / cancel / " in v
        for v in found
    ), found


def test_a_resubmit_or_cancel_under_the_refused_key_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The operator's move sends the refused release again under the key its provider
    refused for good: the mended provider replays the refusal to that key, so the order
    is held again, whatever the operator does (machine/rekey.py)."""
    monkeypatch.setattr(operator, "rekey_refused", lambda b, workflow: "")
    found = _refusals("order-fulfilment/hold", 6)
    assert any(
        v.startswith("liveness: no right end")
        and v.endswith("serve release-inventory@inventory #1 (complete-by t=30): rejected")
        for v in found
    ), found


def test_an_order_held_on_a_refusal_reaches_its_right_end_once_the_provider_is_mended() -> None:
    assert _refusals("express-delivery/hold", 7) == []


# --- a drained agent --------------------------------------------------------------------


def test_a_drained_agent_given_a_dispatch_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the drained-step check made to find nothing, the charge's reply dispatches
    express-delivery's pivot to the drained shipping agent: from the charge running
    (tests/model/starts.py), three events."""
    for module in (dispatch, forward):
        monkeypatch.setattr(module, "drained_step", lambda *args: None)
    setup = SETUPS["express-delivery/hold"]
    model = starts.Walked(BOUNDS["pivot"], setup, starts.CHARGE_RUNNING)
    found = explore(model, INVARIANTS, 3, signature)
    (violation,) = (v for v in found.violations.values() if v.invariant == "drained")
    assert violation.trace[-2:] == ("drain shipping", "deliver charge-payment@payment #1 ok")


# --- an order promoted in its customer's line (chaos c1-86cc-00133, 5ae03d5) -----------

PROMOTED_EVENT_CLAIM = ("neighbour ends: promoted", "event review approved", "claim")
"""reviewed-order in its customer's line: promoted (its check moved up, its nudge sent),
its review event before the nudge, then the nudge's claim dispatching the reserve."""


def _before_5ae03d5(monkeypatch: pytest.MonkeyPatch, *, claim: bool, save: bool) -> None:
    """Put either half of 5ae03d5 back: the claim from the line naming no check
    (forward.claim), and the unit of work writing a check the change left where it was
    (the driver's copy of `UnitOfWork._save`; the drift test fails on the real one)."""
    if claim:
        monkeypatch.setattr(forward, "in_line", lambda process: False)
    if save:
        monkeypatch.setattr(driver, "check_moved", lambda when, watched_at: True)


def _watched_traces(depth: int) -> list[tuple[str, ...]]:
    model = OrderWorld(BOUNDS["fair"], SETUPS["reviewed-order/hold"])
    found = explore(model, INVARIANTS, depth, signature)
    violations = (v for v in found.violations.values() if v.invariant == "watched")
    return sorted((v.trace for v in violations), key=len)


def _claimed_after_the_event() -> str | None:
    """`watched` on the order the chaos run lost: promoted, its event, its claim."""
    model = starts.Walked(BOUNDS["fair"], SETUPS["reviewed-order/hold"], PROMOTED_EVENT_CLAIM)
    world = model.initial()
    assert world.process.state.process_state is ProcessState.PROCESSING
    return next(i for i in INVARIANTS if i.name == "watched").check(world)


def test_an_event_pushing_a_promoted_orders_check_back_to_its_hold_is_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both halves of 5ae03d5 undone: the event's save re-watches the promoted order at
    the line's hold (two events), and after the claim its reserve runs with nothing
    looking before the hold, the chaos run's order."""
    _before_5ae03d5(monkeypatch, claim=True, save=True)
    shortest = _watched_traces(3)[0]
    assert shortest[0] == "neighbour ends: promoted"
    assert shortest[1].startswith("event review")
    assert len(shortest) == 2
    assert (_claimed_after_the_event() or "").startswith("watched at t=600, after its check")


def test_the_saves_half_alone_is_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unit of work writing the row's view back, the claim still naming its check:
    the order promoted and re-watched at its hold is seen before any claim (its nudge
    may be lost); the claim then moves the check up."""
    _before_5ae03d5(monkeypatch, claim=False, save=True)
    assert len(_watched_traces(3)[0]) == 2
    assert _claimed_after_the_event() is None


def test_with_5ae03d5_the_promoted_order_stays_watched() -> None:
    assert _watched_traces(4) == []
    assert _claimed_after_the_event() is None
