"""The operator page lists orders waiting for the world, and answers approvals: an
operator approves one and rejects another, recorded as who acted, in headless Chromium."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import System
from tests.e2e.test_operator_page import KEY, WAIT_MS, page

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker, pytest.mark.browser]

__all__ = ["page"]  # the fixture, reused


async def submit_reviewed(system: System, order_id: str) -> None:
    await system.app.submit_order(order_id, workflow="reviewed-order")


async def test_an_operator_approves_one_order_and_rejects_another_from_the_page(
    system: System, page: Any
) -> None:
    await page.goto(f"{system.api}/ops?code={KEY}")
    await page.wait_for_selector('.count[data-state="Pending"]')
    await submit_reviewed(system, "ops-ok")
    await submit_reviewed(system, "ops-no")
    await page.fill("#approver", "ana")

    approve = page.locator('#waiting tr[data-waiting-order-id="ops-ok"]')
    await approve.wait_for(timeout=WAIT_MS)
    assert "event review" in await approve.inner_text()
    await approve.get_by_role("button", name="Approve").click()
    await page.locator("#actions li", has_text="approve ops-ok: 202 by ana").wait_for()

    reject = page.locator('#waiting tr[data-waiting-order-id="ops-no"]')
    await reject.wait_for(timeout=WAIT_MS)
    await reject.get_by_role("button", name="Reject").click()
    await page.locator("#actions li", has_text="reject ops-no: 202 by ana").wait_for()

    assert (await system.wait_for("ops-ok"))["processState"] == "Processed"
    rejected = await system.wait_for("ops-no")
    assert rejected["processState"] == "Compensated"
    assert rejected["lastError"] == "manual-review: rejected: rejected by ana: no reason"
    assert [e["by"] for e in rejected["events"]] == ["ana"]
    await page.locator('#waiting tr[data-waiting-order-id="ops-ok"]').wait_for(
        state="detached", timeout=WAIT_MS
    )
