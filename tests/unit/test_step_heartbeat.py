"""Step heartbeats: a running step's complete-by moves with its agent's beats, fenced."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from shared.adapters.clock import FakeClock
from shared.domain import process as machine
from shared.domain.model import OrderProcess, ProcessState, StepStatus
from shared.domain.process import ProcessPolicy
from shared.domain.workflow import ORDER_FULFILMENT
from tests.builders import a_policy, a_reply, an_order

WORKFLOW = ORDER_FULFILMENT
START = FakeClock().now()


def beating_policy(heartbeat: float = 10, step_max: float | None = 300) -> ProcessPolicy:
    return replace(
        a_policy(step_timeout=6),
        step_heartbeat=timedelta(seconds=heartbeat),
        step_max=None if step_max is None else timedelta(seconds=step_max),
    )


def dispatched(policy: ProcessPolicy) -> OrderProcess:
    """An order whose first step went out at START (attempt 1, complete-by START + 6 s)."""
    started = machine.start(an_order("o-1"), WORKFLOW, START)
    claimed = machine.claim(started.process, WORKFLOW, policy, "scheduler-1", START)
    assert claimed is not None
    return replace(claimed.process, etag="etag-1")


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def running_step(process: OrderProcess) -> str:
    return process.steps[process.state.current_step].name


def test_dispatch_records_when_the_step_went_out() -> None:
    process = dispatched(beating_policy())
    step = process.steps[0]
    assert step.status is StepStatus.RUNNING
    assert step.dispatched_at == START
    assert step.complete_by == at(6)


def test_a_beat_moves_the_step_and_the_order_complete_by_and_keeps_the_outbox() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    beat = machine.extend_complete_by(process, 1, running_step(process), at(5), policy)
    assert beat is not None
    step = beat.process.steps[0]
    assert step.complete_by == at(15)
    assert beat.process.state.complete_by == at(15)
    assert step.step_heartbeats == 1
    assert beat.outgoing == ()
    assert beat.process.state.outbox == process.state.outbox
    assert beat.process.state.version == process.state.version + 1
    assert beat.process.etag == process.etag
    assert machine.next_deadline(beat.process, policy) == at(15)


def test_only_the_first_beat_of_an_attempt_is_noted_in_the_history() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    first = machine.extend_complete_by(process, 1, running_step(process), at(5), policy)
    assert first is not None
    assert [h.event for h in first.history] == ["step-heartbeat"]
    second = machine.extend_complete_by(first.process, 1, running_step(process), at(10), policy)
    assert second is not None
    assert second.history == ()
    assert second.process.steps[0].step_heartbeats == 2
    assert second.process.steps[0].complete_by == at(20)


def test_beats_never_extend_past_step_max_from_the_dispatch() -> None:
    policy = beating_policy(heartbeat=10, step_max=12)
    process = dispatched(policy)
    beat = machine.extend_complete_by(process, 1, running_step(process), at(5), policy)
    assert beat is not None
    assert beat.process.steps[0].complete_by == at(12)
    assert beat.process.state.complete_by == at(12)
    at_cap = machine.extend_complete_by(beat.process, 1, running_step(process), at(10), policy)
    assert at_cap is None


def test_without_step_max_beats_change_nothing() -> None:
    policy = beating_policy(step_max=None)
    process = dispatched(policy)
    assert machine.extend_complete_by(process, 1, running_step(process), at(5), policy) is None


def test_a_stale_attempt_changes_nothing() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    step = running_step(process)
    assert machine.extend_complete_by(process, 0, step, at(5), policy) is None
    assert machine.extend_complete_by(process, 2, step, at(5), policy) is None
    assert machine.extend_complete_by(process, 1, "create-shipment", at(5), policy) is None


def test_a_recovered_step_is_not_extended_by_its_old_attempt() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    recovered = machine.recover(process, policy, at(7))
    assert recovered is not None
    assert recovered.process.state.process_state is ProcessState.PENDING
    step = running_step(process)
    assert machine.extend_complete_by(recovered.process, 1, step, at(7.5), policy) is None


def test_a_finished_step_changes_nothing() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    request = next(m for m in process.state.outbox if m.body.get("step") == running_step(process))
    replied = machine.apply_reply(process, WORKFLOW, policy, a_reply(request), at(2))
    assert replied is not None
    done = replace(replied.process, state=replace(replied.process.state, current_step=0))
    assert done.steps[0].status is StepStatus.COMPLETED
    assert machine.extend_complete_by(done, 1, running_step(process), at(3), policy) is None


def test_a_terminal_or_held_order_changes_nothing() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    step = running_step(process)
    for held in (ProcessState.SUSPENDED, ProcessState.ERROR, ProcessState.CANCELLED):
        stopped = replace(process, state=replace(process.state, process_state=held))
        assert machine.extend_complete_by(stopped, 1, step, at(5), policy) is None


def test_a_beat_after_the_complete_by_leaves_the_step_in_doubt() -> None:
    policy = beating_policy()
    process = dispatched(policy)
    assert machine.extend_complete_by(process, 1, running_step(process), at(6), policy) is None
