"""One contract for the state store, run against the in-memory store and real Azurite.

The races here are real: on Azurite, concurrent coroutines issue concurrent HTTP
requests, and a barrier makes every contender read the same ETag before any writes.
"""

from __future__ import annotations

import asyncio
import collections.abc
import dataclasses
import json
import types
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, Union, get_args, get_origin, get_type_hints

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.memory.archive import InMemoryArchiveStore
from shared.adapters.memory.customers import InMemoryCustomerLedger
from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.adapters.table.archive import TableArchiveStore
from shared.adapters.table.store import TableStateStore
from shared.contract import Queue, agent_queue
from shared.domain.archive import ArchivedMark
from shared.domain.fairness import Admission, CustomerPolicy
from shared.domain.machine import forward
from shared.domain.machine.forward import start
from shared.domain.machine.recovery import recover
from shared.domain.messages import MAX_MESSAGE_BYTES, OrderSubmission
from shared.domain.model import (
    Action,
    ErrorInfo,
    HistoryEntry,
    Order,
    OrderProcess,
    Outcome,
    ProcessState,
    StepRecord,
    StepStatus,
)
from shared.ports import (
    AlreadyExists,
    ConcurrencyConflict,
    StateStore,
    StoreUnavailable,
    WatchEntry,
)
from shared.settings import azurite_connection_string
from shared.usecases.flow import scheduler
from shared.usecases.flow.scheduler import Handled
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.limits.customers import Customers
from shared.usecases.operations.operator import resubmit_order
from tests.builders import World, a_reply, an_order
from tests.workflows import EXPRESS_DELIVERY, ORDER_FULFILMENT

NOW = datetime(2026, 12, 31, 12, 0, tzinfo=UTC)


