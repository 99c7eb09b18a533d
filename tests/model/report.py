"""Printing what the explorer found: figures, and each violation's shortest trace event
by event with what the order did and the services' ledger after it."""

from __future__ import annotations

from tests.model import driver
from tests.model.explorer import Report, Violation, replay
from tests.model.world import OrderWorld


def figures(name: str, report: Report, depth: int, seconds: float) -> str:
    found = ", ".join(f"{k}: {v}" for k, v in sorted(report.counts.items())) or "none"
    complete = " (every reachable state)" if report.complete else ""
    return (
        f"{name}: depth {report.depth}/{depth}{complete}, {report.states:,} states, "
        f"{report.transitions:,} transitions, {seconds:.1f} s; per level {report.levels}; "
        f"violating edges: {found}"
    )


def trace(model: OrderWorld, violation: Violation) -> str:
    lines = [
        f"[{violation.invariant}] {violation.message}",
        f"  shortest trace, {len(violation.trace)} event(s):",
    ]
    for number, (label, world) in enumerate(replay(model, violation.trace)):
        if number == 0:
            start = "before the intake's choice" if world.deciding else "submitted -> "
            shown = "" if world.deciding else driver.describe(world.process)
            lines.append(f"   0. t=0 {start}{shown}")
            continue
        lines.append(f"  {number:2}. t={world.now} {label}")
        lines += [f"        {note.strip()}" for note in world.notes]
        lines.append(f"        services: {world.provider.describe()}")
    return "\n".join(lines)


def traces(model: OrderWorld, report: Report, others: int = 40) -> str:
    """The shortest trace of each minimal kind of violation in full, then one line for
    each other kind (a trace that needs more kinds of event may have another cause)."""
    minimal = report.shortest()
    rest = sorted(
        (v for v in report.violations.values() if v not in minimal),
        key=lambda v: (v.invariant, len(v.trace), v.trace),
    )
    lines = [f"  {v.invariant} in {len(v.trace)}: {' | '.join(v.trace)}" for v in rest]
    more = f"\n  ... and {len(lines) - others} more" if len(lines) > others else ""
    also = "\n\nOther kinds, shortest trace each:\n" + "\n".join(lines[:others]) + more
    return "\n\n".join(trace(model, v) for v in minimal) + (also if lines else "")
