"""Per-application state shared by the service and control handlers."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from devhost.simulator.effects import EffectLedger
from devhost.simulator.faults import FaultBoard
from devhost.simulator.services import SERVICE_NAMES
from devhost.simulator.stats import StatsBoard


@dataclass
class SimulatorState:
    """Everything one simulator instance knows; two apps in one process never share it."""

    ledger: EffectLedger
    seed: int
    faults: FaultBoard = field(default_factory=lambda: FaultBoard(SERVICE_NAMES))
    stats: StatsBoard = field(default_factory=lambda: StatsBoard(SERVICE_NAMES))
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at shutdown so hung calls end instead of holding the server."""
    finishing: set[asyncio.Task[web.Response]] = field(default_factory=set)
    """Calls still finishing after their client left; cancelled at cleanup."""


STATE = web.AppKey("simulator_state", SimulatorState)
