"""Bulk actions on the in-memory adapters and a fake clock: matching, the preview's
effects, the job's paging, pacing, at-most-once after a crash, and its input rules."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest

from shared.adapters.memory.store import InMemoryBulkStore
from shared.contract import Queue, agent_queue
from shared.domain.bulk import JobState
from shared.domain.bulk_request import (
    BulkAction,
    BulkFilter,
    BulkRequest,
    BulkRequestError,
    parse_request,
)
from shared.domain.model import ProcessState
from shared.openapi import document
from shared.usecases.flow import scheduler
from shared.usecases.flow.submission import submit_order
from shared.usecases.flow.supervisor import sweep
from shared.usecases.operations.bulk import (
    BulkDeps,
    job_status,
    preview,
    start_job,
    work_job,
    work_jobs,
)
from tests.builders import World, a_reply, an_order
from tests.unit.test_failures import time_out_at_payment

ERROR_AT_PAYMENT = BulkFilter(state=ProcessState.ERROR, step="charge-payment", error_code="timeout")
PENDING = BulkFilter(state=ProcessState.PENDING)


def bulk(world: World, per_second: float = 50) -> BulkDeps:
    return BulkDeps(world.deps(), InMemoryBulkStore(world.store), per_second)


async def test_a_preview_counts_samples_and_names_the_remote_operations_and_changes_nothing() -> (
    None
):
    world = World()
    for i in range(12):
        await time_out_at_payment(world, f"e-{i:02d}")
    deps = bulk(world)
    before = dict(world.store.operations)

    resubmit = await preview(deps, BulkRequest(BulkAction.RESUBMIT, ERROR_AT_PAYMENT, True))
    assert world.store.operations["read"] == before.get("read", 0), "read from the entries"
    cancel = await preview(deps, BulkRequest(BulkAction.CANCEL, ERROR_AT_PAYMENT, True))
    suspend = await preview(deps, BulkRequest(BulkAction.SUSPEND, ERROR_AT_PAYMENT, True))

    assert resubmit.matched == 12 and len(resubmit.sample_order_ids) == 10
    assert resubmit.effects_view() == [{"operation": "charge-payment", "count": 12}]
    # The charge is in doubt (no answer by its complete-by): a cancel refunds it too.
    assert cancel.effects_view() == [
        {"operation": "refund-payment", "count": 12},
        {"operation": "release-inventory", "count": 12},
    ]
    assert suspend.matched == 0 and suspend.effects_view() == []
    assert world.store.operations["write"] == before.get("write", 0)


async def test_filters_on_customer_dates_step_and_code_and_the_limit() -> None:
    world = World()
    await time_out_at_payment(world, "old")
    world.clock.advance(3600)
    cut = world.clock.now()
    await time_out_at_payment(world, "new")
    deps = bulk(world)

    def request(flt: BulkFilter, limit: int | None = None) -> BulkRequest:
        return BulkRequest(BulkAction.RESUBMIT, flt, True, limit)

    assert (await preview(deps, request(BulkFilter(created_from=cut)))).sample_order_ids == ["new"]
    assert (await preview(deps, request(BulkFilter(created_to=cut)))).sample_order_ids == ["old"]
    assert (await preview(deps, request(BulkFilter(customer_id="cust-1")))).matched == 2
    assert (await preview(deps, request(BulkFilter(customer_id="other")))).matched == 0
    assert (await preview(deps, request(BulkFilter(step="create-shipment")))).matched == 0
    assert (await preview(deps, request(BulkFilter(error_code="declined")))).matched == 0
    assert (await preview(deps, request(BulkFilter(state=ProcessState.ERROR), 1))).matched == 1


async def test_a_job_resubmits_every_match_a_page_at_a_time_at_the_configured_pace() -> None:
    world = World()
    for i in range(150):
        await time_out_at_payment(world, f"e-{i:03d}")
    deps = bulk(world, per_second=50)
    job = await start_job(deps, BulkRequest(BulkAction.RESUBMIT, ERROR_AT_PAYMENT), "ops")
    assert job.matched == 150 and job.state is JobState.RUNNING
    started = world.clock.now()

    await work_jobs(deps, budget=timedelta(hours=1))

    done = await job_status(deps, job.bulk_id)
    assert (done.state, done.done, done.skipped, done.failed) == (JobState.DONE, 150, 0, 0)
    # 50 per second: the 150 actions take about 3 s of (fake) time, not 0.
    assert world.clock.now() - started >= timedelta(seconds=2.9)
    for i in range(150):
        process = await world.store.load(f"e-{i:03d}")
        assert process is not None and process.state.process_state is ProcessState.PENDING
        history = await world.store.history(f"e-{i:03d}")
        by = [h.detail for h in history if h.event == "resubmitted" and h.detail.startswith("by ")]
        assert by == [f"by bulk:{job.bulk_id}"]


async def test_a_run_stops_at_its_budget_and_the_next_run_continues_from_the_cursor() -> None:
    world = World()
    for i in range(250):
        await time_out_at_payment(world, f"e-{i:03d}")
    deps = bulk(world, per_second=50)
    job = await start_job(deps, BulkRequest(BulkAction.RESUBMIT, ERROR_AT_PAYMENT), "ops")

    await work_jobs(deps, budget=timedelta(seconds=1))
    partial = await job_status(deps, job.bulk_id)
    assert partial.state is JobState.RUNNING and 0 < partial.done < 250

    await work_jobs(deps, budget=timedelta(hours=1))
    finished = await job_status(deps, job.bulk_id)
    assert (finished.state, finished.done) == (JobState.DONE, 250)


async def test_a_run_takes_no_more_actions_than_its_budget_allows_at_the_jobs_pace() -> None:
    """At 0.5 actions/s a 20 s run has room for 10 actions; a page of 30 would take 60 s
    and run far past the budget (and the lease of the run, see bulk_lease)."""
    world = World()
    for i in range(30):  # Pending: not claimed at intake, as past its burst
        await submit_order(
            world.deps(claim_at_intake=False), an_order(f"p-{i:02d}", clock=world.clock)
        )
    deps = bulk(world, per_second=0.5)
    job = await start_job(deps, BulkRequest(BulkAction.SUSPEND, PENDING), "ops")
    started = world.clock.now()

    acted = await work_jobs(deps, budget=timedelta(seconds=20))

    assert acted == 10
    assert world.clock.now() - started < timedelta(seconds=20)
    after = await job_status(deps, job.bulk_id)
    assert (after.state, after.done, after.in_flight) == (JobState.RUNNING, 10, ())
    page = await world.store.list_by_state(ProcessState.SUSPENDED, 100, None)
    assert len(page.items) == 10
    await work_jobs(deps, budget=timedelta(seconds=20))
    assert (await job_status(deps, job.bulk_id)).done == 20


async def test_a_run_that_died_mid_page_is_finished_exactly_once_per_order() -> None:
    world = World()
    for i in range(30):
        await time_out_at_payment(world, f"e-{i:02d}")
    deps = bulk(world)
    job = await start_job(deps, BulkRequest(BulkAction.RESUBMIT, ERROR_AT_PAYMENT), "ops")

    class Killed(Exception):
        pass

    # The runtime dies after the 10th resubmit of the claimed page.
    real_sleep, calls = world.clock.sleep, 0

    async def dying_sleep(seconds: float) -> None:
        nonlocal calls
        calls += 1
        if calls == 10:
            raise Killed
        await real_sleep(seconds)

    world.clock.sleep = dying_sleep  # type: ignore[method-assign]
    with pytest.raises(Killed):
        await work_job(deps, job.bulk_id, world.clock.now() + timedelta(hours=1))
    world.clock.sleep = real_sleep  # type: ignore[method-assign]
    stored = await job_status(deps, job.bulk_id)
    assert len(stored.in_flight) == 30 and stored.done == 0

    # Meanwhile the resubmitted orders time out again and are back in Error, matching.
    deps_p = world.deps()
    for nudge in world.bus.take(Queue.SCHEDULER):
        await scheduler.on_nudge(deps_p, nudge.body["orderId"])
    for _ in range(world.policy.max_failure_count):
        world.clock.advance(31)
        await sweep(deps_p)
        for nudge in world.bus.take(Queue.SCHEDULER):
            await scheduler.on_nudge(deps_p, nudge.body["orderId"])
        world.bus.take(agent_queue("payment"))
    again = await world.store.load("e-00")
    assert again is not None and again.state.process_state is ProcessState.ERROR

    await work_jobs(deps, budget=timedelta(hours=1))
    finished = await job_status(deps, job.bulk_id)
    assert (finished.state, finished.done, finished.skipped) == (JobState.DONE, 30, 0)
    for i in range(30):
        history = await world.store.history(f"e-{i:02d}")
        assert sum(1 for h in history if h.detail.startswith("by bulk:")) == 1


async def test_an_order_moved_on_before_its_turn_is_skipped_not_forced() -> None:
    world = World()
    for i in range(3):
        await time_out_at_payment(world, f"e-{i}")
    deps = bulk(world)
    job = await start_job(deps, BulkRequest(BulkAction.RESUBMIT, ERROR_AT_PAYMENT), "ops")
    from shared.usecases.operations.operator import resubmit_order  # noqa: PLC0415

    await resubmit_order(world.deps(), "e-1", "someone")
    await work_jobs(deps, budget=timedelta(hours=1))
    finished = await job_status(deps, job.bulk_id)
    # The contract: an order that no longer matches when its turn comes is skipped,
    # so a finished job accounts for every order it matched (issue 41, finding 7).
    assert (finished.matched, finished.done, finished.skipped, finished.failed) == (3, 2, 1, 0)


async def test_a_job_whose_orders_all_moved_on_counts_each_as_skipped() -> None:
    world = World()
    for i in range(20):
        await time_out_at_payment(world, f"e-{i:02d}")
    deps = bulk(world)
    job = await start_job(deps, BulkRequest(BulkAction.RESUBMIT, ERROR_AT_PAYMENT), "ops")
    from shared.usecases.operations.operator import resubmit_order  # noqa: PLC0415

    for i in range(0, 20, 2):
        await resubmit_order(world.deps(), f"e-{i:02d}", "someone")
    await work_jobs(deps, budget=timedelta(hours=1))
    finished = await job_status(deps, job.bulk_id)
    assert (finished.state, finished.matched) == (JobState.DONE, 20)
    assert (finished.done, finished.skipped, finished.failed) == (10, 10, 0)


@pytest.mark.parametrize(
    ("action", "flt", "moved"),
    [
        (BulkAction.RESUBMIT, ERROR_AT_PAYMENT, ProcessState.PENDING),
        (BulkAction.CANCEL, ERROR_AT_PAYMENT, ProcessState.ERROR),
        (BulkAction.SUSPEND, BulkFilter(customer_id="cust-1"), ProcessState.SUSPENDED),
    ],
)
async def test_two_identical_jobs_at_once_each_account_for_every_order_it_matched(
    action: BulkAction, flt: BulkFilter, moved: ProcessState
) -> None:
    """Both count the same orders; the first acts on them, so the second finds each
    moved on when its turn comes: skipped, and nothing is acted on twice."""
    world = World()
    for i in range(12):
        if action is BulkAction.SUSPEND:
            await submit_order(world.deps(), an_order(f"o-{i:02d}", clock=world.clock))
        else:
            await time_out_at_payment(world, f"o-{i:02d}")
    deps = bulk(world)
    first = await start_job(deps, BulkRequest(action, flt), "ops")
    second = await start_job(deps, BulkRequest(action, flt), "ops")
    assert first.matched == second.matched == 12

    await work_jobs(deps, budget=timedelta(hours=1))

    jobs = [await job_status(deps, j.bulk_id) for j in (first, second)]
    assert {j.state for j in jobs} == {JobState.DONE}
    # Which runs first is the timer's choice (they were created in the same instant).
    assert sorted((j.done, j.skipped, j.failed) for j in jobs) == [(0, 12, 0), (12, 0, 0)]
    for i in range(12):
        history = await world.store.history(f"o-{i:02d}")
        assert sum(1 for h in history if " by bulk:" in f" {h.detail}") == 1
        process = await world.store.load(f"o-{i:02d}")
        assert process is not None
        if action is not BulkAction.CANCEL:
            assert process.state.process_state is moved


async def test_suspend_then_resume_in_bulk_and_a_job_that_matches_nothing_is_done() -> None:
    world = World()
    deps_p = world.deps(claim_at_intake=False)  # Pending orders, as past the intake's burst
    for i in range(4):
        await submit_order(deps_p, replace(an_order(f"p-{i}", clock=world.clock)))
    deps = bulk(world)
    pending = BulkFilter(state=ProcessState.PENDING)
    suspended = BulkFilter(state=ProcessState.SUSPENDED)
    job = await start_job(deps, BulkRequest(BulkAction.SUSPEND, pending), "ops")
    await work_jobs(deps, budget=timedelta(hours=1))
    assert (await job_status(deps, job.bulk_id)).done == 4
    assert (await preview(deps, BulkRequest(BulkAction.RESUME, suspended, True))).matched == 4
    resumed = await start_job(deps, BulkRequest(BulkAction.RESUME, suspended), "ops")
    await work_jobs(deps, budget=timedelta(hours=1))
    assert (await job_status(deps, resumed.bulk_id)).done == 4
    nothing = await start_job(deps, BulkRequest(BulkAction.RESUME, suspended), "ops")
    assert nothing.matched == 0 and nothing.state is JobState.DONE


async def test_a_bulk_cancel_undoes_what_the_preview_said() -> None:
    world = World()
    deps_p = world.deps()
    await submit_order(deps_p, an_order("c-1", clock=world.clock))
    (reserve,) = world.bus.take(agent_queue("inventory"))
    await scheduler.on_reply(deps_p, a_reply(reserve))
    deps = bulk(world)
    flt = BulkFilter(customer_id="cust-1")
    seen = await preview(deps, BulkRequest(BulkAction.CANCEL, flt, True))
    # The charge is running: it is undone once its answer is in.
    assert seen.effects_view() == [
        {"operation": "refund-payment", "count": 1},
        {"operation": "release-inventory", "count": 1},
    ]
    job = await start_job(deps, BulkRequest(BulkAction.CANCEL, flt), "ops")
    await work_jobs(deps, budget=timedelta(hours=1))
    assert (await job_status(deps, job.bulk_id)).done == 1
    process = await world.store.load("c-1")
    assert process is not None and process.state.cancel_requested


@pytest.mark.parametrize(
    ("body", "title"),
    [
        ([], "Invalid body"),
        ({"action": "resubmit"}, "Empty filter"),
        ({"action": "resubmit", "filter": {}}, "Empty filter"),
        ({"action": "resubmit", "filter": {"state": None}}, "Empty filter"),
        ({"action": "delete", "filter": {"state": "Error"}}, "Invalid action"),
        ({"filter": {"state": "Error"}}, "Invalid action"),
        ({"action": "cancel", "filter": {"state": "Broken"}}, "Invalid filter"),
        ({"action": "cancel", "filter": {"createdFrom": "yesterday"}}, "Invalid filter"),
        ({"action": "cancel", "filter": {"createdTo": "2026-13-01"}}, "Invalid filter"),
        (
            {
                "action": "cancel",
                "filter": {
                    "createdFrom": "2026-02-01T00:00:00Z",
                    "createdTo": "2026-01-01T00:00:00Z",
                },
            },
            "Invalid filter",
        ),
        ({"action": "cancel", "filter": {"colour": "red"}}, "Invalid filter"),
        ({"action": "cancel", "filter": {"step": 3}}, "Invalid filter"),
        ({"action": "cancel", "filter": {"step": "x"}, "limit": 0}, "Invalid limit"),
        ({"action": "cancel", "filter": {"step": "x"}, "limit": 100_001}, "Invalid limit"),
        ({"action": "cancel", "filter": {"step": "x"}, "limit": 1.5}, "Invalid limit"),
        ({"action": "cancel", "filter": {"step": "x"}, "limit": True}, "Invalid limit"),
        ({"action": "cancel", "filter": {"step": "x"}, "dryRun": "yes"}, "Invalid dryRun"),
        ({"action": "cancel", "filter": {"step": "x"}, "extra": 1}, "Invalid body"),
    ],
)
def test_bad_requests_are_refused_with_what_is_wrong(body: object, title: str) -> None:
    with pytest.raises(BulkRequestError) as refused:
        parse_request(body)
    assert refused.value.title == title


def test_a_good_request_parses_dates_as_utc() -> None:
    request = parse_request(
        {
            "action": "resubmit",
            "filter": {"errorCode": "timeout", "createdFrom": "2026-01-01T00:00:00Z"},
            "dryRun": True,
            "limit": 100_000,
        }
    )
    assert request.filter.created_from is not None
    assert request.filter.created_from.utcoffset() == timedelta(0)
    assert request.filter.to_json() == {
        "errorCode": "timeout",
        "createdFrom": "2026-01-01T00:00:00Z",
    }


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("createdFrom", "2026-01-31"),
        ("createdFrom", "2026-01-31T00:00:00"),
        ("createdTo", "2026-W05-1"),
        ("createdTo", "20260131"),
    ],
)
def test_only_an_rfc3339_date_time_with_an_offset_as_published(key: str, text: str) -> None:
    """`fromisoformat` takes all of these; the document's `format: date-time` none."""
    with pytest.raises(BulkRequestError) as refused:
        parse_request({"action": "cancel", "dryRun": True, "filter": {key: text}})
    assert str(refused.value) == (
        f"filter.{key} must be an RFC 3339 date-time with an offset, e.g. 2026-01-31T00:00:00Z"
    )


