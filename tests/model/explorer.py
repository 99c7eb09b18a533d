"""Breadth-first exploration of every interleaving up to a depth, the way TLC (TLA+)
and stateright check a model.

States are hashed through the model's `key`, so a situation reached along two paths is
expanded once; breadth-first means the first path found to a state is a shortest one,
so every violation comes with the shortest trace that reaches it. Invariants are checked
on every successor as it is generated, before the duplicate check, so an invariant
about the step just taken (what a transition sent) sees every edge, not only the
first edge into each state.

Nothing here knows about orders: tests/model/world.py is one model, the self-test's
toy machine another.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

S = TypeVar("S")


class Model(Protocol[S]):
    def initial(self) -> S: ...

    def successors(self, state: S) -> Iterable[tuple[str, S]]:
        """Every event enabled in `state`, each with a label unique among them."""
        ...

    def key(self, state: S) -> Hashable:
        """Equal for states that behave alike from here on."""
        ...


@dataclass(frozen=True)
class Invariant(Generic[S]):
    name: str
    check: Callable[[S], str | None]
    """None when it holds; otherwise what is wrong, in a sentence."""


@dataclass(frozen=True)
class Violation:
    invariant: str
    message: str
    trace: tuple[str, ...]
    """The event labels from the initial state, shortest first found."""


@dataclass
class Report:
    states: int = 0
    """Distinct states (by key) reached, the initial one included."""
    transitions: int = 0
    """Successors generated (edges), duplicates included."""
    depth: int = 0
    """The deepest level that held a state."""
    complete: bool = False
    """True when the frontier ran dry before the bound: every reachable state was seen."""
    levels: list[int] = field(default_factory=list)
    """New states found at each depth."""
    violations: dict[tuple[str, Hashable], Violation] = field(default_factory=dict)
    """The shortest violation per (invariant, signature of its trace)."""
    counts: dict[str, int] = field(default_factory=dict)
    """Violating edges per invariant."""

    def shortest(self) -> list[Violation]:
        """One per invariant and signature, shortest first; a signature that contains
        another's of the same invariant adds nothing and is left out."""
        found = sorted(self.violations.items(), key=lambda kv: (len(kv[1].trace), kv[0][0]))
        kept: list[tuple[tuple[str, Hashable], Violation]] = []
        for (name, sig), violation in found:
            covered = any(
                n == name and isinstance(s, frozenset) and isinstance(sig, frozenset) and s <= sig
                for (n, s), _ in kept
            )
            if not covered:
                kept.append(((name, sig), violation))
        return [v for _, v in kept]


def explore(
    model: Model[S],
    invariants: Sequence[Invariant[S]],
    max_depth: int,
    signature: Callable[[tuple[str, ...]], Hashable] = lambda trace: (),
    max_states: int | None = None,
) -> Report:
    """Visit every state reachable in at most `max_depth` events (or the first
    `max_states`), checking `invariants` on every edge."""
    report = Report()
    first = model.initial()
    first_key = model.key(first)
    parents: dict[Hashable, tuple[Hashable, str] | None] = {first_key: None}
    _check(invariants, first, (), report, signature)
    frontier: list[tuple[Hashable, S]] = [(first_key, first)]
    report.levels.append(1)
    depth = 0
    full = False
    while frontier and depth < max_depth and not full:
        depth += 1
        following: list[tuple[Hashable, S]] = []
        for parent_key, state in frontier:
            for label, successor in model.successors(state):
                report.transitions += 1
                if any(inv.check(successor) is not None for inv in invariants):
                    trace = (*_trace(parents, parent_key), label)
                    _check(invariants, successor, trace, report, signature)
                successor_key = model.key(successor)
                if successor_key in parents or full:
                    continue
                parents[successor_key] = (parent_key, label)
                following.append((successor_key, successor))
                full = max_states is not None and len(parents) >= max_states
        if following:
            report.depth = depth
            report.levels.append(len(following))
        frontier = following
    report.states = len(parents)
    report.complete = not frontier
    return report


def _trace(parents: dict[Hashable, tuple[Hashable, str] | None], key: Hashable) -> list[str]:
    labels: list[str] = []
    link = parents[key]
    while link is not None:
        key, label = link
        labels.append(label)
        link = parents[key]
    labels.reverse()
    return labels


def _check(
    invariants: Sequence[Invariant[S]],
    state: S,
    trace: tuple[str, ...],
    report: Report,
    signature: Callable[[tuple[str, ...]], Hashable],
) -> None:
    for invariant in invariants:
        message = invariant.check(state)
        if message is None:
            continue
        report.counts[invariant.name] = report.counts.get(invariant.name, 0) + 1
        slot = (invariant.name, signature(trace))
        if slot not in report.violations:
            report.violations[slot] = Violation(invariant.name, message, trace)


def replay(model: Model[S], trace: Sequence[str]) -> list[tuple[str, S]]:
    """The states along `trace`, from the initial one (labelled ''), by taking at each
    step the successor with the trace's label: how a trace is printed in full without
    keeping every state in memory."""
    state = model.initial()
    path: list[tuple[str, S]] = [("", state)]
    for label in trace:
        matches = [s for lbl, s in model.successors(state) if lbl == label]
        if len(matches) != 1:
            raise LookupError(f"{len(matches)} successors labelled {label!r}")
        state = matches[0]
        path.append((label, state))
    return path