@pytest.fixture(params=["memory", pytest.param("table", marks=pytest.mark.azurite)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[StateStore]:
    if request.param == "memory":
        yield InMemoryStateStore()
        return
    port = request.getfixturevalue("azurite_table_port")
    service = TableServiceClient.from_connection_string(azurite_connection_string(port))
    table = TableStateStore(service, f"t{uuid.uuid4().hex[:20]}")
    try:
        yield table
    finally:
        await table.close()


class BarrierStore:
    """Delegates to a store, holding each of the first `parties` loads at a barrier so
    that every contender has read the same ETag before anyone writes."""

    def __init__(self, inner: StateStore, parties: int) -> None:
        self._inner = inner
        self._barrier = asyncio.Barrier(parties)
        self._waiting = parties
        self.conflicts = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def load(self, order_id: str) -> OrderProcess | None:
        found = await self._inner.load(order_id)
        if self._waiting > 0:
            self._waiting -= 1
            await self._barrier.wait()
        return found

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        try:
            return await self._inner.save(process, history)
        except ConcurrencyConflict:
            self.conflicts += 1
            raise


def world_on(store: StateStore) -> World:
    world = World()
    world.store = store  # type: ignore[assignment]
    return world


async def started(world: World, order_id: str) -> OrderProcess:
    """Stored Pending (as past the intake's burst): the tests take it on step by step."""
    deps = world.deps(claim_at_intake=False)
    await submit_order(deps, an_order(order_id, skus=("a", "b"), reply_to="client"))
    loaded = await world.store.load(order_id)
    assert loaded is not None
    return loaded


async def test_order_and_state_round_trip(store: StateStore) -> None:
    world = world_on(store)
    stored = await started(world, "rt-1")
    assert stored.etag
    assert stored.order.items == an_order("rt-1", skus=("a", "b")).items
    assert stored.order.reply_to == "client"
    assert stored.state.process_state is ProcessState.PENDING
    assert stored.state.locked_by is None and stored.state.complete_by is None
    assert stored.state.created_at == world.clock.now()
    assert [m.message_id for m in stored.state.outbox] == [
        "status:rt-1:Received:1",
        "nudge:rt-1:1",
    ]
    assert [s.name for s in stored.steps] == [s.name for s in ORDER_FULFILMENT.steps]
    assert [h.event for h in await store.history("rt-1")] == ["submitted"]


async def test_create_twice_is_refused_and_changes_nothing(store: StateStore) -> None:
    world = world_on(store)
    stored = await started(world, "dup-1")
    transition = start(an_order("dup-1", fingerprint="other"), ORDER_FULFILMENT, world.clock.now())
    with pytest.raises(AlreadyExists):
        await store.create(transition.process, transition.history)
    again = await store.load("dup-1")
    assert again == stored


async def test_an_archived_orders_mark_keeps_its_id_and_no_view_shows_it(
    store: StateStore,
) -> None:
    """The archive's purge leaves the order's mark (issue 37, H): a create under the id
    is refused as for a live order, and a load, a listing or a state read finds nothing."""
    world = world_on(store)
    stored = await started(world, "gone-1")
    await started(world, "kept-1")
    assert stored.etag is not None
    mark = ArchivedMark("gone-1", stored.order.fingerprint, ProcessState.PROCESSED, NOW)
    if isinstance(store, TableStateStore):
        assert await TableArchiveStore(store).purge(mark, stored.etag)
    else:
        assert isinstance(store, InMemoryStateStore)
        assert await InMemoryArchiveStore(store).purge(mark, stored.etag)

    transition = start(an_order("gone-1", fingerprint="other"), ORDER_FULFILMENT, NOW)
    with pytest.raises(AlreadyExists):
        await store.create(transition.process, transition.history)
    assert await store.load("gone-1") is None
    assert await store.archived("gone-1") == mark
    assert await store.archived("kept-1") is None
    assert [s.order_id for s in (await store.list_by_state(None, 10, None)).items] == ["kept-1"]
    assert [s.order_id for s in await store.states(["gone-1", "kept-1"])] == ["kept-1"]


async def test_save_with_stale_etag_changes_nothing(store: StateStore) -> None:
    world = world_on(store)
    stored = await started(world, "stale-1")
    claim = forward.claim(stored, ORDER_FULFILMENT, world.policy, "a", world.clock.now())
    assert claim is not None
    new_etag = await store.save(claim.process, claim.history)
    assert new_etag != stored.etag
    result = replace(claim.process.steps[0], status=StepStatus.COMPLETED, result={"x": 1})
    stale = replace(stored, steps=(result, *stored.steps[1:]))
    with pytest.raises(ConcurrencyConflict):
        await store.save(stale, claim.history)
    after = await store.load("stale-1")
    assert after is not None
    assert after.etag == new_etag
    assert after.steps[0].status is StepStatus.RUNNING and after.steps[0].result is None
    assert [h.event for h in await store.history("stale-1")] == [
        "submitted",
        "claimed",
        "step-dispatched",
    ]


async def test_step_results_and_errors_round_trip(store: StateStore) -> None:
    world = world_on(store)
    stored = await started(world, "res-1")
    claim = forward.claim(stored, ORDER_FULFILMENT, world.policy, "a", world.clock.now())
    assert claim is not None
    steps = (
        replace(
            claim.process.steps[0], status=StepStatus.COMPLETED, result={"id": "r-1", "n": [1]}
        ),
        replace(
            claim.process.steps[1], status=StepStatus.FAILED, error=ErrorInfo("declined", "no")
        ),
        claim.process.steps[2],
    )
    await store.save(replace(claim.process, steps=steps), claim.history)
    loaded = await store.load("res-1")
    assert loaded is not None
    assert loaded.steps == steps
    assert loaded.state == claim.process.state


async def test_eight_concurrent_claimers_exactly_one_wins(store: StateStore) -> None:
    world = world_on(store)
    await started(world, "race-1")
    world.bus.take(Queue.SCHEDULER)
    racing = BarrierStore(store, parties=8)
    world.store = racing  # type: ignore[assignment]
    results = await asyncio.gather(
        *(scheduler.on_nudge(world.deps(f"scheduler-{i}"), "race-1") for i in range(8))
    )
    assert sorted(results) == sorted([Handled.APPLIED] + [Handled.STALE] * 7)
    assert racing.conflicts == 7
    claimed = await store.load("race-1")
    assert claimed is not None
    assert claimed.state.attempt == 1
    winner = results.index(Handled.APPLIED)
    assert claimed.state.locked_by == f"scheduler-{winner}"
    requests = world.bus.on(agent_queue("inventory"))
    assert len(requests) == 1 and requests[0].body["attempt"] == 1


async def test_four_concurrent_supervisors_recover_each_order_once(store: StateStore) -> None:
    world = world_on(store)
    ids = [f"sup-{i:02d}" for i in range(50)]
    await asyncio.gather(*(started(world, i) for i in ids))
    await asyncio.gather(*(scheduler.on_nudge(world.deps(), i) for i in ids))
    world.clock.advance(world.policy.step_timeout.total_seconds() + 1)
    world.bus.take(Queue.SCHEDULER)
    reports = await asyncio.gather(*(sweep(world.deps(), concurrency=8) for _ in range(4)))
    assert sum(r.requeued for r in reports) == 50
    recovered = [o for r in reports for o in r.recovered_orders]
    assert sorted(recovered) == ids
    for order_id in ids:
        state = await store.load(order_id)
        assert state is not None
        assert state.state.failure_count == 1
        assert state.state.process_state is ProcessState.PENDING
    nudges = world.bus.on(Queue.SCHEDULER)
    assert sorted(n.body["orderId"] for n in nudges) == ids


async def test_watch_list_finds_only_due_entries_and_honours_etags(store: StateStore) -> None:
    world = world_on(store)
    now = world.clock.now()
    await store.watch("w-1", now + timedelta(seconds=5), replace=False)
    await store.watch("w-2", now + timedelta(seconds=50), replace=False)
    await store.watch("w-1", now + timedelta(seconds=500), replace=False)  # kept as it was
    due = await store.due(now + timedelta(seconds=10), limit=10)
    assert [e.order_id for e in due] == ["w-1"]
    entry = due[0]
    await store.reschedule(entry, now + timedelta(seconds=100))
    await store.reschedule(entry, now + timedelta(seconds=1))  # stale ETag: ignored
    assert [e.order_id for e in await store.due(now + timedelta(seconds=60), 10)] == ["w-2"]
    await store.unwatch("w-2")
    await store.unwatch("w-2")
    later = await store.due(now + timedelta(seconds=1000), 10)
    assert [e.order_id for e in later] == ["w-1"]
    assert await store.due(now + timedelta(seconds=1000), limit=0) == ()


async def test_an_entry_written_with_its_customer_names_it_when_due(store: StateStore) -> None:
    """What the Supervisor needs to give back the count of an order never created."""
    now = world_on(store).clock.now()
    await store.watch("w-1", now, replace=False, version=1, customer="cust/7")
    await store.watch("w-2", now, replace=False, version=1)
    await store.rewatch("w-1", now, version=1)  # a retry's rewatch keeps it
    due = {e.order_id: e.customer for e in await store.due(now, limit=10)}
    assert due == {"w-1": "cust/7", "w-2": ""}


async def test_unwatch_for_a_version_keeps_an_entry_written_for_a_later_one(
    store: StateStore,
) -> None:
    now = World().clock.now()
    await store.watch("v-1", now, replace=False, version=3)
    await store.unwatch("v-1", version=2)  # the Scheduler finished version 2 ...
    (entry,) = await store.due(now, 10)  # ... but a resubmit already watched version 3
    assert entry.version == 3
    await store.reschedule(entry, now)
    (moved,) = await store.due(now, 10)
    assert moved.version == 3  # rescheduling keeps the version
    await store.unwatch("v-1", version=3)
    assert await store.due(now, 10) == ()
    await store.watch("v-2", now, replace=False, version=9)
    await store.unwatch("v-2")  # no version: unconditional
    assert await store.due(now, 10) == ()


async def test_a_resubmit_racing_the_schedulers_unwatch_stays_watched(store: StateStore) -> None:
    """The Scheduler saves Error and unwatches; an operator resubmits in between. Whatever
    the interleaving, an order that is Pending again is on the watch list."""
    for round_ in range(6):
        world = replace(world_on(store), policy=replace(World().policy, max_failure_count=1))
        order_id = f"race-{round_}"
        await started(world, order_id)
        await scheduler.on_nudge(world.deps(), order_id)
        world.clock.advance(31)
        process = await store.load(order_id)
        assert process is not None
        transition = recover(process, ORDER_FULFILMENT, world.policy, world.clock.now())
        assert transition is not None and transition.is_at_rest
        await store.save(transition.process, transition.history)
        scheduler_unwatch = store.unwatch(order_id, transition.process.state.version)
        operator = resubmit_order(world.deps(), order_id, "alice")
        if round_ == 0:  # the worst case: the Scheduler unwatches after the resubmit
            await operator
            await scheduler_unwatch
        elif round_ % 2:
            await asyncio.gather(scheduler_unwatch, operator)
        else:
            await asyncio.gather(operator, scheduler_unwatch)
        resumed = await store.load(order_id)
        assert resumed is not None and resumed.state.process_state is ProcessState.PENDING
        due = await store.due(world.clock.now() + timedelta(days=1), 1000)
        assert order_id in {e.order_id for e in due}


async def test_a_missing_orders_entry_goes_only_as_read_and_a_rewatch_outdates_any_read(
    store: StateStore,
) -> None:
    now = World().clock.now()
    later = now + timedelta(seconds=500)
    assert await store.watch("m-1", now, replace=False, version=1)
    assert not await store.watch("m-1", later, replace=False, version=1)
    (read,) = await store.due(now, 10)
    await store.rewatch("m-1", later, version=7)
    (after,) = await store.due(now, 10)
    assert (after.check_at, after.version) == (read.check_at, 1)  # only its ETag moved
    assert after.etag != read.etag
    await store.unwatch_entry(read)  # read before the rewatch: kept
    assert [e.order_id for e in await store.due(now, 10)] == ["m-1"]
    await store.unwatch_entry(after)
    assert await store.due(later, 10) == ()
    await store.unwatch_entry(after)  # gone: nothing to do
    await store.rewatch("m-1", later, version=2)  # gone: written anew
    (anew,) = await store.due(later, 10)
    assert (anew.check_at, anew.version) == (later, 2)


async def test_an_entry_moved_by_the_etag_its_watch_gave_loses_to_a_write_since(
    store: StateStore,
) -> None:
    """The intake moves its own entry to a waiting order's hold by the ETag its insert
    returned: a promotion's write in between keeps its earlier check."""
    now = World().clock.now()
    soon, hold = now + timedelta(seconds=30), now + timedelta(minutes=10)
    etag = await store.watch("h-1", now, replace=False, version=1)
    assert etag is not None
    await store.reschedule(WatchEntry("h-1", now, etag, 1), hold)
    assert [e.order_id for e in await store.due(hold, 10)] == ["h-1"]
    assert await store.due(soon, 10) == ()

    etag = await store.watch("h-2", now, replace=False, version=1)
    assert etag is not None
    assert await store.watch("h-2", soon, replace=True)  # the promotion's
    await store.reschedule(WatchEntry("h-2", now, etag, 1), hold)
    assert [(e.order_id, e.check_at) for e in await store.due(soon, 10)] == [("h-2", soon)]


async def test_a_promotion_racing_an_earlier_check_never_pushes_it_back(
    store: StateStore,
) -> None:
    """A promotion moves the promoted order's check up to its recheck. Another writer
    may have put an earlier one there, or be putting it there at the same moment (the
    intake's first look, kept by its rewatch; an operator's move): both requests in
    flight at once, in either order of issue, the earlier check is what the entry holds
    afterwards. The promotion still moves a later check (the line's hold) up, and
    watches an order it finds unwatched."""
    now = World().clock.now()
    soon, recheck, hold = (now + timedelta(seconds=s) for s in (5, 30, 600))
    policy = CustomerPolicy(fair_share=1)
    customers = Customers(InMemoryCustomerLedger(), policy)
    bus = InMemoryBus()

    async def promoting(round_: int) -> str:
        """A customer of its own: one order running, the next waiting in its line."""
        running, waiting = f"pr-{round_}-a", f"pr-{round_}-b"
        first = await customers.ledger.enter(f"C{round_}", running, now, policy)
        second = await customers.ledger.enter(f"C{round_}", waiting, now, policy)
        assert (first.admission, second.admission) == (Admission.RUN, Admission.WAIT)
        return waiting

    for round_ in range(8):
        waiting = await promoting(round_)
        earlier: collections.abc.Awaitable[object]
        if round_ < 4:  # the intake's first look, its rewatch racing the promotion
            await store.watch(waiting, soon, replace=False, version=1)
            earlier = store.rewatch(waiting, soon, version=1)
        else:  # the line's hold, an earlier check written over it meanwhile
            await store.watch(waiting, hold, replace=False, version=1)
            earlier = store.watch(waiting, soon, replace=True, version=1)
        promotion = customers.release(f"C{round_}", f"pr-{round_}-a", store, bus, now)
        racing = [promotion, earlier]
        await asyncio.gather(*(racing if round_ % 2 else reversed(racing)))
        found = {e.order_id: e.check_at for e in await store.due(hold, 100)}
        assert found[waiting] == soon, f"round {round_}: the earlier check was pushed back"

    held = await promoting(8)
    await store.watch(held, hold, replace=False, version=1, customer="C8")
    await customers.release("C8", "pr-8-a", store, bus, now)
    unwatched = await promoting(9)
    await customers.release("C9", "pr-9-a", store, bus, now)
    entries = {e.order_id: e for e in await store.due(hold, 100)}
    promoted = entries[held]
    assert (promoted.check_at, promoted.version, promoted.customer) == (recheck, 1, "C8")
    assert entries[unwatched].check_at == recheck
    assert [m.message_id for m in bus.sent[-2:]] == [
        f"nudge:{held}:fair-share",
        f"nudge:{unwatched}:fair-share",
    ]


async def test_a_rewatch_racing_the_supervisors_delete_always_leaves_the_entry(
    store: StateStore,
) -> None:
    """Both requests in flight at once, in either order of issue: whichever the store
    applies first, the order is on the watch list afterwards."""
    now = World().clock.now()
    for round_ in range(8):
        order_id = f"wr-{round_}"
        await store.watch(order_id, now, replace=False, version=1)
        (read,) = [e for e in await store.due(now, 100) if e.order_id == order_id]
        racing = [store.unwatch_entry(read), store.rewatch(order_id, now, version=1)]
        await asyncio.gather(*(racing if round_ % 2 else reversed(racing)))
        assert order_id in {e.order_id for e in await store.due(now, 100)}


class FailingCreate:
    """Delegates to a store whose next create fails, as a 503 from storage would."""

    def __init__(self, inner: StateStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def create(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        raise StoreUnavailable("503 Server Busy")


class HeldAfterLoad:
    """Delegates to a store, holding its caller after the first load until `go` is set."""

    def __init__(self, inner: StateStore) -> None:
        self._inner = inner
        self.loaded = asyncio.Event()
        self.go = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def load(self, order_id: str) -> OrderProcess | None:
        found = await self._inner.load(order_id)
        if not self.loaded.is_set():
            self.loaded.set()
            await self.go.wait()
        return found


async def test_a_retry_accepted_while_the_supervisor_drops_its_missing_order_stays_watched(
    store: StateStore,
) -> None:
    """The first POST writes the watch entry and its create fails; at due time the
    Supervisor finds no order; the client's retry lands between that load and the
    Supervisor's delete and is accepted. The order must stay watched, so that when its
    nudge is lost a later sweep sends it again."""
    world = world_on(store)
    order = an_order("lost-1")
    with pytest.raises(StoreUnavailable):
        await submit_order(replace(world.deps(), store=FailingCreate(store)), order)  # type: ignore[arg-type]
    world.clock.advance(world.policy.pending_timeout.total_seconds() + 1)
    held = HeldAfterLoad(store)
    supervisor = replace(world.deps("supervisor-1"), store=held)  # type: ignore[arg-type]
    supervising = asyncio.create_task(sweep(supervisor))
    await held.loaded.wait()  # the Supervisor has found no order ...

    retried = await submit_order(world.deps("intake-2"), order)  # ... and the retry: 202
    held.go.set()
    await supervising

    assert retried.created
    world.bus.take(Queue.SCHEDULER)  # its nudge is lost
    due = await store.due(world.clock.now() + timedelta(days=1), 1000)
    assert "lost-1" in {e.order_id for e in due}
    world.clock.advance(world.policy.pending_timeout.total_seconds() + 1)
    report = await sweep(world.deps("supervisor-1"))
    assert report.recovered_orders == ["lost-1"]
    assert [n.body["orderId"] for n in world.bus.on(Queue.SCHEDULER)] == ["lost-1"]


async def test_finished_orders_leave_the_watch_list(store: StateStore) -> None:
    world = world_on(store)
    await started(world, "fin-1")
    await scheduler.on_nudge(world.deps(), "fin-1")
    for queue in (agent_queue("inventory"), agent_queue("payment"), agent_queue("shipping")):
        (request,) = world.bus.take(queue)
        await scheduler.on_reply(world.deps(), a_reply(request))
    done = await store.load("fin-1")
    assert done is not None and done.state.process_state is ProcessState.PROCESSED
    assert await store.due(world.clock.now() + timedelta(days=365), 100) == ()


async def test_list_by_state_pages_through_matches(store: StateStore) -> None:
    world = world_on(store)
    for i in range(5):
        await started(world, f"list-{i}")
    await scheduler.on_nudge(world.deps(), "list-0")
    seen: list[str] = []
    token = None
    for _ in range(5):
        page = await store.list_by_state(ProcessState.PENDING, 2, token)
        seen.extend(s.order_id for s in page.items)
        token = page.continuation
        if token is None:
            break
    assert sorted(seen) == ["list-1", "list-2", "list-3", "list-4"]
    everything = await store.list_by_state(None, 100, None)
    assert len(everything.items) == 5


@pytest.mark.parametrize("error_chars", [0, 100, 2 * 16_000 + 5, 4 * 16_000 + 5])
async def test_a_listed_state_is_the_state_a_load_reads(
    store: StateStore, error_chars: int
) -> None:
    """A listing asks the table for the state's columns only (not the steps and history);
    an error text longer than the parts it asks for is read whole."""
    world = world_on(store)
    loaded = await started(world, "listed-1")
    state = replace(loaded.state, last_error=("é" * error_chars) or None, failure_count=2)
    await store.save(replace(loaded, state=state), [])
    again = await store.load("listed-1")
    assert again is not None and again.state.last_error == state.last_error
    page = await store.list_by_state(state.process_state, 10, None)
    assert page.items == (again.state,)


def a_sample(tp: Any, name: str) -> Any:
    """A value of type `tp` that no field would have by default."""
    if get_origin(tp) in (Union, types.UnionType):
        return a_sample(next(a for a in get_args(tp) if a is not type(None)), name)
    if get_origin(tp) is tuple:
        return (a_sample(get_args(tp)[0], name),)
    if isinstance(tp, type) and issubclass(tp, Enum):
        return list(tp)[-1]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = get_type_hints(tp)
        return tp(**{f.name: a_sample(hints[f.name], f.name) for f in dataclasses.fields(tp)})
    samples: dict[Any, Any] = {
        str: f"{name}-sample",
        int: 7,
        float: 1.25,
        bool: True,
        datetime: datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    }
    if tp in samples:
        return samples[tp]
    if get_origin(tp) is collections.abc.Mapping:
        return {"id": name, "nested": {"n": [1, 2.5, None, "ü"]}}
    raise AssertionError(f"no sample for {tp!r}: extend a_sample")


async def test_every_step_field_round_trips(store: StateStore) -> None:
    """Built from the fields themselves, so a field added to StepRecord is covered too."""
    world = world_on(store)
    stored = await started(world, "fields-1")
    hints = get_type_hints(StepRecord)
    changes = {
        f.name: a_sample(hints[f.name], f.name)
        for f in dataclasses.fields(StepRecord)
        if f.name != "name"
    }
    for f in dataclasses.fields(StepRecord):
        if f.name in changes:
            assert changes[f.name] != f.default, f"the sample of {f.name} is its default"
    step = replace(stored.steps[1], **changes)
    steps = (stored.steps[0], step, *stored.steps[2:])
    await store.save(replace(stored, steps=steps), ())
    loaded = await store.load("fields-1")
    assert loaded is not None
    assert loaded.steps == steps


async def test_a_steps_key_round_and_refusal_round_trip(store: StateStore) -> None:
    """A retriable step refused for good is stored with its refusal; the resubmit moves
    its do key to the next round (machine/rekey.py), and a load reads that round back,
    so the Supervisor and reconciliation ask the key that was sent."""
    world = world_on(store)
    deps = world.deps()
    await submit_order(deps, an_order("round-1", clock=world.clock), workflow=EXPRESS_DELIVERY)
    for agent in ("inventory", "payment", "shipping"):
        (request,) = world.bus.take(agent_queue(agent))
        await scheduler.on_reply(deps, a_reply(request))
    (notify,) = world.bus.take(agent_queue("notifications"))
    await scheduler.on_reply(deps, a_reply(notify, Outcome.FAILED))
    held = await store.load("round-1")
    assert held is not None
    assert (held.steps[-1].refused, held.steps[-1].do_round) == (Action.DO, 0)
    await resubmit_order(deps, "round-1", "op")
    moved = await store.load("round-1")
    assert moved is not None
    assert (moved.steps[-1].refused, moved.steps[-1].do_round) == (None, 1)
    assert moved.steps[-1].rekeyed_at == (held.state.attempt,)
    assert [s.do_round for s in moved.steps[:-1]] == [0, 0, 0]
    assert [s.rekeyed_at for s in moved.steps[:-1]] == [(), (), ()]
    await scheduler.on_nudge(deps, "round-1")
    (again,) = world.bus.take(agent_queue("notifications"))
    assert again.body["idempotencyKey"] == "round-1:notify-customer:r2"


def the_largest_order(order_id: str) -> Order:
    """The largest order either intake accepts: 100 lines of 128-character SKUs and a
    128-character customer id, in characters that take the most room once stored (a
    non-ASCII character is six code units as JSON, an astral one two; control characters
    are refused). The HTTP route's 64 KiB body limit refuses it; the `orders` queue's
    256 KiB accepts it."""
    escaped, astral = "\u00ff" * 128, "\U0001f600" * 128
    body = {
        "orderId": order_id,
        "customerId": escaped,
        "items": [
            {"sku": astral if i % 10 == 0 else escaped, "quantity": 1_000_000, "unitPrice": 1e12}
            for i in range(100)
        ],
        "priority": "high",
        "replyTo": "q" * 256,
    }
    raw = json.dumps(body).encode()
    assert len(raw) <= MAX_MESSAGE_BYTES
    submission = OrderSubmission.parse(raw)
    assert len(submission.items) == 100
    return submission.to_order(datetime(2030, 1, 1, tzinfo=UTC))


async def test_the_largest_accepted_order_round_trips(store: StateStore) -> None:
    world = world_on(store)
    order = the_largest_order("big-1")
    await submit_order(world.deps(claim_at_intake=False), order)  # its claim comes below
    stored = await store.load("big-1")
    assert stored is not None and stored.order == order
    claim = forward.claim(stored, ORDER_FULFILMENT, world.policy, "a", world.clock.now())
    assert claim is not None
    request = next(m for m in claim.process.state.outbox if "payload" in m.body)
    assert len(request.body["payload"]["items"]) == 100
    await store.save(claim.process, claim.history)
    claimed = await store.load("big-1")
    assert claimed is not None
    assert claimed.order == order
    assert claimed.state == claim.process.state
    assert claimed.steps == claim.process.steps
