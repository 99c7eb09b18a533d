"""In-doubt steps: what the remote service says about a key, and which key to ask about.

A step whose complete-by passed with no reply may or may not have taken effect. Rather
than guess, the Supervisor asks the agent that holds the step's key (see
shared/usecases/flow/outcomes.py); this module is the pure half: the answer's type and the
question an order's state asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum

from shared.domain.messages import do_key, undo_key
from shared.domain.model import (
    JsonObject,
    KeyState,
    OrderProcess,
    Phase,
    ProcessState,
    StepStatus,
)
from shared.domain.routing import PRIMARY_ONLY, Routing
from shared.domain.workflow import Workflow

SETTLE_MARGIN = timedelta(seconds=1)
"""How long after a step's complete-by the Supervisor waits before asking: the agent
stops its call at the complete-by, and a request sent just before it needs a moment to
be registered by the service (or to see its client leave). Asked earlier, "never seen"
could be a guess. The residual risk is in docs/in-doubt.md."""


NOTHING_TO_UNDO = "nothing-to-undo"
"""The `reason` of an undo's result when its do was not applied at that service: the
undo is settled (applied) and undid nothing."""


class RemoteOutcomeKind(StrEnum):
    APPLIED = "applied"
    NOT_APPLIED = "not-applied"
    NEVER_SEEN = "never-seen"
    IN_PROGRESS = "in-progress"
    ABANDONED = "abandoned"
    """Settled for good by `abandon`: the key never applies at that service."""
    NOT_SUPPORTED = "not-supported"
    """The service has no abandon route: only time can make "not applied" final."""
    UNKNOWN = "unknown"
    """No answer: unreachable, breaker open, out of time, or an answer we cannot read."""


@dataclass(frozen=True)
class RemoteOutcome:
    kind: RemoteOutcomeKind
    result: JsonObject | None = None
    """What the operation returned, when APPLIED."""
    detail: str = ""
    """Why there is no answer, for the history (UNKNOWN only)."""

    @property
    def safe_to_move(self) -> bool:
        """The key took no effect where it was sent: a retry elsewhere cannot apply it twice."""
        return self.kind in (RemoteOutcomeKind.NOT_APPLIED, RemoteOutcomeKind.NEVER_SEEN)

    @property
    def found_nothing_to_undo(self) -> bool:
        """An undo key's answer: applied, but its do was not applied there when the undo
        came, so it undid nothing (the contract's `{"undone": false, "reason":
        "nothing-to-undo"}`, docs/contract.md 8.1), and that do may still apply after it."""
        if self.kind is not RemoteOutcomeKind.APPLIED or self.result is None:
            return False
        return self.result.get("reason") == NOTHING_TO_UNDO or self.result.get("undone") is False

    @classmethod
    def applied(cls, result: JsonObject) -> RemoteOutcome:
        return cls(RemoteOutcomeKind.APPLIED, dict(result))

    @classmethod
    def unknown(cls, detail: str) -> RemoteOutcome:
        return cls(RemoteOutcomeKind.UNKNOWN, detail=detail)


NOT_APPLIED = RemoteOutcome(RemoteOutcomeKind.NOT_APPLIED)
NEVER_SEEN = RemoteOutcome(RemoteOutcomeKind.NEVER_SEEN)
IN_PROGRESS = RemoteOutcome(RemoteOutcomeKind.IN_PROGRESS)
ABANDONED = RemoteOutcome(RemoteOutcomeKind.ABANDONED)
NOT_SUPPORTED = RemoteOutcome(RemoteOutcomeKind.NOT_SUPPORTED)


@dataclass(frozen=True)
class Question:
    """Ask `agent` about `key` once `ask_at` has passed; with `abandon`, settle the key for
    good there instead (where the service allows it): the order is about to undo the
    step or move it to another provider, and a plain "not applied" could still change."""

    agent: str
    key: str
    ask_at: datetime
    abandon: bool = False
    movable: bool = False
    """A "not applied" answer would send the retry to another provider: it is made final
    by abandoning the key before the order acts on it."""


def question(
    process: OrderProcess,
    workflow: Workflow,
    routing: Routing = PRIMARY_ONLY,
    *,
    exhausting: bool = False,
) -> Question | None:
    """The in-doubt key of an order whose complete-by passed, or None when nothing is in
    doubt: a forward step Running past its complete-by, a compensation out, or a step a
    compensation waits on to settle. A Pending order was never given to an agent.
    """
    state = process.state
    index = state.current_step
    if index >= len(process.steps) or index >= len(workflow.steps):
        return None
    step, definition = process.steps[index], workflow.steps[index]
    if step.agent is None:
        return None
    done_key = do_key(process.order_id, definition.name, step)
    active = state.process_state in (ProcessState.PROCESSING, ProcessState.COMPENSATING)
    if step.status is StepStatus.RUNNING and active and step.complete_by is not None:
        # `exhausting`: this timeout is the last one and the order will undo the step.
        leaving = state.cancel_requested or state.phase is Phase.COMPENSATE or exhausting
        # Only agents where the key was not abandoned can take the step: an abandoned
        # primary that routing prefers again must not make this agent's key abandoned too.
        still_open = [c for c in definition.candidates if c not in step.abandoned_at]
        if not leaving and not definition.retry_elsewhere and still_open:
            chosen, _ = routing.choose(still_open)
            leaving = chosen != step.agent
        # Movable: the retry would leave this agent (another open one is healthy, as the
        # Supervisor's retry routes), so "not applied" must be made final by an abandon.
        movable = (
            not definition.retry_elsewhere
            and len(still_open) > 1
            and routing.choose(still_open, avoid=step.agent)[0] != step.agent
        )
        ask_at = step.complete_by + SETTLE_MARGIN
        return Question(step.agent, done_key, ask_at, abandon=leaving, movable=movable)
    if state.process_state is not ProcessState.COMPENSATING:
        return None
    if step.complete_by is None:
        if step.key_state is not KeyState.UNSETTLED and not step.attempts:
            return None
        return Question(step.agent, done_key, state.complete_by or step.live_until or _EPOCH, True)
    if definition.compensation is None:
        return None
    undoing = undo_key(process.order_id, definition.compensation, step)
    return Question(step.agent, undoing, step.complete_by + SETTLE_MARGIN)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
