"""The one rule that keeps money from being left behind, written once.

Every do request sent is live until its complete-by plus the clock-skew margin: until
then its provider may still apply it, whatever the order has decided since. So, while a
step's request is live and its key unsettled:

- no undo of that step is sent (a provider applies an undo only against an applied do,
  so an early undo finds nothing, and the do applies after it);
- no do of that step goes to another provider (the first may still apply too).

A key settles only on evidence: a reply (success: applied; permanent failure: not
applied), the provider's answer to a query or an abandon, or the live time passing with
the provider saying it never applied the key. Resume, undelivered, cancel and resubmit
never erase that evidence or the live time.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from shared.domain.in_doubt import RemoteOutcome, RemoteOutcomeKind
from shared.domain.model import KeyState, StepRecord, StepStatus
from shared.domain.workflow import AgentName, StepDefinition, StepKind, Workflow


class Undo(StrEnum):
    """What a compensation does with one step."""

    SEND = "send"
    """The do applied, or no request can still apply it: the undo finds what it needs."""
    SKIP = "skip"
    """Nothing was ever applied: no undo (a provider would pay out what it never took)."""
    WAIT = "wait"
    """A request is live and unsettled: wait for its answer, its abandon, or its end."""


def live(step: StepRecord, now: datetime) -> bool:
    """May a do request of this step still apply at its provider?"""
    return key_state(step) in (KeyState.UNSETTLED, KeyState.EXPIRED) and (
        step.live_until is not None and now < step.live_until
    )


def undo_of(step: StepRecord, definition: StepDefinition, now: datetime) -> Undo:
    if definition.compensation is None or step.status is StepStatus.COMPENSATED:
        return Undo.SKIP
    state = key_state(step)
    if step.status is StepStatus.RUNNING or state is KeyState.UNSETTLED:
        return Undo.WAIT
    if state in (KeyState.APPLIED, KeyState.EXPIRED) or step.status is StepStatus.COMPLETED:
        return Undo.SEND
    return Undo.SKIP


def pinned(step: StepRecord, definition: StepDefinition) -> AgentName | None:
    """The agent a retry must stay with: the one whose key may still apply, unless the
    candidates share one key space (then a move cannot apply it twice)."""
    if step.agent is None or key_state(step) not in (KeyState.UNSETTLED, KeyState.EXPIRED):
        return None
    if definition.retry_elsewhere:
        return None
    return AgentName(step.agent)


def open_candidates(step: StepRecord, definition: StepDefinition) -> tuple[AgentName, ...]:
    """The agents a do of this step may go to: never one where its key was abandoned."""
    return tuple(c for c in definition.candidates if c not in step.abandoned_at)


def key_state(step: StepRecord) -> KeyState:
    """The step's key state; a step stored before key states were kept, dispatched and
    not completed, counts as unsettled (with no live time known, so not live)."""
    if step.key_state is KeyState.UNSENT and step.attempts > 0:
        return KeyState.APPLIED if step.status is StepStatus.COMPLETED else KeyState.UNSETTLED
    return step.key_state


def undone_by(step: StepRecord, found_nothing: bool) -> KeyState:
    """The do key once its undo applied (a reply, or the Supervisor's answer). An undo
    goes only once no request of the do can still apply, so one that found nothing to
    undo is the provider's word that the do had not applied: an unsettled key settles
    not applied, as a sweep's "not applied" past the live time would. A success of the
    do after that is an effect in force nothing undid (`forward._late_do`)."""
    if found_nothing and not key_state(step).settled:
        return KeyState.NOT_APPLIED
    return step.key_state


def settled_by(step: StepRecord, outcome: RemoteOutcome, now: datetime) -> KeyState:
    """What an answer about the step's do key proves. "Not applied" is final only once no
    request sent with the key can still apply, or once the key was abandoned; no answer
    past that time leaves the key expired (an undo is then safe, a move is not)."""
    kind = outcome.kind
    if kind is RemoteOutcomeKind.APPLIED:
        return KeyState.APPLIED
    if kind is RemoteOutcomeKind.ABANDONED:
        return KeyState.NOT_APPLIED
    current = key_state(step)
    if current.settled or live(step, now) or kind is RemoteOutcomeKind.IN_PROGRESS:
        return current
    return KeyState.NOT_APPLIED if outcome.safe_to_move else KeyState.EXPIRED


def past_pivot(steps: Sequence[StepRecord], workflow: Workflow) -> bool:
    """May the order's pivot have taken effect? From then on nothing is undone: its
    effect stays, so the order can only go forward (a cancel is refused, a failure is
    held for an operator). A pivot whose key is unsent or settled not-applied is not
    passed."""
    index = workflow.pivot
    if index is None or index >= len(steps):
        return False
    step = steps[index]
    return step.status is StepStatus.COMPLETED or key_state(step) not in (
        KeyState.UNSENT,
        KeyState.NOT_APPLIED,
    )


def forward_only(steps: Sequence[StepRecord], workflow: Workflow, index: int) -> bool:
    """Must a failure at step `index` be held rather than compensated? Yes for a
    retriable step (it is retried until it succeeds) and for any step once the pivot
    may have applied."""
    if index < len(workflow.steps) and workflow.steps[index].kind is StepKind.RETRIABLE:
        return True
    return past_pivot(steps, workflow)
