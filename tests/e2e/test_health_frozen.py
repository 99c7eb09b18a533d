"""`/api/health` tells the truth about a dependency that stops answering without closing
its connections (a frozen process, SIGSTOP): a 503 naming it, every answer within 3.5 s.

An open AMQP link or a pooled HTTP connection proves nothing about such a peer, so the
probes are round trips (a peek at a dead-letter queue, a point read), and an "ok" the
check reuses is dropped as soon as one of the app's own calls to that dependency failed.
The whole system runs as processes (`Stack`), so that the broker and Azurite can be
frozen without freezing the runtime.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devhost.harness.stack import Stack
from shared.contract import Route, Setting
from shared.usecases.operations.health_check import HEALTH_TTL
from tests.e2e.test_infrastructure_outage import Answer, ask

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

ANSWER_WITHIN = 3.5
"""The issue's bound for each answer of /api/health, whatever is frozen."""
SETTINGS = {Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *"}


async def health(stack: Stack, session: aiohttp.ClientSession) -> Answer:
    answer = await ask(session, "GET", f"{stack.api()}/{Route.HEALTH}")
    assert answer.seconds < ANSWER_WITHIN, answer
    return answer


async def health_until(
    stack: Stack, session: aiohttp.ClientSession, status: int, within: float
) -> Answer:
    """The first answer with `status`; each one within the bound. `within` only fails a
    check that never says it: a cached answer is at most HEALTH_TTL old."""
    deadline = time.monotonic() + within
    while True:
        answer = await health(stack, session)
        if answer.status == status:
            return answer
        assert time.monotonic() < deadline, f"health never answered {status}: {answer}"
        await asyncio.sleep(0.2)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[tuple[Stack, aiohttp.ClientSession]]:
    async with (
        Stack("frozen", tmp_path, settings=SETTINGS) as running,
        aiohttp.ClientSession() as session,
    ):
        yield running, session


def order(order_id: str) -> dict[str, Any]:
    return {
        "orderId": order_id,
        "customerId": "c-1",
        "items": [{"sku": "SKU-1", "quantity": 1, "unitPrice": 5.0}],
    }


STALE_AT_MOST = HEALTH_TTL.total_seconds() + 2 * ANSWER_WITHIN


@pytest.mark.parametrize(
    ("service", "check", "other"),
    [("broker", "serviceBus", "stateStore"), ("azurite", "stateStore", "serviceBus")],
)
async def test_a_frozen_dependency_is_named_in_a_503_within_the_bound(
    stack: tuple[Stack, aiohttp.ClientSession], service: str, check: str, other: str
) -> None:
    running, session = stack
    assert (await health(running, session)).status == 200
    frozen = running.services[service]
    frozen.signal(signal.SIGSTOP)
    try:
        down = await health_until(running, session, 503, STALE_AT_MOST)
        assert down.body["status"] == "degraded"
        assert down.body["checks"][check].startswith("unavailable"), down
        assert down.body["checks"][other] == "ok", down
    finally:
        frozen.signal(signal.SIGCONT)
    await health_until(running, session, 200, STALE_AT_MOST)


async def test_a_call_that_failed_on_a_frozen_store_drops_the_ok_at_once(
    stack: tuple[Stack, aiohttp.ClientSession],
) -> None:
    """The intake's write meets the frozen store (503); the very next health answer is a
    new probe, not the "ok" of a moment before."""
    running, session = stack
    assert (await health(running, session)).status == 200
    frozen = running.services["azurite"]
    frozen.signal(signal.SIGSTOP)
    try:
        refused = await ask(
            session, "POST", f"{running.api()}/{Route.ORDERS}", json=order("frozen-1")
        )
        assert refused.status == 503, refused
        down = await health(running, session)
        assert down.status == 503, down
        assert down.body["checks"]["stateStore"].startswith("unavailable"), down
    finally:
        frozen.signal(signal.SIGCONT)
