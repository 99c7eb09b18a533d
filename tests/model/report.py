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
            lines.append(f"   0. t=0 submitted -> {driver.describe(world.process)}")
            continue
        lines.append(f"  {number:2}. t={world.now} {label}")
        lines += [f"        {note.strip()}" for note in world.notes]
        lines.append(f"        services: {world.provider.describe()}")
    return "\n".join(lines)


def traces(model: OrderWorld, report: Report) -> str:
    return "\n\n".join(trace(model, v) for v in report.shortest())
