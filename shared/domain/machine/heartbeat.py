"""Step heartbeats: an agent whose remote call is still running keeps its step alive.

The beat moves the step's complete-by, and so its request's live time too: the call
the beat speaks for may apply as late as the new complete-by plus the skew margin.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from shared.domain.machine.transition import ProcessPolicy, Transition
from shared.domain.messages import iso
from shared.domain.model import HistoryEntry, OrderProcess, ProcessState, StepRecord, StepStatus


def extend_complete_by(
    process: OrderProcess,
    attempt: int,
    step: str,
    now: datetime,
    policy: ProcessPolicy,
) -> Transition | None:
    """A step heartbeat: the agent of `step` at `attempt` is still running its call, so
    the step's complete-by and the order's move to now + StepHeartbeatSeconds, never past
    StepMaxSeconds from the dispatch.

    None changes nothing and tells the agent to stop beating: another attempt holds the
    order, the step is no longer Running (answered, recovered), the order is Pending,
    held or finished, the complete-by has already passed (the step is in doubt, the
    Supervisor's to resolve), or the cap leaves nothing to extend. A beat sends nothing
    and keeps the outbox as it is (a dispatch message not yet sent must still be resent),
    and only the first beat of an attempt is noted in the history; the rest are counted.
    """
    state = process.state
    running = running_step(process, attempt, step)
    if running is None:
        return None
    index, record = running
    if state.process_state not in (ProcessState.PROCESSING, ProcessState.COMPENSATING):
        return None
    if policy.step_max is None or record.dispatched_at is None or record.complete_by is None:
        return None
    if record.complete_by <= now:
        return None
    cap = record.dispatched_at + policy.step_max
    extended = min(now + policy.step_heartbeat, cap)
    if extended <= record.complete_by:
        return None
    beats = record.step_heartbeats + 1
    extended_process = move_complete_by(
        process, index, extended, now, policy, step_heartbeats=beats
    )
    history: tuple[HistoryEntry, ...] = ()
    if beats == 1:
        history = (
            HistoryEntry(
                at=now,
                event="step-heartbeat",
                detail=f"{step}: {record.agent or 'the agent'} still runs its call; complete-by "
                f"moves with its heartbeats, at most to {iso(cap)}",
                process_state=state.process_state,
                failure_count=state.failure_count,
                attempt=state.attempt,
            ),
        )
    return Transition(extended_process, (), history)


def running_step(process: OrderProcess, attempt: int, step: str) -> tuple[int, StepRecord] | None:
    """The step of `attempt` while it runs: the fence an agent's own write must pass, or
    None (another attempt holds the order, or the step was answered or recovered)."""
    index = process.state.current_step
    if process.state.attempt != attempt or index >= len(process.steps):
        return None
    record = process.steps[index]
    if record.name != step or record.status is not StepStatus.RUNNING:
        return None
    return index, record


def move_complete_by(
    process: OrderProcess,
    index: int,
    to: datetime,
    now: datetime,
    policy: ProcessPolicy,
    *,
    live: bool = True,
    **changes: object,
) -> OrderProcess:
    """The step's complete-by and the order's moved later to `to`; the request's live time
    follows it and never shrinks. Sends nothing and keeps the outbox as it is. Without
    `live` (an undo's call) the live time stays: it is the do key's, which the undo's
    request does not carry."""
    record = process.steps[index]
    steps = list(process.steps)
    live_until = record.live_until
    if live:
        live_until = max(record.live_until or to, to + policy.clock_skew)
    steps[index] = replace(record, complete_by=to, live_until=live_until, **changes)  # type: ignore[arg-type]
    state = process.state
    order_by = to if state.complete_by is None else max(state.complete_by, to)
    moved = replace(state, version=state.version + 1, updated_at=now, complete_by=order_by)
    return OrderProcess(process.order, moved, tuple(steps), process.etag)
