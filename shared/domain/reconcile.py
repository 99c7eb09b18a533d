"""Reconciliation, the pure half: what a finished order says each remote service did,
and whether the service's own answer for the key agrees.

A finished order is a claim about the world: `Processed` says every step's effect is
applied; `Compensated` and `Cancelled` say none is left applied (each one that took effect
was undone). Asking each step's agent about its keys checks that claim after the fact,
when a lost reply, an operator's hand edit or a bug could have made the two disagree.

Per step, at most two questions, to the agent that holds the step's key (the step's
`agent`, the one its compensation went to as well):

- `Processed`: the do-key. Applied is a match; not applied or never seen is an effect
  missing.
- `Compensated`, `Cancelled`: the undo key first (applied: the effect was undone, a
  match, one question). Otherwise the do-key: not applied or never seen is a match
  (nothing took effect), applied is an effect still applied.

A step never dispatched (no agent) or without an undo (in a compensated order) asks
nothing. Any other answer (in progress, no answer) is unknown, never a mismatch: a
reconciliation that guessed would page an operator for a network blip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.messages import OperatorAlert, idempotency_key
from shared.domain.model import OrderProcess, Outgoing, ProcessState
from shared.domain.workflow import Workflow

FINISHED = (ProcessState.PROCESSED, ProcessState.COMPENSATED, ProcessState.CANCELLED)
"""The states whose claim about the world no later step changes."""

MISMATCH_REASON = "reconciliation-mismatch"
"""The operator alert's reason."""

MAX_QUESTIONS_PER_STEP = 2


class Expect(StrEnum):
    APPLIED = "applied"
    """The step's effect is in place (`Processed`)."""
    UNDONE = "not applied, or undone"
    """No effect left (`Compensated`, `Cancelled`)."""


class Verdict(StrEnum):
    MATCH = "match"
    MISMATCH = "mismatch"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class StepCheck:
    """What one step of a finished order should look like at the agent holding its key."""

    order_id: str
    state: ProcessState
    step: str
    agent: str
    do_key: str
    undo_key: str | None
    expect: Expect


@dataclass(frozen=True)
class Mismatch:
    order_id: str
    state: ProcessState
    step: str
    agent: str
    key: str
    expected: str
    found: str

    @property
    def message(self) -> str:
        return (
            f"{self.state.value} order {self.order_id}: {self.step} at {self.agent}: "
            f"key {self.key} {self.found}, expected {self.expected}"
        )

    def alert(self, failure_count: int, at: datetime) -> Outgoing:
        """One alert per order and key while the broker's duplicate window lasts, so two
        runs (or two instances) finding the same mismatch page the operator once."""
        alert = OperatorAlert(
            order_id=self.order_id,
            reason=MISMATCH_REASON,
            failure_count=failure_count,
            last_error=self.message,
            at=at,
        )
        return alert.outgoing(f"reconcile:{self.key}")


def checks(process: OrderProcess, workflow: Workflow) -> tuple[StepCheck, ...]:
    """The steps of a finished order worth asking about; none for any other state."""
    state = process.state.process_state
    if state not in FINISHED:
        return ()
    expect = Expect.APPLIED if state is ProcessState.PROCESSED else Expect.UNDONE
    found: list[StepCheck] = []
    for step, definition in zip(process.steps, workflow.steps, strict=False):
        if step.agent is None:
            continue
        if expect is Expect.UNDONE and definition.compensation is None:
            continue
        undo = definition.compensation
        found.append(
            StepCheck(
                order_id=process.order_id,
                state=state,
                step=step.name,
                agent=step.agent,
                do_key=idempotency_key(process.order_id, definition.name),
                undo_key=None if undo is None else idempotency_key(process.order_id, undo),
                expect=expect,
            )
        )
    return tuple(found)


def next_key(check: StepCheck, answers: Mapping[str, RemoteOutcome]) -> str | None:
    """The next key to ask the step's agent about, or None once the answers settle it."""
    if check.expect is Expect.APPLIED or check.undo_key is None:
        return None if check.do_key in answers else check.do_key
    if check.undo_key not in answers:
        return check.undo_key
    if answers[check.undo_key].kind is RemoteOutcomeKind.APPLIED:
        return None
    return None if check.do_key in answers else check.do_key


def verdict(check: StepCheck, answers: Mapping[str, RemoteOutcome]) -> Verdict:
    do = answers.get(check.do_key)
    if check.expect is Expect.APPLIED:
        if do is None:
            return Verdict.UNKNOWN
        if do.kind is RemoteOutcomeKind.APPLIED:
            return Verdict.MATCH
        return Verdict.MISMATCH if do.safe_to_move else Verdict.UNKNOWN
    undo = answers.get(check.undo_key) if check.undo_key else None
    if undo is not None and undo.kind is RemoteOutcomeKind.APPLIED:
        return Verdict.MATCH
    undo_missing = undo is not None and undo.safe_to_move
    if do is None:
        return Verdict.UNKNOWN
    if do.safe_to_move:
        return Verdict.MATCH
    if do.kind is RemoteOutcomeKind.APPLIED and (check.undo_key is None or undo_missing):
        return Verdict.MISMATCH
    return Verdict.UNKNOWN


def mismatch(check: StepCheck, answers: Mapping[str, RemoteOutcome]) -> Mismatch | None:
    """The disagreement, worded for the operator, when the verdict is a mismatch."""
    if verdict(check, answers) is not Verdict.MISMATCH:
        return None
    if check.expect is Expect.APPLIED:
        found = _said(answers[check.do_key])
    else:
        undo = answers.get(check.undo_key) if check.undo_key else None
        found = "applied" + (f", its undo key {check.undo_key} {_said(undo)}" if undo else "")
    return Mismatch(
        order_id=check.order_id,
        state=check.state,
        step=check.step,
        agent=check.agent,
        key=check.do_key,
        expected=check.expect.value,
        found=found,
    )


def _said(outcome: RemoteOutcome) -> str:
    if outcome.kind is RemoteOutcomeKind.NEVER_SEEN:
        return "never seen"
    if outcome.kind is RemoteOutcomeKind.NOT_APPLIED:
        return "not applied"
    return outcome.kind.value


@dataclass(frozen=True)
class ReconcileRun:
    """One reconciliation run, kept so the operator page can show the last few."""

    instance: str
    started_at: datetime
    finished_at: datetime
    orders: int
    """Finished orders in the sample, each checked."""
    queries: int
    """Outcome queries sent (at most orders x steps x MAX_QUESTIONS_PER_STEP)."""
    unknown: int
    """Step checks left unknown: no answer, or a call still running."""
    mismatches: tuple[Mismatch, ...]
