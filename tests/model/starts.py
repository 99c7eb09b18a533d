"""Explorations that start part-way through an order's story.

Some of the machine's rules sit behind a long prefix that nothing about them depends on
(the order's first steps served and answered): a cancel once the pivot runs, a retry
at the second provider after the first was abandoned. Walking that prefix once and
exploring from there spends the depth on what follows, as `ChargeRunning` in
tests/model/test_explorer_sees.py does, where a global bound deep enough to get there
costs thousands of times the states. A walk is a real trace of the same model: each step
is the first event whose label starts with the given text, so a walk that no longer
matches the model fails loudly rather than starting somewhere else.
"""

from __future__ import annotations

from tests.model.setups import DEFAULT, Setup
from tests.model.world import Bounds, OrderWorld, World

CHARGE_RUNNING = ("claim", "serve reserve", "deliver reserve")
"""The reservation done, the charge's request on its way to payment."""
EVENT_KEPT = ("claim", "serve reserve", "event review approved", "deliver reserve")
"""reviewed-order: the approval came before its wait began; the wait's nudge is due."""
SECONDARY_DUE = (
    *CHARGE_RUNNING,
    "time",
    "time",
    "sweep: abandoned, save lost",
    "sweep: no-answer",
    "time",
    "claim",
    "arrive charge-payment@payment #2",
    "deliver charge-payment@payment #2 abandoned",
    "claim",
    "time -> t=35",
    "time -> t=62",
    "time -> t=63",
)
"""`lost-saves`, `order-fulfilment/compensate`: a sweep abandoned the charge's key at
payment and lost its save, the winner heard nothing, the retry at payment met the
abandon (`operation-abandoned`) and moved to payment-secondary, whose request is now
past its complete-by and its ask-at."""


REFUND_FOUND_NOTHING = (
    *CHARGE_RUNNING,
    "arrive charge",
    "cancel",
    "time",
    "time",
    "sweep: no-answer",
    "time",
    "sweep: no-answer",
    "claim",
    "serve refund",
    "deliver refund",
)
"""`order-fulfilment/hold/no-abandon`: the charge held past its live time at payment (no
abandon), a cancel, both sweeps unanswered, so the key expired and the refund went and
found nothing to undo; the charge may still apply late. Its reply makes the Scheduler
send the undo under the heal key (told-late), and reconciliation over the cancelled order
then asks that heal key what it did."""


SECONDARY_SERVED = (
    *CHARGE_RUNNING,
    "arrive charge",
    "time",
    "time",
    "time",
    "sweep: not-applied",
    "time",
    "claim",
    "serve charge",
    "deliver charge",
)
"""`order-fulfilment/hold/no-abandon`: the charge held past its live time at payment (no
abandon), the sweep's answer not applied, the retry served at payment-secondary and its
reply taken; the shipment's request is on its way. Reconciliation over the Processed
order asks payment, the provider the order moved away from, too."""


BACKUP_DUE = (
    "claim",
    "serve reserve",
    "deliver reserve",
    "serve charge",
    "deliver charge",
    "serve create",
    "deliver create",
    "arrive notify",
    "time",
    "time",
    "time",
    "sweep: not-applied",
    "time",
    "claim",
)
"""`setups.RETRIABLE_MOVES`: the notice's request held at `notifications` (no abandon)
past its live time, the sweep's answer not applied, and the retry on its way to
`notifications-backup` under the same key, which may refuse it for good; the operator
then mends the backup and resubmits, the key moves to `:r2`, and the first request may
still apply at `notifications`."""


class Walked(OrderWorld):
    """The model from the state its walk reaches."""

    def __init__(self, bounds: Bounds, setup: Setup = DEFAULT, walk: tuple[str, ...] = ()) -> None:
        super().__init__(bounds, setup)
        self.walk = walk

    def initial(self) -> World:
        world = super().initial()
        for start in self.walk:
            labels = []
            for label, after in self.successors(world):
                if label.startswith(start):
                    world = after
                    break
                labels.append(label)
            else:
                raise AssertionError(f"no event {start!r} among {labels}")
        return world
