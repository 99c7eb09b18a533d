"""Every interleaving of one order's life up to a depth, on the real domain code, in
every setup generated from catalogue.json (tests/model/setups.py).

The CI bounds run in seconds; the deep bounds are marked slow and print their figures
(`.venv/bin/pytest tests/model -m slow -s`). `python -m tests.model core 10 --setup
NAME` prints one bound's figures and every trace without pytest. All of them assert
that no invariant of tests/model/invariants.py, and no liveness check
(tests/model/liveness.py), is violated, but for the known findings whose fixes are on
their way (tests/model/known.py, reported, not failed), and on failure print each
violation's shortest trace (see tests/model/report.py).
"""

from __future__ import annotations

import time

import pytest

from shared.domain.model import ExhaustedPolicy
from shared.domain.workflow import StepKind
from tests.model import liveness, report, starts
from tests.model.explorer import explore
from tests.model.invariants import INVARIANTS, signature
from tests.model.known import known
from tests.model.setups import DEFAULT, RETRIABLE_MOVES, SETUPS, Setup
from tests.model.test_explorer_sees import HELD_DEPTH, TOLD_DEPTH, late_after_nothing
from tests.model.world import BOUNDS, Bounds, OrderWorld
from tests.workflows import CATALOGUE

CORE = BOUNDS["core"]
"""Replies, rejections, sweeps with every truthful answer, two operator moves, a drain,
events, a late apply: depth 8 takes a whole order through to Processed."""
FAILED_SENDS = BOUNDS["failed-sends"]
"""Sends failing after the request went out or before it, then `undelivered`."""
EVERYTHING = BOUNDS["everything"]
"""Duplicated and lost replies, step heartbeats and limit holds as well."""
OPS = BOUNDS["ops"]
"""A dropped version, bulk actions, reconciliation, archive and the id sent again, an
operator's approval, a sweep in our own outage, and a neighbour order's keys."""
FAIR = BOUNDS["fair"]
"""The order waits in its customer's line behind another of its orders; on
reviewed-order, its review event may come while it waits, before or after its promotion
(the watch entry a promotion moved up must stay, test_explorer_sees)."""
LATE = BOUNDS["late"]
"""A late apply at a service without abandon, its reply coming after the key was settled,
with a declined charge, an unanswered sweep and one operator move: the Scheduler's
late-answer rules (machine/forward.py `_late_do`, `_late_failure`,
`_applied_after_settled`, `_undo_extra`) and reconciliation's mismatches."""
LATE_FAR = BOUNDS["late-far"]
"""As LATE without the declines, the unanswered sweeps and the operator: the late reply
arriving after the retry went to the other provider (`applied-at-two-providers`)."""
LATE_SETUP = "order-fulfilment/hold/no-abandon"
INTAKE = BOUNDS["intake"]
"""The intake's choice: claimed at its insert (its sends going out, or the intake dying
first) or nudged, for a client of every status and one of the final status only."""
REFUSALS = BOUNDS["refusals"]
"""A retriable step or an undo refused for good (then mended once the order is held),
with a declined charge and one cancel or resubmit: the order held at once with its
alert, and one action reaching the right end once the provider is mended."""
REFUSALS_SETUP = "express-delivery/hold"
"""A retriable step past the pivot, and undos: release and refund."""
OPS_DEPTH = 4
OPS_SETUPS = ("order-fulfilment/compensate/no-abandon", "reviewed-order/hold")
"""One with a service without abandon, one with an approval (the operator's route)."""
SMALL = {"": 5, "no-abandon": 4, "shared-keys": 4}
"""Each setup's depth in CI: as shipped, and the variants."""


def _small(name: str) -> int:
    """reviewed-order's events branch widely: one level less keeps CI fast."""
    depth = SMALL[name.rsplit("/", 1)[-1] if name.count("/") == 2 else ""]
    return depth - 1 if name.startswith("reviewed-order/") and depth > 4 else depth


