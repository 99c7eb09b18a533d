"""Intake and health answer within their budgets whatever the store and the bus do: a
stored order is accepted while its nudge is still on its way, a silent store is
StoreUnavailable, and health names the dependency that does not answer."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest

from shared.adapters.memory.store import InMemoryBus, InMemoryStateStore
from shared.contract import Queue, agent_queue
from shared.domain.model import OrderProcess, Outgoing, ProcessState
from shared.ports import StoreUnavailable
from shared.usecases.flow.submission import submit_order
from shared.usecases.limits.budget import Budget
from shared.usecases.operations import health_check
from shared.usecases.operations.health_check import HealthCheck, Probe
from tests.builders import World, an_order

INVENTORY = agent_queue("inventory")
BUDGET = Budget(store=0.2, nudge=0.1)


def probes(world: World) -> HealthCheck:
    return HealthCheck(
        {"stateStore": Probe(world.store.ping), "serviceBus": Probe(world.bus.ping)}, world.clock
    )


class SlowBus(InMemoryBus):
    """Sends (and pings) wait until `release` is set, like a broker that does not answer."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.sending = asyncio.Event()  # set once a send has begun (and waits for release)

    async def send(self, messages: Sequence[Outgoing]) -> None:
        self.sending.set()
        await self.release.wait()
        await super().send(messages)

    async def ping(self) -> None:
        await self.release.wait()


class SilentStore(InMemoryStateStore):
    """Every call hangs, like a store that accepted the connection and went quiet."""

    async def load(self, order_id: str) -> OrderProcess | None:
        await asyncio.sleep(3600)
        return None

    async def watch(
        self,
        order_id: str,
        check_at: Any,
        *,
        replace: bool,
        version: int = 0,
        customer: str = "",
    ) -> str | None:
        await asyncio.sleep(3600)
        return None

    async def ping(self) -> None:
        await asyncio.sleep(3600)


async def test_a_stored_order_is_accepted_while_its_request_is_late_and_it_still_goes() -> None:
    world = World()
    bus = world.bus = SlowBus()
    begun = time.monotonic()
    submitted = await submit_order(world.deps(), an_order("o-1"), budget=BUDGET)
    assert time.monotonic() - begun < 0.5
    assert submitted.created
    assert submitted.process_state is ProcessState.PROCESSING  # claimed at intake
    assert await world.store.load("o-1") is not None
    assert "o-1" in world.store.watched()
    assert bus.on(INVENTORY) == []
    bus.release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    (request,) = bus.on(INVENTORY)
    assert request.body["orderId"] == "o-1"


async def test_a_late_send_that_fails_is_only_logged(caplog: pytest.LogCaptureFixture) -> None:
    world = World()
    bus = world.bus = SlowBus()
    bus.fail_next = 1
    submitted = await submit_order(world.deps(), an_order("o-1"), budget=BUDGET)
    assert submitted.created
    bus.release.set()
    for _ in range(10):
        await asyncio.sleep(0)
    assert bus.on(INVENTORY) == [] and bus.on(Queue.ORDER_STATUS) == []
    assert "the Supervisor's next check sends it again" in caplog.text


async def test_a_repeated_submission_within_budget_answers_with_the_stored_order() -> None:
    world = World()
    world.bus = SlowBus()
    first = await submit_order(world.deps(), an_order("o-1"), budget=BUDGET)
    again = await submit_order(world.deps(), an_order("o-1"), budget=BUDGET)
    assert first.created and not again.created
    assert again.order_id == "o-1"


async def test_a_silent_store_is_store_unavailable_within_the_budget() -> None:
    world = World(store=SilentStore())
    begun = time.monotonic()
    with pytest.raises(StoreUnavailable, match=r"no answer within 0\.2 s"):
        await submit_order(world.deps(), an_order("o-1"), budget=BUDGET)
    assert time.monotonic() - begun < 0.5


async def test_without_a_budget_the_submission_waits_for_its_sends() -> None:
    world = World()
    bus = world.bus = SlowBus()
    submitting = asyncio.ensure_future(submit_order(world.deps(), an_order("o-1")))
    await asyncio.wait_for(bus.sending.wait(), 5)  # the request is on its way, held
    await asyncio.sleep(0)  # the submission's turn, were it not waiting for its sends
    assert not submitting.done()
    bus.release.set()
    assert (await submitting).created
    assert len(bus.on(INVENTORY)) == 1


async def test_health_names_the_bus_that_does_not_answer_within_the_probe_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(health_check, "PROBE_TIMEOUT", 0.1)
    world = World()
    world.bus = SlowBus()
    begun = time.monotonic()
    report = await probes(world).report()
    assert time.monotonic() - begun < 0.5
    assert report == {"stateStore": "ok", "serviceBus": "unavailable: no answer within 0.1 s"}


async def test_health_probes_both_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_check, "PROBE_TIMEOUT", 0.5)
    world = World(store=SilentStore())
    world.bus = SlowBus()
    begun = time.monotonic()
    report = await probes(world).report()
    assert time.monotonic() - begun < 0.9  # one after the other would take 1 s
    assert report["stateStore"].startswith("unavailable")
    assert report["serviceBus"].startswith("unavailable")
