"""Step heartbeats on real Azurite: the conditional write, and beats racing replies."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table.store import TableStateStore
from shared.domain.machine import forward
from shared.domain.machine.forward import claim, start
from shared.domain.machine.transition import ProcessPolicy
from shared.domain.messages import AgentReply, AgentRequest
from shared.domain.model import Action, Outcome, StepStatus
from shared.ports import ConcurrencyConflict
from shared.settings import azurite_connection_string
from shared.usecases.flow.step_heartbeat import StepHeartbeats
from shared.usecases.flow.unit_of_work import UnitOfWork
from tests.builders import a_policy, an_order
from tests.workflows import CATALOGUE, ORDER_FULFILMENT

pytestmark = [pytest.mark.azurite]

T0 = datetime(2026, 11, 24, 9, 0, 0, 250000, tzinfo=UTC)
POLICY: ProcessPolicy = replace(
    a_policy(step_timeout=6),
    step_heartbeat=timedelta(seconds=10),
    step_max=timedelta(seconds=300),
)


@pytest.fixture
async def store(azurite_table_port: int) -> AsyncIterator[TableStateStore]:
    service = TableServiceClient.from_connection_string(
        azurite_connection_string(azurite_table_port)
    )
    table = TableStateStore(service, f"hb{uuid.uuid4().hex[:20]}")
    try:
        yield table
    finally:
        await table.close()


async def dispatched(store: TableStateStore, order_id: str) -> AgentRequest:
    """A stored order whose first step went out at T0 (attempt 1); its agent request."""
    started = start(an_order(order_id), ORDER_FULFILMENT, T0)
    await store.create(started.process, started.history)
    loaded = await store.load(order_id)
    assert loaded is not None
    claimed = claim(loaded, ORDER_FULFILMENT, POLICY, "scheduler-1", T0)
    assert claimed is not None
    await store.save(claimed.process, claimed.history)
    [request] = [m for m in claimed.outgoing if m.body.get("action") == "do"]
    return AgentRequest.parse(json.dumps(dict(request.body)))


def beats_at(seconds: float, store: TableStateStore) -> StepHeartbeats:
    clock = FakeClock(T0)
    clock.advance(seconds)
    return StepHeartbeats(UnitOfWork(store, InMemoryBus(), catalogue=CATALOGUE), clock, POLICY)


async def test_a_beat_is_a_conditional_write_that_round_trips(store: TableStateStore) -> None:
    request = await dispatched(store, "hb-1")
    stale = await store.load("hb-1")
    assert stale is not None
    extended = await beats_at(5, store).beat(request)
    assert extended == T0 + timedelta(seconds=15)
    loaded = await store.load("hb-1")
    assert loaded is not None
    step = loaded.steps[0]
    assert step.dispatched_at == T0
    assert step.complete_by == extended and loaded.state.complete_by == extended
    assert step.step_heartbeats == 1
    assert [h.event for h in await store.history("hb-1")][-1] == "step-heartbeat"
    with pytest.raises(ConcurrencyConflict):
        await store.save(replace(stale, state=replace(stale.state, last_error="x")), [])
    again = await beats_at(8, store).beat(request)
    assert again == T0 + timedelta(seconds=18)
    assert [h.event for h in await store.history("hb-1")].count("step-heartbeat") == 1


async def test_two_racing_beats_both_land_or_give_way(store: TableStateStore) -> None:
    request = await dispatched(store, "hb-2")
    first, second = await asyncio.gather(
        beats_at(4, store).beat(request), beats_at(5, store).beat(request)
    )
    loaded = await store.load("hb-2")
    assert loaded is not None
    written = [b for b in (first, second) if b is not None]
    assert written, "one beat at least wins its conditional write"
    assert loaded.steps[0].complete_by == max(written)
    assert loaded.steps[0].step_heartbeats == len(written)


async def test_a_beat_racing_the_reply_never_revives_the_finished_step(
    store: TableStateStore,
) -> None:
    request = await dispatched(store, "hb-3")
    reply = AgentReply(
        order_id="hb-3",
        step=request.step,
        action=Action.DO,
        attempt=request.attempt,
        outcome=Outcome.SUCCEEDED,
        result={"ref": "r-1"},
        error=None,
    )

    async def apply_reply() -> None:
        for _ in range(3):
            loaded = await store.load("hb-3")
            assert loaded is not None
            now = T0 + timedelta(seconds=5)
            applied = forward.apply_reply(loaded, ORDER_FULFILMENT, POLICY, reply, now)
            if applied is None:
                return
            try:
                await store.save(applied.process, applied.history)
                return
            except ConcurrencyConflict:
                continue

    beat, _ = await asyncio.gather(beats_at(5, store).beat(request), apply_reply())
    loaded = await store.load("hb-3")
    assert loaded is not None
    assert loaded.steps[0].status is StepStatus.COMPLETED
    assert loaded.state.current_step == 1
    assert loaded.steps[1].status is StepStatus.RUNNING
    assert loaded.steps[1].step_heartbeats == 0
    assert beat is None or beat == T0 + timedelta(seconds=15)
