"""One trace per order, as the local OTLP receiver keeps it.

The system runs as processes (`Stack`): each runtime configures OpenTelemetry once per
process from the settings the stack gives it, which the in-process `System` fixture
cannot offer (the tests in one process share one global provider). For a fault-free
order, one an agent retried, one the Supervisor recovered and one compensated: every
span the receiver holds for the order's trace forms one tree (one root, no orphan), with
one app span per invocation, one CLIENT span per remote call, and the simulator saw a
`traceparent` of the order's trace on every call.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devhost.harness.clients import AppClient, SimulatorControl
from devhost.harness.stack import Stack
from devhost.simulator.effects import MAX_TRACEPARENTS
from shared.contract import Setting

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

SETTINGS = {Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *", Setting.STEP_TIMEOUT_SECONDS: "4"}
DONE = 120.0
"""Seconds an order gets to finish, and its spans to reach the receiver, on a loaded machine."""
EXPORT_SOON = {"OTEL_BSP_SCHEDULE_DELAY": "200"}
"""The SDK's batch span processor exports every 0.2 s, not its default 5 s: what is
checked is the trace once the receiver holds all of it, and the four waits for a batch
were a third of the test's time."""


async def spans_of(session: aiohttp.ClientSession, stack: Stack, trace_id: str) -> list[Any]:
    async with session.get(f"{stack.trace_query_url}/{trace_id}") as response:
        if response.status == 404:
            return []
        response.raise_for_status()
        found: list[Any] = await response.json()
        return found


def app_spans(spans: list[Any]) -> list[Any]:
    """The app's invocation spans: the local host's own are named `host <function>`."""
    return [
        s
        for s in spans
        if "faas.invocation_id" in s["attributes"] and not s["name"].startswith("host ")
    ]


def remote_calls(spans: list[Any]) -> list[Any]:
    return [s for s in spans if s["kind"] == "CLIENT" and "url.full" in s["attributes"]]


async def simulator_calls(sim: SimulatorControl, order_id: str) -> tuple[int, list[str]]:
    effects = await sim.effects(order_id)
    return sum(e["calls"] for e in effects), [t for e in effects for t in e["traceparents"]]


async def whole_trace(
    session: aiohttp.ClientSession, stack: Stack, sim: SimulatorControl, order_id: str
) -> list[Any]:
    """The order's trace once every remote call the simulator saw has its span and every
    host span its app span (the runtimes export in batches, every few seconds)."""
    view = await AppClient(session, stack.api()).order(order_id)
    trace_id = view["traceId"]
    assert trace_id, view
    deadline = time.monotonic() + DONE
    spans: list[Any] = []
    while time.monotonic() < deadline:
        spans = await spans_of(session, stack, trace_id)
        calls, _ = await simulator_calls(sim, order_id)
        hosts = [s for s in spans if s["name"].startswith("host ")]
        ids = {s["spanId"] for s in spans}
        if (
            len(remote_calls(spans)) >= calls
            and len(app_spans(spans)) >= len(hosts)
            and all(s["parentSpanId"] in ids for s in spans if s["parentSpanId"])
        ):
            return spans
        await asyncio.sleep(0.25)
    raise AssertionError(f"order {order_id}: trace {trace_id} never complete: {spans}")


async def assert_one_tree(
    session: aiohttp.ClientSession, stack: Stack, sim: SimulatorControl, order_id: str
) -> list[Any]:
    spans = await whole_trace(session, stack, sim, order_id)
    trace_ids = {s["traceId"] for s in spans}
    assert len(trace_ids) == 1
    ids = {s["spanId"] for s in spans}
    roots = [s for s in spans if not s["parentSpanId"]]
    assert len(roots) == 1, [s["name"] for s in roots]
    assert all(s["parentSpanId"] in ids for s in spans if s["parentSpanId"]), "orphan span"
    invocations = Counter(s["attributes"]["faas.invocation_id"] for s in app_spans(spans))
    assert invocations and set(invocations.values()) == {1}, invocations
    hosts = Counter(
        s["attributes"]["faas.invocation_id"] for s in spans if s["name"].startswith("host ")
    )
    assert hosts == invocations, "an invocation without its one app span"
    calls, traceparents = await simulator_calls(sim, order_id)
    assert len(remote_calls(spans)) == calls
    (trace_id,) = trace_ids
    assert traceparents and all(t.split("-")[1] == trace_id for t in traceparents)
    for effect in await sim.effects(order_id):  # every call carried one (the last 10 kept)
        assert len(effect["traceparents"]) == min(effect["calls"], MAX_TRACEPARENTS)
    return spans


async def test_every_order_is_one_trace_whatever_happened_to_it(tmp_path: Path) -> None:
    async with (
        Stack("tracing", tmp_path, settings=SETTINGS, runtime_env=EXPORT_SOON) as stack,
        aiohttp.ClientSession() as session,
    ):
        app, sim = stack.app(session), stack.simulator(session)

        await app.submit_order("tr-ok")
        assert (await app.wait_for("tr-ok", timeout=DONE))["processState"] == "Processed"
        await assert_one_tree(session, stack, sim, "tr-ok")

        await sim.set_faults("inventory", transientErrorRate=1.0)
        await app.submit_order("tr-retried")
        await _until_called(sim, "tr-retried")
        await sim.clear_faults()
        assert (await app.wait_for("tr-retried", timeout=DONE))["processState"] == "Processed"
        retried = await assert_one_tree(session, stack, sim, "tr-retried")
        assert any(
            s["attributes"].get("http.request.resend_count", 0) >= 1 for s in remote_calls(retried)
        )
        assert any(e["name"] == "retry" for s in retried for e in s["events"])

        await sim.set_faults("inventory", hangRate=1.0, hangSeconds=30.0)
        await app.submit_order("tr-recovered")
        await app.wait_for("tr-recovered", {"Pending", "Processing"}, DONE, failureCount=1)
        await sim.clear_faults()
        assert (await app.wait_for("tr-recovered", timeout=DONE))["processState"] == "Processed"
        recovered = await assert_one_tree(session, stack, sim, "tr-recovered")
        rejoins = [s for s in recovered if s["name"].endswith("rejoins order")]
        assert rejoins and all(s["links"] for s in rejoins)

        await sim.set_faults("payment", permanentFailureSkus=["SKU-DECLINED"])
        await app.submit_order("tr-compensated", ("SKU-DECLINED",))
        done = await app.wait_for("tr-compensated", timeout=DONE)
        assert done["processState"] == "Compensated"
        await assert_one_tree(session, stack, sim, "tr-compensated")


async def _until_called(sim: SimulatorControl, order_id: str) -> None:
    deadline = time.monotonic() + DONE
    while (await simulator_calls(sim, order_id))[0] == 0:
        assert time.monotonic() < deadline, f"no call for {order_id}"
        await asyncio.sleep(0.2)
