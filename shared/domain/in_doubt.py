"""In-doubt steps: what the remote service says about a key, and which key to ask about.

A step whose complete-by passed with no reply may or may not have taken effect. Rather
than guess, the Supervisor asks the agent that holds the step's key (see
shared/usecases/outcomes.py); this module is the pure half: the answer's type and the
question an order's state asks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from shared.domain.messages import idempotency_key
from shared.domain.model import JsonObject, OrderProcess, Phase, ProcessState, StepStatus
from shared.domain.workflow import Workflow

SETTLE_MARGIN = timedelta(seconds=1)
"""How long after a step's complete-by the Supervisor waits before asking: the agent
stops its call at the complete-by, and a request sent just before it needs a moment to
be registered by the service (or to see its client leave). Asked earlier, "never seen"
could be a guess. The residual risk is in docs/in-doubt.md."""


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
    """Ask `agent` about `key` once `ask_at` has passed."""

    agent: str
    key: str
    ask_at: datetime


def question(process: OrderProcess, workflow: Workflow) -> Question | None:
    """The in-doubt request of an order whose deadline passed, or None when nothing is in
    doubt: a forward step Running, or a compensation out (Compensating, its step with a
    complete-by). A Pending order was never given to an agent, so there is nothing to ask.
    """
    state = process.state
    index = state.current_step
    if index >= len(process.steps) or index >= len(workflow.steps):
        return None
    step, definition = process.steps[index], workflow.steps[index]
    if step.agent is None or step.complete_by is None:
        return None
    if step.status is StepStatus.RUNNING and state.process_state in (
        ProcessState.PROCESSING,
        ProcessState.COMPENSATING,
    ):
        operation: str | None = definition.name
    elif state.process_state is ProcessState.COMPENSATING and state.phase is Phase.COMPENSATE:
        operation = definition.compensation
    else:
        return None
    if operation is None:
        return None
    return Question(
        step.agent, idempotency_key(process.order_id, operation), step.complete_by + SETTLE_MARGIN
    )