CI = [
    pytest.param("core", CORE, DEFAULT, 7, id="core-depth-7"),
    pytest.param("failed-sends", FAILED_SENDS, DEFAULT, 4, id="failed-sends-depth-4"),
    *(
        pytest.param("core", CORE, s, _small(n), id=f"{n}-depth-{_small(n)}")
        for n, s in SETUPS.items()
    ),
    *(
        pytest.param("ops", OPS, SETUPS[n], OPS_DEPTH, id=f"ops-{n}-depth-{OPS_DEPTH}")
        for n in OPS_SETUPS
    ),
    pytest.param("fair", FAIR, DEFAULT, 6, id="fair-depth-6"),
    pytest.param("fair", FAIR, SETUPS["reviewed-order/hold"], 4, id="fair-reviewed-depth-4"),
    pytest.param("late", LATE, SETUPS[LATE_SETUP], 10, id="late-depth-10"),
    pytest.param("late-far", LATE_FAR, SETUPS[LATE_SETUP], 12, id="late-far-depth-12"),
    pytest.param("large", BOUNDS["large"], SETUPS[LATE_SETUP], 9, id="large-depth-9"),
    pytest.param("intake", INTAKE, DEFAULT, 7, id="intake-depth-7"),
    pytest.param("intake", INTAKE, SETUPS["reviewed-order/hold"], 5, id="intake-reviewed-depth-5"),
    pytest.param("refusals", REFUSALS, SETUPS[REFUSALS_SETUP], 9, id="refusals-depth-9"),
]
WALKED = [
    pytest.param(
        "pivot",
        BOUNDS["pivot"],
        SETUPS["express-delivery/hold"],
        4,
        starts.CHARGE_RUNNING,
        id="pivot-from-charge-running-depth-4",
    ),
    pytest.param(
        "lost-saves",
        BOUNDS["lost-saves"],
        SETUPS["order-fulfilment/compensate"],
        6,
        starts.SECONDARY_DUE,
        id="lost-saves-from-secondary-due-depth-6",
    ),
    pytest.param(
        "lost-saves",
        BOUNDS["lost-saves"],
        SETUPS["order-fulfilment/hold/shared-keys"],
        6,
        starts.CHARGE_RUNNING,
        id="lost-saves-shared-keys-from-charge-running-depth-6",
    ),
    pytest.param(
        "early-event",
        BOUNDS["early-event"],
        SETUPS["reviewed-order/hold"],
        5,
        starts.EVENT_KEPT,
        id="early-event-from-event-kept-depth-5",
    ),
    pytest.param(
        "late",
        LATE,
        SETUPS[LATE_SETUP],
        8,
        starts.REFUND_FOUND_NOTHING,
        id="late-from-refund-found-nothing-depth-8",
    ),
    pytest.param(
        "late",
        LATE,
        SETUPS[LATE_SETUP],
        6,
        starts.SECONDARY_SERVED,
        id="late-from-secondary-served-depth-6",
    ),
    pytest.param(
        "rekey-late",
        BOUNDS["rekey-late"],
        RETRIABLE_MOVES,
        9,
        starts.BACKUP_DUE,
        id="rekey-late-from-backup-due-depth-9",
    ),
]
"""Rules behind a long prefix, explored from a walked start (tests/model/starts.py):
a cancel refused past express-delivery's pivot and a reply that dispatches a step whose
agent is drained; a key abandoned by a sweep whose save lost, met by the retry
(`operation-abandoned`) at one provider and then at the last one (no provider left);
a shared key space's retry, which no agent pins; an event kept before its wait began,
taken by the Supervisor when the wait's nudge is late; reconciliation over an order
whose heal was served, asking the heal key, and over a Processed order whose retry
moved to payment-secondary, asking payment too (`reconcile._held`, `_settled`); and a
notice whose first key, settled not applied by time at `notifications`, was refused at
`notifications-backup`, mended and resubmitted under `:r2`, then applied late at
`notifications` (`forward._earlier_round`, `Expect.EARLIER`; depth 9 takes it to the late
reply taken by the Processed order): a run from the order's start reaches none of them
within the CI bounds."""
DEEP = [
    pytest.param("core", CORE, DEFAULT, 12, id="core-depth-12"),
    pytest.param("failed-sends", FAILED_SENDS, DEFAULT, 8, id="failed-sends-depth-8"),
    pytest.param("everything", EVERYTHING, DEFAULT, 7, id="everything-depth-7"),
    *(pytest.param("core", CORE, s, 9, id=f"{n}-depth-9") for n, s in SETUPS.items()),
    *(
        pytest.param("deep", BOUNDS["deep"], s, 16, id=f"{n}-deep-16")
        for n, s in SETUPS.items()
        if n.count("/") == 1
    ),
    *(pytest.param("ops", OPS, s, 8, id=f"ops-{n}-depth-8") for n, s in SETUPS.items()),
    pytest.param("fair", FAIR, DEFAULT, 10, id="fair-depth-10"),
    *(
        pytest.param("intake", INTAKE, s, 9, id=f"intake-{n}-depth-9")
        for n, s in SETUPS.items()
        if n.count("/") == 1
    ),
    *(
        pytest.param("late", LATE, s, 11, id=f"late-{n}-depth-11")
        for n, s in SETUPS.items()
        if n.endswith("/no-abandon")
    ),
    *(
        pytest.param("refusals", REFUSALS, s, 11, id=f"refusals-{n}-depth-11")
        for n, s in SETUPS.items()
        if n.count("/") == 1
    ),
]


