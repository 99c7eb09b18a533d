"""The one module that calls the domain (shared/domain/machine/ and its types).

The explorer's world speaks ticks, Requests, Replies and Answers (tests/model/wire.py);
this module turns them into the domain's calls and the domain's transitions back into
them. It mirrors what the use cases do around each pure call, so the world can stay
ignorant of both:

- the Scheduler's nudge claims a Pending order or wakes a waiting step
  (shared/usecases/flow/scheduler.py `on_nudge`); a failed send is followed by `undelivered`;
- the Supervisor asks the in-doubt question with the current routing and whether this
  timeout exhausts the count, only once its ask-at has passed, and settles it as
  `_settle` does: abandon where the question says so (a service without the route is
  asked instead), and a "not applied" that would move the step is made final by an
  abandon (shared/usecases/flow/supervisor.py `_check`, `_settle`);
- events and approvals are kept as the events route keeps them (`receive_event`);
- a workflow version the catalogue dropped (a deploy): the Scheduler's handlers skip
  the order, every operator and event route refuses it (`UnknownWorkflow`, 409), the
  Supervisor holds it (`_hold_version_gone`); a bulk job skips it (`bulk.matches`);
- a bulk action is `bulk._act`: the job's filter and `matches`, then the single action;
- reconciliation is `Reconciler._check` over the services' answers, its alerts and
  undos sent as `Reconciler.run` sends them;
- an archived order's id sent again goes through the real intake (`submit_order`) over
  the in-memory store holding the archive's mark (shared/usecases/flow/submission.py);
- a limit's hold waits what the limiter's booking says (shared/domain/limits.py):
  another caller's slot taken, or its concurrency lease held.

tests/model/test_drift.py holds this copy to the use cases: it runs them over the
in-memory store on the same situations and compares.

One `Domain` per setup (tests/model/setups.py): the workflow, the policy and the
services come from there, never from constants here.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Hashable, Mapping
from datetime import UTC, datetime, timedelta
from enum import Enum
from functools import partial

from shared.adapters.clock import FakeClock
from shared.adapters.memory.customers import InMemoryCustomerLedger
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.domain import bulk, fairness, in_doubt, limits
from shared.domain import reconcile as reconciliation
from shared.domain.archive import ArchivedMark, ArchivedOrder
from shared.domain.bulk_request import BulkAction, BulkFilter
from shared.domain.destination import To
from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.machine import events as machine_events
from shared.domain.machine import forward, line, operator, recovery
from shared.domain.machine import migrate as migrate_rules
from shared.domain.machine.events import answer_approval, receive_event
from shared.domain.machine.forward import KEY_ABANDONED, apply_reply
from shared.domain.machine.heartbeat import extend_complete_by
from shared.domain.machine.hold import hold_complete_by
from shared.domain.machine.recovery import exhaustion_undoes, next_complete_by, recover
from shared.domain.machine.settle import past_pivot
from shared.domain.machine.transition import InvalidTransition, ProcessPolicy, Transition
from shared.domain.machine.waits import wake
from shared.domain.messages import AgentReply
from shared.domain.model import (
    Action,
    ErrorInfo,
    Notify,
    Order,
    OrderLine,
    OrderProcess,
    Outcome,
    Outgoing,
    Priority,
    ProcessState,
    ReceivedEvent,
)
from shared.domain.routing import AgentView, Availability, Routing
from shared.domain.workflow import Workflow
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.submission import OrderConflict, OverQuota, submit_order
from shared.usecases.flow.submission import first_look as intake_first_look
from shared.usecases.flow.supervisor import _as_stored_by_intake
from shared.usecases.limits.customers import Customers
from tests.model.setups import DEFAULT, SKEW, Setup
from tests.model.wire import Answer, Effects, Large, Question, Reply, Request
from tests.workflows import AGENTS, CATALOGUE

T0 = datetime(2026, 1, 1, tzinfo=UTC)
"""Tick 0. Ticks are whole seconds from here, so equal situations hash equal."""
NOT_BEFORE = 40
"""A timer step waiting for the order's notBefore waits until this tick."""
ORDER = Order(
    order_id="o-1",
    customer_id="c-1",
    items=(OrderLine("sku-1", 1, 10.0),),
    priority=Priority.NORMAL,
    reply_to=None,
    fingerprint="fp",
    created_at=T0,
    not_before=T0 + timedelta(seconds=NOT_BEFORE),
)
SCHEDULER = "scheduler-1"
INTAKE = "intake-1"
BEAT_LEAD = 5
"""The model's agents beat this long before their call's complete-by."""
HOLD_WAIT = 20
"""How long another caller keeps the limit's next slot in the model (seconds)."""
NEIGHBOUR = "o-2"
"""A second order of another customer, finished at the same services: its keys must
never be touched by this order's requests (tests/model/invariants.py `neighbour`)."""
BULK_FILTER = BulkFilter(customer_id=ORDER.customer_id)
FAIR_SHARE = fairness.CustomerPolicy(max_pending=2, fair_share=1)
"""FairShareRunningPerCustomer=1: an order waits while another of its customer's runs."""
EARLIER = (-60, -30)
"""The customer's earlier order: entered and ended before this story, the neighbour
waiting behind it (the ledger keeps a customer's pace of ends while it has open orders)."""
OTHERS = ("o-3", "o-4")
"""The customer's next orders, POSTed while this one lives (the intake's quota)."""
__all__ = ["REACHED", "SKEW", "Domain", "Intake", "Step", "at", "key", "tick"]
REACHED: set[tuple[str, str]] = set()
"""Every (rule, state before) that made a transition in this process: the handlers the
exploration reached (tests/model/test_handlers.py)."""


