"""Error orders grouped by step and error code: what the state machine records, read back."""

from __future__ import annotations

from shared.contract import Queue, agent_queue
from shared.domain.failures import Failure, failure_of
from shared.domain.model import Outcome, ProcessState
from shared.usecases.flow import scheduler
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.failures import group_failures
from tests.builders import World, a_policy, a_reply, an_order
from tests.workflows import ORDER_FULFILMENT


async def time_out_at_payment(world: World, order_id: str) -> None:
    """The charge never answers until the Supervisor gives up (policy: hold)."""
    deps = world.deps()
    await submit_order(deps, an_order(order_id, clock=world.clock))
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    for _ in range(world.policy.max_failure_count):
        world.clock.advance(31)
        await sweep(deps)
        for nudge in world.bus.take(Queue.SCHEDULER):
            world.clock.advance(2)
            await scheduler.on_nudge(deps, nudge.body["orderId"])
        world.bus.take(agent_queue("payment"))


async def test_an_order_the_supervisor_gave_up_on_is_a_timeout_at_its_step() -> None:
    world = World()
    await time_out_at_payment(world, "o-1")
    process = await world.store.load("o-1")
    assert process is not None and process.state.process_state is ProcessState.ERROR
    assert failure_of(process.state, ORDER_FULFILMENT) == Failure("charge-payment", "timeout")


async def test_a_failed_undo_is_named_after_its_operation_with_the_agents_code() -> None:
    world = World(policy=a_policy())
    deps = world.deps()
    await submit_order(deps, an_order("o-1", clock=world.clock))
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve))
    (charge,) = world.bus.take(agent_queue("payment"))
    await scheduler.on_reply(deps, a_reply(charge, Outcome.FAILED))
    (release,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(release, Outcome.FAILED))
    process = await world.store.load("o-1")
    assert process is not None and process.state.process_state is ProcessState.ERROR
    assert failure_of(process.state, ORDER_FULFILMENT) == Failure("release-inventory", "declined")


async def test_groups_are_largest_first_with_samples_and_the_scan_is_capped() -> None:
    world = World()
    for i in range(7):
        await time_out_at_payment(world, f"t-{i}")
    report = await group_failures(world.store)
    (group,) = report.groups
    assert (group.step, group.error_code, group.count) == ("charge-payment", "timeout", 7)
    assert len(group.sample_order_ids) == 5 and group.first_at <= group.last_at
    assert (report.scanned, report.truncated) == (7, False)
    capped = await group_failures(world.store, scan_cap=4)
    assert (capped.scanned, capped.truncated, capped.groups[0].count) == (4, True, 4)
    exact = await group_failures(world.store, scan_cap=7)
    assert (exact.scanned, exact.truncated) == (7, False)
