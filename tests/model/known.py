"""Violations the explorer finds on main whose fix is being made on another branch.

Each entry names the finding of issue #37 it is, the invariants it breaks, and the kind
of event its trace needs (a kind of tests/model/invariants.py `signature`). The
explorer still reports every match, with its shortest trace, but a match does not fail
the suite; anything else does. The lead removes an entry once its fix is merged, and
the explorer then fails if the fix did not cover every trace.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.model.explorer import Violation
from tests.model.invariants import signature


@dataclass(frozen=True)
class Known:
    finding: str
    invariants: frozenset[str]
    needs: str
    """A kind of event every trace of the finding has."""
    what: str


KNOWN: tuple[Known, ...] = (
    Known(
        "A (expired undo)",
        frozenset({"liveness"}),
        "sweep:no-answer",
        "a charge's key expired (its sweep unanswered past its live time), so the cancel's "
        "refund went and found nothing to undo; the charge then applied late, and "
        "reconciliation reads the applied refund key as no effect (docs/in-doubt.md, the "
        "remaining risk): `late 12` on order-fulfilment/hold/no-abandon, 12 events",
    ),
)
""""A (residual)" (a late apply at a service without abandon, its reply never coming) is
healed in the model by reconciliation, which liveness runs; core depth 9 on
order-fulfilment/hold/no-abandon, where its 9-event trace was found, finds nothing. "A
(expired undo)" is the gap docs/in-doubt.md names, first reached by the late bound at
depth 12 (CI runs it at 10, the slow suite at 11)."""


def known(violation: Violation) -> Known | None:
    kinds = signature(violation.trace)
    for entry in KNOWN:
        named = violation.invariant in entry.invariants
        if named and isinstance(kinds, frozenset) and entry.needs in kinds:
            return entry
    return None