@dataclasses.dataclass(frozen=True)
class Step:
    """A workflow step as the judge needs it: its keys and the agents that may hold them."""

    name: str
    do_key: str | None
    """None for a wait (an event or a timer): nothing is sent, nothing is in force."""
    undo_key: str | None
    agents: tuple[str, ...]
    undoable: bool
    index: int


@dataclasses.dataclass(frozen=True)
class Intake:
    """The customer's other orders POSTed while this one lives, as the intake left them:
    which it admitted (to run or to wait in line), and what the instance that refused
    one remembers (`fairness.RefusalMemo`: refused from memory until `memo_until`, the
    last Retry-After it gave)."""

    admitted: tuple[tuple[str, int], ...] = ()
    """(order id, tick admitted)."""
    posts: int = 0
    memo_set: int | None = None
    memo_until: int | None = None
    booked: int | None = None
    come_back: int | None = None
    """When the refused client comes back (its Retry-After)."""


RECHECK = int(Customers.recheck.total_seconds())
"""When the Supervisor looks at a promoted order (`Customers.release` moves its check up
to then, before the promotion's nudge goes)."""


def check_moved(when: datetime, watched_at: datetime | None) -> bool:
    """Does `UnitOfWork._save` write the check again? Only where the change moved it from
    the complete-by the order was read with: the entry may hold an earlier check written
    by someone who knows more (a promotion), which the row's view would push out again.
    (A module function so that test_explorer_sees can put the rule before 5ae03d5 back.)"""
    return when != watched_at


def at(tick: int) -> datetime:
    return T0 + timedelta(seconds=tick)


def tick(when: datetime) -> int:
    return int((when - T0).total_seconds())


_OUTCOMES = {
    Answer.APPLIED: RemoteOutcomeKind.APPLIED,
    Answer.NOT_APPLIED: RemoteOutcomeKind.NOT_APPLIED,
    Answer.NEVER_SEEN: RemoteOutcomeKind.NEVER_SEEN,
    Answer.IN_PROGRESS: RemoteOutcomeKind.IN_PROGRESS,
    Answer.ABANDONED: RemoteOutcomeKind.ABANDONED,
    Answer.NOT_SUPPORTED: RemoteOutcomeKind.NOT_SUPPORTED,
    Answer.UNKNOWN: RemoteOutcomeKind.UNKNOWN,
}


