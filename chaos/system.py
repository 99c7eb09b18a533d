"""Starts and stops what a chaos run needs, and kills runtimes on request.

Its own Azurite (in memory, on a free port), a durable local broker (SQLite file, short
lock), the simulator, and two runtimes (`python -m devhost --no-services`) against the
same storage and broker: two Schedulers compete for orders, two Supervisors sweep at
once. Everything listens on 127.0.0.1 on ports picked here; everything started is
stopped on exit, also after a failure or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import aiohttp

from chaos.config import ChaosConfig
from chaos.processes import Child, StartError, python
from shared.contract import ChaosSetting, Queue, Setting
from shared.domain.workflow import AGENTS
from shared.settings import azurite_connection_string
from tests.azurite import free_port, running_azurite

RUNTIMES = ("a", "b")
HEALTH_TIMEOUT_SECONDS = 90.0


def broker_connection_string(port: int) -> str:
    """The local broker speaks the emulator's connection string."""
    return (
        f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )


@dataclass
class RuntimeSlot:
    """One of the two runtimes; each start after a kill is a new incarnation."""

    name: str
    port: int
    incarnation: int = 0
    child: Child | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def instance_id(self) -> str:
        return f"chaos-{self.name}{self.incarnation}"


@dataclass(frozen=True)
class KillEvent:
    runtime: str
    instance_id: str
    pid: int
    at: float
    """Seconds since the load started."""
    back_after: float
    """Seconds from the kill until the restarted runtime answered /api/health."""


class ChaosSystem:
    def __init__(self, config: ChaosConfig, workdir: Path) -> None:
        self.config = config
        self.workdir = workdir
        self.table_name = f"chaos{config.seed}x{uuid.uuid4().hex[:8]}"
        self.slots = {name: RuntimeSlot(name, free_port()) for name in RUNTIMES}
        self._stack = contextlib.ExitStack()
        self.table_port = 0
        self.broker_port = 0
        self.broker_control_port = 0
        self.simulator_port = 0

    # -- lifecycle -------------------------------------------------------------------------

    def __enter__(self) -> ChaosSystem:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.table_port = self._stack.enter_context(running_azurite())
            self._start_broker()
            self._start_simulator()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Runtimes first (they hold broker links), then simulator, broker, Azurite."""
        try:
            for slot in self.slots.values():
                if slot.child is not None:
                    slot.child.stop(timeout=10)
                    slot.child = None
        finally:
            self._stack.close()

    def _start_broker(self) -> None:
        child = Child(
            "broker",
            python(
                *("-m", "devhost.broker", "--port", "0"),
                *("--control-port", str(free_port())),  # 0 would switch it off
                *("--db", str(self.workdir / "broker.sqlite3")),
                *("--lock-seconds", str(self.config.timings.broker_lock_seconds)),
                *("--log-level", "WARNING"),
            ),
            self.workdir / "broker.log",
        )
        self._stack.callback(child.stop)
        found = child.wait_for_line(
            r"broker listening on amqp://127\.0\.0\.1:(\d+) \(control http://127\.0\.0\.1:(\d+)\)"
        )
        self.broker_port, self.broker_control_port = int(found[1]), int(found[2])

    def _start_simulator(self) -> None:
        child = Child(
            "simulator",
            python(
                *("-m", "devhost.simulator", "--port", "0", "--seed", str(self.config.seed)),
                *("--log-level", "WARNING"),
            ),
            self.workdir / "simulator.log",
        )
        self._stack.callback(child.stop)
        found = child.wait_for_line(r"simulator listening on http://127\.0\.0\.1:(\d+)")
        self.simulator_port = int(found[1])

    # -- addresses -------------------------------------------------------------------------

    @property
    def storage_connection(self) -> str:
        return azurite_connection_string(self.table_port)

    @property
    def broker_connection(self) -> str:
        return broker_connection_string(self.broker_port)

    @property
    def broker_control(self) -> str:
        return f"http://127.0.0.1:{self.broker_control_port}"

    @property
    def simulator(self) -> str:
        return f"http://127.0.0.1:{self.simulator_port}"

    def apis(self) -> list[str]:
        return [slot.api for slot in self.slots.values()]

    def runtime_logs(self) -> list[Path]:
        return [path for slot in self.slots.values() for path in slot.logs]

    # -- runtimes --------------------------------------------------------------------------

    def settings(self, slot: RuntimeSlot) -> dict[str, str]:
        return {
            Setting.STORAGE: self.storage_connection,
            Setting.SERVICE_BUS: self.broker_connection,
            Setting.STATE_TABLE: self.table_name,
            Setting.REPLY_TO_ALLOW_LIST: Queue.ORDER_STATUS,
            **{
                spec.service_url_setting: f"{self.simulator}/{name.value}"
                for name, spec in AGENTS.items()
            },
            Setting.INSTANCE_ID: slot.instance_id,
            ChaosSetting.FAULT_RATE: str(self.config.chaos_fault_rate),
            **self.config.timings.settings(),
        }

    def start_runtime(self, name: str) -> None:
        slot = self.slots[name]
        if slot.child is not None and slot.child.alive():
            raise RuntimeError(f"runtime {name} is already running")
        slot.incarnation += 1
        log = self.workdir / f"runtime-{slot.name}{slot.incarnation}.log"
        slot.logs.append(log)
        slot.child = Child(
            f"runtime {slot.instance_id}",
            python(
                *("-m", "devhost", "--no-services", "--port", str(slot.port)),
                *("--state-dir", str(self.workdir / "devhost"), "--drain-timeout", "3"),
            ),
            log,
            self.settings(slot),
        )

    async def wait_healthy(self, session: aiohttp.ClientSession, name: str) -> None:
        slot = self.slots[name]
        deadline = time.monotonic() + HEALTH_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            child = slot.child
            if child is None or not child.alive():
                detail = child.tail() if child is not None else "not started"
                raise StartError(f"runtime {slot.instance_id} is not running:\n{detail}")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(
                    f"{slot.api}/health", timeout=aiohttp.ClientTimeout(total=5)
                ) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.25)
        raise StartError(f"runtime {slot.instance_id} not healthy after {HEALTH_TIMEOUT_SECONDS}s")

    async def start_runtimes(self, session: aiohttp.ClientSession) -> None:
        for name in self.slots:
            self.start_runtime(name)
        await asyncio.gather(*(self.wait_healthy(session, name) for name in self.slots))

    def kill_runtime(self, name: str) -> tuple[str, int]:
        """`kill -9` the runtime; returns the instance id and pid that died."""
        slot = self.slots[name]
        if slot.child is None:
            raise RuntimeError(f"runtime {name} is not running")
        pid, instance = slot.child.pid, slot.instance_id
        slot.child.kill()
        slot.child = None
        return instance, pid

    def runtime_alive(self, name: str) -> bool:
        child = self.slots[name].child
        return child is not None and child.alive()
