"""A kill -9 of the runtime between an order's state write and its rest-index write heals
(issue #26): after a restart the order is in the index once, off the watch list, and its
client hears that it finished.

The runtime reaches Azurite through a tripwire proxy that kills it at the first write of
a rest entry, before Azurite sees that write: the state row is saved, the entry is not,
and nothing in the app was changed to make the crash land there."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from azure.data.tables.aio import TableServiceClient

from devhost.broker import Broker
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child
from devhost.harness.services import runtime_command
from devhost.harness.tripwire import Seen, Tripwire
from devhost.simulator import SimulatorServer
from shared.adapters.table.store import TableStateStore
from shared.contract import Queue, Setting
from shared.domain.model import ProcessState
from shared.domain.rest_index import RestRange
from shared.settings import azurite_connection_string
from tests.e2e.conftest import System, e2e_settings, until

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

ORDER = "rest-kill-1"


def rest_entry_write(seen: Seen) -> bool:
    return seen.method == "PUT" and "(PartitionKey='~rest-" in seen.target


async def rest_entries(store: TableStateStore) -> list[str]:
    page = await store.rest_entries(RestRange(ProcessState.PROCESSED), 100, None)
    return [entry.order_id for entry in page.items]


async def watched(store: TableStateStore) -> list[str]:
    return [entry.order_id for entry in (await store.watch_list(100, None)).items]


async def test_a_kill_between_the_state_write_and_the_rest_entry_heals(
    azurite_table_port: int, broker: Broker, tmp_path: Path
) -> None:
    with SimulatorServer(port=0, seed=3) as simulator:
        settings = e2e_settings(azurite_table_port, broker, simulator.url)
        direct = azurite_connection_string(azurite_table_port)
        store = TableStateStore(
            TableServiceClient.from_connection_string(direct), settings[Setting.STATE_TABLE]
        )
        port = free_port()
        runtime = Child(
            "runtime",
            runtime_command(port=port, state_dir=tmp_path / "devhost"),
            tmp_path / "runtime.log",
        )

        async def kill(_: Seen) -> None:
            await asyncio.to_thread(runtime.kill)

        upstream = f"http://{LOOPBACK}:{azurite_table_port}"
        async with (
            Tripwire(upstream, rest_entry_write, kill) as wire,
            aiohttp.ClientSession() as session,
        ):
            runtime.env = settings | {Setting.STORAGE: azurite_connection_string(wire.port)}
            system = System(
                f"http://{LOOPBACK}:{port}/api", simulator.url, broker, session, settings
            )
            runtime.start()
            try:
                await system.app.wait_healthy(30, runtime)
                await system.app.submit_order(ORDER, ("S",))
                await asyncio.wait_for(wire.tripped.wait(), 60)

                assert not runtime.alive()
                saved = await store.load(ORDER)
                assert saved is not None
                assert saved.state.process_state is ProcessState.PROCESSED, "the save landed"
                assert await rest_entries(store) == [], "the entry did not"
                assert await watched(store) == [ORDER]
                before = [m["status"] for m in await system.drain(Queue.ORDER_STATUS, ORDER)]
                assert "Received" in before and "Processed" not in before, before

                runtime.start()
                await system.app.wait_healthy(30, runtime)

                async def healed() -> bool:
                    return await watched(store) == []

                await until("the Supervisor's heal", healed, 60, runtime)
                assert await rest_entries(store) == [ORDER]
                listed = await system.app.orders(state="Processed")
                assert [o["orderId"] for o in listed["items"]] == [ORDER]
                after = await store.load(ORDER)
                assert after is not None and after.state.version == saved.state.version
                statuses = [m["status"] for m in await system.drain(Queue.ORDER_STATUS, ORDER)]
                assert statuses.count("Processed") == 1, statuses
                stats = await system.sim.stats()
                assert {name: s["calls"] for name, s in stats.items() if s["calls"]} == {
                    "inventory": 1,
                    "payment": 1,
                    "shipping": 1,
                }, "no step ran again"
            finally:
                runtime.stop()
                await store.close()