class Domain:
    """The domain's rules for one setup, in the world's terms."""

    def __init__(self, setup: Setup = DEFAULT) -> None:
        self.setup = setup
        self.workflow = setup.workflow
        self.policy = setup.policy
        self.steps: tuple[Step, ...] = tuple(
            Step(
                s.name,
                None if s.waits else f"{ORDER.order_id}:{s.name}",
                None if s.compensation is None else f"{ORDER.order_id}:{s.compensation}",
                s.candidates,
                s.undoable,
                i,
            )
            for i, s in enumerate(self.workflow.steps)
        )
        self._undoes = {s.undo_key: s.do_key for s in self.steps if s.undo_key is not None}
        self.pivot = self.workflow.pivot
        self.events = tuple(sorted(self.workflow.events))
        self.approvals = frozenset(s.event for s in self.workflow.steps if s.approval)
        self.neighbour: tuple[tuple[str, str], ...] = tuple(
            (setup.space(s.agent), f"{NEIGHBOUR}:{s.name}")
            for s in self.workflow.steps
            if not s.waits
        )
        """The neighbour's effects: each do step of the same workflow, at its primary."""
        self.target = later_version(self.workflow)
        self._reply_ids: dict[Reply, str] = {}
        self._plain = {k for s in self.steps for k in (s.do_key, s.undo_key) if k}
        """The operations' own keys: a reply names any other (a heal key) in its id."""
        self.versions = {w.version: w for w in (self.workflow, self.target)}

    def of(self, process: OrderProcess) -> Workflow:
        """The version the order pins (the use cases' `find_workflow`)."""
        return self.versions[process.state.workflow_version]

    # --- translation ------------------------------------------------------------------

    def routing(self, drained: frozenset[str]) -> Routing:
        """Every agent healthy (so a retry may move to the alternative), some drained."""
        agents = {*AGENTS, *self.setup.agents}
        views = {a: AgentView(a, Availability.HEALTHY, "healthy") for a in sorted(agents)}
        return Routing(views, drained)

    def _effects(
        self,
        transition: Transition | None,
        now: int,
        what: str,
        before: OrderProcess | None = None,
        rule: str | None = None,
        *,
        check: bool = False,
        scheduler: bool = False,
    ) -> Effects | None:
        """`check`: the use case hands the unit of work the order's next check (an
        operator's action or an outside event, `operator._change`); the Scheduler's
        changes (`scheduler`) hand it none, and move the entry up where the change may
        make the order due sooner than it says (`scheduler._apply`'s `sooner`)."""
        if transition is None:
            return None
        if before is not None:
            REACHED.add((rule or what, before.state.process_state.value))
        requests: list[Request] = []
        nudges: list[int] = []
        alerts: list[str] = []
        words: list[str] = []
        statuses: list[str] = []
        for message in transition.outgoing:
            to = message.destination.to
            if to is To.AGENT:
                requests.append(self._request(message))
            elif to is To.SCHEDULER:
                nudges.append(tick(message.deliver_at) if message.deliver_at else now)
            elif to is To.OPERATORS:
                alerts.append(str(message.body.get("reason")))
                words.append(str(message.body.get("lastError") or ""))
            elif to is To.CLIENT:
                statuses.append(str(message.body["status"]))
        events = ", ".join(h.event for h in transition.history)
        summary = f"{what}: {events} -> {describe(transition.process)}"
        rewatch, watch = self._watch(transition, now, before, check)
        sooner = None
        if scheduler and before is not None and not rewatch and transition.check_at is None:
            of = self.of(transition.process)
            moved = recovery.sooner_check(
                before, transition.process, of, self.policy, at(now), Customers.recheck
            )
            sooner = None if moved is None else tick(moved)
        return Effects(
            transition.process,
            tuple(requests),
            tuple(nudges),
            tuple(alerts),
            summary,
            tuple(statuses),
            tuple(words),
            rewatch,
            watch,
            sooner,
        )

    def _watch(
        self, transition: Transition, now: int, before: OrderProcess | None, check: bool
    ) -> tuple[bool, int | None]:
        """What the unit of work writes to the order's watch entry (`UnitOfWork._save`,
        then `_rest`): the transition's own check, else the one the use case handed it,
        written when it differs from the complete-by the order was read with (an entry
        someone who knew more moved up stays); an order leaving a rest is watched at
        that check or now; an order come to rest leaves the watch list. (False, None):
        the entry stays as it was."""
        process = transition.process
        state = process.state
        if transition.is_at_rest:
            return True, None
        when = transition.check_at
        if when is None and check:
            when = recovery.next_check(process, self.of(process), self.policy, at(now))
        if transition.moves_rest:
            return True, tick(when or state.updated_at)
        watched_at = None if before is None else before.state.complete_by
        if when is not None and check_moved(when, watched_at):
            return True, tick(when)
        return False, None

    def _request(self, message: Outgoing) -> Request:
        body = message.body
        undo = body["action"] == Action.COMPENSATE.value
        key = str(body["idempotencyKey"])
        undoes = body.get("undoes") or (self._undoes.get(key) if undo else None)
        return Request(
            agent=str(message.destination.agent),
            step=str(body["step"]),
            undo=undo,
            key=key,
            attempt=int(body["attempt"]),
            complete_by=tick(datetime.fromisoformat(str(body["completeBy"]))),
            undoes=undoes,
            message_id=message.message_id,
        )

    def reply_id(self, answer: Reply) -> str:
        """The message id of the agent's reply on the `agent-replies` queue, as the
        domain builds it (`AgentReply.outgoing`)."""
        found = self._reply_ids.get(answer)
        if found is None:
            found = self._reply_ids[answer] = self.message(answer).outgoing().message_id
        return found

    # --- the order's moves --------------------------------------------------------------

    def start(self, in_line: bool = False) -> Effects:
        """The intake's transition; `in_line`: the customer already runs its fair share
        (another of its orders), so the ledger admits this one to wait in its line
        (`submission._store`: `admit`, then `wait_in_line`, no nudge)."""
        transition = forward.start(ORDER, self.workflow, at(0))
        if in_line:
            admission = fairness.admit(fairness.CustomerLoad(running=1), FAIR_SHARE)
            assert admission is fairness.Admission.WAIT
            transition = line.wait_in_line(transition, at(0))
        effects = self._effects(transition, 0, "submitted")
        assert effects is not None
        return self._intake_watch(effects)

    def _intake_watch(self, effects: Effects, look: int | None = None) -> Effects:
        """The entry the intake writes before its insert (`submit_order`): its first look
        at an order it claimed, else the order's next check (a line's hold)."""
        if look is None:
            look = self.next_check(effects.process, 0)
        return dataclasses.replace(effects, rewatch=True, watch=look)

    def submit_other(
        self, process: OrderProcess, now: int, promoted_at: int | None, intake: Intake
    ) -> tuple[str, Intake]:
        """The customer POSTs its next order while this one lives: the real intake
        (`submit_order`) with a customer ledger at FAIR_SHARE (IntakeMaxPendingPerCustomer=2)
        holding what the story did so far (the earlier order's end, the neighbour's end
        at `promoted_at`, this order's end once at rest, the others admitted) and the
        refusing instance's memory. Admitted to wait or run, or refused with a
        Retry-After; nothing of this order changes."""
        customer = ORDER.customer_id
        order_id = OTHERS[min(intake.posts, len(OTHERS) - 1)]
        other = dataclasses.replace(ORDER, order_id=order_id, fingerprint=order_id)

        async def submit() -> tuple[str, Intake]:
            store, bus = InMemoryStateStore(), InMemoryBus()
            ledger = InMemoryCustomerLedger()
            assert FAIR_SHARE.active  # the composition root keeps a ledger only then
            customers = Customers(ledger, FAIR_SHARE)
            earlier, ended = EARLIER
            await customers.enter(dataclasses.replace(ORDER, order_id="o-p"), at(earlier))
            await customers.enter(dataclasses.replace(ORDER, order_id="o-0"), at(earlier + 10))
            await customers.release(customer, "o-p", store, bus, at(ended))  # o-0 promoted
            await customers.enter(ORDER, at(0))
            leaves = [] if promoted_at is None else [("o-0", promoted_at)]
            if process.state.process_state.is_at_rest:
                leaves.append((ORDER.order_id, tick(process.state.updated_at)))
            # In the order they happened (a leave first at a tie: it made the room).
            story = [(when, 0, o) for o, when in leaves]
            story += [(when, 1, o) for o, when in intake.admitted]
            for when, enters, name in sorted(story):
                if enters:
                    await customers.enter(dataclasses.replace(ORDER, order_id=name), at(when))
                else:
                    await customers.release(customer, name, store, bus, at(when))
            memo = customers.memo
            cleared = any(when >= (intake.memo_set or 0) for _, when in leaves)
            if intake.memo_until is not None and not cleared:
                loads = dict(await ledger.loads(10))
                load = loads.get(customer, fairness.CustomerLoad())
                memo.held[customer] = (at(intake.memo_until), load)
            if intake.booked is not None:
                memo.booked[customer] = at(intake.booked)
            deps = ProcessDeps(
                store,
                bus,
                FakeClock(at(now)),
                self.policy,
                SCHEDULER,
                customers=customers,
                catalogue=CATALOGUE,
            )
            posted = dataclasses.replace(intake, posts=intake.posts + 1)
            try:
                submitted = await submit_order(deps, other, workflow=self.workflow)
            except OverQuota as refused:
                held = memo.held.get(customer)
                booked = memo.booked.get(customer)
                after = dataclasses.replace(
                    posted,
                    memo_set=now if held is not None else None,
                    memo_until=None if held is None else tick(held[0]),
                    booked=None if booked is None else tick(booked),
                    come_back=now + refused.retry_after,
                )
                return f"refused, Retry-After {refused.retry_after}", after
            assert submitted.created and submitted.process is not None
            how = "waits in line" if line.in_line(submitted.process) else "runs"
            admitted = (*intake.admitted, (order_id, now))
            return how, dataclasses.replace(posted, admitted=admitted, come_back=None)

        return _LOOP.run_until_complete(submit())

    # --- the intake's claim (issue #39): tests/model/world.py `_intake` -----------------

    def start_claimed(self, notify: Notify) -> Effects:
        """The intake within its burst: the order stored already claimed, its first step
        dispatched in the one insert (`submission._claimed`, `forward.start_claimed`)."""
        order = dataclasses.replace(ORDER, notify=notify)
        transition = forward.start_claimed(
            order, self.workflow, self.policy, INTAKE, at(0), None, self.routing(frozenset())
        )
        assert transition is not None, "nothing is drained at t=0"
        first = self.workflow.steps[0]
        if not first.waits:
            # The intake claims only what the Scheduler's claim would run: with the first
            # step's agents drained it stores the order nudged (`submission._claimed`).
            drained = self.routing(frozenset(first.candidates))
            refused = forward.start_claimed(
                order, self.workflow, self.policy, INTAKE, at(0), None, drained
            )
            assert refused is None, "claimed at intake for a drained agent"
        effects = self._effects(transition, 0, "submitted, claimed at intake")
        assert effects is not None
        return self._intake_watch(effects, self.first_look(effects.process))

    def start_nudged(self, notify: Notify) -> Effects:
        """The intake past its burst: Pending, with a nudge (`forward.start`)."""
        order = dataclasses.replace(ORDER, notify=notify)
        effects = self._effects(forward.start(order, self.workflow, at(0)), 0, "submitted")
        assert effects is not None
        return self._intake_watch(effects)

    def first_look(self, process: OrderProcess) -> int:
        """When the Supervisor first looks at an order claimed at intake: the watch entry
        the intake writes (`submission.first_look`)."""
        return tick(intake_first_look(process, self.policy, process.state.created_at))

    def as_stored_by_intake(self, process: OrderProcess, now: int) -> bool:
        """Does the Supervisor's check send the order's outbox again before it decides
        (`supervisor._as_stored_by_intake`)?"""
        return _as_stored_by_intake(process, at(now))

    def promoted(self, process: OrderProcess, now: int, watched: int | None) -> Effects:
        """The customer's other order came to rest: the ledger's leave promotes this one
        (`promotes`) and `Customers.release` nudges it (`promotion`), its check moved up
        to the recheck, never back from an earlier one (`WatchList.move_up`)."""
        left = fairness.CustomerLoad(running=0, waiting=1).ended(at(now))
        assert fairness.promotes(left, FAIR_SHARE)
        nudge = line.promotion(fairness.Promoted(process.order_id))
        effects = self._effects(Transition(process, (nudge,), ()), now, "promoted")
        assert effects is not None
        check = now + RECHECK if watched is None else min(watched, now + RECHECK)
        return dataclasses.replace(effects, rewatch=True, watch=check)

    def claim(
        self, process: OrderProcess, now: int, drained: frozenset[str], gone: bool = False
    ) -> Effects | None:
        """The Scheduler consumes a nudge: claim a Pending order, or wake a waiting step;
        nothing when its version is gone (`find_workflow` is None)."""
        if gone:
            return None
        routing = self.routing(drained)
        claimed = forward.claim(
            process, self.of(process), self.policy, SCHEDULER, at(now), None, routing
        )
        if claimed is not None:
            return self._effects(claimed, now, "claim", process, scheduler=True)
        woken = wake(process, self.of(process), self.policy, at(now), None, routing)
        return self._effects(woken, now, "claim", process, "wake", scheduler=True)

    def message(self, answer: Reply) -> AgentReply:
        """The agent's reply on the wire."""
        r = answer.request
        result: dict[str, object] | None = {"ref": r.key} if answer.succeeded else None
        if answer.succeeded and answer.undone is not None:
            result = dict(outcome(Answer.APPLIED, r.key, answer.undone).result or {})
        if answer.succeeded and answer.large:
            result = self._large(r.step, r.key, Large(answer.large))
        if answer.succeeded:
            error = None
        elif answer.abandoned:
            error = ErrorInfo(KEY_ABANDONED, "the key was abandoned here")
        else:
            error = ErrorInfo("declined", "rejected by the service")
        return AgentReply(
            order_id=ORDER.order_id,
            step=r.step,
            action=Action.COMPENSATE if r.undo else Action.DO,
            attempt=r.attempt,
            outcome=Outcome.SUCCEEDED if answer.succeeded else Outcome.FAILED,
            result=result,
            error=error,
            agent=r.agent,
            key=None if r.key in self._plain else r.key,
        )

    def _large(self, step: str, key: str, large: Large) -> dict[str, object]:
        """A result over forward.MAX_RESULT_BYTES: a document beside the declared fields
        (kept alone), or the declared fields themselves too large (nothing kept)."""
        index = self.workflow.index_of(step)
        declared = self.workflow.steps[index].results if index is not None else ()
        field = declared[0] if declared else "ref"
        big = "x" * (forward.MAX_RESULT_BYTES + 1)
        if large is Large.DECLARED_FIT:
            return {field: key, "document": big}
        return {field: big}

    def reply(
        self,
        process: OrderProcess,
        answer: Reply,
        now: int,
        drained: frozenset[str],
        gone: bool = False,
    ) -> Effects | None:
        """The Scheduler takes an agent's reply (stale when the version is gone)."""
        if gone:
            return None
        transition = apply_reply(
            process,
            self.of(process),
            self.policy,
            self.message(answer),
            at(now),
            None,
            self.routing(drained),
        )
        rule = "reply undo" if answer.request.undo else "reply do"
        return self._effects(transition, now, "reply", process, rule, scheduler=True)

    def due(self, process: OrderProcess, now: int) -> bool:
        """Has the order's deadline passed, so a sweep would act on it?"""
        deadline = next_complete_by(process, self.policy)
        return deadline is not None and tick(deadline) <= now

    def question(self, process: OrderProcess, drained: frozenset[str]) -> Question | None:
        """What the Supervisor asks about a due order (supervisor._check)."""
        exhausting = exhaustion_undoes(process, self.of(process), self.policy)
        asked = in_doubt.question(
            process, self.of(process), self.routing(drained), exhausting=exhausting
        )
        if asked is None:
            return None
        return Question(asked.agent, asked.key, tick(asked.ask_at), asked.abandon, asked.movable)

    def sweep(
        self,
        process: OrderProcess,
        now: int,
        answer: Answer | None,
        key: str | None = None,
        gone: bool = False,
        in_line: bool | None = None,
        counted: bool = True,
        undone: bool | None = None,
        drained: frozenset[str] = frozenset(),
    ) -> Effects | None:
        """The Supervisor's recover, with what `_settle` concluded about `key` (None: not
        asked; `undone`: what an applied undo key's answer says it did); an order whose
        version is gone is held (`_hold_version_gone`). With a customer ledger (`in_line`
        not None: does the ledger still hold the order in its customer's line?), an order
        in line waits for its turn (its check moves to `held_until`) or, promoted with its
        nudge lost, is released and nudged. Not `counted`: the deadline passed in an
        outage of our own broker or store (nothing is asked, nothing counted)."""
        if gone:
            held = recovery.version_gone(process, at(now))
            return self._effects(held, now, "sweep", process, "version gone")
        if in_line is not None and line.in_line(process):
            if in_line:
                assert line.held_until(process, at(now)) > at(now)
                return None
            process = line.released(process, at(now))
        asked = None if answer is None else outcome(answer, key or "", undone)
        transition = recover(
            process,
            self.of(process),
            self.policy,
            at(now),
            count=counted,
            outcome=asked,
            routing=self.routing(drained),
        )
        effects = self._effects(transition, now, "sweep", process, "recover")
        if effects is None or effects.rewatch:
            return effects
        # The entry it read, not written over by the save: moved to the next check.
        check = self.next_check(effects.process, now)
        return effects if check is None else dataclasses.replace(effects, rewatch=True, watch=check)

    def undelivered(self, process: OrderProcess, now: int) -> Effects | None:
        """The Scheduler's send failed after the save: the use case notes it."""
        transition = recovery.undelivered(process, self.policy, at(now))
        return self._effects(transition, now, "undelivered", process)

    def cancel(self, process: OrderProcess, now: int, gone: bool = False) -> Effects | None:
        if gone:
            return None  # UnknownWorkflow: 409 version-gone
        try:
            transition = operator.cancel(process, self.of(process), self.policy, at(now))
        except InvalidTransition:
            return None
        return self._effects(transition, now, "cancel", process, check=True)

    def suspend(self, process: OrderProcess, now: int, gone: bool = False) -> Effects | None:
        if gone:
            return None  # the unit of work's check_at reads the workflow: 409
        try:
            transition = operator.suspend(process, at(now))
            return self._effects(transition, now, "suspend", process, check=True)
        except InvalidTransition:
            return None

    def resume(self, process: OrderProcess, now: int, gone: bool = False) -> Effects | None:
        if gone:
            return None
        try:
            transition = operator.resume(process, self.policy, at(now))
            return self._effects(transition, now, "resume", process, check=True)
        except InvalidTransition:
            return None

    def resubmit(self, process: OrderProcess, now: int, gone: bool = False) -> Effects | None:
        if gone:
            return None
        try:
            transition = operator.resubmit(process, self.policy, at(now), workflow=self.of(process))
            return self._effects(transition, now, "resubmit", process, check=True)
        except InvalidTransition:
            return None

    def event(
        self,
        process: OrderProcess,
        now: int,
        event_id: str,
        name: str,
        approved: bool | None,
        gone: bool = False,
        drained: frozenset[str] = frozenset(),
    ) -> Effects | None:
        """An event from outside, as the events route keeps it (with the current routing:
        a step the event completes dispatches the next); None when it is refused (the
        order is final, its version gone) or a repeat of one kept."""
        if gone:
            return None
        data = None if approved is None else {"approved": approved, "by": "reviewer"}
        try:
            transition = receive_event(
                process,
                self.of(process),
                self.policy,
                event_id,
                name,
                data,
                at(now),
                None,
                self.routing(drained),
            )
        except (InvalidTransition, ValueError):
            return None
        return self._effects(transition, now, f"event {name}", process, "event", check=True)

    def approve(
        self,
        process: OrderProcess,
        now: int,
        event_id: str,
        approved: bool,
        gone: bool = False,
        drained: frozenset[str] = frozenset(),
    ) -> Effects | None:
        """An operator answers the approval the order is at (the approval route, no event
        named; a rejection with a comment, which becomes its error); None when it is
        refused (none waits, the order is final) or a repeat. Naming the approval the
        order is at (the route's `event`) must do exactly the same."""
        if gone:
            return None
        workflow = self.of(process)
        comment = None if approved else "out of stock"

        def answer(event: str | None) -> Transition | None:
            return answer_approval(
                process,
                workflow,
                self.policy,
                event_id,
                event,
                approved,
                "op",
                comment,
                at(now),
                None,
                self.routing(drained),
            )

        try:
            transition = answer(None)
        except (InvalidTransition, ValueError):
            return None
        if transition is not None:
            named = machine_events.approval_event(process, workflow, None)
            assert answer(named) == transition, f"the approval {named} named did otherwise"
        return self._effects(transition, now, "approval", process, "event", check=True)

    def refuses_malformed(self, process: OrderProcess, now: int) -> bool:
        """The events route refuses, changing nothing, an event the workflow never waits
        for, an approval whose data is not one, an approval named that no step has, and
        an event past the order's limit of kept events."""
        workflow = self.of(process)
        policy, when = self.policy, at(now)
        receive = partial(receive_event, now=when)
        tries: list[Callable[[], object]] = [
            lambda: receive_event(process, workflow, policy, "x-1", "never", None, when),
            lambda: answer_approval(
                process, workflow, policy, "x-2", "never", True, "op", None, when
            ),
        ]
        for name in sorted(a for a in self.approvals if a is not None):
            tries.append(
                partial(receive, process, workflow, policy, "x-3", name, {"approved": "y"})
            )
        full = (
            ReceivedEvent(f"k-{i}", "kept", when, None) for i in range(machine_events.MAX_EVENTS)
        )
        crowded = dataclasses.replace(
            process, state=dataclasses.replace(process.state, events=tuple(full))
        )
        for name in self.events:
            tries.append(
                partial(receive, crowded, workflow, policy, "x-4", name, {"approved": True})
            )
        for attempt in tries:
            try:
                attempt()
            except (InvalidTransition, ValueError):
                continue
            return False
        return True

    def migrate(
        self, process: OrderProcess, now: int, gone: bool = False, to_version: int | None = None
    ) -> Effects | None:
        """An operator moves the order to `to_version` (None: the other version); None
        when it refuses."""
        if gone:
            return None
        source = self.of(process)
        target = self._target(source, to_version)
        try:
            transition = migrate_rules.migrate(process, source, target, at(now))
        except InvalidTransition:
            return None
        return self._effects(
            transition, now, f"migrate to v{target.version}", process, "migrate", check=True
        )

    def _target(self, source: Workflow, to_version: int | None) -> Workflow:
        if to_version is not None:
            return self.versions[to_version]
        return self.target if source is self.workflow else self.workflow

    def refuses_shorter(self, process: OrderProcess, now: int) -> bool:
        """A migrate to a version with fewer steps than the order has done (a deploy that
        dropped steps from the workflow's end) is refused, single (409) and in bulk
        (`bulk.refusal`: skipped), changing nothing."""
        done = migrate_rules.done_so_far(process)
        if done < 2 or process.state.process_state.is_final:
            return True
        source = self.of(process)
        shorter = dataclasses.replace(source, steps=source.steps[: done - 1], version=9)
        if bulk.refusal(BulkAction.MIGRATE, process, source, shorter) is None:
            return False
        try:
            migrate_rules.migrate(process, source, shorter, at(now))
        except migrate_rules.IncompatibleVersions:
            return True
        return False

    def heartbeat(self, process: OrderProcess, request: Request, now: int) -> Effects | None:
        """A step heartbeat from the agent running `request`."""
        transition = extend_complete_by(
            process, request.attempt, request.step, at(now), self.policy
        )
        return self._effects(transition, now, "step heartbeat", process, "heartbeat")

    def hold(
        self, process: OrderProcess, request: Request, waited: int, now: int
    ) -> Effects | None:
        """The agent's limit held `request` for `waited` seconds (machine/hold.py)."""
        action = Action.COMPENSATE if request.undo else Action.DO
        waiting = timedelta(seconds=waited)
        transition = hold_complete_by(
            process, request.attempt, request.step, waiting, at(now), self.policy, action
        )
        return self._effects(transition, now, "held by a limit", process, "hold")

    def bulk(
        self,
        process: OrderProcess,
        action: str,
        now: int,
        gone: bool = False,
        to_version: int | None = None,
    ) -> Effects | None:
        """A bulk job's action on this order (`bulk._act`): skipped (None) unless the
        job's filter and `matches` select it, then the single action. A migrate's
        target is the job's `to_version` (None: the other version); an order already
        there is skipped (`incompatibility`)."""
        kind = BulkAction(action)
        source = None if gone else self.of(process)
        target = None
        if kind is BulkAction.MIGRATE and source is not None:
            target = self._target(source, to_version)
        if not bulk.matches(kind, BULK_FILTER, process, source, target):
            return None
        if kind is BulkAction.MIGRATE:
            return self.migrate(process, now, gone, to_version)
        single = {
            BulkAction.CANCEL: self.cancel,
            BulkAction.SUSPEND: self.suspend,
            BulkAction.RESUME: self.resume,
            BulkAction.RESUBMIT: self.resubmit,
        }[kind]
        return single(process, now, gone)

    def limit_wait(self, request: Request, now: int, concurrent: bool) -> int:
        """How long the agent's limiter holds `request` (shared/usecases/limits/limiter.py):
        another caller took the rate schedule's slots up to HOLD_WAIT from now, or holds
        the only concurrency lease until then."""
        start = at(now)
        unlimited = limits.AgentLimits()
        assert not unlimited.limited and unlimited.gap is None  # never held
        assert not limits.slot_still_usable(start, start, unlimited)
        if concurrent:
            lease = limits.SlotLease(0, "another-call", at(now + HOLD_WAIT - SKEW), "e")
            skew = self.policy.clock_skew
            assert limits.AgentLimits(max_concurrent=2).limited
            assert len(limits.free_slots((lease,), 2, start, skew)) == 1  # not held: a slot
            expired = dataclasses.replace(lease, expires=start - skew)
            assert limits.free_slots((expired,), 1, start, skew)  # not held: it expired
            assert not limits.free_slots((lease,), 1, start, skew)
            return tick(limits.next_expiry((lease,), 1, start, skew)) - now
        rate = limits.AgentLimits(calls_per_second=1.0)
        gap = rate.gap
        assert gap is not None
        booked = limits.book(at(now + HOLD_WAIT), start, 1, gap)
        (slot,) = booked.starts
        assert limits.slot_still_usable(slot, slot, rate)
        return tick(slot) - now

    def reconcile(
        self, process: OrderProcess, now: int, ask: Callable[[str, str], RemoteOutcome]
    ) -> Effects | None:
        """A reconciliation run over this order at rest (finished or held); None when it
        finds nothing to say."""
        outgoing = self.reconciled(process, now, ask)
        if not outgoing:
            return None
        transition = Transition(process, outgoing, ())
        return self._effects(transition, now, "reconcile")

    def reconciled(
        self, process: OrderProcess, now: int, ask: Callable[[str, str], RemoteOutcome]
    ) -> tuple[Outgoing, ...]:
        """What a run sends for this order: `Reconciler._check` walks each step's
        questions, and `Reconciler.run` sends an alert per mismatch and the undos."""
        workflow = self.of(process)
        outgoing: list[Outgoing] = []
        for check in reconciliation.checks(process, workflow):
            answers: dict[tuple[str, str], RemoteOutcome] = {}
            while (asked := reconciliation.next_question(check, answers)) is not None:
                answers[asked] = ask(*asked)
            reconciliation.verdict(check, answers)
            found = reconciliation.mismatches(check, answers)
            outgoing += [m.alert(process.state.failure_count, at(now)) for m in found]
            undos = reconciliation.heals(process, workflow, self.policy, check, answers, at(now))
            outgoing += undos
        return tuple(outgoing)

    def submit_again(self, process: OrderProcess, now: int, same_body: bool) -> str:
        """The intake given the archived order's id again (`submit_order` over the store
        that holds the archive's mark): 'repeat' (202, its final state), 'conflict'
        (409), or 'created' (a new order under the id: finding H)."""
        order = ORDER if same_body else dataclasses.replace(ORDER, fingerprint="another-body")

        async def submit() -> str:
            store = InMemoryStateStore()
            await store.create(process, ())
            loaded = await store.load(process.order_id)
            assert loaded is not None and loaded.etag is not None
            mark = ArchivedMark.of(ArchivedOrder(process, at(now)))
            assert await store.purge(mark, loaded.etag)
            deps = ProcessDeps(
                store,
                InMemoryBus(),
                FakeClock(at(now)),
                self.policy,
                SCHEDULER,
                catalogue=CATALOGUE,
            )
            try:
                submitted = await submit_order(deps, order, workflow=self.workflow)
            except OrderConflict:
                return "conflict"
            return "created" if submitted.created else "repeat"

        return _LOOP.run_until_complete(submit())

    def complete_by(self, process: OrderProcess, step: str) -> int | None:
        index = self.of(process).index_of(step)
        if index is None or index >= len(process.steps):
            return None
        when = process.steps[index].complete_by
        return None if when is None else tick(when)

    # --- what the judge reads -----------------------------------------------------------

    def next_check(self, process: OrderProcess, now: int) -> int | None:
        check = recovery.next_check(process, self.of(process), self.policy, at(now))
        return None if check is None else tick(check)

    def watched(self, process: OrderProcess, now: int) -> bool:
        """Will the Supervisor find this order? Orders held for an operator (Error,
        Suspended) and finished ones need no watch."""
        if process.state.process_state.is_at_rest:
            return True
        return self.next_check(process, now) is not None

    def wake_ups(self, process: OrderProcess, drained: frozenset[str]) -> tuple[int, ...]:
        """The instants at which the order's own rules may change their answer: its
        deadline, the moment the Supervisor may ask, and every instant the record holds
        (a complete-by, a step's live-until): a new time field counts without a change
        here."""
        ticks: set[int] = set()
        deadline = next_complete_by(process, self.policy)
        if deadline is not None:
            ticks.add(tick(deadline))
        asked = self.question(process, drained)
        if asked is not None:
            ticks.add(asked.ask_at)
        for record in (process.state, *process.steps):
            for name in _fields(record):
                value = getattr(record, name)
                if isinstance(value, datetime):
                    ticks.add(tick(value))
        return tuple(sorted(ticks))

    def past_pivot(self, process: OrderProcess) -> bool:
        return past_pivot(process.steps, self.of(process))


