"""Bulk jobs on the local runtime: a bulk resubmit of Error orders (the preview, the
durable job through a kill -9 of the runtime mid-job, every order finished, and each
resubmitted by the job exactly once: its history says so), and two identical migrate
jobs started at once over the same orders, whose counts each add up."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from azure.data.tables.aio import TableServiceClient

from devhost.broker import Broker
from devhost.harness.clients import AppClient, SimulatorControl
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child
from devhost.harness.services import runtime_command
from devhost.simulator import SimulatorServer
from shared.adapters.table.bulk import TableBulkStore
from shared.adapters.table.store import TableStateStore
from shared.catalogue import DEFAULT_FILE, FILE_SETTING
from shared.contract import Setting
from tests.e2e.conftest import e2e_settings, running_system, until
from tests.e2e.test_workflow_versions import NOTIFY

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

ORDERS = 120
ERROR_GROUP = {"state": "Error", "customerId": "bulk-c"}
"""Most orders time out at create-shipment; on a loaded machine a few time out waiting
for their claim at an earlier step, so the group is the customer's Error orders."""
STEPS = {"reserve-inventory", "charge-payment", "create-shipment"}


@pytest.fixture
def durable_broker(tmp_path: Path) -> Iterator[Broker]:
    with Broker(
        port=0, control_port=0, db_path=str(tmp_path / "broker.sqlite3"), lock_seconds=4
    ) as b:
        yield b


async def count(app: AppClient, state: str) -> int:
    return len((await app.orders(state, 1000))["items"])


async def test_a_bulk_resubmit_survives_a_kill_and_acts_once_per_order(
    azurite_table_port: int, durable_broker: Broker, tmp_path: Path
) -> None:
    with SimulatorServer(port=0, seed=3) as simulator:
        settings = e2e_settings(azurite_table_port, durable_broker, simulator.url)
        settings[Setting.STEP_TIMEOUT_SECONDS] = "2"
        settings[Setting.MAX_FAILURE_COUNT] = "1"
        # Slow enough that the kill lands mid-job: 120 orders take about 20 s.
        settings[Setting.BULK_ACTIONS_PER_SECOND] = "6"
        port = free_port()
        command = runtime_command(port=port, state_dir=tmp_path / "devhost")
        runtime = Child("runtime", command, tmp_path / "runtime.log", env=settings)
        ids = [f"bulk-{i:03d}" for i in range(ORDERS)]
        runtime.start()
        try:
            async with aiohttp.ClientSession() as session:
                api = f"http://{LOOPBACK}:{port}/api"
                app = AppClient(session, api)
                sim = SimulatorControl(session, simulator.url)
                await app.wait_healthy(30, runtime)
                await sim.set_faults("shipping", hangRate=1.0, hangSeconds=30)
                for order_id in ids:
                    await app.submit_order(order_id, ("S",), customer_id="bulk-c")

                async def all_in_error() -> bool:
                    return await count(app, "Error") == ORDERS

                await until("every order in Error", all_in_error, 180, runtime)
                await sim.clear_faults()

                async with session.post(
                    f"{api}/orders/bulk",
                    json={"action": "resubmit", "filter": ERROR_GROUP, "dryRun": True},
                ) as response:
                    assert response.status == 200
                    preview = await response.json()
                assert preview["matched"] == ORDERS and len(preview["sampleOrderIds"]) == 10
                # A resubmit re-runs the step each order stopped at, nothing else.
                assert {e["operation"] for e in preview["effects"]} <= STEPS
                assert sum(e["count"] for e in preview["effects"]) == ORDERS
                assert await count(app, "Error") == ORDERS, "a dry run changed something"

                async with session.post(
                    f"{api}/orders/bulk", json={"action": "resubmit", "filter": ERROR_GROUP}
                ) as response:
                    assert response.status == 202
                    started = await response.json()
                    location = response.headers["Location"]
                assert started["matched"] == ORDERS
                assert location == f"/api/bulk/{started['bulkId']}"
                job_url = f"http://{LOOPBACK}:{port}{location}"

                async def some_resubmitted() -> bool:
                    return await count(app, "Error") <= ORDERS - 15

                await until("the job under way", some_resubmitted, 60, runtime)
                async with session.get(job_url) as response:
                    before_kill = await response.json()
                runtime.kill()
                assert before_kill["state"] == "Running", "killed too late"
            # The dead run's lease would hold the next runs off for its budget plus 30 s
            # of grace; what is tested is what the next run does, so it ends now.
            store = TableStateStore(
                TableServiceClient.from_connection_string(settings[Setting.STORAGE]),
                settings[Setting.STATE_TABLE],
            )
            try:
                jobs = TableBulkStore(store)
                lease = await jobs.lease()
                assert lease is not None and not lease.free(datetime.now(UTC)), lease
                await jobs.put_lease(replace(lease, until=datetime.now(UTC)), lease)
            finally:
                await store.close()
            # Orders in flight at the kill pass their 2 s deadlines while it is down; with
            # MaxFailureCount 1 that alone would put them back in Error, which is the
            # crash's doing, not the job's. The restarted runtime lets them retry.
            runtime.env[Setting.MAX_FAILURE_COUNT] = "5"
            runtime.start()
            async with aiohttp.ClientSession() as session:
                app = AppClient(session, api)
                await app.wait_healthy(30, runtime)

                async def job_done() -> dict[str, Any] | None:
                    async with session.get(job_url) as response:
                        job: dict[str, Any] = await response.json()
                    return job if job["state"] == "Done" else None

                job = await until("the job Done", job_done, 180, runtime)
                assert job is not None
                assert (job["matched"], job["done"], job["skipped"], job["failed"]) == (
                    ORDERS,
                    ORDERS,
                    0,
                    0,
                ), job

                async def all_processed() -> bool:
                    return await count(app, "Processed") == ORDERS

                await until("every order Processed", all_processed, 180, runtime)
                for order_id in ids:
                    history = (await app.order(order_id))["history"]
                    by_job = [
                        h
                        for h in history
                        if h["event"] == "resubmitted"
                        and h["detail"] == f"by bulk:{started['bulkId']}"
                    ]
                    assert len(by_job) == 1, (order_id, history)
        finally:
            runtime.stop(timeout=30)
        assert "devhost listening" in runtime.output()


