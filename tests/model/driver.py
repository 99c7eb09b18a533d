"""The one module that calls the domain (shared/domain/process.py and its types).

The explorer's world speaks ticks, Requests, Replies and Answers (tests/model/wire.py);
this module turns them into the domain's calls and the domain's transitions back into
them. It mirrors what the use cases do around each pure call (the Supervisor asks the
in-doubt question only once its ask-at has passed; a failed send is followed by
`undelivered`), so the world can stay ignorant of both.

The domain is being rewritten (a step's KeyState and live_until, the abandoned answer,
the answering agent on a reply): this file is the one to adapt. The functions the
world calls are listed in `__all__`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Mapping
from datetime import UTC, datetime, timedelta
from enum import Enum

from shared.contract import Queue, agent_queue
from shared.domain import in_doubt
from shared.domain import process as machine
from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
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
from tests.model.wire import Answer, Effects, Question, Reply, Request
from tests.workflows import AGENTS, ORDER_FULFILMENT

__all__ = [
    "SKEW",
    "STEPS",
    "Step",
    "cancel",
    "claim",
    "describe",
    "due",
    "finished",
    "key",
    "question",
    "reply",
    "resubmit",
    "resume",
    "start",
    "suspend",
    "sweep",
    "undelivered",
    "wake_ups",
    "watched",
]

T0 = datetime(2026, 1, 1, tzinfo=UTC)
"""Tick 0. Ticks are whole seconds from here, so equal situations hash equal."""
STEP_TIMEOUT = 30
PENDING_TIMEOUT = 60
SKEW = 5
"""The clock-skew margin: a request sent with complete-by C can apply up to C + SKEW."""
MAX_FAILURES = 2

WORKFLOW = ORDER_FULFILMENT
POLICY = machine.ProcessPolicy(
    step_timeout=timedelta(seconds=STEP_TIMEOUT),
    pending_timeout=timedelta(seconds=PENDING_TIMEOUT),
    max_failure_count=MAX_FAILURES,
)
ORDER = Order(
    order_id="o-1",
    customer_id="c-1",
    items=(OrderLine("sku-1", 1, 10.0),),
    priority=Priority.NORMAL,
    reply_to=None,
    fingerprint="fp",
    created_at=T0,
)
SCHEDULER = "scheduler-1"


@dataclasses.dataclass(frozen=True)
class Step:
    """A workflow step as the judge needs it: its keys and the agents that may hold them."""

    name: str
    do_key: str
    undo_key: str | None
    agents: tuple[str, ...]


def _key_of(operation: str | None) -> str | None:
    return None if operation is None else f"{ORDER.order_id}:{operation}"


STEPS: tuple[Step, ...] = tuple(
    Step(
        s.name,
        f"{ORDER.order_id}:{s.name}",
        _key_of(s.compensation),
        tuple(a for a in s.candidates),
    )
    for s in WORKFLOW.steps
)
_UNDOES = {s.undo_key: s.do_key for s in STEPS if s.undo_key is not None}
_AGENT_OF_QUEUE = {agent_queue(name, high): name for name in AGENTS for high in (False, True)}


def at(tick: int) -> datetime:
    return T0 + timedelta(seconds=tick)


def tick(when: datetime) -> int:
    return int((when - T0).total_seconds())


def _routing(drained: frozenset[str]) -> Routing:
    """Every agent healthy (so a retry may move to the alternative), some drained."""
    views = {a: AgentView(a, Availability.HEALTHY, "healthy") for a in AGENTS}
    return Routing(views, drained)


def _effects(transition: machine.Transition | None, now: int, what: str) -> Effects | None:
    if transition is None:
        return None
    requests: list[Request] = []
    nudges: list[int] = []
    alerts: list[str] = []
    for message in transition.outgoing:
        if message.queue in _AGENT_OF_QUEUE:
            requests.append(_request(message))
        elif message.queue in (Queue.SCHEDULER, Queue.SCHEDULER_HIGH):
            nudges.append(tick(message.deliver_at) if message.deliver_at else now)
        elif message.queue == Queue.OPERATOR_ALERTS:
            alerts.append(str(message.body.get("reason")))
    events = ", ".join(h.event for h in transition.history)
    summary = f"{what}: {events} -> {describe(transition.process)}"
    return Effects(transition.process, tuple(requests), tuple(nudges), tuple(alerts), summary)


def _request(message: Outgoing) -> Request:
    body = message.body
    undo = body["action"] == Action.COMPENSATE.value
    key = str(body["idempotencyKey"])
    undoes = body.get("undoes") or (_UNDOES.get(key) if undo else None)
    return Request(
        agent=_AGENT_OF_QUEUE[message.queue],
        step=str(body["step"]),
        undo=undo,
        key=key,
        attempt=int(body["attempt"]),
        complete_by=tick(datetime.fromisoformat(str(body["completeBy"]))),
        undoes=undoes,
    )


def start() -> Effects:
    effects = _effects(machine.start(ORDER, WORKFLOW, at(0)), 0, "submitted")
    assert effects is not None
    return effects


def claim(process: OrderProcess, now: int, drained: frozenset[str]) -> Effects | None:
    """The Scheduler consumes a nudge."""
    transition = machine.claim(
        process, WORKFLOW, POLICY, SCHEDULER, at(now), None, _routing(drained)
    )
    return _effects(transition, now, "claim")


def reply(
    process: OrderProcess, answer: Reply, now: int, drained: frozenset[str]
) -> Effects | None:
    """The Scheduler takes an agent's reply."""
    r = answer.request
    message = AgentReply(
        order_id=ORDER.order_id,
        step=r.step,
        action=Action.COMPENSATE if r.undo else Action.DO,
        attempt=r.attempt,
        outcome=Outcome.SUCCEEDED if answer.succeeded else Outcome.FAILED,
        result={"ref": r.key} if answer.succeeded else None,
        error=None if answer.succeeded else ErrorInfo("declined", "rejected by the service"),
        agent=r.agent,
    )
    transition = machine.apply_reply(
        process, WORKFLOW, POLICY, message, at(now), None, _routing(drained)
    )
    return _effects(transition, now, "reply")


