"""The one rule for what an outage of our own infrastructure spares an order.

A timeout is not counted when the step's complete-by fell in an outage of the broker or
the state store: the step's time ran out while the system could not carry its request,
its reply or its recovery, so the order is not to blame. A complete-by that passed before
the outage began is the step's own failure (a provider that hung), even when the
Supervisor gets to count it only after the outage; so what decides is the complete-by,
never the moment of the count. docs/contract.md (3.4) states it for operators.

The Supervisor applies it to the outages it witnessed, widened because it sees an outage
a little after it begins and a backlog drains after it ends; the chaos judge applies it
to the outages it caused, as they really were. Both call `spared`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

Window = tuple[datetime, datetime]


def spared(
    complete_by: datetime,
    outages: Iterable[Window],
    *,
    before: timedelta = timedelta(0),
    after: timedelta = timedelta(0),
) -> bool:
    """Whether a step that missed `complete_by` fell in one of the `outages` (from its
    start widened by `before` to its end widened by `after`)."""
    return any(start - before <= complete_by <= end + after for start, end in outages)
