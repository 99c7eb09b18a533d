"""An order waiting in its customer's line (docs/fairness.md): the machine's side of the
fair share. The intake takes the nudge out of a waiting order's submission, the
Supervisor tells a waiting order from a lost nudge and holds it in place, and a
promotion nudges the next in line. Who waits and who runs is decided by the pure
customer arithmetic of shared/domain/fairness.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from shared.domain.fairness import Promoted
from shared.domain.machine.transition import Transition
from shared.domain.messages import Nudge
from shared.domain.model import HistoryEntry, OrderProcess, Outgoing, ProcessState

HOLD = timedelta(minutes=10)
"""How long an order waits in its customer's line before the Supervisor nudges it anyway:
the safety net if the chain of promotions breaks (a crash between an order's end and the
nudge of the next in line). Long, because each expiry is a claim that skips the line."""


def wait_in_line(transition: Transition, now: datetime, hold: timedelta = HOLD) -> Transition:
    """The submission's transition without its nudge: the order stays Pending until a
    promotion nudges it, or its hold passes and the Supervisor does (next_complete_by reads
    a Pending order's complete_by)."""
    process = transition.process
    kept = tuple(m for m in transition.outgoing if not _is_nudge(m, process.order_id))
    state = replace(process.state, outbox=kept, complete_by=now + hold)
    note = HistoryEntry(
        at=now,
        event="waiting-for-fair-share",
        detail="behind this customer's running orders",
        process_state=state.process_state,
        failure_count=state.failure_count,
        attempt=state.attempt,
    )
    return replace(
        transition,
        process=replace(process, state=state),
        outgoing=kept,
        history=(*transition.history, note),
    )


def in_line(process: OrderProcess) -> bool:
    """Waiting in its customer's line: Pending with no nudge of its own in its outbox
    (every other Pending state keeps the nudge that will bring it to the Scheduler)."""
    state = process.state
    if state.process_state is not ProcessState.PENDING or state.complete_by is None:
        return False
    return not any(_is_nudge(m, process.order_id) for m in state.outbox)


def promotion(promoted: Promoted) -> Outgoing:
    """The nudge of the next order in line, on its own lane. One id per order: a
    promotion repeated after a crash is dropped by the broker's duplicate detection."""
    message = Nudge(promoted.order_id, "fair-share").outgoing(0, high=promoted.high)
    return replace(message, message_id=f"nudge:{promoted.order_id}:fair-share")


def released(process: OrderProcess, now: datetime) -> OrderProcess:
    """An order in line whose promotion the ledger has made but whose nudge has not
    brought it to the Scheduler: its hold is over, so the Supervisor's recovery nudges
    it now (machine.recover renudges a Pending order past its complete-by)."""
    return replace(process, state=replace(process.state, complete_by=now))


def held_until(process: OrderProcess, now: datetime, hold: timedelta = HOLD) -> datetime:
    """When the Supervisor looks again at an order still in its customer's line: at its
    hold, or, once that has passed, a new hold from now (nudging it would skip the line)."""
    complete_by = process.state.complete_by
    return complete_by if complete_by is not None and complete_by > now else now + hold


def _is_nudge(message: Outgoing, order_id: str) -> bool:
    return message.message_id.startswith(f"nudge:{order_id}:")