TWINS = 12
TWIN_FILTER = {"workflow": "reviewed-order", "workflowVersion": 2, "customerId": "bulk-twins"}


def catalogue_with_reviewed_v2(tmp_path: Path) -> Path:
    """The shipped catalogue plus reviewed-order v2: a notification after the shipment.
    New orders start on v2; one waiting for its review can move back to v1, as an
    operator would move orders off a new version that misbehaves."""
    doc = json.loads(DEFAULT_FILE.read_text(encoding="utf-8"))
    v1 = next(w for w in doc["workflows"] if w["name"] == "reviewed-order")
    v2 = copy.deepcopy(v1) | {"version": 2}
    v2["steps"] = [*v2["steps"], NOTIFY]
    doc["workflows"].append(v2)
    path = tmp_path / "catalogue.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


async def test_two_identical_jobs_at_once_each_count_every_order_they_matched(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Issue 41, finding 7: two migrate jobs (v2 back to v1) started together over the
    same orders. Both match them all; one moves each order, and the other finds each
    moved on when its turn comes: skipped. For each job done + skipped + failed =
    matched, and no order is moved twice."""
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings[FILE_SETTING] = str(catalogue_with_reviewed_v2(tmp_path))
    ids = [f"twin-{i:02d}" for i in range(TWINS)]
    async with running_system(settings, broker, simulator, monkeypatch) as system:
        for order_id in ids:
            await system.app.submit_order(
                order_id, customer_id="bulk-twins", workflow="reviewed-order"
            )
        for order_id in ids:
            await system.wait_for(order_id, {"Processing"}, currentStep=1)

        async def start() -> dict[str, Any]:
            body = {"action": "migrate", "filter": TWIN_FILTER, "toVersion": 1}
            async with system.session.post(f"{system.api}/orders/bulk", json=body) as response:
                answer: dict[str, Any] = await response.json()
                assert response.status == 202, answer
                return answer

        started = await asyncio.gather(start(), start())
        assert [s["matched"] for s in started] == [TWINS, TWINS]

        async def finished() -> list[dict[str, Any]] | None:
            jobs = []
            for s in started:
                async with system.session.get(f"{system.api}/bulk/{s['bulkId']}") as response:
                    jobs.append(await response.json())
            return jobs if all(j["state"] == "Done" for j in jobs) else None

        jobs = await until_done(finished, 60)
        for job in jobs:
            assert job["done"] + job["skipped"] + job["failed"] == job["matched"], job
            assert job["failed"] == 0, job
        assert sorted((j["done"], j["skipped"]) for j in jobs) == [(0, TWINS), (TWINS, 0)], jobs

        for order_id in ids:
            view = await system.order(order_id)
            assert view["workflowVersion"] == 1, view
            moved = [h for h in view["history"] if h["event"] == "migrated"]
            assert len(moved) == 1 and " by bulk:" in moved[0]["detail"], view["history"]


async def until_done(
    check: Callable[[], Awaitable[list[dict[str, Any]] | None]], timeout: float
) -> list[dict[str, Any]]:
    deadline = asyncio.get_running_loop().time() + timeout
    last = None
    while asyncio.get_running_loop().time() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"the jobs not Done within {timeout:.0f} s")
