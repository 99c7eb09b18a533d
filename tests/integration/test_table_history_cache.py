"""The table store's history cache on real Azurite, when two orders' state entities carry
the same ETag string.

Table ETags are the entity's timestamp (W/"datetime'...'"), so two entities written in
one tick read alike. Azurite rarely ties on cue, so a thin layer in front of the store's
single-entity requests (shared/adapters/table/entities.py) makes every ETag read the
same string and turns it back into the entity's real one on a write: the conditions the
service checks stay real.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.table.entities import TableEntities
from shared.adapters.table.store import TableStateStore
from shared.domain.machine import forward
from shared.domain.machine.forward import start
from shared.domain.model import ProcessState
from shared.settings import azurite_connection_string
from tests.builders import a_policy, an_order
from tests.workflows import ORDER_FULFILMENT

pytestmark = pytest.mark.azurite

TIED = "W/\"datetime'2026-11-24T09%3A00%3A00.25Z'\""


class TiedETags:
    """The store's single-entity requests, on which every entity's ETag reads `TIED`."""

    def __init__(self, inner: TableEntities) -> None:
        self._inner = inner
        self._real: dict[tuple[str, str], str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _tie(self, entity: Any, etag: str) -> str:
        self._real[(str(entity["PartitionKey"]), str(entity["RowKey"]))] = etag
        return TIED

    async def insert(self, entity: Any) -> str:
        return self._tie(entity, await self._inner.insert(entity))

    async def replace(self, entity: Any, if_match: str | None) -> str:
        if if_match == TIED:
            if_match = self._real[(str(entity["PartitionKey"]), str(entity["RowKey"]))]
        return self._tie(entity, await self._inner.replace(entity, if_match))

    async def read(self, partition_key: str, row_key: str, select: Any = None) -> Any:
        entity = await self._inner.read(partition_key, row_key, select)
        entity.metadata["etag"] = self._tie(entity, str(entity.metadata["etag"]))
        return entity


@pytest.fixture
async def tied_store(azurite_table_port: int) -> AsyncIterator[TableStateStore]:
    service = TableServiceClient.from_connection_string(
        azurite_connection_string(azurite_table_port)
    )
    store = TableStateStore(service, f"h{uuid.uuid4().hex[:20]}")
    store._entities = TiedETags(store._entities)  # type: ignore[assignment]
    try:
        yield store
    finally:
        await store.close()


async def test_two_orders_whose_state_etags_tie_each_save_their_own_history(
    tied_store: TableStateStore,
) -> None:
    store, clock = tied_store, FakeClock()
    first = start(an_order("tie-a", clock=clock), ORDER_FULFILMENT, clock.now())
    clock.advance(3600)
    second = start(an_order("tie-b", clock=clock), ORDER_FULFILMENT, clock.now())
    await store.create(first.process, first.history)
    await store.create(second.process, second.history)
    a = await store.load("tie-a")
    b = await store.load("tie-b")
    assert a is not None and b is not None
    assert a.etag == b.etag == TIED  # two entities written in one tick

    for loaded, started in ((a, first), (b, second)):
        claim = forward.claim(loaded, ORDER_FULFILMENT, a_policy(), "s-1", clock.now())
        assert claim is not None
        await store.save(claim.process, claim.history)
        saved = await store.history(loaded.order_id)
        expected = [*started.history, *claim.history]
        assert [(h.event, h.at) for h in saved] == [(h.event, h.at) for h in expected]


@pytest.fixture
async def store(azurite_table_port: int) -> AsyncIterator[TableStateStore]:
    service = TableServiceClient.from_connection_string(
        azurite_connection_string(azurite_table_port)
    )
    store = TableStateStore(service, f"h{uuid.uuid4().hex[:20]}")
    try:
        yield store
    finally:
        await store.close()


async def test_a_final_order_keeps_no_history_in_the_cache(store: TableStateStore) -> None:
    """Nothing saves a Processed, Compensated or Cancelled order again: its history kept
    for that save only took memory, for every order finished or looked at (issue 27)."""
    clock = FakeClock()
    started = start(an_order("fin-1", clock=clock), ORDER_FULFILMENT, clock.now())
    await store.create(started.process, started.history)
    loaded = await store.load("fin-1")
    assert loaded is not None and len(store._inline) == 1  # the save to come needs it
    done = replace(loaded, state=replace(loaded.state, process_state=ProcessState.PROCESSED))
    await store.save(done, [])
    assert len(store._inline) == 0
    again = await store.load("fin-1")
    assert again is not None and again.state.process_state is ProcessState.PROCESSED
    assert len(store._inline) == 0
    assert [h.event for h in await store.history("fin-1")] == [h.event for h in started.history]
