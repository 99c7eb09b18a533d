"""Per-application state shared by the service and control handlers."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from devhost.simulator.effects import EffectLedger
from devhost.simulator.faults import FaultBoard
from devhost.simulator.limits import LoadMeter, Monotonic
from devhost.simulator.services import Service
from devhost.simulator.stats import StatsBoard


class CallsInProgress:
    """Keys with an operation still running, so a query does not call them not applied.

    In memory: after a restart no call is running any more, which is exactly right.
    """

    def __init__(self) -> None:
        self._running: Counter[tuple[str, str]] = Counter()

    def begin(self, service: str, key: str) -> None:
        self._running[service, key] += 1

    def end(self, service: str, key: str) -> None:
        self._running[service, key] -= 1
        if self._running[service, key] <= 0:
            del self._running[service, key]

    def running(self, service: str, key: str) -> bool:
        return (service, key) in self._running


class QueryNumbers:
    """How often each key was queried, the query's counterpart of a key's call count."""

    def __init__(self) -> None:
        self._asked: Counter[tuple[str, str]] = Counter()

    def next(self, service: str, key: str) -> int:
        self._asked[service, key] += 1
        return self._asked[service, key]

    def clear(self) -> None:
        self._asked.clear()


@dataclass
class SimulatorState:
    """Everything one simulator instance knows; two apps in one process never share it."""

    ledger: EffectLedger
    seed: int
    services: Mapping[str, Service]
    """The simulated services by name: the catalogue's agents."""
    monotonic: Monotonic = time.monotonic
    """What the quotas' one-second windows are measured on (a fake one in tests)."""
    faults: FaultBoard = field(init=False)
    stats: StatsBoard = field(init=False)
    load: LoadMeter = field(init=False)
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    """Set at shutdown so hung calls end instead of holding the server."""
    finishing: set[asyncio.Task[web.Response]] = field(default_factory=set)
    """Calls still finishing after their client left; cancelled at cleanup."""
    in_progress: CallsInProgress = field(default_factory=CallsInProgress)
    query_numbers: QueryNumbers = field(default_factory=QueryNumbers)
    sent_numbers: QueryNumbers = field(default_factory=QueryNumbers)
    """How often each key was sent (held calls included), for the late-arrival draw."""

    def __post_init__(self) -> None:
        names = tuple(self.services)
        self.faults = FaultBoard(names)
        self.stats = StatsBoard(names)
        self.load = LoadMeter(names, self.monotonic)


STATE = web.AppKey("simulator_state", SimulatorState)
