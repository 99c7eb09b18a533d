"""The whole system as processes: up on free ports, an order through, a runtime crash,
a durable Azurite killed and started again."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import aiohttp
import pytest
from azure.data.tables.aio import TableServiceClient

from devhost.harness.stack import Stack
from shared.contract import Setting

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]


async def test_stack_runs_orders_and_survives_a_killed_runtime(tmp_path: Path) -> None:
    settings = {Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *", Setting.STEP_TIMEOUT_SECONDS: "5"}
    async with (
        Stack("harness", tmp_path, settings=settings, broker_lock_seconds=3) as stack,
        aiohttp.ClientSession() as session,
    ):
        assert set(stack.pids()) == {"azurite", "broker", "simulator", "otlp", "runtime"}
        assert stack.settings()[Setting.INSTANCE_ID] == "harness-a1"
        assert stack.settings()["OTEL_EXPORTER_OTLP_ENDPOINT"] == (
            f"http://127.0.0.1:{stack.otlp_port}"
        )
        assert stack.settings()[Setting.TRACE_QUERY_URL] == stack.trace_query_url
        async with session.get(stack.trace_query_url) as listed:
            assert listed.status == 200
        app = stack.app(session)
        await stack.simulator(session).set_faults("payment", latencyMs=50)
        await app.submit_order("h-1")
        assert (await app.wait_for("h-1", timeout=60))["processState"] == "Processed"
        assert len(await stack.simulator(session).effects("h-1")) == 3
        assert (await stack.broker(session).stats())["orders"]

        instance, pid = stack.kill_runtime("a")
        assert (instance, stack.runtime_alive("a")) == ("harness-a1", False)
        stack.start_runtime("a")
        await stack.wait_healthy(session, "a")
        assert stack.pids()["runtime"] != pid
        await app.submit_order("h-2")
        assert (await app.wait_for("h-2", timeout=60))["processState"] == "Processed"
        assert [p.name for p in stack.runtime_logs()] == ["runtime-a1.log", "runtime-a2.log"]
        pids = stack.pids()
    assert stack.pids() == {}
    assert all(not _alive(pid) for pid in pids.values())


async def test_a_durable_azurite_keeps_what_it_answered_across_kill_and_restart(
    tmp_path: Path,
) -> None:
    with Stack("durable", tmp_path, durable_azurite=True) as stack:
        port = stack.table_port
        async with TableServiceClient.from_connection_string(
            stack.storage_connection_string
        ) as service:
            table = await service.create_table("kept")
            for i in range(20):
                await table.upsert_entity({"PartitionKey": "p", "RowKey": str(i), "N": i})
            pid = stack.kill_azurite()
            assert not _alive(pid) and "azurite" not in stack.pids()
            stack.start_azurite()
            assert stack.table_port == port and stack.pids()["azurite"] != pid
            rows = [e async for e in table.list_entities()]
            await table.close()
        assert sorted(e["N"] for e in rows) == list(range(20))
        assert (tmp_path / "azurite").is_dir()


async def test_a_runtime_whose_port_was_taken_meanwhile_starts_on_another(tmp_path: Path) -> None:
    """A free port is free only when picked: here another process holds it when the
    runtime starts, as happens by chance between a pick (or a kill) and a start."""
    with Stack("taken", tmp_path) as stack:
        taken = stack.runtimes["a"].port
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", taken))
            holder.listen()
            async with aiohttp.ClientSession() as session:
                stack.start_runtime("a")
                await stack.wait_healthy(session, "a")
                assert stack.runtimes["a"].port != taken
                assert stack.runtime_logs()[0].name == "runtime-a1.log"
                assert "address already in use" in stack.runtime_logs()[0].read_text()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