def test_an_offset_is_kept_as_the_moment_it_names() -> None:
    request = parse_request(
        {"action": "cancel", "filter": {"createdFrom": "2026-01-31T00:30:00.5+01:00"}}
    )
    assert request.filter.to_json() == {"createdFrom": "2026-01-30T23:30:00.500000Z"}


@pytest.mark.parametrize("edge", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-23:59"])
def test_a_valid_date_outside_utc_range_is_a_clear_400_not_a_crash(edge: str) -> None:
    with pytest.raises(BulkRequestError, match="outside the range of dates in UTC"):
        parse_request({"action": "cancel", "dryRun": True, "filter": {"createdTo": edge}})


def test_a_whole_limit_written_as_a_float_is_that_number_as_elsewhere() -> None:
    request = parse_request(
        {"action": "cancel", "dryRun": True, "filter": {"step": "x"}, "limit": 303.0}
    )
    assert request.limit == 303
    with pytest.raises(BulkRequestError, match="whole number"):
        parse_request({"action": "cancel", "filter": {"step": "x"}, "limit": 303.5})


def test_the_published_bulk_filter_allows_the_nulls_the_server_reads_as_no_filter() -> None:
    filter_schema = document()["paths"]["/orders/bulk"]["post"]["requestBody"]["content"][
        "application/json"
    ]["schema"]["properties"]["filter"]
    created_to = filter_schema["properties"]["createdTo"]
    assert {"type": "null"} in created_to["anyOf"]
    request = parse_request({"action": "cancel", "filter": {"step": "x", "createdTo": None}})
    assert request.filter.created_to is None
