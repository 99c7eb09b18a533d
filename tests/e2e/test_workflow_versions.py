"""Versions pinned per order, across a redeploy: orders started on v1 finish on v1 while
new orders run v2, and a catalogue without v1 is refused while v1 orders are in flight."""

from __future__ import annotations

import asyncio
import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest

from devhost.broker import Broker
from devhost.simulator import SimulatorServer
from shared.catalogue import DEFAULT_FILE, FILE_SETTING
from shared.cli.app import run
from shared.contract import Setting
from tests.e2e.conftest import e2e_settings, running_system

pytestmark = [pytest.mark.e2e, pytest.mark.azurite, pytest.mark.broker]

IN_FLIGHT = 50
NOTIFY = {
    "name": "notify-customer",
    "agent": "notifications",
    "kind": "retriable",
    "inputs": ["create-shipment.trackingNumber"],
    "results": ["notificationId"],
}


def catalogues(tmp_path: Path) -> tuple[Path, Path, Path]:
    """v1 only (as shipped), v1 and v2, and v2 alone (v1 dropped)."""
    shipped = json.loads(DEFAULT_FILE.read_text(encoding="utf-8"))
    v1 = next(w for w in shipped["workflows"] if w["name"] == "order-fulfilment")
    v2 = copy.deepcopy(v1) | {"version": 2}
    v2["steps"] = [*v2["steps"], NOTIFY]
    both = copy.deepcopy(shipped)
    both["workflows"].append(v2)
    dropped = copy.deepcopy(both)
    dropped["workflows"] = [w for w in both["workflows"] if w != v1]
    paths = []
    for name, doc in (("v1", shipped), ("both", both), ("dropped", dropped)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(doc), encoding="utf-8")
        paths.append(path)
    return paths[0], paths[1], paths[2]


async def cli(*argv: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    code = await run(list(argv), out=out, err=err, env={})
    return code, out.getvalue() + err.getvalue()


def on(settings: dict[str, str], path: Path) -> dict[str, str]:
    """The settings of an app deployed with the catalogue at `path`."""
    return {**settings, FILE_SETTING: str(path)}


async def test_orders_finish_on_the_version_they_started_while_new_ones_run_the_next(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    v1, both, dropped = catalogues(tmp_path)
    settings = e2e_settings(azurite_table_port, broker, simulator.url)
    table = settings[Setting.STATE_TABLE]
    ids = [f"v1-{i:02d}" for i in range(IN_FLIGHT)]

    async with running_system(on(settings, v1), broker, simulator, monkeypatch) as s:
        await s.faults("shipping", latencyMs=1500)
        await asyncio.gather(*(s.submit(i) for i in ids))
        views = [await s.order(i) for i in ids]
        assert {(v["workflow"], v["workflowVersion"]) for v in views} == {("order-fulfilment", 1)}
    unfinished = [v for v in views if v["processState"] not in ("Processed", "Compensated")]
    assert unfinished, "the redeploy must happen while v1 orders are in flight"

    connection = settings[Setting.STORAGE]
    code, said = await cli(
        "workflows", "check", "--file", str(dropped), "--against", connection, "--table", table
    )
    assert code == 1, said
    assert "drops order-fulfilment v1" in said

    async with running_system(on(settings, both), broker, simulator, monkeypatch) as s:
        await s.clear_faults()
        await s.submit("v2-00")
        finished: list[dict[str, Any]] = [await s.wait_for(i, timeout=120) for i in ids]
        new = await s.wait_for("v2-00", timeout=60)
    assert {v["processState"] for v in finished} == {"Processed"}
    assert {v["workflowVersion"] for v in finished} == {1}
    assert {len(v["steps"]) for v in finished} == {3}
    assert (new["processState"], new["workflowVersion"]) == ("Processed", 2)
    assert [st["name"] for st in new["steps"]][-1] == "notify-customer"

    code, said = await cli(
        "workflows", "check", "--file", str(dropped), "--against", connection, "--table", table
    )
    assert code == 0, said
