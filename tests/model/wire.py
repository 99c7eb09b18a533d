"""What travels between the order, its agents and their services, in the model's own
terms (ticks, plain strings), so the world and the invariants do not depend on the
domain's messages: only tests/model/driver.py calls the domain and translates. The
order's process is carried through untouched (the world never looks inside it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from shared.domain.model import OrderProcess

_ROUND = re.compile(r":r[0-9]+$")


def first_round(key: str) -> str:
    """The key's round 0, `{orderId}:{operation}` (a later round, `...:r2`, is sent only
    after a refusal for good: shared/domain/machine/rekey.py)."""
    return _ROUND.sub("", key)


def operation_of(key: str) -> str:
    """The operation a key (of any round) is for."""
    return first_round(key).split(":", 1)[-1]


@dataclass(frozen=True, order=True)
class Request:
    """An agent request as its service sees it."""

    agent: str
    step: str
    undo: bool
    key: str
    attempt: int
    complete_by: int
    undoes: str | None = None
    """For an undo: the do key it names (derived from the workflow when the body does
    not say)."""
    message_id: str = ""
    """The broker's message id, as the domain built it: the agent's queue drops a second
    message with an id it took within its duplicate-detection window (world.py)."""

    def live_until(self, skew: int) -> int:
        """The tick from which this request can no longer apply at its service."""
        return self.complete_by + skew

    @property
    def operation(self) -> str:
        return operation_of(self.key)

    def describe(self) -> str:
        name = self.key.split(":", 1)[-1]
        return f"{name}@{self.agent} #{self.attempt} (complete-by t={self.complete_by})"


@dataclass(frozen=True, order=True)
class Reply:
    """An agent's answer to `request` on its way to the Scheduler."""

    request: Request
    succeeded: bool
    duplicate: bool = False
    """A second copy the broker will deliver again (at-least-once)."""
    abandoned: bool = False
    """A failure because the key was abandoned at that service (`operation-abandoned`)."""
    large: str = ""
    """A `Large` value: a success whose result is over the size the order keeps
    (Bounds.large_results); empty for a result of the usual size."""
    undone: bool | None = None
    """An undo's success: did it undo its do (False: it found nothing to undo, the
    agent passing on the service's `{"undone": false, "reason": "nothing-to-undo"}`)?"""

    def describe(self) -> str:
        r = self.request
        how = "ok" if self.succeeded else "abandoned" if self.abandoned else "failed"
        size = f" ({self.large})" if self.large else ""
        return f"{r.operation}@{r.agent} #{r.attempt} {how}{size}"


class Large(StrEnum):
    """A service's result too large to keep (machine/forward.py `bounded_result`)."""

    DECLARED_FIT = "large result, its declared fields small"
    NOTHING_FITS = "large result, its declared fields too"


class Answer(StrEnum):
    """What a service can truthfully say about a key when the Supervisor asks."""

    APPLIED = "applied"
    NOT_APPLIED = "not-applied"
    NEVER_SEEN = "never-seen"
    IN_PROGRESS = "in-progress"
    ABANDONED = "abandoned"
    NOT_SUPPORTED = "not-supported"
    UNKNOWN = "no-answer"


@dataclass(frozen=True)
class Question:
    """The Supervisor's question for a due order: ask `agent` about `key` from `ask_at`;
    with `abandon` the question is the abandon call, which settles the key."""

    agent: str
    key: str
    ask_at: int
    abandon: bool = False
    movable: bool = False
    """A "not applied" answer would move the step: it is made final by an abandon."""


@dataclass(frozen=True)
class Effects:
    """One transition of the order, as the world needs it: the next process (opaque to
    the world), what it sent, and a line for the trace."""

    process: OrderProcess
    requests: tuple[Request, ...]
    nudges: tuple[int, ...]
    """Ticks at which the Scheduler's nudges are delivered."""
    alerts: tuple[str, ...]
    summary: str
    statuses: tuple[str, ...] = ()
    """The status notifications it sent the client, in order."""
    alert_words: tuple[str, ...] = ()
    """Each alert's `lastError`, beside `alerts` (what an operator reads)."""
    rewatch: bool = False
    """Does the change write the order's watch entry? Otherwise the entry the store holds
    stays as it was, whatever the row now says."""
    watch: int | None = None
    """What it writes there (None: the order leaves the watch list)."""
    sooner: int | None = None
    """A check the entry is moved up to, never back from an earlier one
    (`WatchList.move_up`): the Scheduler's change that makes the order due sooner."""

    def watched(self, entry: int | None) -> int | None:
        """The entry the store holds after this change, from the one it held before."""
        if self.rewatch:
            return self.watch
        if self.sooner is None:
            return entry
        return self.sooner if entry is None else min(entry, self.sooner)
