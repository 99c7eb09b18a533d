"""The operator page's Drain toggle and Failures panel in headless Chromium.

An operator drains payment from the page with a reason, sees it marked drained (and the
API agrees), undrains it; then sees an order that timed out at create-shipment counted
in the failures panel under its step and the code `timeout`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import System
from tests.e2e.test_operator_page import KEY, WAIT_MS, page
from tests.workflows import AGENTS

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker, pytest.mark.browser]

__all__ = ["page"]  # the fixture, reused
SCREENSHOT = Path(__file__).resolve().parents[2] / ".artifacts" / "ops-page-fleet.png"


async def agent(system: System, name: str) -> dict[str, Any]:
    async with system.session.get(f"{system.api}/agents") as r:
        agents: list[dict[str, Any]] = (await r.json())["agents"]
    return next(a for a in agents if a["agent"] == name)


async def test_an_operator_drains_an_agent_and_reads_the_failures_from_the_page(
    system: System, page: Any
) -> None:
    await page.goto(f"{system.api}/ops?code={KEY}")
    payment = page.locator('#drains tr[data-drain-agent="payment"]')
    await payment.wait_for(timeout=WAIT_MS)
    assert await page.locator("#drains tr[data-drain-agent]").count() == len(AGENTS)

    await page.fill("#drain-reason", "provider maintenance")
    await payment.get_by_role("button", name="Drain").click()
    await page.locator("#actions li", has_text="drain payment: 200 drained").wait_for()
    await page.locator('#drains tr[data-drain-agent="payment"][data-drained="true"]').wait_for()
    assert "provider maintenance" in await payment.inner_text()
    drained = await agent(system, "payment")
    assert (drained["drained"], drained["reason"], drained["by"]) == (
        True,
        "provider maintenance",
        "ops-page",
    )

    await payment.get_by_role("button", name="Undrain").click()
    await page.locator("#actions li", has_text="undrain payment: 200 undrained").wait_for()
    await page.locator('#drains tr[data-drain-agent="payment"][data-drained="false"]').wait_for()
    assert (await agent(system, "payment"))["drained"] is False

    await system.faults("shipping", hangRate=1.0, hangSeconds=30)
    await system.submit("ops-timeout")
    assert (await system.wait_for("ops-timeout", timeout=90))["processState"] == "Error"
    await page.click("#failures-refresh")
    group = page.locator('#failures tr[data-failure="create-shipment timeout"]')
    await group.wait_for(timeout=WAIT_MS)
    cells = await group.locator("td").all_inner_texts()
    assert cells[0] == "1" and cells[5] == "ops-timeout"
    SCREENSHOT.parent.mkdir(exist_ok=True)
    await page.screenshot(path=str(SCREENSHOT), full_page=True)