_LOOP = asyncio.new_event_loop()
"""The intake is a use case over the in-memory store: one loop for every call."""


def outcome(answer: Answer, key: str, undone: bool | None = None) -> RemoteOutcome:
    """The outcome query's answer as the adapter reads it: applied carries the service's
    result, which for an undo is its undo answer (`{"undone": false, "reason":
    "nothing-to-undo"}` when it found nothing to undo, docs/simulator.md)."""
    result: dict[str, object] | None = None
    if answer is Answer.APPLIED:
        result = {"ref": key} if undone is None else {"undone": undone}
        if undone is False:
            result["reason"] = "nothing-to-undo"
    return RemoteOutcome(_OUTCOMES[answer], result)


def later_version(workflow: Workflow) -> Workflow:
    """A version 2 that differs in a field of every step: a timeout (which a done step may
    change), and for a wait what it means (an approval becomes a plain event, a timer
    waits a fixed time): the migrate rule must refuse the second once the step is done."""
    steps = tuple(
        dataclasses.replace(
            s,
            timeout_seconds=(s.timeout_seconds or 30) * 2,
            approval=False if s.approval else s.approval,
            until=None if s.until else s.until,
            wait_seconds=20 if s.until else s.wait_seconds,
        )
        for s in workflow.steps
    )
    return dataclasses.replace(workflow, steps=steps, version=workflow.version + 1)


