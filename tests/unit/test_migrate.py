"""Migrating in-flight orders to another version of their workflow: only when the steps
done so far are the same in both versions; single order and bulk, dry run and job."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shared.adapters.memory.store import InMemoryBulkStore, InMemoryBus
from shared.contract import Queue, agent_queue
from shared.domain.bulk import JobState, matches
from shared.domain.bulk_request import (
    BulkAction,
    BulkFilter,
    BulkRequest,
    BulkRequestError,
    migration_target,
    parse_request,
)
from shared.domain.machine.migrate import (
    IncompatibleVersions,
    done_so_far,
    incompatibility,
    migrate,
)
from shared.domain.machine.transition import InvalidTransition
from shared.domain.model import (
    OrderProcess,
    Phase,
    ProcessState,
    StateRecord,
    StepRecord,
    StepStatus,
)
from shared.domain.workflow import OnDeadline, StepDefinition, StepKind
from shared.usecases.flow import scheduler
from shared.usecases.flow.deps import ProcessDeps
from shared.usecases.flow.submission import submit_order
from shared.usecases.operations.bulk import BulkDeps, job_status, preview, start_job, work_jobs
from shared.usecases.operations.operator import migrate_order
from tests.builders import World, a_reply, an_order
from tests.workflows import CATALOGUE, ORDER_FULFILMENT, REVIEWED_ORDER, running

NOTIFY = StepDefinition(
    name="notify-customer",
    agent="notifications",
    compensation=None,
    kind=StepKind.RETRIABLE,
    inputs=("create-shipment.trackingNumber",),
    results=("notificationId",),
)
V2 = dataclasses.replace(ORDER_FULFILMENT, version=2, steps=(*ORDER_FULFILMENT.steps, NOTIFY))
"""v1 and a notification after the shipment: compatible with every v1 order in flight."""
reserve, charge, ship = ORDER_FULFILMENT.steps
V3 = dataclasses.replace(
    ORDER_FULFILMENT,
    version=3,
    steps=(reserve, dataclasses.replace(charge, compensation="void-payment"), ship),
)
"""The charge is undone another way: compatible only with orders not yet at the charge."""
MIGRATE = BulkFilter(workflow="order-fulfilment", workflow_version=1)


async def submitted(deps: ProcessDeps, order_id: str) -> None:
    """Pending at its first step, nothing dispatched yet: nothing done so far."""
    await submit_order(deps, an_order(order_id), workflow=ORDER_FULFILMENT)


async def charging(deps: ProcessDeps, bus: InMemoryBus, order_id: str) -> None:
    """Processing: inventory reserved, the charge dispatched and running."""
    await submitted(deps, order_id)
    await scheduler.on_nudge(deps, order_id)
    (reserve_request,) = bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps, a_reply(reserve_request))
    for nudge in bus.take(Queue.SCHEDULER):
        await scheduler.on_nudge(deps, nudge.body["orderId"])


async def load(world: World, order_id: str) -> OrderProcess:
    process = await world.store.load(order_id)
    assert process is not None
    return process


async def test_a_running_order_whose_steps_so_far_are_shared_moves_and_finishes_on_v2() -> None:
    world = World(catalogue=running(V2, V3))
    await charging(world.deps(), world.bus, "o-1")
    before = await load(world, "o-1")
    assert before.state.process_state is ProcessState.PROCESSING
    assert [s.status for s in before.steps][:2] == [StepStatus.COMPLETED, StepStatus.RUNNING]
    assert done_so_far(before) == 2
    (charge_request,) = world.bus.take(agent_queue("payment"))
    sent_before = list(world.bus.sent)

    moved = await migrate_order(world.deps(), "o-1", "ops", 2)

    assert moved.state.workflow_version == 2
    assert moved.steps[:2] == before.steps[:2]
    assert [s.name for s in moved.steps] == [s.name for s in V2.steps]
    assert moved.steps[3].status is StepStatus.NOT_STARTED and moved.steps[3].attempts == 0
    assert world.bus.sent == sent_before, "a migration sends nothing"
    assert moved.state.outbox == before.state.outbox
    history = await world.store.history("o-1")
    assert [h.detail for h in history if h.event == "migrated"] == ["from v1 to v2 by ops"]
    # Asked again, it changes nothing.
    again = await migrate_order(world.deps(), "o-1", "ops", 2)
    assert again.state.version == moved.state.version

    # The running charge's answer is taken as before; the order then runs v2's steps.
    deps = world.deps()
    await scheduler.on_reply(deps, a_reply(charge_request))
    for queue, step in (("shipping", "create-shipment"), ("notifications", "notify-customer")):
        for nudge in world.bus.take(Queue.SCHEDULER):
            await scheduler.on_nudge(deps, nudge.body["orderId"])
        (request,) = world.bus.take(agent_queue(queue))
        assert request.body["step"] == step
        await scheduler.on_reply(
            deps, a_reply(request, result={"trackingNumber": "TRK-1", "shipmentId": "s-1"})
        )
    done = await load(world, "o-1")
    assert done.state.process_state is ProcessState.PROCESSED
    assert [s.status for s in done.steps] == [StepStatus.COMPLETED] * 4


async def test_an_order_whose_steps_so_far_differ_is_refused_and_unchanged() -> None:
    world = World(catalogue=running(V2, V3))
    await charging(world.deps(), world.bus, "o-1")
    await submitted(world.deps(), "o-2")
    before = await load(world, "o-1")

    with pytest.raises(IncompatibleVersions, match="charge-payment"):
        await migrate_order(world.deps(), "o-1", "ops", 3)

    assert await load(world, "o-1") == before
    # Nothing done yet: any version of the workflow fits.
    fresh = await migrate_order(world.deps(), "o-2", "ops", 3)
    assert fresh.state.workflow_version == 3


def processed() -> OrderProcess:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    state = StateRecord(
        order_id="p-1",
        process_state=ProcessState.PROCESSED,
        locked_by=None,
        complete_by=None,
        failure_count=0,
        attempt=3,
        phase=Phase.FORWARD,
        current_step=3,
        last_error=None,
        version=9,
        created_at=at,
        updated_at=at,
        workflow="order-fulfilment",
    )
    steps = tuple(StepRecord(s.name, StepStatus.COMPLETED, 1) for s in ORDER_FULFILMENT.steps)
    return OrderProcess(an_order("p-1"), state, steps)


def in_state(process: OrderProcess, state: ProcessState, current_step: int) -> OrderProcess:
    changed = dataclasses.replace(process.state, process_state=state, current_step=current_step)
    return dataclasses.replace(process, state=changed)


def test_a_final_order_is_refused_and_so_is_a_target_shorter_than_what_was_done() -> None:
    done = processed()
    with pytest.raises(InvalidTransition, match="Processed") as refused:
        migrate(done, ORDER_FULFILMENT, V2, done.state.updated_at)
    assert not isinstance(refused.value, IncompatibleVersions)

    short = dataclasses.replace(ORDER_FULFILMENT, version=4, steps=(reserve,))
    held = in_state(done, ProcessState.ERROR, 2)
    assert "v4 has only 1" in (incompatibility(held, ORDER_FULFILMENT, short) or "")
    with pytest.raises(IncompatibleVersions):
        migrate(held, ORDER_FULFILMENT, short, done.state.updated_at)


@pytest.mark.parametrize(
    "changed",
    [
        {"approval": False},
        {"event": "second-look"},
        {"on_deadline": OnDeadline.HOLD},
        {"until": "notBefore"},
        {"wait_seconds": 60.0},
        {"final_deadline_seconds": 3600.0},
        {"retry_elsewhere": True},
    ],
)
def test_a_wait_whose_meaning_differs_in_the_target_refuses_the_migrate(
    changed: dict[str, Any],
) -> None:
    """A review that was an approval must not become a plain event (a rejection would
    complete it and the charge would follow), nor wait for something else."""
    review = REVIEWED_ORDER.steps[1]
    steps = (
        REVIEWED_ORDER.steps[0],
        dataclasses.replace(review, **changed),
        *REVIEWED_ORDER.steps[2:],
    )
    target = dataclasses.replace(REVIEWED_ORDER, version=2, steps=steps)
    records = (
        StepRecord(steps[0].name, StepStatus.COMPLETED, 1),
        StepRecord(review.name, StepStatus.RUNNING, 1),
        *(StepRecord(s.name) for s in steps[2:]),
    )
    waiting = in_state(dataclasses.replace(processed(), steps=records), ProcessState.PROCESSING, 1)
    assert "manual-review" in (incompatibility(waiting, REVIEWED_ORDER, target) or "")
    slower = dataclasses.replace(review, timeout_seconds=172800.0)
    same = dataclasses.replace(target, steps=(steps[0], slower, *steps[2:]))
    assert incompatibility(waiting, REVIEWED_ORDER, same) is None


def test_steps_done_so_far_count_every_started_step_and_all_before_the_current() -> None:
    fresh = [StepRecord(s.name) for s in ORDER_FULFILMENT.steps]
    base = in_state(processed(), ProcessState.PENDING, 0)
    assert done_so_far(dataclasses.replace(base, steps=tuple(fresh))) == 0
    assert (
        done_so_far(
            in_state(dataclasses.replace(base, steps=tuple(fresh)), ProcessState.PENDING, 1)
        )
        == 1
    )
    # An attempt sent with no answer (in doubt) counts though the status is NotStarted.
    in_doubt = [fresh[0], dataclasses.replace(fresh[1], attempts=1), fresh[2]]
    assert done_so_far(dataclasses.replace(base, steps=tuple(in_doubt))) == 2


async def test_a_bulk_dry_run_counts_only_compatible_orders_and_the_job_migrates_them() -> None:
    world = World(catalogue=running(V2, V3))
    for i in range(3):
        await charging(world.deps(), world.bus, f"c-{i}")
    for i in range(2):
        await submitted(world.deps(), f"n-{i}")
    deps = BulkDeps(world.deps(), InMemoryBulkStore(world.store), 50)
    request = BulkRequest(BulkAction.MIGRATE, MIGRATE, True, to_version=3)

    dry = await preview(deps, request)

    assert dry.matched == 2 and sorted(dry.sample_order_ids) == ["n-0", "n-1"]
    assert dry.effects_view() == []
    assert dry.refused == 3 and {r["orderId"] for r in dry.refusals} == {"c-0", "c-1", "c-2"}
    assert all("charge-payment" in r["reason"] for r in dry.refusals)
    assert (await preview(deps, dataclasses.replace(request, to_version=2))).matched == 5

    job = await start_job(deps, dataclasses.replace(request, dry_run=False), "ops")
    assert job.to_version == 3 and job.matched == 2
    await work_jobs(deps, budget=timedelta(minutes=5))

    finished = await job_status(deps, job.bulk_id)
    assert (finished.state, finished.done, finished.skipped, finished.failed) == (
        JobState.DONE,
        2,
        0,
        0,
    )
    versions = {i: (await load(world, i)).state.workflow_version for i in ("c-0", "n-0", "n-1")}
    assert versions == {"c-0": 1, "n-0": 3, "n-1": 3}
    history = await world.store.history("n-0")
    assert [h.detail for h in history if h.event == "migrated"] == [
        f"from v1 to v3 by bulk:{job.bulk_id}"
    ]


@pytest.mark.parametrize(
    ("body", "title"),
    [
        ({"action": "migrate", "filter": {"workflow": "order-fulfilment"}}, "Invalid toVersion"),
        (
            {"action": "migrate", "filter": {"workflow": "order-fulfilment"}, "toVersion": "2"},
            "Invalid toVersion",
        ),
        (
            {"action": "migrate", "filter": {"workflow": "order-fulfilment"}, "toVersion": True},
            "Invalid toVersion",
        ),
        (
            {"action": "migrate", "filter": {"workflow": "order-fulfilment"}, "toVersion": 0},
            "Invalid toVersion",
        ),
        ({"action": "cancel", "filter": {"state": "Error"}, "toVersion": 2}, "Invalid toVersion"),
        ({"action": "migrate", "filter": {"state": "Error"}, "toVersion": 2}, "Invalid filter"),
        (
            {
                "action": "migrate",
                "filter": {"workflow": "order-fulfilment", "workflowVersion": 2},
                "toVersion": 2,
            },
            "Invalid toVersion",
        ),
        (
            {
                "action": "cancel",
                "filter": {"workflow": "order-fulfilment", "workflowVersion": "1"},
            },
            "Invalid filter",
        ),
        ({"action": "cancel", "filter": {"workflowVersion": 1}}, "Invalid filter"),
        ({"action": "cancel", "filter": {"workflow": 7}}, "Invalid filter"),
    ],
)
def test_bad_migrate_requests_are_refused_with_what_is_wrong(body: object, title: str) -> None:
    with pytest.raises(BulkRequestError) as refused:
        parse_request(body)
    assert refused.value.title == title


def test_the_target_must_be_in_the_catalogue_and_a_good_request_round_trips() -> None:
    request = parse_request(
        {
            "action": "migrate",
            "filter": {"workflow": "order-fulfilment", "workflowVersion": 1},
            "toVersion": 2,
        }
    )
    assert request.to_version == 2 and request.filter.workflow_version == 1
    assert request.filter.to_json() == {"workflow": "order-fulfilment", "workflowVersion": 1}
    with pytest.raises(BulkRequestError, match="keeps v1") as refused:
        migration_target(request, CATALOGUE)
    assert refused.value.title == "Unknown version"
    with_v2 = dataclasses.replace(CATALOGUE, workflows=(*CATALOGUE.workflows, V2))
    assert migration_target(request, with_v2) == V2
    elsewhere = dataclasses.replace(request, filter=BulkFilter(workflow="gift-wrap"))
    with pytest.raises(BulkRequestError, match="order-fulfilment") as unknown:
        migration_target(elsewhere, CATALOGUE)
    assert unknown.value.title == "Unknown workflow"
    cancel = parse_request({"action": "cancel", "filter": {"state": "Error"}})
    assert migration_target(cancel, CATALOGUE) is None


def test_a_workflow_the_bulk_filter_names_selects_only_its_orders() -> None:
    error = in_state(processed(), ProcessState.ERROR, 1)
    cancel = BulkAction.CANCEL
    assert matches(cancel, BulkFilter(workflow="order-fulfilment"), error, ORDER_FULFILMENT)
    assert not matches(cancel, BulkFilter(workflow="express-delivery"), error, ORDER_FULFILMENT)
    assert not matches(
        cancel, BulkFilter(workflow="order-fulfilment", workflow_version=2), error, ORDER_FULFILMENT
    )
    # A migrate with no target (gone from the catalogue) matches nothing.
    assert not matches(BulkAction.MIGRATE, MIGRATE, error, ORDER_FULFILMENT, None)
