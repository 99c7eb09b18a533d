"""The net-effect judge (docs/simulator.md): what an order leaves in force at the providers.

Counting ``applied`` cannot see order-of-effects bugs: a refund that came before its
charge found nothing to undo, and the charge that applied after it stays. So the judge
reads the ledger the way a provider's customer would: for each order, step (its do
operation) and service, a do applied and not followed, in ``appliedAt`` order, by an
undo of that key with ``undone: true`` is *in force*. Then

* a ``Processed`` order has every step in force at exactly one service (a step's do may
  be done by one of several services, e.g. ``payment`` and ``payment-secondary``);
* a ``Compensated`` or ``Cancelled`` order has nothing in force anywhere;
* other states are not judged (the order is not finished).

An order may be judged only once no request sent for it can still apply, that is once
every request is past its complete-by: the caller either passes only such orders, or
gives each order its ``settles_at`` and the judge's ``now``, and the orders not yet
settled are returned as ``not_yet`` instead of judged.

Pure and typed: no I/O, the caller reads ``GET /_sim/effects`` (``LedgerEntry.from_json``)
and the orders' states, and passes the workflow's steps (``Step(do, undo)``), so the
simulator does not depend on the application's catalogue.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

NOTHING_IN_FORCE_STATES = frozenset({"Compensated", "Cancelled"})
PROCESSED = "Processed"
_EARLIEST = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True)
class Step:
    """A workflow step as the providers see it: its do operation and the undo, if any."""

    do: str
    undo: str | None = None


@dataclass(frozen=True)
class LedgerEntry:
    """One ``GET /_sim/effects`` entry: one key at one service."""

    service: str
    operation: str
    order_id: str
    idempotency_key: str
    applied: bool
    applied_at: datetime | None = None
    first_call_at: datetime | None = None
    abandoned: bool = False
    undoes: str | None = None
    """A compensation's do key at this service."""
    undone: bool | None = None
    """A compensation's: True when it undid its do, False when it found nothing to undo."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LedgerEntry:
        undone = data.get("undone")
        return cls(
            service=str(data["service"]),
            operation=str(data["operation"]),
            order_id=str(data["orderId"]),
            idempotency_key=str(data["idempotencyKey"]),
            applied=bool(data["applied"]),
            applied_at=_moment(data.get("appliedAt")),
            first_call_at=_moment(data.get("firstCallAt")),
            abandoned=bool(data.get("abandoned", False)),
            undoes=None if data.get("undoes") is None else str(data["undoes"]),
            undone=None if undone is None else bool(undone),
        )

    @property
    def when(self) -> datetime:
        """Where the entry sits in the ledger sequence: applied, else first called."""
        return self.applied_at or self.first_call_at or _EARLIEST

    def describe(self) -> str:
        if self.abandoned:
            status = "abandoned"
        elif not self.applied:
            status = "not applied"
        elif self.undone is True:
            status = f"undid {self.undoes}"
        elif self.undone is False:
            status = f"nothing-to-undo for {self.undoes}"
        else:
            status = "applied"
        at = _iso(self.applied_at) if self.applied_at else f"first call {_iso(self.first_call_at)}"
        return f"{at} {self.service} {self.operation} {self.idempotency_key}: {status}"


@dataclass(frozen=True)
class OrderToJudge:
    order_id: str
    state: str
    """The order's processState: ``Processed``, ``Compensated``, ``Cancelled`` or other."""
    settles_at: datetime | None = None
    """When every request sent for the order is past its complete-by (None: it is)."""


@dataclass(frozen=True)
class InForce:
    step: str
    service: str
    key: str
    applied_at: datetime | None

    def __str__(self) -> str:
        return f"{self.step} at {self.service} (key {self.key}, applied {_iso(self.applied_at)})"


class Problem(StrEnum):
    MISSING_STEP = "missing-step"
    """A Processed order's step is in force nowhere."""
    IN_FORCE_TWICE = "in-force-twice"
    """A Processed order's step is in force at two services (or twice at one)."""
    LEFT_IN_FORCE = "left-in-force"
    """A Compensated or Cancelled order has a step in force."""