def deadline(process: OrderProcess, policy: ProcessPolicy) -> int | None:
    """The order's next deadline (`recovery.next_complete_by`), as a tick."""
    when = next_complete_by(process, policy)
    return None if when is None else tick(when)


def finished(process: OrderProcess) -> str | None:
    """'processed' or 'undone' (Compensated, Cancelled) once final; None before."""
    state = process.state.process_state
    if state is ProcessState.PROCESSED:
        return "processed"
    if state in (ProcessState.COMPENSATED, ProcessState.CANCELLED):
        return "undone"
    return None


def at_rest(process: OrderProcess) -> bool:
    """Finished, or held for an operator (Error, Suspended): what reconciliation samples
    (`reconcile.CHECKED`)."""
    return process.state.process_state in reconciliation.CHECKED


def in_line(process: OrderProcess) -> bool:
    """Pending in its customer's line, no nudge of its own (`machine/line.py` `in_line`)."""
    return line.in_line(process)


def held(process: OrderProcess) -> bool:
    return process.state.process_state is ProcessState.ERROR


_SKIPPED = frozenset(
    {"order", "history", "etag", "version", "outbox", "outbox_cause", "last_error"}
)
"""Fields that never steer the machine: the order (one order), the record's bookkeeping
and text for people."""


def key(process: OrderProcess) -> Hashable:
    """The process as a hashable value, datetimes as ticks: two paths to the same
    situation meet here. Generic over the dataclasses so new fields count by default."""
    return _canon(process)


