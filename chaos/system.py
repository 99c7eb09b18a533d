"""What a chaos run starts: the harness `Stack` with two runtimes, and its kill record.

Its own Azurite (on disk under the workdir with the durable preload, on a port fixed for
the run), a durable local broker (SQLite file, short lock), both killed and started again
for the infrastructure faults, the simulator, and two
runtimes (`python -m devhost --no-services`) against the same storage and broker: two
Schedulers compete for orders, two Supervisors sweep at once. Everything started is
stopped on exit, also after a failure or Ctrl-C.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from chaos.config import ChaosConfig
from devhost.harness import services
from devhost.harness.stack import STARTUP_TIMEOUT, Stack
from shared.contract import ChaosSetting, Setting

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


@dataclass(frozen=True)
class Outage:
    service: str
    """What was killed: "broker" or "azurite"."""
    pid: int
    at: float
    """Seconds since the load started, when it was killed."""
    down_seconds: float
    """Seconds until it took connections again."""
    started_at: datetime
    ended_at: datetime
    """Wall clock (UTC), to compare with the orders' history."""
    runtime_killed: str | None = None
    """The runtime killed while it was down, if any."""


class ChaosStack(Stack):
    """The harness stack (its Azurite durable, so it can be killed and started again), plus
    a broker that can be killed and started again on the same ports and the same SQLite
    file (its queues and their messages survive)."""

    def kill_broker(self) -> int:
        child = self.services["broker"]
        pid = child.pid
        child.kill()
        return pid

    def restart_broker(self) -> None:
        """Blocks until the broker is ready (call it in a thread)."""
        command = services.broker_command(
            port=self.broker_port,
            control_port=self.control_port,
            db=self.workdir / "broker.sqlite3",
            lock_seconds=self.broker_lock_seconds,
        )
        self._service("broker", command).wait_ready(
            line=services.BROKER_READY, timeout=STARTUP_TIMEOUT
        )


def chaos_stack(config: ChaosConfig, workdir: Path) -> ChaosStack:
    """`with chaos_stack(...)` starts the services; the run starts the runtimes."""
    return ChaosStack(
        "chaos",
        workdir,
        seed=config.seed,
        broker_db=True,
        durable_azurite=True,
        broker_lock_seconds=config.timings.broker_lock_seconds,
        settings={
            ChaosSetting.FAULT_RATE: str(config.chaos_fault_rate),
            # The check after the load reconciles every order of a run (at most 1000).
            Setting.RECONCILE_SAMPLE_SIZE: "1000",
            **config.timings.settings(),
            **config.limits.settings(),
        },
        runtimes=RUNTIMES,
        runtime_extra=("--drain-timeout", str(DRAIN_SECONDS)),
    )
