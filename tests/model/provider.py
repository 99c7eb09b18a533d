"""The remote services as the judge sees them (docs/simulator.md), in ticks.

One entry per (service, idempotency key). A request sent with complete-by C may reach
its service and apply there at any moment up to C + skew: the caller giving up at C
does not stop the service. An undo names the do key it undoes and applies only against
that key applied; against a running do it is refused (409, no effect); against anything
else it records "nothing-to-undo", which does not stop the do from applying later.

The judge reads the net effect: a do applied and not followed by an undo of it with
undone=true is in force. An undo can only apply after its do did (it is refused while
the do runs and records nothing-to-undo otherwise), so "followed, in apply order" comes
down to the undo's `undone` flag.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from tests.model.wire import first_round


class KeyStatus(StrEnum):
    NEVER_SEEN = "never-seen"
    RUNNING = "running"
    """A request with the key was registered and may still apply (until `live_until`)."""
    NOT_APPLIED = "not-applied"
    """Seen, and every request with it gave up without applying."""
    APPLIED = "applied"
    REJECTED = "rejected"
    """A permanent failure (card declined): the key never applies."""
    ABANDONED = "abandoned"
    """Settled for good by `abandon`: the key never applies."""

    @property
    def settled(self) -> bool:
        """Can no request with this key apply any more, whatever the clock says?"""
        return self in (KeyStatus.APPLIED, KeyStatus.REJECTED, KeyStatus.ABANDONED)


@dataclass(frozen=True, order=True)
class Entry:
    agent: str
    key: str
    status: KeyStatus = KeyStatus.NEVER_SEEN
    live_until: int = 0
    """The tick from which no registered request with this key can apply any more."""
    undoes: str | None = None
    """For an undo key: the do key it names."""
    undone: bool = False
    """For an applied undo: did it undo an applied do (False: "nothing-to-undo")?"""
    late: bool = False
    """Not applied by time, at a service without abandon: a request of it may still
    apply after its live time (the residual risk of docs/in-doubt.md)."""
    attempt: int = 0
    """The latest claim attempt a request of this key came with: the attempt a late
    apply's reply carries, which tells the order which round of a key it answers."""


@dataclass(frozen=True)
class Provider:
    """Every service's ledger; entries sorted so equal ledgers hash equal."""

    entries: tuple[Entry, ...] = ()

    def get(self, agent: str, key: str) -> Entry:
        for entry in self.entries:
            if entry.agent == agent and entry.key == key:
                return entry
        return Entry(agent, key)

    def put(self, entry: Entry) -> Provider:
        kept = [e for e in self.entries if (e.agent, e.key) != (entry.agent, entry.key)]
        return Provider(tuple(sorted([*kept, entry])))

    def register(
        self, agent: str, key: str, live_until: int, undoes: str | None, attempt: int = 0
    ) -> Provider:
        """A request reaches the service: an unsettled key is running until the latest
        window of the requests that carried it; a settled one stays as it is."""
        entry = self.get(agent, key)
        if entry.status.settled:
            return self
        return self.put(
            replace(
                entry,
                status=KeyStatus.RUNNING,
                live_until=max(entry.live_until, live_until),
                undoes=undoes,
                attempt=max(entry.attempt, attempt),
            )
        )

    def can_apply(self, agent: str, key: str, now: int) -> bool:
        """May the service apply the running key now? An undo waits while its do runs."""
        entry = self.get(agent, key)
        if entry.status is not KeyStatus.RUNNING or now >= entry.live_until:
            return False
        return entry.undoes is None or self.get(agent, entry.undoes).status is not (
            KeyStatus.RUNNING
        )

    def apply(self, agent: str, key: str) -> Provider:
        entry = self.get(agent, key)
        if entry.undoes is None:
            return self.put(replace(entry, status=KeyStatus.APPLIED))
        undone = self.get(agent, entry.undoes).status is KeyStatus.APPLIED
        return self.put(replace(entry, status=KeyStatus.APPLIED, undone=undone))

    def reject(self, agent: str, key: str) -> Provider:
        return self.put(replace(self.get(agent, key), status=KeyStatus.REJECTED))

    def abandon(self, agent: str, key: str) -> tuple[Provider, KeyStatus]:
        """`POST .../abandon`: applied stays applied, running answers 409 (RUNNING), any
        other key is abandoned for good."""
        entry = self.get(agent, key)
        if entry.status in (KeyStatus.APPLIED, KeyStatus.RUNNING, KeyStatus.ABANDONED):
            return self, entry.status
        abandoned = replace(entry, status=KeyStatus.ABANDONED, late=False)
        return self.put(abandoned), KeyStatus.ABANDONED

    def expire(self, now: int, late: frozenset[str] = frozenset()) -> Provider:
        """Running keys whose every request is past its window are, finally, not applied;
        a do key at a service in `late` (no abandon route) may still apply late."""
        if not any(e.status is KeyStatus.RUNNING and now >= e.live_until for e in self.entries):
            return self
        return Provider(
            tuple(
                replace(
                    e,
                    status=KeyStatus.NOT_APPLIED,
                    late=e.agent in late and e.undoes is None,
                )
                if e.status is KeyStatus.RUNNING and now >= e.live_until
                else e
                for e in self.entries
            )
        )

    def apply_late(self, agent: str, key: str) -> Provider:
        """A request the service held past its live time applies after all."""
        entry = self.get(agent, key)
        return self.put(replace(entry, status=KeyStatus.APPLIED, late=False))

    def stragglers(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.late and e.status is KeyStatus.NOT_APPLIED)

    def in_force(self, agent: str, do_key: str) -> bool:
        """The judge: the do applied under its key, or under a later round of it (sent
        after a refusal for good), and no undo of it undid it."""
        return bool(self.rounds_in_force(agent, do_key))

    def rounds_in_force(self, agent: str, do_key: str) -> tuple[str, ...]:
        """Each round of the do key in force at `agent`: two rounds applied there are two
        effects (a provider charges, or notifies, once per key), which `in_force` alone
        reads as one."""
        rounds = [e.key for e in self.entries if e.agent == agent and first_round(e.key) == do_key]
        return tuple(key for key in rounds if self.key_in_force(agent, key))

    def key_in_force(self, agent: str, do_key: str) -> bool:
        if self.get(agent, do_key).status is not KeyStatus.APPLIED:
            return False
        return not any(e.agent == agent and e.undoes == do_key and e.undone for e in self.entries)

    def running(self) -> bool:
        return any(e.status is KeyStatus.RUNNING for e in self.entries)

    def describe(self) -> str:
        if not self.entries:
            return "(nothing seen)"
        parts = []
        for e in self.entries:
            what = e.status.value
            if e.status is KeyStatus.RUNNING:
                what += f" until t={e.live_until}"
            if e.undoes is not None and e.status is KeyStatus.APPLIED:
                what += " (undone)" if e.undone else " (nothing-to-undo)"
            name = _operation(e.key) if e.key.startswith("o-1:") else e.key
            parts.append(f"{name}@{e.agent}: {what}")
        return "; ".join(parts)


def _operation(key: str) -> str:
    return key.split(":", 1)[-1]
