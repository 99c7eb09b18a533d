"""An operation its provider refused for good goes again under a fresh key.

A provider that refused a key for good keeps that answer for the key and replays it to
every repeat (the simulator does, as most payment APIs do with an idempotency key), so
once the provider is mended (a card, an account, a configuration) the same key would
still meet the same refusal and the order would stay held for good. A key refused for
good is settled not applied for good: a permanent refusal never applies later, so a new
key cannot make a second effect. So the operator's move that sends the refused
operation again (a resubmit, or a cancel of an order held in compensation) sends it
under the step's next round of that key (`messages.idempotency_key`).

Only a refusal for good moves a key (`StepRecord.refused`, set where the Scheduler
takes the refusal, machine/forward.py). A key in doubt, a timeout or no answer, keeps
its own: the provider may have applied it, and answering the repeat from its record is
what the key is for. docs/in-doubt.md, "An operation refused for good".
"""

from __future__ import annotations

from shared.domain.machine.transition import Builder
from shared.domain.messages import idempotency_key
from shared.domain.model import Action, Phase, StepRecord
from shared.domain.workflow import Workflow


def rekey_refused(b: Builder, workflow: Workflow | None) -> str:
    """Move the key of the current step's operation, when its provider refused that key
    for good and the order is about to send it again: the do of a step held going
    forward, or the undo of a held compensation. Returns the words for the history of
    the move that sends it ("" when no key moved), naming both keys when the workflow
    is known."""
    index = b.state.current_step
    if index >= len(b.steps):
        return ""
    step = b.steps[index]
    undo = b.state.phase is Phase.COMPENSATE
    if step.refused is not (Action.COMPENSATE if undo else Action.DO):
        return ""
    before = step.undo_round if undo else step.do_round
    if undo:
        b.set_step(index, undo_round=before + 1, refused=None)
    else:
        rekeyed_at = (*step.rekeyed_at, b.state.attempt)
        b.set_step(index, do_round=before + 1, refused=None, rekeyed_at=rekeyed_at)
    what = f"compensation of {step.name}" if undo else step.name
    operation = workflow.operation(step.name, undo) if workflow is not None else None
    if operation is None:
        return f"{what} refused for good: sent again under a fresh key"
    order_id = b.order.order_id
    old, new = (idempotency_key(order_id, operation, r) for r in (before, before + 1))
    return f"{what} refused for good under {old}: sent again under {new}"


def round_of(step: StepRecord, attempt: int) -> int:
    """The do round a request of the claim's `attempt` carried: each resubmit that moved
    the key did so at the attempt the order was held at (`rekeyed_at`), and every request
    of the round before went out at or before it; the next claim sends the new round.
    Rounds moved before `rekeyed_at` was kept are not dated: read as the current one."""
    undated = step.do_round - len(step.rekeyed_at)
    return undated + sum(1 for moved in step.rekeyed_at if attempt > moved)
