"""Persistence of the ledger across restarts, and the command-line entry point."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devhost.simulator import SimulatorServer
from tests.simulator.conftest import SimClient

REPO_ROOT = Path(__file__).resolve().parents[2]


async def test_ledger_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "effects.db"
    async with aiohttp.ClientSession() as session:
        with SimulatorServer(db_path=db, seed=1) as first:
            sim = SimClient(session, first.url)
            charged = await sim.call("payment", "charge-payment", "o-1", "k-pay")
            await sim.put_faults("inventory", {"permanentFailureSkus": ["SKU-1"]})
            rejected = await sim.call("inventory", "reserve-inventory", "o-1", "k-inv")

        with SimulatorServer(db_path=db, seed=1) as second:
            sim = SimClient(session, second.url)
            charged_again = await sim.call("payment", "charge-payment", "o-1", "k-pay")
            rejected_again = await sim.call("inventory", "reserve-inventory", "o-1", "k-inv")
            effects = await sim.effects()

    assert charged_again.body == charged.body
    assert charged_again.headers.get("Idempotent-Replayed") == "true"
    assert (rejected.status, rejected_again.status) == (422, 422)
    assert rejected_again.body == rejected.body
    assert [(e["idempotencyKey"], e["calls"], e["applied"]) for e in effects] == [
        ("k-pay", 2, 1),
        ("k-inv", 2, 0),
    ]


def test_without_a_db_each_server_starts_empty() -> None:
    with SimulatorServer() as first, SimulatorServer() as second:
        assert first.port != second.port


def test_start_fails_loudly_when_the_port_is_taken() -> None:
    with SimulatorServer() as first:
        taken = SimulatorServer(port=first.port)
        with pytest.raises(OSError):
            taken.start()


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def _post_json(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        status: int = response.status
        return status


def test_command_line_runs_and_stops_on_sigterm(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    command = [sys.executable, "-m", "devhost.simulator", "--port", "0", "--seed", "5"]
    with subprocess.Popen(
        [*command, "--db", str(db)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().strip()
            assert line.startswith("simulator listening on http://127.0.0.1:")
            url = line.removeprefix("simulator listening on ")
            assert _get_json(url + "/_sim/health")["seed"] == 5
            body = {"orderId": "o", "idempotencyKey": "k", "payload": {"result": None}}
            assert _post_json(url + "/shipping/cancel-shipment", body) == 200

            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=10) == 0
        finally:
            if process.poll() is None:
                process.kill()
    assert db.exists()
