"""Two bulk runners on two instances, against one real Azurite table: each run of the
bulk timer is worked by one of them only, and no order is acted on twice.

Each runner has its own table clients, as two runtime processes do; they share one fake
clock (their clocks agree) and one in-memory bus (not under test). What a runner acted
on is what its state store saved: every bulk action ends in a save of the order.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table.bulk import TableBulkStore
from shared.adapters.table.store import TableStateStore
from shared.domain.bulk import BulkJob, JobState, acted_by
from shared.domain.bulk_request import BulkAction, BulkFilter, BulkRequest
from shared.domain.model import HistoryEntry, OrderProcess, ProcessState
from shared.ports import BulkStore, StateStore
from shared.settings import azurite_connection_string
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.submission import submit_order
from shared.usecases.operations.bulk import BulkDeps, job_status, start_job, work_jobs
from tests.builders import a_policy, an_order
from tests.workflows import CATALOGUE

pytestmark = pytest.mark.azurite

ORDERS = 12
PENDING = BulkFilter(state=ProcessState.PENDING)


@dataclass
class Acts:
    """Which runner saved which order, in order."""

    saves: list[tuple[str, str]] = field(default_factory=list)
    after_save: Callable[[int], Awaitable[None]] | None = None

    def by(self, runner: str) -> list[str]:
        return [order for who, order in self.saves if who == runner]


class Acting:
    """A runner's state store: records its saves, and may run something after one."""

    def __init__(self, inner: StateStore, runner: str, acts: Acts) -> None:
        self._inner, self._runner, self._acts = inner, runner, acts

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        etag = await self._inner.save(process, history)
        self._acts.saves.append((self._runner, process.order_id))
        if self._acts.after_save is not None:
            await self._acts.after_save(len(self._acts.saves))
        return etag


class Gate:
    """Holds both runners after they listed the Running jobs, so they race from there."""

    def __init__(self) -> None:
        self.barrier: asyncio.Barrier | None = None

    def wrap(self, inner: BulkStore) -> BulkStore:
        gate = self

        class Gated:
            def __getattr__(self, name: str) -> object:
                return getattr(inner, name)

            async def jobs(self, state: JobState) -> tuple[BulkJob, ...]:
                found = await inner.jobs(state)
                if gate.barrier is not None:
                    await gate.barrier.wait()
                return found

        return Gated()  # type: ignore[return-value]


@dataclass
class Runners:
    one: BulkDeps
    two: BulkDeps
    clock: FakeClock
    acts: Acts
    gate: Gate
    store: TableStateStore


@pytest.fixture
async def runners(azurite_table_port: int) -> AsyncIterator[Runners]:
    connection = azurite_connection_string(azurite_table_port)
    name = f"r{uuid.uuid4().hex[:20]}"
    stores = [
        TableStateStore(TableServiceClient.from_connection_string(connection), name)
        for _ in range(2)
    ]
    clock, bus, acts, gate = FakeClock(), InMemoryBus(), Acts(), Gate()

    def runner(n: int) -> BulkDeps:
        store = Acting(stores[n - 1], f"bulk-{n}", acts)
        process = ProcessDeps(store, bus, clock, a_policy(), f"bulk-{n}", catalogue=CATALOGUE)  # type: ignore[arg-type]
        return BulkDeps(process, gate.wrap(TableBulkStore(stores[n - 1])), actions_per_second=0.5)

    try:
        yield Runners(runner(1), runner(2), clock, acts, gate, stores[0])
    finally:
        for store in stores:
            await store.close()


async def a_suspend_job(runners: Runners) -> BulkJob:
    plain = ProcessDeps(  # Pending orders, as past the intake's burst
        runners.store,
        InMemoryBus(),
        runners.clock,
        a_policy(),
        "intake",
        catalogue=CATALOGUE,
        claim_at_intake=False,
    )
    for i in range(ORDERS):
        await submit_order(plain, an_order(f"b-{i:02d}", clock=runners.clock))
    job = await start_job(runners.one, BulkRequest(BulkAction.SUSPEND, PENDING), "ops")
    assert job.matched == ORDERS
    return job


async def acted_once_each(runners: Runners, job: BulkJob) -> None:
    """Every order suspended, each by one save and one `by bulk:` entry in its history."""
    assert sorted(Counter(order for _, order in runners.acts.saves).values()) == [1] * ORDERS
    for i in range(ORDERS):
        history = await runners.store.history(f"b-{i:02d}")
        assert sum(1 for h in history if h.detail.startswith("by bulk:")) == 1
        assert acted_by((h.detail for h in history), job.actor)
    done = await job_status(runners.one, job.bulk_id)
    assert (done.state, done.done, done.skipped, done.failed) == (JobState.DONE, ORDERS, 0, 0)


async def test_a_run_started_on_another_instance_mid_page_leaves_the_page_to_its_owner(
    runners: Runners,
) -> None:
    """The timer lock is per process: the second instance's tick comes while the first
    is halfway through its page. It must not act on that page too."""
    job = await a_suspend_job(runners)
    second: list[int] = []

    async def second_instance_ticks(saves: int) -> None:
        if saves == 5:
            second.append(await work_jobs(runners.two, budget=timedelta(seconds=20)))

    runners.acts.after_save = second_instance_ticks
    first = await work_jobs(runners.one, budget=timedelta(seconds=20))
    runners.acts.after_save = None

    assert second == [0] and runners.acts.by("bulk-2") == []
    assert first == len(runners.acts.by("bulk-1")) > 0
    runners.clock.advance(5)
    while (await job_status(runners.one, job.bulk_id)).state is JobState.RUNNING:
        await work_jobs(runners.two, budget=timedelta(seconds=20))
        runners.clock.advance(5)
    await acted_once_each(runners, job)


async def test_two_instances_ticking_together_one_acts_per_run_and_each_order_once(
    runners: Runners,
) -> None:
    job = await a_suspend_job(runners)
    for _ in range(ORDERS):
        if (await job_status(runners.one, job.bulk_id)).state is JobState.DONE:
            break
        runners.gate.barrier = asyncio.Barrier(2)
        before = len(runners.acts.saves)
        acted = await asyncio.gather(
            work_jobs(runners.one, budget=timedelta(seconds=20)),
            work_jobs(runners.two, budget=timedelta(seconds=20)),
        )
        runners.gate.barrier = None
        this_run = {who for who, _ in runners.acts.saves[before:]}
        assert len(this_run) <= 1, f"acting in one run: {sorted(this_run)}"
        assert sorted(acted)[0] == 0
        assert sorted(acted)[1] == len(runners.acts.saves) - before
        runners.clock.advance(5)
    await acted_once_each(runners, job)
