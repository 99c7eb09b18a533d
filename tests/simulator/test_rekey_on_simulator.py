"""An operation refused for good, against the real simulator (docs/in-doubt.md, "An
operation refused for good"): the simulator, like most payment APIs, replays a refused
key's answer even once its fault is lifted, so the express-delivery order the chaos run
leaves held on `notify-customer` ends `Processed` only because the resubmit sends the
notification under a fresh key."""

from __future__ import annotations

import aiohttp

from devhost.simulator import SimulatorServer
from shared.adapters.http_remote import HttpRemoteService
from shared.domain.model import ProcessState
from shared.ports import RemoteService
from shared.usecases.flow.submission import submit_order
from shared.usecases.operations.operator import inspect_order, resubmit_order
from tests.builders import World, an_order
from tests.simulator.conftest import SimClient
from tests.unit.test_rekey import serve
from tests.workflows import EXPRESS_DELIVERY

ORDER_ID = "rekey-1"


async def test_a_held_notification_resubmitted_once_its_fault_is_lifted_ends_processed(
    simulator: SimulatorServer, session: aiohttp.ClientSession, sim: SimClient
) -> None:
    def remote(agent: str) -> RemoteService:
        return HttpRemoteService(f"{simulator.url}/{agent}", session)

    await sim.put_faults("notifications", {"permanentFailureOperations": ["notify-customer"]})
    world = World()
    await submit_order(
        world.deps(), an_order(ORDER_ID, clock=world.clock), workflow=EXPRESS_DELIVERY
    )
    await serve(world, remote)
    held = await inspect_order(world.deps(), ORDER_ID)
    assert held.state.process_state is ProcessState.ERROR

    await sim.put_faults("notifications", {"permanentFailureOperations": []})
    replayed = await sim.call(
        "notifications", "notify-customer", ORDER_ID, f"{ORDER_ID}:notify-customer"
    )
    assert replayed.status == 422, "the refused key keeps its refusal once the fault is lifted"
    await resubmit_order(world.deps(), ORDER_ID, "op")
    await serve(world, remote)

    done = await inspect_order(world.deps(), ORDER_ID)
    assert done.state.process_state is ProcessState.PROCESSED
    effects = await sim.effects(f"?orderId={ORDER_ID}&service=notifications")
    assert sorted((e["idempotencyKey"], e["applied"]) for e in effects) == [
        (f"{ORDER_ID}:notify-customer", 0),
        (f"{ORDER_ID}:notify-customer:r2", 1),
    ]
