"""A step held back by a limit: the wait is not counted against its complete-by.

An agent whose call must wait for its service's limit (the agent's own `callsPerSecond`
or `maxConcurrent`, or the throttle the service's `429`s set) has not sent that call
yet, so the wait is no fault of the attempt: the step's complete-by moves later by the
time waited. Without this the Supervisor would find the complete-by passed and count a
failure against the order for a quota it has no part in.

Only the wait moves it, not a fresh timeout from each wait: a provider that fails every
call and answers some of them `429` must still meet its step's timeout after the time
its calls actually ran, or the `429`s would keep a failing step alive to the cap.

The live time only grows: a do request sent earlier in the same attempt (one the
service refused with a `429`, or a retry cut by a timeout) is covered by the new live
time too, so no undo or move of the step goes while it may still apply (settle.py).

An undo is held the same way: its timeout is counted against the order like a do's
(recovery.py), and after MaxFailureCount the order would be held in Error with the undo
never sent, for a wait on a quota it has no part in. Its hold moves the complete-by
only: the step's live time is its do key's, which an undo does not carry.

Bounded: never past `hold_max` from the dispatch. A provider that refuses for ever does
not keep an order Processing for ever: past the cap the agent stops, says nothing, and
the Supervisor's timeout and in-doubt path applies as for any other silent attempt.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from shared.domain.machine.heartbeat import move_complete_by, running_step
from shared.domain.machine.transition import ProcessPolicy, Transition
from shared.domain.messages import iso
from shared.domain.model import (
    Action,
    HistoryEntry,
    OrderProcess,
    ProcessState,
    StepRecord,
    StepStatus,
)


def hold_complete_by(
    process: OrderProcess,
    attempt: int,
    step: str,
    waited: timedelta,
    now: datetime,
    policy: ProcessPolicy,
    action: Action = Action.DO,
) -> Transition | None:
    """The call of `step` at `attempt` waited (or will wait) `waited` for a limit: its
    complete-by (and the order's) moves later by that much, at most to the dispatch
    plus `hold_max`.

    None changes nothing and tells the agent it may not count on more time: another
    attempt holds the order, the call is no longer the order's (a do: the step is not
    Running or the order not Processing; an undo: the order is not Compensating that
    step), the complete-by has already passed (the step is the Supervisor's now), or
    the cap leaves nothing to add. A hold sends nothing and keeps the outbox as it is.
    """
    state = process.state
    called = _called(process, attempt, step, action)
    if called is None or waited <= timedelta(0):
        return None
    index, record = called
    if record.dispatched_at is None or record.complete_by is None or record.complete_by <= now:
        return None
    cap = record.dispatched_at + policy.hold_max
    moved = min(record.complete_by + waited, cap)
    if moved <= record.complete_by:
        return None
    undo = action is Action.COMPENSATE
    held = move_complete_by(process, index, moved, now, policy, live=not undo)
    what = f"the undo of {step}" if undo else step
    entry = HistoryEntry(
        at=now,
        event="step-held",
        detail=f"{what}: {record.agent or 'the agent'}'s limit held its call "
        f"{waited.total_seconds():.1f} s; complete-by moves by that to {iso(moved)}, at "
        f"most to {iso(cap)}",
        process_state=state.process_state,
        failure_count=state.failure_count,
        attempt=state.attempt,
    )
    return Transition(held, (), (entry,))


def _called(
    process: OrderProcess, attempt: int, step: str, action: Action
) -> tuple[int, StepRecord] | None:
    """The step whose call of `action` at `attempt` the order still waits for: the fence
    a hold must pass."""
    state = process.state
    if action is Action.DO:
        running = running_step(process, attempt, step)
        return running if state.process_state is ProcessState.PROCESSING else None
    index = state.current_step
    if state.attempt != attempt or state.process_state is not ProcessState.COMPENSATING:
        return None
    if index >= len(process.steps):
        return None
    record = process.steps[index]
    if record.name != step or record.status is StepStatus.RUNNING:
        return None
    return index, record
