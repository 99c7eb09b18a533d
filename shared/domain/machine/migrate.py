"""An operator moves an in-flight order from the workflow version it runs on to another.

Only when what the order has done so far means the same in both versions: every step
it started (or passed) is, at the same index, the same step in all but its timeout,
alternatives and results (the same agent, kind, undo and inputs, and for a wait the same
event, approval, timer and deadline policy). The rest of the order then runs on the
target version as if it had started there; nothing is sent (the order continues on its
next claim, or as it was: a running step's answer, a Pending order's nudge, the
Supervisor's watch).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

from shared.domain.machine.transition import Builder, InvalidTransition, Transition
from shared.domain.model import OrderProcess, StepRecord, StepStatus
from shared.domain.workflow import StepDefinition, Workflow


class IncompatibleVersions(InvalidTransition):
    """The order's steps done so far are not the same in the target version."""

    code = "incompatible-versions"


def done_so_far(process: OrderProcess) -> int:
    """How many leading steps the order has started or passed: every step before its
    current one, and every step with a status or an attempt (a running, failed, in-doubt
    or compensated step), up to the last such."""
    done = min(process.state.current_step, len(process.steps))
    for index, record in enumerate(process.steps):
        if record.status is not StepStatus.NOT_STARTED or record.attempts > 0:
            done = max(done, index + 1)
    return done


def _meaning(step: StepDefinition) -> StepDefinition:
    """All but what two versions of a done step may say differently: how long a try may
    take, where else it may go, what it offers later steps. Everything else (agent, kind,
    undo, inputs, what a wait waits for and what its complete-by does, `retryElsewhere`'s key
    space) is what the step meant when the order took it; a field added later counts too."""
    return replace(step, timeout_seconds=None, alternatives=(), results=())


def _same(a: StepDefinition, b: StepDefinition) -> bool:
    return _meaning(a) == _meaning(b)


def incompatibility(process: OrderProcess, source: Workflow, target: Workflow) -> str | None:
    """Why the order cannot move from `source` to `target`, or None when it can."""
    state = process.state
    if state.process_state.is_final:
        return f"order {process.order_id} is {state.process_state.value}: nothing to migrate"
    if (source.name, source.version) == (target.name, target.version):
        return f"order {process.order_id} already runs on {target.name} v{target.version}"
    if source.name != target.name:
        return f"order {process.order_id} runs {source.name}, not {target.name}"
    done = done_so_far(process)
    for index in range(done):
        if index >= len(target.steps):
            return (
                f"order {process.order_id} has done {done} steps; "
                f"v{target.version} has only {len(target.steps)}"
            )
        if index >= len(source.steps) or not _same(source.steps[index], target.steps[index]):
            ours = source.steps[index].name if index < len(source.steps) else "?"
            return (
                f"order {process.order_id}: step {index + 1} ({ours}) it has done so far "
                f"differs in v{target.version} ({target.steps[index].name})"
            )
    return None


def migrate(
    process: OrderProcess,
    source: Workflow,
    target: Workflow,
    now: datetime,
    operator: str = "operator",
    cause: str | None = None,
) -> Transition:
    """The order runs on `target` from now on: its step records for the steps done so
    far stay as they are, the target's other steps start fresh. Sends nothing and keeps
    the outbox (a message not yet sent must still be resent)."""
    reason = incompatibility(process, source, target)
    if reason is not None:
        if process.state.process_state.is_final:
            raise InvalidTransition(reason)
        raise IncompatibleVersions(reason)
    done = done_so_far(process)
    b = Builder(process, now, cause)
    b.steps = [
        *process.steps[:done],
        *(StepRecord(name=definition.name) for definition in target.steps[done:]),
    ]
    b.set(workflow_version=target.version)
    b.note("migrated", f"from v{source.version} to v{target.version} by {operator}")
    built = b.build()
    kept = replace(
        built.process.state,
        outbox=process.state.outbox,
        outbox_cause=process.state.outbox_cause,
    )
    return replace(built, process=replace(built.process, state=kept))
