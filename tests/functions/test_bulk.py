"""Bulk actions over HTTP: every bad input is a precise 400, a dry run changes nothing,
a real run answers 202 with a Location the progress route serves, and the timer works it."""

from __future__ import annotations

from typing import Any

import azure.functions as func
import pytest

from shared.domain.model import ProcessState
from tests.functions.conftest import Harness
from tests.functions.test_functions import ORDER, assert_problem, body
from tests.unit.test_migrate import V2
from tests.workflows import running

SUSPEND_PROCESSING = {"action": "suspend", "filter": {"state": "Processing"}}
"""Every order just submitted: the intake claims it."""


async def post(
    harness: Harness, payload: Any = None, raw: bytes | None = None, **kw: Any
) -> func.HttpResponse:
    return await harness.http("bulk_orders", "POST", "orders/bulk", payload, raw=raw, **kw)


async def submit(harness: Harness, order_id: str) -> None:
    response = await harness.http(
        "submit_order_http", "POST", "orders", {**ORDER, "orderId": order_id}
    )
    assert response.status_code == 202


@pytest.mark.parametrize(
    ("payload", "title"),
    [
        ({"action": "resubmit", "filter": {}}, "Empty filter"),
        ({"action": "resubmit"}, "Empty filter"),
        ({"action": "explode", "filter": {"state": "Error"}}, "Invalid action"),
        ({"action": "cancel", "filter": {"createdFrom": "31/01/2026"}}, "Invalid filter"),
        ({"action": "cancel", "filter": {"createdTo": "2026-02-30T00:00:00Z"}}, "Invalid filter"),
        ({"action": "cancel", "filter": {"state": "Gone"}}, "Invalid filter"),
        ({"action": "cancel", "filter": {"state": "Error"}, "limit": 0}, "Invalid limit"),
        ({"action": "cancel", "filter": {"state": "Error"}, "limit": 100_001}, "Invalid limit"),
        ({"action": "cancel", "filter": {"state": "Error"}, "limit": "10"}, "Invalid limit"),
        ({"action": "cancel", "filter": {"state": "Error"}, "dryRun": 1}, "Invalid dryRun"),
        ({"action": "cancel", "filter": ["Error"]}, "Invalid filter"),
        ("cancel", "Invalid body"),
        ({"action": "migrate", "filter": {"workflow": "order-fulfilment"}}, "Invalid toVersion"),
        ({"action": "cancel", "filter": {"state": "Error"}, "toVersion": 2}, "Invalid toVersion"),
        ({"action": "migrate", "filter": {"state": "Error"}, "toVersion": 2}, "Invalid filter"),
        (
            {"action": "migrate", "filter": {"workflow": "order-fulfilment"}, "toVersion": 9},
            "Unknown version",
        ),
        (
            {"action": "migrate", "filter": {"workflow": "gift-wrap"}, "toVersion": 2},
            "Unknown workflow",
        ),
        (
            {
                "action": "migrate",
                "filter": {"workflow": "order-fulfilment", "workflowVersion": 1},
                "toVersion": 1,
            },
            "Invalid toVersion",
        ),
    ],
)
async def test_bad_input_is_a_precise_400(harness: Harness, payload: Any, title: str) -> None:
    problem = assert_problem(await post(harness, payload), 400)
    assert problem["title"] == title


async def test_not_json_too_large_and_wrong_type_are_4xx(harness: Harness) -> None:
    assert_problem(await post(harness, raw=b"{nope"), 400)
    assert_problem(await post(harness, raw=b'{"a": "' + b"x" * 70_000 + b'"}'), 413)
    response = await harness.http(
        "bulk_orders", "POST", "orders/bulk", raw=b"{}", headers={"content-type": "text/plain"}
    )
    assert_problem(response, 415)


async def test_a_dry_run_previews_and_changes_nothing(harness: Harness) -> None:
    for i in range(3):
        await submit(harness, f"b-{i}")
    response = await post(harness, {**SUSPEND_PROCESSING, "dryRun": True})
    assert response.status_code == 200
    assert body(response) == {
        "matched": 3,
        "sampleOrderIds": ["b-0", "b-1", "b-2"],
        "effects": [],
    }
    process = await harness.store.load("b-0")
    assert process is not None and process.state.process_state is ProcessState.PROCESSING


async def test_a_real_run_is_a_job_the_timer_works_and_the_progress_route_shows(
    harness: Harness,
) -> None:
    for i in range(3):
        await submit(harness, f"b-{i}")
    response = await post(harness, {**SUSPEND_PROCESSING, "limit": 2})
    assert response.status_code == 202
    started = body(response)
    assert started["matched"] == 2
    assert response.headers["Location"] == f"/api/bulk/{started['bulkId']}"

    async def progress() -> dict[str, Any]:
        answer = await harness.http(
            "bulk_job",
            "GET",
            f"bulk/{started['bulkId']}",
            route_params={"bulkId": started["bulkId"]},
        )
        assert answer.status_code == 200
        return dict(body(answer))

    assert (await progress())["state"] == "Running"
    await harness.functions["bulk_actions"].func(None)
    assert await progress() == {
        "bulkId": started["bulkId"],
        "action": "suspend",
        "state": "Done",
        "matched": 2,
        "done": 2,
        "skipped": 0,
        "failed": 0,
    }
    states = [(await harness.store.load(f"b-{i}")) for i in range(3)]
    assert [p.state.process_state for p in states if p] == [
        ProcessState.SUSPENDED,
        ProcessState.SUSPENDED,
        ProcessState.PROCESSING,
    ]


@pytest.mark.parametrize("bulk_id", ["0" * 32, "nope", "../x", "A" * 32])
async def test_an_unknown_bulk_job_is_404(harness: Harness, bulk_id: str) -> None:
    response = await harness.http(
        "bulk_job", "GET", f"bulk/{bulk_id}", route_params={"bulkId": bulk_id}
    )
    assert_problem(response, 404)


async def test_a_migrate_to_a_version_not_kept_names_the_kept_ones(harness: Harness) -> None:
    payload = {"action": "migrate", "filter": {"workflow": "order-fulfilment"}, "toVersion": 9}
    problem = assert_problem(await post(harness, payload), 400)
    assert "keeps v1" in problem["detail"]


async def test_a_migrate_dry_run_reports_refused_orders(
    harness: Harness,
) -> None:
    await submit(harness, "m-0")
    harness.run_on(running(V2))
    payload = {
        "action": "migrate",
        "filter": {"workflow": "order-fulfilment", "workflowVersion": 1},
        "toVersion": 2,
        "dryRun": True,
    }
    response = await post(harness, payload)
    assert response.status_code == 200
    assert body(response) == {
        "matched": 1,
        "sampleOrderIds": ["m-0"],
        "effects": [],
        "refused": 0,
        "refusals": [],
    }
