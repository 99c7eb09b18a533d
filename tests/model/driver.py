"""The one module that calls the domain (shared/domain/machine/ and its types).

The explorer's world speaks ticks, Requests, Replies and Answers (tests/model/wire.py);
this module turns them into the domain's calls and the domain's transitions back into
them. It mirrors what the use cases do around each pure call, so the world can stay
ignorant of both:

- the Scheduler's nudge claims a Pending order or wakes a waiting step
  (shared/usecases/scheduler.py `on_nudge`); a failed send is followed by `undelivered`;
- the Supervisor asks the in-doubt question with the current routing and whether this
  timeout exhausts the count, only once its ask-at has passed, and settles it as
  `_settle` does: abandon where the question says so (a service without the route is
  asked instead), and a "not applied" that would move the step is made final by an
  abandon (shared/usecases/supervisor.py `_check`, `_settle`);
- events and approvals are kept as the events route keeps them (`receive_event`).

tests/model/test_drift.py holds this copy to the use cases: it runs them over the
in-memory store on the same situations and compares.

One `Domain` per setup (tests/model/setups.py): the workflow, the policy and the
services come from there, never from constants here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from datetime import UTC, datetime, timedelta
from enum import Enum

from shared.domain import in_doubt
from shared.domain.destination import To
from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.machine import forward, operator, recovery
from shared.domain.machine import migrate as migrate_rules
from shared.domain.machine.events import receive_event
from shared.domain.machine.forward import KEY_ABANDONED, apply_reply
from shared.domain.machine.heartbeat import extend_complete_by
from shared.domain.machine.hold import hold_complete_by
from shared.domain.machine.recovery import exhaustion_undoes, next_deadline, recover
from shared.domain.machine.settle import past_pivot
from shared.domain.machine.transition import InvalidTransition, Transition
from shared.domain.machine.waits import wake
from shared.domain.messages import AgentReply
from shared.domain.model import (
    Action,
    ErrorInfo,
    Order,
    OrderLine,
    OrderProcess,
    Outcome,
    Outgoing,
    Priority,
    ProcessState,
)
from shared.domain.routing import AgentView, Availability, Routing
from shared.domain.workflow import Workflow
from tests.model.setups import DEFAULT, SKEW, Setup
from tests.model.wire import Answer, Effects, Question, Reply, Request
from tests.workflows import AGENTS

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
BEAT_LEAD = 5
"""The model's agents beat this long before their call's complete-by."""
HOLD_WAIT = 20
"""How long a limit holds a request in the model (seconds)."""
__all__ = ["REACHED", "SKEW", "Domain", "Step", "at", "key", "tick"]
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
        self.target = later_version(self.workflow)
        self.versions = {w.version: w for w in (self.workflow, self.target)}

    def of(self, process: OrderProcess) -> Workflow:
        """The version the order pins (the use cases' `find_workflow`)."""
        return self.versions[process.state.workflow_version]

    # --- translation ------------------------------------------------------------------

    def routing(self, drained: frozenset[str]) -> Routing:
        """Every agent healthy (so a retry may move to the alternative), some drained."""
        views = {a: AgentView(a, Availability.HEALTHY, "healthy") for a in AGENTS}
        return Routing(views, drained)

    def _effects(
        self,
        transition: Transition | None,
        now: int,
        what: str,
        before: OrderProcess | None = None,
        rule: str | None = None,
    ) -> Effects | None:
        if transition is None:
            return None
        if before is not None:
            REACHED.add((rule or what, before.state.process_state.value))
        requests: list[Request] = []
        nudges: list[int] = []
        alerts: list[str] = []
        for message in transition.outgoing:
            to = message.destination.to
            if to is To.AGENT:
                requests.append(self._request(message))
            elif to is To.SCHEDULER:
                nudges.append(tick(message.deliver_at) if message.deliver_at else now)
            elif to is To.OPERATORS:
                alerts.append(str(message.body.get("reason")))
        events = ", ".join(h.event for h in transition.history)
        summary = f"{what}: {events} -> {describe(transition.process)}"
        return Effects(transition.process, tuple(requests), tuple(nudges), tuple(alerts), summary)

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
        )

    # --- the order's moves --------------------------------------------------------------

    def start(self) -> Effects:
        effects = self._effects(forward.start(ORDER, self.workflow, at(0)), 0, "submitted")
        assert effects is not None
        return effects

    def claim(self, process: OrderProcess, now: int, drained: frozenset[str]) -> Effects | None:
        """The Scheduler consumes a nudge: claim a Pending order, or wake a waiting step."""
        routing = self.routing(drained)
        claimed = forward.claim(
            process, self.of(process), self.policy, SCHEDULER, at(now), None, routing
        )
        if claimed is not None:
            return self._effects(claimed, now, "claim", process)
        woken = wake(process, self.of(process), self.policy, at(now), None, routing)
        return self._effects(woken, now, "claim", process, "wake")

    def message(self, answer: Reply) -> AgentReply:
        """The agent's reply on the wire."""
        r = answer.request
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
            result={"ref": r.key} if answer.succeeded else None,
            error=error,
            agent=r.agent,
        )

    def reply(
        self, process: OrderProcess, answer: Reply, now: int, drained: frozenset[str]
    ) -> Effects | None:
        """The Scheduler takes an agent's reply."""
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
        return self._effects(transition, now, "reply", process, rule)

    def due(self, process: OrderProcess, now: int) -> bool:
        """Has the order's deadline passed, so a sweep would act on it?"""
        deadline = next_deadline(process, self.policy)
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
        self, process: OrderProcess, now: int, answer: Answer | None, key: str | None = None
    ) -> Effects | None:
        """The Supervisor's recover, with what `_settle` concluded about `key` (None: not
        asked)."""
        outcome = None
        if answer is not None:
            result = {"ref": key} if answer is Answer.APPLIED else None
            outcome = RemoteOutcome(_OUTCOMES[answer], result)
        transition = recover(process, self.of(process), self.policy, at(now), outcome=outcome)
        return self._effects(transition, now, "sweep", process, "recover")

    def undelivered(self, process: OrderProcess, now: int) -> Effects | None:
        """The Scheduler's send failed after the save: the use case notes it."""
        transition = recovery.undelivered(process, self.policy, at(now))
        return self._effects(transition, now, "undelivered", process)

    def cancel(self, process: OrderProcess, now: int) -> Effects | None:
        try:
            transition = operator.cancel(process, self.of(process), self.policy, at(now))
        except InvalidTransition:
            return None
        return self._effects(transition, now, "cancel", process)

    def suspend(self, process: OrderProcess, now: int) -> Effects | None:
        try:
            return self._effects(operator.suspend(process, at(now)), now, "suspend", process)
        except InvalidTransition:
            return None

    def resume(self, process: OrderProcess, now: int) -> Effects | None:
        try:
            transition = operator.resume(process, self.policy, at(now))
            return self._effects(transition, now, "resume", process)
        except InvalidTransition:
            return None

    def resubmit(self, process: OrderProcess, now: int) -> Effects | None:
        try:
            transition = operator.resubmit(process, self.policy, at(now))
            return self._effects(transition, now, "resubmit", process)
        except InvalidTransition:
            return None

    def event(
        self, process: OrderProcess, now: int, event_id: str, name: str, approved: bool | None
    ) -> Effects | None:
        """An event from outside, as the events route keeps it; None when it is refused
        (the order is final) or a repeat of one kept."""
        data = None if approved is None else {"approved": approved, "by": "reviewer"}
        try:
            transition = receive_event(
                process, self.of(process), self.policy, event_id, name, data, at(now)
            )
        except (InvalidTransition, ValueError):
            return None
        return self._effects(transition, now, f"event {name}", process, "event")

    def migrate(self, process: OrderProcess, now: int) -> Effects | None:
        """An operator moves the order to the other version; None when it refuses."""
        source = self.of(process)
        target = self.target if source is self.workflow else self.workflow
        try:
            transition = migrate_rules.migrate(process, source, target, at(now))
        except InvalidTransition:
            return None
        return self._effects(transition, now, f"migrate to v{target.version}", process, "migrate")

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
        if process.state.process_state.is_terminal:
            return True
        return self.next_check(process, now) is not None

    def wake_ups(self, process: OrderProcess, drained: frozenset[str]) -> tuple[int, ...]:
        """The instants at which the order's own rules may change their answer: its
        deadline, the moment the Supervisor may ask, and every instant the record holds
        (a complete-by, a step's live-until): a new time field counts without a change
        here."""
        ticks: set[int] = set()
        deadline = next_deadline(process, self.policy)
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


def finished(process: OrderProcess) -> str | None:
    """'processed' or 'undone' (Compensated, Cancelled) once final; None before."""
    state = process.state.process_state
    if state is ProcessState.PROCESSED:
        return "processed"
    if state in (ProcessState.COMPENSATED, ProcessState.CANCELLED):
        return "undone"
    return None


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
