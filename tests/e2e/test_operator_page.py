"""The operator's page in headless Chromium against the whole local stack.

An operator watches orders move without reloading, sees two orders end in Error after
the shipping service hangs on every attempt, clears the fault, resubmits one of them
from the page and sees it reach Processed while the other stays in Error. The browser is
Debian's `chromium` (bin/setup installs it), driven by Playwright without its own
browser download.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import System

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker, pytest.mark.browser]

CHROMIUM = Path(os.environ.get("OPS_PAGE_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOT = Path(__file__).resolve().parents[2] / ".artifacts" / "ops-page.png"
KEY = "not-a-real-admin-key"
WAIT_MS = 90_000

playwright_api = pytest.importorskip(
    "playwright.async_api", reason="Playwright is not installed: run bin/setup"
)
if not CHROMIUM.exists():
    pytest.skip(
        f"{CHROMIUM} is missing: bin/setup installs Debian's chromium when run as root "
        "with apt-get available (see its output)",
        allow_module_level=True,
    )


@pytest.fixture
async def page() -> AsyncIterator[Any]:
    async with playwright_api.async_playwright() as driver:
        browser = await driver.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        try:
            context = await browser.new_context(viewport={"width": 1400, "height": 1000})
            yield await context.new_page()
        finally:
            await browser.close()


def in_state(state: str, order_id: str) -> str:
    return f'.count[data-state="{state}"] li[data-order-id="{order_id}"]'


async def test_an_operator_watches_orders_and_resubmits_one_from_the_page(
    system: System, page: Any
) -> None:
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    await page.goto(f"{system.api}/ops?code={KEY}")
    await page.wait_for_selector('.count[data-state="Pending"]')
    await page.evaluate("window.loadedOnce = true")

    await system.faults("shipping", hangRate=1.0, hangSeconds=30)
    await system.submit("ops-retry")
    await system.submit("ops-held")
    in_flight = ", ".join(in_state(s, "ops-retry") for s in ("Pending", "Processing"))
    await page.wait_for_selector(in_flight, timeout=WAIT_MS)
    errors = page.locator("#errors tr[data-order-id]")
    await errors.filter(has_text="ops-held").wait_for(timeout=WAIT_MS)
    retry_row = errors.filter(has_text="ops-retry")
    await retry_row.wait_for(timeout=WAIT_MS)
    assert "create-shipment" in await retry_row.inner_text()
    assert await page.locator("#sweeps tr").count() >= 1
    shipping = page.locator('#agents tr[data-agent="shipping"]').first
    await shipping.wait_for(timeout=WAIT_MS)
    assert "none" in await shipping.inner_text(), "no limit declared: limit none, no 429"

    await system.clear_faults()
    await retry_row.get_by_role("button", name="Resubmit").click()
    await page.locator("#actions li", has_text="resubmit ops-retry: 202").wait_for()
    await page.wait_for_selector(in_state("Processed", "ops-retry"), timeout=WAIT_MS)
    await page.wait_for_function(
        """() => document.querySelectorAll('#errors tr[data-order-id]').length === 1""",
        timeout=WAIT_MS,
    )
    processed = page.locator('.count[data-state="Processed"] .n')
    assert await processed.inner_text() == "1"
    assert await page.locator('.count[data-state="Error"] .n').inner_text() == "1"
    assert await page.evaluate("window.loadedOnce") is True  # live updates, no reload
    assert (await system.order("ops-retry"))["processState"] == "Processed"
    assert (await system.order("ops-held"))["processState"] == "Error"

    await page.locator('#errors a[data-open-order="ops-held"]').click()
    await page.locator('#order[data-process-state="Error"]').wait_for(timeout=WAIT_MS)
    await assert_graph_shows(page, await system.order("ops-held"))
    current = page.locator("#order-graph .node.current")
    assert "create-shipment" in await current.inner_text(), "the step it is held at"

    calls = [u for u in requests if "/api/ops/data" in u or "/resubmit" in u]
    assert any("/resubmit" in u for u in calls)
    assert calls and all(f"code={KEY}" in u for u in calls)
    SCREENSHOT.parent.mkdir(exist_ok=True)
    await page.screenshot(path=str(SCREENSHOT), full_page=True)


async def assert_graph_shows(page: Any, order: dict[str, Any]) -> None:
    """The order view's workflow graph: received, then every step of the order in its
    order and with its status as the API gives it, the current one outlined, then the
    order's state (its undone steps between, in reverse)."""
    graph = page.locator("#order-graph li")
    drawn = await graph.evaluate_all(
        "items => items.map((i) => [i.dataset.kind, i.dataset.step || '', i.dataset.status,"
        " i.querySelector('.node').classList.contains('current')])"
    )
    steps = order["steps"]
    undone = [s for s in reversed(steps) if s["status"] == "Compensated"]
    at_rest = order["processState"] in ("Processed", "Compensated", "Cancelled")
    assert drawn == [
        ["start", "", "Completed", False],
        *(
            ["step", s["name"], s["status"], i == order["currentStep"] and not at_rest]
            for i, s in enumerate(steps)
        ),
        *(["undo", s["name"], "Compensated", False] for s in undone),
        ["end", "", order["processState"], False],
    ]