@dataclass(frozen=True)
class Violation:
    order_id: str
    state: str
    problem: Problem
    step: str
    in_force: tuple[InForce, ...]
    sequence: tuple[LedgerEntry, ...]
    """The step's ledger entries for the order (dos and undos) in ledger order."""

    def __str__(self) -> str:
        where = "; ".join(str(f) for f in self.in_force) or "nowhere"
        shown = " | ".join(e.describe() for e in self.sequence) or "no ledger entry"
        return (
            f"{self.order_id}: {self.state}, {self.problem.value} {self.step}: in force "
            f"{where}; ledger: {shown}"
        )


@dataclass(frozen=True)
class Verdict:
    judged: tuple[str, ...]
    not_yet: tuple[str, ...]
    """Orders not judged: some request sent for them may still apply."""
    violations: tuple[Violation, ...]

    @property
    def passed(self) -> bool:
        return not self.violations


def in_force(entries: Iterable[LedgerEntry], steps: Sequence[Step]) -> dict[str, list[InForce]]:
    """Per order, each do applied and not undone after it (with ``undone: true``)."""
    do_operations = {s.do for s in steps}
    undo_step = {s.undo: s.do for s in steps if s.undo is not None}
    undone_at: dict[tuple[str, str], list[datetime]] = defaultdict(list)
    dos: list[LedgerEntry] = []
    for e in entries:
        if e.operation in do_operations and e.applied:
            dos.append(e)
        elif e.operation in undo_step and e.applied and e.undone is True:
            do_key = e.undoes or f"{e.order_id}:{undo_step[e.operation]}"
            undone_at[(e.service, do_key)].append(e.when)
    found: dict[str, list[InForce]] = defaultdict(list)
    for do in sorted(dos, key=lambda d: d.when):
        applied = do.when
        if any(at > applied for at in undone_at.get((do.service, do.idempotency_key), ())):
            continue
        found[do.order_id].append(
            InForce(do.operation, do.service, do.idempotency_key, do.applied_at)
        )
    return found


def judge(
    entries: Iterable[LedgerEntry],
    orders: Iterable[OrderToJudge],
    steps: Sequence[Step],
    *,
    now: datetime | None = None,
) -> Verdict:
    """Judge each finished order's net effect; see the module docstring for the rules.

    With ``now``, an order whose ``settles_at`` is later is left out (``not_yet``).
    """
    ledger = tuple(entries)
    forces = in_force(ledger, steps)
    by_order: dict[str, list[LedgerEntry]] = defaultdict(list)
    for e in ledger:
        by_order[e.order_id].append(e)
    judged: list[str] = []
    not_yet: list[str] = []
    violations: list[Violation] = []
    for order in orders:
        if now is not None and order.settles_at is not None and order.settles_at > now:
            not_yet.append(order.order_id)
            continue
        if order.state != PROCESSED and order.state not in NOTHING_IN_FORCE_STATES:
            continue
        judged.append(order.order_id)
        mine = forces.get(order.order_id, [])
        for step in steps:
            here = tuple(f for f in mine if f.step == step.do)
            problem = _problem(order.state, len(here))
            if problem is not None:
                sequence = _sequence(by_order[order.order_id], step)
                violations.append(
                    Violation(order.order_id, order.state, problem, step.do, here, sequence)
                )
    return Verdict(tuple(judged), tuple(not_yet), tuple(violations))


def _problem(state: str, in_force: int) -> Problem | None:
    if state == PROCESSED:
        if in_force == 0:
            return Problem.MISSING_STEP
        return Problem.IN_FORCE_TWICE if in_force > 1 else None
    return Problem.LEFT_IN_FORCE if in_force else None


def _sequence(entries: Iterable[LedgerEntry], step: Step) -> tuple[LedgerEntry, ...]:
    operations = {step.do, step.undo}
    return tuple(sorted((e for e in entries if e.operation in operations), key=lambda e: e.when))


def _moment(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value))


def _iso(moment: datetime | None) -> str:
    if moment is None:
        return "never"
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
