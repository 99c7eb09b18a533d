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


KNOWN: tuple[Known, ...] = ()
"""Empty: "A (residual)" (a late apply at a service without abandon, its reply never
coming) is healed in the model by reconciliation, which liveness now runs; core depth 9
on order-fulfilment/hold/no-abandon, where its 9-event trace was found, finds nothing."""


def known(violation: Violation) -> Known | None:
    kinds = signature(violation.trace)
    for entry in KNOWN:
        named = violation.invariant in entry.invariants
        if named and isinstance(kinds, frozenset) and entry.needs in kinds:
            return entry
    return None
