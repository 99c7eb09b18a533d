"""Fixtures for the CLI tests: an in-process CLI runner, a bare broker, the whole stack.

The CLI runs as a coroutine in the test's event loop (next to the in-process host), with
an explicit environment so a developer's exported settings cannot leak into a test.
"""

from __future__ import annotations

import io
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass

import pytest

from devhost.broker import Broker
from devhost.simulator import SimulatorServer
from shared.cli.app import run
from shared.contract import Setting
from tests.e2e.conftest import System, e2e_settings, running_system


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


async def cli(*argv: str, env: Mapping[str, str] | None = None) -> Result:
    out, err = io.StringIO(), io.StringIO()
    code = await run(list(argv), out, err, dict(env or {}))
    return Result(code, out.getvalue(), err.getvalue())


@pytest.fixture
def broker() -> Iterator[Broker]:
    with Broker(port=0, control_port=None, lock_seconds=10) as running:
        yield running


@pytest.fixture
def simulator() -> Iterator[SimulatorServer]:
    with SimulatorServer(port=0, seed=7) as running:
        yield running


@pytest.fixture
async def quick_system(
    azurite_table_port: int,
    broker: Broker,
    simulator: SimulatorServer,
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[System]:
    """The e2e stack with MaxFailureCount 1, so a hung step puts an order in Error quickly."""
    settings = {
        **e2e_settings(azurite_table_port, broker, simulator.url),
        Setting.MAX_FAILURE_COUNT: "1",
        Setting.STATE_TABLE: f"cli{uuid.uuid4().hex[:12]}",
    }
    async with running_system(settings, broker, simulator, monkeypatch) as started:
        yield started
