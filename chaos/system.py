"""What a chaos run starts: the harness `Stack` with two runtimes, and its kill record.

Its own Azurite (in memory, on a free port), a durable local broker (SQLite file, short
lock), the simulator, and two runtimes (`python -m devhost --no-services`) against the
same storage and broker: two Schedulers compete for orders, two Supervisors sweep at
once. Everything started is stopped on exit, also after a failure or Ctrl-C.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chaos.config import ChaosConfig
from devhost.harness.stack import Stack
from shared.contract import ChaosSetting

RUNTIMES = ("a", "b")
DRAIN_SECONDS = 3


@dataclass(frozen=True)
class KillEvent:
    runtime: str
    instance_id: str
    pid: int
    at: float
    """Seconds since the load started."""
    back_after: float
    """Seconds from the kill until the restarted runtime answered /api/health."""


def chaos_stack(config: ChaosConfig, workdir: Path) -> Stack:
    """`with chaos_stack(...)` starts the services; the run starts the runtimes."""
    return Stack(
        "chaos",
        workdir,
        seed=config.seed,
        broker_db=True,
        broker_lock_seconds=config.timings.broker_lock_seconds,
        settings={
            ChaosSetting.FAULT_RATE: str(config.chaos_fault_rate),
            **config.timings.settings(),
        },
        runtimes=RUNTIMES,
        runtime_extra=("--drain-timeout", str(DRAIN_SECONDS)),
    )