def check(name: str, bounds: Bounds, setup: Setup, depth: int, walk: tuple[str, ...] = ()) -> None:
    model = starts.Walked(bounds, setup, walk) if walk else OrderWorld(bounds, setup)
    invariants = (*INVARIANTS, liveness.invariant(setup))
    started = time.perf_counter()
    found = explore(model, invariants, depth, signature)
    seconds = time.perf_counter() - started
    figures = report.figures(f"{name} {setup.name}", found, depth, seconds)
    print(figures)
    expected = {k: v for k, v in found.violations.items() if known(v) is not None}
    for violation in expected.values():
        entry = known(violation)
        assert entry is not None
        print(f"  known finding {entry.finding}: {report.trace(model, violation)}")
    new = {k: v for k, v in found.violations.items() if k not in expected}
    if new:
        found.violations = new
        pytest.fail(f"{figures}\n\n{report.traces(model, found)}", pytrace=False)


@pytest.mark.parametrize(("name", "bounds", "setup", "depth"), CI)
def test_no_interleaving_breaks_an_invariant(
    name: str, bounds: Bounds, setup: Setup, depth: int
) -> None:
    check(name, bounds, setup, depth)


@pytest.mark.parametrize(("name", "bounds", "setup", "depth", "walk"), WALKED)
def test_no_interleaving_from_a_walked_start_breaks_an_invariant(
    name: str, bounds: Bounds, setup: Setup, depth: int, walk: tuple[str, ...]
) -> None:
    check(name, bounds, setup, depth, walk)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "bounds", "setup", "depth"), DEEP)
def test_no_interleaving_breaks_an_invariant_deep(
    name: str, bounds: Bounds, setup: Setup, depth: int
) -> None:
    check(name, bounds, setup, depth)


def test_a_charge_applied_after_its_refund_found_nothing_is_healed() -> None:
    """From the charge running at payment (no abandon), a cancel, the sweep's every
    answer and one late apply (`test_explorer_sees.ChargeRunning`), with liveness."""
    assert late_after_nothing() == []


def test_a_late_charge_after_its_refund_found_nothing_is_undone_when_its_reply_comes() -> None:
    """The refund's nothing-to-undo settles the charge's key not applied, so the charge's
    late success is undone at once under the heal key (told-late), not left to
    reconciliation's sample."""
    assert late_after_nothing(TOLD_DEPTH, live=False) == []


@pytest.mark.slow
def test_a_late_charge_on_an_order_held_for_an_operator_is_alerted() -> None:
    """Held in Error at the charge, or releasing the inventory after the cancel skipped
    it, with the charge's key settled not applied; then the charge applies late:
    reconciliation of the held order alerts (healed), and liveness still finds a right
    end (50,306 states)."""
    assert late_after_nothing(HELD_DEPTH) == []


def test_the_setups_hold_every_shipped_workflow_step_kind_and_policy() -> None:
    """A workflow, a step kind or a policy added to the product without the model
    holding it fails here, so the model cannot silently fall behind again."""
    workflows = {s.workflow.name for s in SETUPS.values()}
    kinds = {k for s in SETUPS.values() for k in s.kinds}
    policies = {s.policy.exhausted_policy for s in SETUPS.values()}
    approvals = any(st.approval for s in SETUPS.values() for st in s.workflow.steps)

    assert workflows == set(CATALOGUE.names)
    assert kinds == set(StepKind)
    assert policies == set(ExhaustedPolicy)
    assert approvals
    assert any(not s.abandons(a) for s in SETUPS.values() for a in s.agents)
    assert any(s.spaces for s in SETUPS.values())
