"""What a compensation does at a provider: undo its do, or find nothing to undo.

Real providers order things: a refund needs its charge. So an undo applies only against
its do applied (``undone: true``); while a call with the do's key is still running the
undo cannot be decided (the caller answers 409 ``operation-in-progress``); otherwise
(never seen, rejected, failed before applying, abandoned) it settles as
``nothing-to-undo`` and does not stop the do from applying later. That last case is the
hazard the net-effect judge (``judge.py``) exists to catch.
"""

from __future__ import annotations

from typing import Any, Final

from devhost.simulator.effects import Outcome, OutcomeKind
from devhost.simulator.state import SimulatorState

NOTHING_TO_UNDO: Final[dict[str, Any]] = {"undone": False, "reason": "nothing-to-undo"}


def undo_outcome(
    state: SimulatorState, service: str, do_key: str, result: dict[str, Any]
) -> Outcome | None:
    """The outcome of a compensation of ``do_key`` at ``service``, with ``result`` its
    result if it undoes; None while a call with the do's key is running there."""
    do = state.ledger.get(service, do_key)
    if do is not None and do.outcome is not None and do.outcome.kind is OutcomeKind.APPLIED:
        return Outcome(OutcomeKind.APPLIED, result, undone=True)
    if (do is None or do.outcome is None) and state.in_progress.running(service, do_key):
        return None
    return Outcome(OutcomeKind.APPLIED, dict(NOTHING_TO_UNDO), undone=False)
