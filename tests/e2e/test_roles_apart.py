"""The app split by role over two runtime processes, as `bench --placement roles` runs
it: the front and the Scheduler on one, the Agents on the other, made only with the
host's `AzureWebJobs.<name>.Disabled` settings. Orders go through; each process did only
its own part (the other answers `404` on the route it does not serve)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from bench._placement import app_functions, runtime_settings
from devhost.harness.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

DONE = 120.0
"""Seconds the orders get to finish on a loaded machine."""


async def test_front_and_scheduler_on_one_runtime_agents_on_the_other(tmp_path: Path) -> None:
    split = runtime_settings("roles", ("a", "b"), app_functions())
    async with (
        Stack("roles", tmp_path, runtimes=("a", "b"), runtime_settings=split) as stack,
        aiohttp.ClientSession() as session,
    ):
        front, agents = stack.app(session, "a"), stack.app(session, "b")
        status, _ = await agents.submit({"orderId": "r-0", "customerId": "c-1", "items": []})
        assert status == 404
        ids = [f"r-{i}" for i in range(1, 5)]
        for order_id in ids:
            await front.submit_order(order_id)
        views = await asyncio.gather(*(front.wait_for(o, timeout=DONE) for o in ids))
        assert [v["processState"] for v in views] == ["Processed"] * len(ids)
        logs = {name: "".join(p.read_text() for p in stack.runtimes[name].logs) for name in "ab"}
    for order_id in ids:
        assert f"order {order_id} reserve-inventory succeeded" in logs["b"]
        assert f"order {order_id} claimed" in logs["a"]
    assert " succeeded (attempt " not in logs["a"]
    assert " claimed: by " not in logs["b"]