_FIELDS: dict[type, tuple[str, ...]] = {}
_ATOMS = (str, int, float, bool, type(None))


def _fields(record: object) -> tuple[str, ...]:
    kind = type(record)
    names = _FIELDS.get(kind)
    if names is None:
        fields = dataclasses.fields(record)  # type: ignore[arg-type]
        names = _FIELDS[kind] = tuple(f.name for f in fields if f.name not in _SKIPPED)
    return names


def _canon(value: object) -> Hashable:
    if isinstance(value, _ATOMS):
        return value  # enums included: a StrEnum is a str
    if isinstance(value, datetime):
        return tick(value)
    kind = type(value)
    names = _fields(value) if dataclasses.is_dataclass(value) else None
    if names is not None:
        return tuple([_canon(getattr(value, name)) for name in names])
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _canon(v)) for k, v in value.items()))
    if isinstance(value, tuple | list):
        return tuple([_canon(v) for v in value])
    if isinstance(value, Enum):
        return _canon(value.value)
    raise TypeError(f"cannot key a {kind.__name__}")


def describe(process: OrderProcess) -> str:
    """One line: the order's state and each step's status, agent and complete-by."""
    state = process.state
    flags = " cancel-requested" if state.cancel_requested else ""
    head = (
        f"{state.process_state.value}/{state.phase.value} step {state.current_step} "
        f"attempt {state.attempt} failures {state.failure_count}{flags}"
    )
    steps = []
    for s in process.steps:
        where = f"@{s.agent}" if s.agent else ""
        by = f" by t={tick(s.complete_by)}" if s.complete_by else ""
        steps.append(f"{s.name}={s.status.value}{where}{by}")
    return f"{head} [{', '.join(steps)}]"
