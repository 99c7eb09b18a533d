"""The one unit of work every change to a stored order goes through: load, decide, save
on the ETag, send, watch. The Scheduler, the Supervisor, operator actions, events and
step heartbeats all use it, each with one call (`UnitOfWork.change`, or `commit` for a
transition the Supervisor decided) that saves and then delivers, so the ordering rule
is written once:

1. Watch before the save when the order leaves a rest (Error, Suspended): at rest it may
   have no entry, and a crash after the save must not leave a moving order unwatched (a
   spare entry only costs the Supervisor a read). Its rest entry goes next, still
   before the save: a crash or a lost race then leaves an order at rest without its
   entry, but watched, and the Supervisor's check writes it again (`finish_rest`),
   where a drop only after the save would leave a stale entry that nothing finds once
   the order is unwatched at its next rest. It is dropped once more after the save, for
   an entry written meanwhile by whoever brought the order to that rest (rule 4). An
   order already moving keeps its watch entry, so a new check time is written after
   the save: a lost race then writes nothing, and no winner's earlier check is pushed
   back. A check sooner than the entry may hold (the Scheduler's `sooner`) is moved up
   before the save, and only up (`WatchList.move_up`): a lost race leaves a spare
   earlier check, a crash after the save no late one.
2. Save on the ETag. A lost race has sent nothing; the change is read and decided again.
3. Send. A failure leaves the messages in the record's outbox, with deterministic ids:
   the Supervisor (the order is still watched) or a redelivery sends them again, and the
   broker drops what already went. A caller may name a rule to store when its sends
   failed (`unsent`): the Scheduler notes a dispatch the bus refused, so that its
   complete-by passing is not counted against the order; that note sends nothing.
4. An order come to rest gets its rest entry right after its save, before its sends
   (the views of orders at rest read it, docs/history.md), and is unwatched last, once
   its messages went out: a crash anywhere between leaves it watched, and the
   Supervisor's check (`finish_rest`) writes the entry and sends again. An Error or
   Suspended order's row is read once after its entry is written: an operator who
   moved it on before the entry landed had nothing to drop yet.
   A final order's watch entry goes unconditionally (nothing re-watches it); Error and
   Suspended keep the version check, since an operator may already have moved the
   order on.

With a customer ledger (docs/fairness.md), an order leaving a rest is counted before its
save (like rule 1: a crash leaves a spare count, never a moving order uncounted), and an
order come to rest leaves the count before it is unwatched, so a crash in between leaves
it watched and the Supervisor's check of a rested order does the (repeatable) leave.

The intake's create is the one write outside it: there is no ETag to save on, and the
entry goes first for the same reason as rule 1 (shared/usecases/flow/submission.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from shared.catalogue.running import workflow_of
from shared.domain.machine.transition import Transition
from shared.domain.model import OrderProcess
from shared.domain.rest_index import rest_entry
from shared.domain.workflow import Catalogue
from shared.ports import (
    BusUnavailable,
    ConcurrencyConflict,
    MessageBus,
    StateStore,
    StateStoreError,
)
from shared.telemetry.logsafe import app_logger
from shared.usecases.limits.budget import Budget, send_within_budget, within_store_budget
from shared.usecases.limits.customers import Customers

log = app_logger("orders")

MAX_RACES = 5
"""Lost ETag races in a row, each on a fresh read, before a change gives up."""

Decide = Callable[[OrderProcess], Transition | None]
"""A machine rule applied to the stored order: the transition, or None for nothing to do."""
CheckAt = Callable[[OrderProcess], datetime | None]
"""When the Supervisor should next look at the changed order (None: leave the entry)."""
Sooner = Callable[[OrderProcess, OrderProcess], datetime | None]
"""From the order as read and as changed: the check its entry must be moved up to, where
the change may make it due before the entry says (None: the entry stands)."""


@dataclass(frozen=True)
class Changed:
    """What one change came to: the order as stored, and the transition saved and sent."""

    process: OrderProcess
    transition: Transition | None
    """None: `decide` found nothing to do on a fresh read."""
    resend: bool = False
    """Nothing changed, but the stored state was made by the same cause: an earlier try
    may have stopped before sending, so its outbox went out again."""


@dataclass(frozen=True)
class UnitOfWork:
    store: StateStore
    bus: MessageBus
    customers: Customers | None = None
    """None: no customer rule is set, and no customer record is kept."""
    catalogue: Catalogue = field(kw_only=True)
    """Which step an order at rest stopped on, for its rest entry."""

    async def change(
        self,
        order_id: str,
        decide: Decide,
        *,
        cause: str | None = None,
        check_at: CheckAt | None = None,
        cached: OrderProcess | None = None,
        races: int = MAX_RACES,
        budget: Budget | None = None,
        unsent: Decide | None = None,
        sooner: Sooner | None = None,
    ) -> Changed | None:
        """Load, decide, save, then deliver: the one call of a change to a stored order.
        None: no such order.

        A lost race reads again and decides again. A `cached` copy is never taken at its
        word: its transition is saved on its ETag, and nothing to do on it is checked
        against a fresh read. Nothing to do on the state this `cause` made sends its
        outbox again (an earlier try may have stopped before sending).

        With a `budget` (a caller that must answer soon) the store's part fails with
        StoreUnavailable past `budget.store`, and the sends are waited for `budget.nudge`
        at most, then go on without the caller, a failure only logged. Without one a
        failed send raises, the change stored: `unsent`, when given, is first decided on
        the stored order and saved without a send. `sooner` (the Scheduler's, which
        hands no `check_at`): the entry moved up before the save where the change may
        make the order due sooner than it says."""
        if budget is not None:
            changed = await within_store_budget(
                self._decide(order_id, decide, cause, check_at, cached, races, sooner), budget
            )
            if changed is not None and (changed.transition is not None or changed.resend):
                await send_within_budget(self._send(changed), budget, order_id)
            return changed
        changed = await self._decide(order_id, decide, cause, check_at, cached, races, sooner)
        if changed is None:
            return None
        try:
            await self._send(changed)
        except BusUnavailable:
            if unsent is not None and changed.transition is not None:
                await self._note_unsent(changed.process, unsent)
            raise
        return changed

    async def commit(self, transition: Transition) -> OrderProcess:
        """A transition decided elsewhere (the Supervisor's), saved then delivered."""
        changed = Changed(await self._save(transition), transition)
        await self._send(changed)
        return changed.process

    async def _decide(
        self,
        order_id: str,
        decide: Decide,
        cause: str | None,
        check_at: CheckAt | None,
        cached: OrderProcess | None,
        races: int,
        sooner: Sooner | None = None,
    ) -> Changed | None:
        """Rules 1 and 2, deciding again on a fresh read after a lost race."""
        process, fresh, lost = cached, cached is None, 0
        while lost < races:
            if process is None:
                process, fresh = await self.store.load(order_id), True
                if process is None:
                    return None
            transition = decide(process)
            if transition is None:
                if not fresh:
                    process = None
                    continue
                resend = cause is not None and process.state.outbox_cause == cause
                return Changed(process, None, resend=resend)
            when = check_at(transition.process) if check_at is not None else None
            watched = process.state.complete_by
            early = sooner(process, transition.process) if sooner is not None else None
            try:
                saved = await self._save(
                    transition, check_at=when, watched_at=watched, sooner=early
                )
                return Changed(saved, transition)
            except ConcurrencyConflict:
                lost += int(fresh)
                process = None
        raise ConcurrencyConflict(f"order {order_id}: lost {races} races in a row")

    async def _save(
        self,
        transition: Transition,
        *,
        check_at: datetime | None = None,
        watched_at: datetime | None = None,
        sooner: datetime | None = None,
    ) -> OrderProcess:
        """Rules 1 and 2: the watch entry and the conditional save. The transition's own
        check time (a compensation waiting for a live request) wins over `check_at`.
        `watched_at`: the deadline the order was watched at before this change (its
        complete-by as read). A check that moves earlier than that (a wait's far deadline
        replaced by a dispatched step's complete-by) is written before the save too, as
        when leaving a rest: a crash after the save would otherwise leave the order
        watched at the far deadline, its step in doubt and nothing looking at it; a
        spare earlier entry only costs the Supervisor a read. A check the change leaves
        where it was is not written again: the entry may hold an earlier one written by
        someone who knows more (a promotion that moved the order up its customer's line),
        and writing the row's view back would push it out again. `sooner`, where no
        check is written: the entry only moved up to it (`WatchList.move_up`), before the
        save for the same reason, and never pushed back from an earlier check someone
        else wrote (a lost race leaves a spare earlier check)."""
        state = transition.process.state
        when = transition.check_at or check_at
        left = transition.rested_in if transition.moves_rest else None
        if left is not None:
            at = when or state.updated_at
            await self.store.watch(state.order_id, at, replace=True, version=state.version)
            await self.store.drop_rest(left, state.order_id, state.created_at, below=state.version)
        elif when is not None and watched_at is not None and when < watched_at:
            await self.store.watch(state.order_id, when, replace=True, version=state.version)
        elif when is None and sooner is not None:
            await self.store.move_up(state.order_id, sooner, version=state.version)
        if transition.leaves_rest and self.customers is not None:
            await self.customers.rejoin(transition.process, state.updated_at)
        etag = await self.store.save(transition.process, transition.history)
        log_transition(transition)
        if left is not None:
            await self.store.drop_rest(left, state.order_id, state.created_at, below=state.version)
        if when is not None and left is None and when != watched_at:
            await self.store.watch(state.order_id, when, replace=True, version=state.version)
        return replace(transition.process, etag=etag)

    async def _send(self, changed: Changed) -> None:
        """Rules 3 and 4: an order come to rest gets its rest entry; send; then it
        leaves the watch list. Nothing changed: the outbox again, when `resend`."""
        transition = changed.transition
        if transition is None:
            if changed.resend:
                await self.resend_outbox(changed.process)
            return
        if transition.is_at_rest:
            await self._file(transition.process)
        if transition.outgoing:
            await self.bus.send(transition.outgoing)
        if transition.is_at_rest:
            await self._rest(transition.process)

    async def _note_unsent(self, sent: OrderProcess, unsent: Decide) -> None:
        """Best effort: if this fails too, the Supervisor counts one timeout, as after a
        crash. Nothing is sent (the bus just refused); the outbox keeps it."""
        try:
            process = await self.store.load(sent.order_id)
            if process is None or process.state.version != sent.state.version:
                return  # not stored, or already moved on (an answer came, so it was sent)
            transition = unsent(process)
            if transition is not None:
                await self._save(transition)
        except StateStoreError as exc:
            log.warning(
                "order %s: undelivered dispatch not noted (%s: %s)",
                sent.order_id,
                type(exc).__name__,
                exc,
            )

    async def resend_outbox(self, process: OrderProcess) -> None:
        """The stored outbox again (its ids are deterministic, so repeats are dropped):
        a redelivered message that finds its own change already stored, an order come
        to rest whose delivery stopped short, and the Supervisor's resend of an order
        still as the intake stored it (the intake may have died between its insert and
        its sends)."""
        if process.state.outbox:
            await self.bus.send(process.state.outbox)

    async def finish_rest(self, process: OrderProcess) -> None:
        """Rules 3 and 4 for an order stored at rest whose delivery may have stopped
        short (the Supervisor finds it still watched): its rest entry and its outbox
        again, then the rest."""
        await self._file(process)
        await self.resend_outbox(process)
        await self._rest(process)

    async def _file(self, process: OrderProcess) -> None:
        """The order came to rest: its rest entry, right after its save, so the views
        of its state trail the row by this one write."""
        state = process.state
        await self.store.put_rest(rest_entry(process, workflow_of(self.catalogue, state)))
        if not state.process_state.is_final:
            await self._moved_on(process)

    async def _rest(self, process: OrderProcess) -> None:
        """The order came to rest and its messages went out: it leaves its customer's
        count, then the watch list."""
        if self.customers is not None:
            await self.customers.rested(process, self.store, self.bus)
        state = process.state
        version = None if state.process_state.is_final else state.version
        await self.store.unwatch(state.order_id, version)

    async def _moved_on(self, process: OrderProcess) -> None:
        """An operator may have moved an Error or Suspended order on between its save and
        its rest entry (dropping an entry not yet written): read the row once, and drop
        the entry again if so. A row still in this rest at a later version may have had
        its own entry overwritten by this older one: it is written again from the row.
        A final order never moves, so it is spared the read."""
        state = process.state
        found = await self.store.states([state.order_id])
        if found and found[0].version == state.version:
            return
        if found and found[0].process_state is state.process_state:
            fresh = await self.store.load(state.order_id)
            if fresh is not None and fresh.state.process_state is state.process_state:
                workflow = workflow_of(self.catalogue, fresh.state)
                await self.store.put_rest(rest_entry(fresh, workflow))
                return
        below = found[0].version if found else None
        await self.store.drop_rest(
            state.process_state, state.order_id, state.created_at, below=below
        )


def log_transition(transition: Transition) -> None:
    state = transition.process.state
    for entry in transition.history:
        log.info(
            "order %s %s%s [%s, attempt %d, failures %d]",
            state.order_id,
            entry.event,
            f": {entry.detail}" if entry.detail else "",
            entry.process_state.value,
            entry.attempt,
            entry.failure_count,
        )
