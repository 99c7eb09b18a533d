"""With EventSigningSecret set, the operator page's Approve and Reject still work (issue
41, finding 6): the page answers through the operator route, recorded as the operator,
while the signed events route refuses the page's kind of unsigned request. Headless
Chromium against the whole local stack."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devhost.broker import Broker
from devhost.simulator import SimulatorServer
from shared.contract import Setting
from tests.e2e.conftest import System, e2e_settings, running_system
from tests.e2e.test_operator_page import KEY, WAIT_MS, page
from tests.e2e.test_operator_page_waits import submit_reviewed

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker, pytest.mark.browser]

__all__ = ["page"]  # the fixture, reused


@pytest.fixture
async def signing(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[System]:
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    settings[Setting.EVENT_SIGNING_SECRET] = "ops-page-test-secret"
    async with running_system(settings, broker, simulator, monkeypatch) as started:
        yield started


async def test_with_signing_on_an_operator_approves_and_rejects_from_the_page(
    signing: System, page: Any
) -> None:
    system = signing
    posted: list[str] = []
    page.on("request", lambda r: posted.append(r.url) if r.method == "POST" else None)
    await page.goto(f"{system.api}/ops?code={KEY}")
    await page.wait_for_selector('.count[data-state="Pending"]')
    await submit_reviewed(system, "sig-ok")
    await submit_reviewed(system, "sig-no")
    await page.fill("#approver", "ana")

    # The route machine clients use is still closed to an unsigned answer.
    unsigned = json.dumps({"eventId": "x", "data": {"approved": True}})
    async with system.session.post(
        f"{system.api}/orders/sig-ok/events/review",
        data=unsigned,
        headers={"content-type": "application/json"},
    ) as response:
        assert response.status == 401

    approve = page.locator('#waiting tr[data-waiting-order-id="sig-ok"]')
    await approve.wait_for(timeout=WAIT_MS)
    await approve.get_by_role("button", name="Approve").click()
    await page.locator("#actions li", has_text="approve sig-ok: 202 by ana").wait_for()

    reject = page.locator('#waiting tr[data-waiting-order-id="sig-no"]')
    await reject.wait_for(timeout=WAIT_MS)
    await reject.get_by_role("button", name="Reject").click()
    await page.locator("#actions li", has_text="reject sig-no: 202 by ana").wait_for()

    approved = await system.wait_for("sig-ok")
    assert approved["processState"] == "Processed"
    assert [(e["name"], e["by"]) for e in approved["events"]] == [("review", "ana")]
    rejected = await system.wait_for("sig-no")
    assert rejected["processState"] == "Compensated"
    assert rejected["lastError"] == "manual-review: rejected: rejected by ana: no reason"
    answers = [u.split("?")[0] for u in posted if "/orders/sig-" in u]
    assert answers == [
        f"{system.api}/orders/sig-ok/approval",
        f"{system.api}/orders/sig-no/approval",
    ]
