"""A bulk action through the operator page in headless Chromium: "Resubmit this group"
on a failures row shows the preview (orders, remote operations) and changes nothing
until Confirm; then the job's progress runs to Done and the orders finish."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devhost.broker import Broker
from devhost.simulator import SimulatorServer
from shared.contract import Setting
from tests.e2e.conftest import System, e2e_settings, running_system
from tests.e2e.test_operator_page import KEY, WAIT_MS, page

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker, pytest.mark.browser]

__all__ = ["page"]  # the fixture, reused
IDS = ("page-bulk-1", "page-bulk-2", "page-bulk-3")


@pytest.fixture
async def quick(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[System]:
    """A hung step puts an order in Error after one deadline of the e2e default (6 s):
    at 2 s, an order on a loaded machine (load 4 to 5) missed it without a fault, and the
    warm-up joined the failures group the test counts."""
    settings = {
        **e2e_settings(azurite_table_port, broker, simulator.url),
        Setting.MAX_FAILURE_COUNT: "1",
        Setting.STATE_TABLE: f"pb{uuid.uuid4().hex[:12]}",
    }
    async with running_system(settings, broker, simulator, monkeypatch) as started:
        yield started


async def failure_groups(
    system: System, wanted: tuple[str, str, int], timeout: float = 10
) -> list[tuple[str, str, int]]:
    """`GET /api/failures` until it shows `wanted`: an order's rest entry is written
    right after the save that put it in Error (docs/history.md), so it may trail the
    state a poll just read."""
    deadline = time.monotonic() + timeout
    while True:
        async with system.session.get(f"{system.api}/failures") as response:
            found = [
                (g["step"], g["errorCode"], g["count"]) for g in (await response.json())["groups"]
            ]
        if wanted in found or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.2)


async def test_an_operator_resubmits_a_failures_group_from_the_page(
    quick: System, page: Any
) -> None:
    system = quick
    # A first order while the agents' receivers open may miss its deadline anyway.
    await system.submit("page-bulk-warm-up")
    await system.wait_for("page-bulk-warm-up", timeout=60)
    await system.faults("shipping", hangRate=1.0, hangSeconds=30)
    for order_id in IDS:
        await system.submit(order_id)
    for order_id in IDS:
        assert (await system.wait_for(order_id, timeout=60))["processState"] == "Error"
    await system.clear_faults()

    groups = await failure_groups(system, ("create-shipment", "timeout", 3))
    assert ("create-shipment", "timeout", 3) in groups, groups
    await page.goto(f"{system.api}/ops?code={KEY}")
    await page.click("#failures-refresh")
    group = page.locator('#failures tr[data-failure="create-shipment timeout"]')
    await group.wait_for(timeout=WAIT_MS)
    await group.get_by_role("button", name="Resubmit this group").click()

    await page.locator("#bulk-preview", has_text="resubmit would act on 3 orders").wait_for()
    effect = page.locator('#bulk-effects li[data-operation="create-shipment"]')
    assert await effect.inner_text() == "3 x create-shipment"
    for order_id in IDS:
        assert (await system.order(order_id))["processState"] == "Error"

    await page.click("#bulk-confirm")
    await page.locator('#bulk-progress[data-state="Done"]').wait_for(timeout=30_000)
    assert "3 done, 0 skipped, 0 failed of 3" in await page.inner_text("#bulk-progress")
    await page.locator("#actions li", has_text="bulk resubmit: job").wait_for()
    for order_id in IDS:
        finished = await system.wait_for(order_id, timeout=60)
        assert finished["processState"] == "Processed"
