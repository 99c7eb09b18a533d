"""Every handler of the order's state machine, in every state it acts in, is reached
by the explorer: a rule (a message or an operator's move) that no exploration takes
in some state is a part of the product the model does not hold, and fails here.

A handler is a rule of shared/domain/machine/ taken in one ProcessState (the state
before) that made a transition. HANDLERS lists them; tests/model/driver.py records
each one an exploration reaches (`REACHED`). The explorations are small: each shipped
workflow under both policies at a small depth, two lean and deeper ones with liveness
(its operator reaches the held orders), everything at a small depth, the ops and
fair bounds (a dropped version held by the Supervisor, bulk actions, reconciliation,
archive, the customer's line), and the late bound (a suspended order's undo answered).
An event kept by an order held in Error is reached only deeper (a held reviewed-order
is 10 events in): docs/explorer.md.
"""

from __future__ import annotations

from shared.domain.model import ProcessState
from tests.model import driver, liveness
from tests.model.explorer import explore
from tests.model.invariants import INVARIANTS, signature
from tests.model.setups import DEFAULT, SETUPS
from tests.model.world import BOUNDS, OrderWorld

LEAN = 10
CORE = 5
OPS = 4
FAIR = 6
LATE = 8
LATE_SETUP = "order-fulfilment/hold/no-abandon"
"""A suspended order's compensation answered: the late bound's operator suspends it."""
HELD = ("order-fulfilment/hold", "scheduled-delivery/compensate")
"""Lean and deep enough to hold an order in Error (liveness's operator then resubmits
and cancels it) and to fire a timer."""
P = ProcessState
HANDLERS: frozenset[tuple[str, ProcessState]] = frozenset(
    {
        ("claim", P.PENDING),
        ("wake", P.PROCESSING),
        ("reply do", P.PENDING),
        ("reply do", P.PROCESSING),
        ("reply do", P.SUSPENDED),
        ("reply do", P.COMPENSATING),
        ("reply undo", P.COMPENSATING),
        ("reply undo", P.SUSPENDED),
        ("recover", P.PENDING),
        ("recover", P.PROCESSING),
        ("recover", P.COMPENSATING),
        ("undelivered", P.PROCESSING),
        ("undelivered", P.COMPENSATING),
        ("cancel", P.PENDING),
        ("cancel", P.PROCESSING),
        ("cancel", P.COMPENSATING),
        ("cancel", P.SUSPENDED),
        ("cancel", P.ERROR),
        ("suspend", P.PENDING),
        ("suspend", P.PROCESSING),
        ("suspend", P.COMPENSATING),
        ("resume", P.SUSPENDED),
        ("resubmit", P.ERROR),
        ("event", P.PENDING),
        ("event", P.PROCESSING),
        ("event", P.COMPENSATING),
        ("event", P.SUSPENDED),
        ("migrate", P.PENDING),
        ("migrate", P.PROCESSING),
        ("heartbeat", P.PROCESSING),
        ("hold", P.PROCESSING),
        ("version gone", P.PENDING),
        ("version gone", P.PROCESSING),
    }
)


def reach() -> set[tuple[str, str]]:
    driver.REACHED.clear()
    for name, setup in SETUPS.items():
        if name.count("/") != 1:
            continue
        explore(OrderWorld(BOUNDS["core"], setup), INVARIANTS, CORE, signature)
    for name in HELD:
        setup = SETUPS[name]
        checks = (*INVARIANTS, liveness.invariant(setup))
        explore(OrderWorld(BOUNDS["lean"], setup), checks, LEAN, signature)
    explore(OrderWorld(BOUNDS["everything"], DEFAULT), INVARIANTS, 5, signature)
    explore(OrderWorld(BOUNDS["ops"], DEFAULT), INVARIANTS, OPS, signature)
    explore(OrderWorld(BOUNDS["fair"], DEFAULT), INVARIANTS, FAIR, signature)
    explore(OrderWorld(BOUNDS["late"], SETUPS[LATE_SETUP]), INVARIANTS, LATE, signature)
    return set(driver.REACHED)


def test_the_explorer_reaches_every_handler_in_every_state_it_acts_in() -> None:
    reached = reach()

    missed = {(rule, state.value) for rule, state in HANDLERS} - reached
    assert not missed, f"handlers the explorer never reached: {sorted(missed)}"
