"""Liveness: from every reachable state the order can still reach a right end.

Safety (tests/model/invariants.py) says nothing bad happens; it is content with an
order that sits in Error forever with a charge in force, which is how finding B of
issue #37 went unseen. Here, every state the explorer reaches is taken as a start, and
the system is left to its own events (services apply, replies arrive, the Scheduler
claims, the Supervisor sweeps and hears the truth, time passes) plus at most one
operator action (resubmit, cancel, or undrain an agent; a suspended order's resume is
free, its suspend was the operator's move, and so is putting a dropped workflow version
back in the catalogue, a deploy rather than a move on the order, and so is the mend of
a provider that refused for good an operation the saga counts on, once the order is
held: docs/in-doubt.md). Reconciliation is one
of the system's own events (it runs over a finished order once nothing sent can apply),
and so is the end of the customer's other order that an order waits behind in line.
Some such continuation must reach a right end:

- a finished order whose net effect is right (Processed: each step in force at exactly
  one key space; Compensated, Cancelled: nothing in force), nothing left that can apply;
- or, after a request applied past its live time (the residual risk), the order held
  for an operator past its pivot, with the operator alerted;
- or, after such a request, a finished order whose only wrong effects are of steps with
  no undo (a retriable step's earlier round applied late: nothing takes it back), with
  the operator alerted (`invariants.beyond_undo`).

An order held on a refusal for good that it learned of after the operator's action (it
held the key in doubt, the resubmit sent that key again and the provider replayed its
refusal) is a new hold, with its own alert: the operator gets one more action there.

No such end means every action is refused or leads back to where it started while
money is in force. A continuation is found greedily first (the system's likeliest
moves, in a fixed order), then by a bounded breadth-first search; every state on a
path found good is remembered, so most starts cost a lookup.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field, replace

from shared.domain.model import KeyState, Phase
from tests.model import driver
from tests.model.explorer import Invariant
from tests.model.invariants import beyond_undo, wrong_effects
from tests.model.setups import Setup
from tests.model.world import Bounds, OrderWorld, World

OPERATOR = ("cancel", "resubmit", "undrain")
GREEDY_STEPS = 80
SEARCH_STATES = 1_000
_PREFERENCE = (
    "intake",
    "serve",
    "apply",
    "arrive",
    "deliver",
    "claim",
    "nudge",
    "sweep",
    "reconcile",
    "neighbour ends: promoted",
    "time",
)
FREE = ("resume", "restore the version")
"""Moves that are not the operator's one action: a resume (its suspend was), and a
deploy that puts the order's workflow version back; and the mend of a provider that
refused for good an operation the saga counts on (`World._menders`): its refusal lifted,
the order's resubmit or cancel is still the one action."""


def _free(label: str) -> bool:
    return label in FREE or label.startswith("mend ")


def _system(label: str) -> bool:
    """Is this one of the system's own, well-behaved events?"""
    if "[send failed" in label or label.endswith((": rejected", " late", ": no-answer")):
        return False
    if label.endswith(("nudge lost", "died before its sends")):
        return False
    if label.startswith(("deliver twice", "reject ", "lose ")):
        return False
    return label.startswith(_PREFERENCE)


def _held_on_refusal(world: World) -> bool:
    process = world.process
    index = process.state.current_step
    step = process.steps[index] if index < len(process.steps) else None
    return driver.held(process) and step is not None and step.refused is not None


def _learns_refusal(before: World, after: World) -> bool:
    """Does the order come to be held here on a refusal for good?"""
    return not _held_on_refusal(before) and _held_on_refusal(after)


def _in_doubt(world: World) -> bool:
    """Is the order's current step's key in doubt, with no refusal known for it?"""
    process = world.process
    index = process.state.current_step
    step = process.steps[index] if index < len(process.steps) else None
    if step is None or step.refused is not None:
        return False
    return step.key_state in (KeyState.UNSETTLED, KeyState.EXPIRED)


UNUSED, USED, DOUBTED, REFUNDED = 0, 1, 2, 3
"""The operator's one action: not taken; taken; taken on an order whose current key was
in doubt (the resubmit sends that key again, as a key in doubt must be, and a provider
that had refused it replays the refusal: the order learns of it only then, held on it,
a new hold the operator is told of and acts on); and given back once that happened
(one more action, never twice: docs/in-doubt.md)."""


def _available(spent: int) -> bool:
    return spent in (UNUSED, REFUNDED)


def _after(spent: int, before: World, after: World) -> int:
    """`spent` once the system moved from `before` to `after`."""
    return REFUNDED if spent == DOUBTED and _learns_refusal(before, after) else spent


def good_end(world: World) -> bool:
    if not world.quiet():
        return False
    if driver.finished(world.process) is not None:
        return not wrong_effects(world) or beyond_undo(world)
    return (
        bool(world.late_applied)
        and driver.held(world.process)
        and world.domain.past_pivot(world.process)
        and bool(world.alerted)
    )


