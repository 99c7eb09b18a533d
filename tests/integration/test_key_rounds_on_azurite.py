"""Steps stored before a step kept its key's round, on real Azurite: an older version
wrote each step's JSON without `do_round`, `undo_round` or `refused`. Such a row loads
at round 0, so its keys are the ones it was sent with (`{orderId}:{operation}`), and a
step at round 0 is still written as before, without them (shared/domain/machine/rekey.py).
A later version kept the round but not the attempt it moved at (`rekeyed_at`): such a
step loads at its round, with no date, and its replies read as the current round's."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator

import pytest
from azure.data.tables import UpdateMode
from azure.data.tables.aio import TableServiceClient

from shared.adapters.clock import FakeClock
from shared.adapters.memory.store import InMemoryBus
from shared.adapters.table.rows import STATE_ROW, STEPS
from shared.adapters.table.store import TableStateStore
from shared.contract import agent_queue
from shared.domain.machine.rekey import round_of
from shared.domain.model import Outcome
from shared.settings import azurite_connection_string
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.submission import submit_order
from shared.usecases.operations.operator import resubmit_order
from tests.builders import a_policy, a_reply, an_order
from tests.workflows import CATALOGUE, EXPRESS_DELIVERY

pytestmark = pytest.mark.azurite

ROUND_FIELDS = ("do_round", "undo_round", "refused")


@pytest.fixture
async def store(azurite_table_port: int) -> AsyncIterator[TableStateStore]:
    connection = azurite_connection_string(azurite_table_port)
    made = TableStateStore(
        TableServiceClient.from_connection_string(connection), f"o{uuid.uuid4().hex[:20]}"
    )
    await made.ensure_table()
    try:
        yield made
    finally:
        await made.close()


async def test_a_step_stored_without_its_round_loads_at_round_0(store: TableStateStore) -> None:
    """Held on a refused notify-customer as an older version stored it (no round, no
    refusal): it loads at round 0, and its resubmit sends the key it always had, since
    nothing says that key was refused (an older version's operator cleared the record)."""
    bus = InMemoryBus()
    deps = ProcessDeps(store, bus, FakeClock(), a_policy(), catalogue=CATALOGUE)
    order_id = f"old-{uuid.uuid4().hex[:8]}"
    await submit_order(deps, an_order(order_id), workflow=EXPRESS_DELIVERY)
    for agent in ("inventory", "payment", "shipping"):
        (request,) = bus.take(agent_queue(agent))
        await scheduler.on_reply(deps, a_reply(request))
    (notify,) = bus.take(agent_queue("notifications"))
    await scheduler.on_reply(deps, a_reply(notify, Outcome.FAILED))
    row = await store.table.get_entity(order_id, STATE_ROW)
    steps = json.loads(row[STEPS])
    assert steps[-1]["refused"] == "do"
    assert not any(f in step for step in steps[:-1] for f in ROUND_FIELDS), (
        "a step at round 0 is written as before"
    )
    row[STEPS] = json.dumps([{k: v for k, v in s.items() if k not in ROUND_FIELDS} for s in steps])
    await store.table.update_entity(row, mode=UpdateMode.REPLACE)

    old = await store.load(order_id)
    assert old is not None
    assert {(s.do_round, s.undo_round, s.refused) for s in old.steps} == {(0, 0, None)}
    await resubmit_order(deps, order_id, "op")
    await scheduler.on_nudge(deps, order_id)
    (again,) = bus.take(agent_queue("notifications"))
    assert again.body["idempotencyKey"] == f"{order_id}:notify-customer"


async def test_a_step_moved_before_rounds_were_dated_loads_at_its_round(
    store: TableStateStore,
) -> None:
    bus = InMemoryBus()
    deps = ProcessDeps(store, bus, FakeClock(), a_policy(), catalogue=CATALOGUE)
    order_id = f"dated-{uuid.uuid4().hex[:8]}"
    await submit_order(deps, an_order(order_id), workflow=EXPRESS_DELIVERY)
    for agent in ("inventory", "payment", "shipping"):
        (request,) = bus.take(agent_queue(agent))
        await scheduler.on_reply(deps, a_reply(request))
    (notify,) = bus.take(agent_queue("notifications"))
    await scheduler.on_reply(deps, a_reply(notify, Outcome.FAILED))
    await resubmit_order(deps, order_id, "op")
    row = await store.table.get_entity(order_id, STATE_ROW)
    steps = json.loads(row[STEPS])
    assert (steps[-1]["do_round"], steps[-1]["rekeyed_at"]) == (1, [notify.body["attempt"]])
    assert not any("rekeyed_at" in step for step in steps[:-1]), "left out when empty"
    row[STEPS] = json.dumps([{k: v for k, v in s.items() if k != "rekeyed_at"} for s in steps])
    await store.table.update_entity(row, mode=UpdateMode.REPLACE)

    old = await store.load(order_id)
    assert old is not None
    step = old.steps[-1]
    assert (step.do_round, step.rekeyed_at) == (1, ())
    assert round_of(step, notify.body["attempt"]) == 1, "undated: read as the current round"
    await scheduler.on_nudge(deps, order_id)
    (again,) = bus.take(agent_queue("notifications"))
    assert again.body["idempotencyKey"] == f"{order_id}:notify-customer:r2"