def due(process: OrderProcess, now: int) -> bool:
    """Has the order's deadline passed, so a sweep would act on it?"""
    deadline = machine.next_deadline(process, POLICY)
    return deadline is not None and tick(deadline) <= now


def question(process: OrderProcess) -> Question | None:
    """What the Supervisor asks about a due order (shared/usecases/supervisor._check)."""
    asked = in_doubt.question(process, WORKFLOW)
    if asked is None:
        return None
    return Question(asked.agent, asked.key, tick(asked.ask_at))


_OUTCOMES = {
    Answer.APPLIED: RemoteOutcomeKind.APPLIED,
    Answer.NOT_APPLIED: RemoteOutcomeKind.NOT_APPLIED,
    Answer.NEVER_SEEN: RemoteOutcomeKind.NEVER_SEEN,
    Answer.IN_PROGRESS: RemoteOutcomeKind.IN_PROGRESS,
    Answer.ABANDONED: RemoteOutcomeKind.ABANDONED,
    Answer.NOT_SUPPORTED: RemoteOutcomeKind.NOT_SUPPORTED,
    Answer.UNKNOWN: RemoteOutcomeKind.UNKNOWN,
}


def sweep(
    process: OrderProcess, now: int, answer: Answer | None, key: str | None = None
) -> Effects | None:
    """The Supervisor's recover, with the service's answer about `key` (None: not asked)."""
    outcome = None
    if answer is not None:
        result = {"ref": key} if answer is Answer.APPLIED else None
        outcome = RemoteOutcome(_OUTCOMES[answer], result)
    transition = machine.recover(process, ORDER_FULFILMENT, POLICY, at(now), outcome=outcome)
    return _effects(transition, now, "sweep")


def undelivered(process: OrderProcess, now: int) -> Effects | None:
    """The Scheduler's send failed after the save: the use case notes it."""
    return _effects(machine.undelivered(process, POLICY, at(now)), now, "undelivered")


def cancel(process: OrderProcess, now: int) -> Effects | None:
    try:
        return _effects(machine.cancel(process, ORDER_FULFILMENT, POLICY, at(now)), now, "cancel")
    except machine.InvalidTransition:
        return None


def suspend(process: OrderProcess, now: int) -> Effects | None:
    try:
        return _effects(machine.suspend(process, at(now)), now, "suspend")
    except machine.InvalidTransition:
        return None


def resume(process: OrderProcess, now: int) -> Effects | None:
    try:
        return _effects(machine.resume(process, POLICY, at(now)), now, "resume")
    except machine.InvalidTransition:
        return None


def resubmit(process: OrderProcess, now: int) -> Effects | None:
    try:
        return _effects(machine.resubmit(process, POLICY, at(now)), now, "resubmit")
    except machine.InvalidTransition:
        return None


def watched(process: OrderProcess, now: int) -> bool:
    """Will the Supervisor find this order? Orders held for an operator (Error,
    Suspended) and finished ones need no watch."""
    if process.state.process_state.is_terminal:
        return True
    return machine.next_check(process, WORKFLOW, POLICY, at(now)) is not None


def finished(process: OrderProcess) -> str | None:
    """'processed' or 'undone' (Compensated, Cancelled) once final; None before."""
    state = process.state.process_state
    if state is ProcessState.PROCESSED:
        return "processed"
    if state in (ProcessState.COMPENSATED, ProcessState.CANCELLED):
        return "undone"
    return None


def wake_ups(process: OrderProcess) -> tuple[int, ...]:
    """The instants at which the order's own rules may change their answer: its
    deadline, the moment the Supervisor may ask, and every instant the record holds (a
    complete-by, a step's live-until): a new time field counts without a change here."""
    ticks: set[int] = set()
    deadline = machine.next_deadline(process, POLICY)
    if deadline is not None:
        ticks.add(tick(deadline))
    asked = in_doubt.question(process, WORKFLOW)
    if asked is not None:
        ticks.add(tick(asked.ask_at))
    for record in (process.state, *process.steps):
        for name in _fields(record):
            value = getattr(record, name)
            if isinstance(value, datetime):
                ticks.add(tick(value))
    return tuple(sorted(ticks))


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
