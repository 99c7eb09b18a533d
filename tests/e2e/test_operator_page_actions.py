"""The operator page's Suspend, Resume and Cancel buttons in headless Chromium.

An operator suspends an order mid-step from the page, sees it listed as Suspended,
resumes it and sees it finish; then cancels another one (accepting the confirmation)
and sees it end Cancelled.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import System
from tests.e2e.test_operator_page import KEY, WAIT_MS, assert_graph_shows, in_state, page

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker, pytest.mark.browser]

__all__ = ["page"]  # the fixture, reused


def in_flight(order_id: str) -> str:
    return ", ".join(in_state(s, order_id) for s in ("Pending", "Processing"))


async def test_an_operator_suspends_resumes_and_cancels_from_the_page(
    system: System, page: Any
) -> None:
    await page.goto(f"{system.api}/ops?code={KEY}")
    await page.wait_for_selector('.count[data-state="Pending"]')
    await system.faults("shipping", latencyMs=4000)

    await system.submit("ops-pause")
    processing = page.locator(in_flight("ops-pause"))
    await processing.wait_for(timeout=WAIT_MS)
    await processing.get_by_role("button", name="Suspend").click()
    await page.locator("#actions li", has_text="suspend ops-pause: 202").wait_for()
    suspended = page.locator(in_state("Suspended", "ops-pause"))
    await suspended.wait_for(timeout=WAIT_MS)
    await suspended.get_by_role("button", name="Resume").click()
    await page.locator("#actions li", has_text="resume ops-pause: 202").wait_for()
    await page.wait_for_selector(in_state("Processed", "ops-pause"), timeout=WAIT_MS)

    await system.submit("ops-stop")
    stopping = page.locator(in_flight("ops-stop"))
    await stopping.wait_for(timeout=WAIT_MS)
    page.once("dialog", lambda dialog: dialog.accept())
    await stopping.get_by_role("button", name="Cancel").click()
    await page.locator("#actions li", has_text="cancel ops-stop: 202").wait_for()
    await page.wait_for_selector(in_state("Cancelled", "ops-stop"), timeout=WAIT_MS)
    stopped = await system.order("ops-stop")
    assert stopped["processState"] == "Cancelled"
    await page.locator('.count[data-state="Cancelled"] a[data-open-order="ops-stop"]').click()
    await page.locator('#order[data-process-state="Cancelled"]').wait_for(timeout=WAIT_MS)
    await assert_graph_shows(page, stopped)  # with its undone steps, if any had completed