@dataclass
class Liveness:
    """Checks starts one by one, remembering every state found to reach a right end."""

    setup: Setup
    good: set[Hashable] = field(default_factory=set)
    bad: dict[Hashable, str] = field(default_factory=dict)
    checked: int = 0
    stuck: list[tuple[World, str]] = field(default_factory=list)
    mended: dict[Hashable, str | None] = field(default_factory=dict)
    """Held on a refusal for good: what each action did once the provider was mended."""

    def __post_init__(self) -> None:
        drainable = ("payment",)
        self.model = OrderWorld(
            Bounds(
                rejectable=frozenset(),
                drainable=drainable,
                operator_actions=1,
                operator=frozenset({*OPERATOR, "resume", "restore"}),
                send_failures=False,
                duplicates=False,
                lost_replies=False,
                late_applies=0,
                events=0,
                reconcile=True,
            ),
            self.setup,
        )

    def _key(self, world: World, spent: int) -> Hashable:
        return (self.model.key(world), spent)

    def _moves(self, world: World, spent: int) -> Iterator[tuple[str, World, int]]:
        moves = int(not _available(spent))
        for label, after in self.model.successors(replace(world, operator_moves=moves)):
            if _free(label):
                yield label, after, spent
            elif label.split(" ", 1)[0] in OPERATOR:
                if _available(spent):
                    doubted = spent == UNUSED and _in_doubt(world)
                    yield label, after, DOUBTED if doubted else USED
            elif _system(label):
                yield label, after, _after(spent, world, after)

    def check(self, start: World) -> str | None:
        """None when `start` can reach a right end (and, held on a refusal for good, each
        action the operator is told to take does once the provider is mended); else why
        not."""
        self.checked += 1
        begin = replace(start, operator_moves=0, events_sent=self.model.bounds.events)
        return self._reaches(begin, start) or self._each_action(begin)

    def _each_action(self, world: World) -> str | None:
        """An order held on an operation refused for good: once the provider is mended,
        each action docs/in-doubt.md tells the operator to take reaches a right end on
        its own, not merely some action: a resubmit, and for a held compensation a
        cancel too. (A resubmit that went forward from a held cancel would ship the
        parcel, while the cancel alone would still end right.)"""
        if not world.refused or not driver.held(world.process):
            return None
        key = self._key(world, UNUSED)
        if key in self.mended:
            return self.mended[key]
        mended = world
        while mended.refused:
            mended = next(after for _, after in self.model._menders(mended))
        actions = ["resubmit"]
        if world.process.state.phase is Phase.COMPENSATE:
            actions.append("cancel")
        why = None
        for action in actions:
            after = next((w for label, w in self.model._operator(mended) if label == action), None)
            if after is None:
                why = f"the provider mended, a {action} is refused"
            elif not (self._greedy(after, USED) or self._search(after, USED)):
                why = f"the provider mended, a {action} reaches no right end"
            if why is not None:
                why += f" from t={world.now}: {driver.describe(world.process)}"
                self.stuck.append((world, why))
                break
        self.mended[key] = why
        return why

    def _reaches(self, begin: World, start: World) -> str | None:
        key = self._key(begin, UNUSED)
        if key in self.good:
            return None
        if key in self.bad:
            return self.bad[key]
        if self._greedy(begin) or self._operated(begin) or self._search(begin):
            return None
        why = f"no right end from t={start.now}: {driver.describe(start.process)}"
        self.bad[key] = why
        self.stuck.append((start, why))
        return why

    def _greedy(self, world: World, spent: int = UNUSED) -> bool:
        """Follow the system's likeliest move; where it has none, try each operator
        action in turn (so every one an order at rest allows is taken somewhere)."""
        path: list[Hashable] = []
        for _ in range(GREEDY_STEPS):
            key = self._key(world, spent)
            if key in self.good or good_end(world):
                self.good.update(path)
                self.good.add(key)
                return True
            path.append(key)
            move = self._first(world, spent)
            if move is not None:
                spent = _after(spent, world, move)
                world = move
                continue
            moves = self._moves(world, spent)
            tried = [
                self._greedy(after, used) for label, after, used in moves if used or _free(label)
            ]
            if any(tried):
                self.good.update(path)
                return True
            return False
        return False

    def _operated(self, world: World) -> bool:
        """The operator acts first (an order waiting for a drained agent waits forever
        on its own, which the greedy walk cannot tell from progress), then the system."""
        moves = self._moves(world, UNUSED)
        return any(
            [self._greedy(after, used) for label, after, used in moves if used or _free(label)]
        )

    def _first(self, world: World, spent: int) -> World | None:
        """The system's likeliest move, in a fixed order (the first the world offers in
        its likeliest category), or None when it has none."""
        model = self.model
        taken = int(not _available(spent))
        world = replace(world, just_sent=(), notes=(), operator_moves=taken)
        for moves in (
            model._services(world),
            model._replies(world),
            model._scheduler(world),
            model._supervisor(world),
            model._reconciler(world),
            model._customers(world),
            model._clock(world),
        ):
            for label, after in moves:
                if _system(label):
                    return after
        return None

    def _search(self, world: World, spent: int = UNUSED) -> bool:
        start = self._key(world, spent)
        parents: dict[Hashable, Hashable | None] = {start: None}
        frontier = [(world, spent)]
        while frontier and len(parents) < SEARCH_STATES:
            following = []
            for state, was in frontier:
                for _, after, used in self._moves(state, was):
                    key = self._key(after, used)
                    if key in parents:
                        continue
                    parents[key] = self._key(state, was)
                    if key in self.good or good_end(after):
                        self._remember(parents, key)
                        return True
                    following.append((after, used))
            frontier = following
        return False

    def _remember(self, parents: dict[Hashable, Hashable | None], key: Hashable | None) -> None:
        while key is not None:
            self.good.add(key)
            key = parents[key]


def invariant(setup: Setup) -> Invariant[World]:
    """Liveness as an invariant on every state reached (its memory makes repeats free)."""
    return Invariant("liveness", Liveness(setup).check)
