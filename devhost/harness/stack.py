"""The whole system as separate processes on free loopback ports, for bench and chaos.

Azurite (table service, in memory unless `durable_azurite`), the local broker, the
simulator, the OTLP receiver (every span of the runtimes) and one or more
runtimes (`python -m devhost --no-services`) against the same table and broker, each
its own process as under `python -m devhost`: the CPU each takes can be read from the
OS, a runtime can be killed like a crashed instance, and the broker's reactor does not
share a GIL with a runtime. Everything started is stopped on exit, runtimes first
(they hold broker links), also after a failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import contextlib
import re
import signal
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import aiohttp

from devhost.harness import services
from devhost.harness.clients import AppClient, BrokerControl, SimulatorControl
from devhost.harness.ports import LOOPBACK, free_port
from devhost.harness.process import Child, StartError
from shared.catalogue import catalogue_file, load
from shared.contract import Queue, Setting
from shared.settings import azurite_connection_string

STARTUP_TIMEOUT = 60.0
HEALTH_TIMEOUT = 90.0


PORT_TRIES = 3
PORT_TAKEN = "address already in use"
"""What the runtime logs when another process holds its port (devhost/host/http.py)."""


@dataclass
class Runtime:
    """One runtime slot: its port stays (unless another process takes it while the
    runtime is down), each start after a kill is a new incarnation."""

    name: str
    port: int
    incarnation: int = 0
    child: Child | None = None
    logs: list[Path] = field(default_factory=list)

    @property
    def api(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/api"


class Stack:
    """`async with Stack(...)` starts the services and every runtime (healthy when the
    block begins); plain `with` starts only the services."""

    def __init__(
        self,
        name: str,
        workdir: Path,
        *,
        seed: int | None = 7,
        broker_db: bool = True,
        durable_azurite: bool = False,
        broker_lock_seconds: float | None = None,
        settings: Mapping[str, str] | None = None,
        runtimes: Sequence[str] = ("a",),
        runtime_settings: Mapping[str, Mapping[str, str]] | None = None,
        runtime_module: str = "devhost",
        runtime_env: Mapping[str, str] | None = None,
        runtime_extra: Sequence[str] = (),
        log_dir: Path | None = None,
    ) -> None:
        self.name = name
        self.workdir = workdir
        self.log_dir = log_dir or workdir
        self.seed = seed
        self.broker_db = broker_db
        self.durable_azurite = durable_azurite
        self.broker_lock_seconds = broker_lock_seconds
        self.overrides = dict(settings or {})
        self.runtime_settings = {r: dict(v) for r, v in (runtime_settings or {}).items()}
        self.runtime_module = runtime_module
        self.runtime_env = dict(runtime_env or {})
        self.runtime_extra = tuple(runtime_extra)
        self.table_name = _table_name(name)
        self.table_port = free_port()
        self.broker_port = 0
        self.control_port = 0
        self.simulator_port = 0
        self.otlp_port = 0
        self.runtimes = {r: Runtime(r, free_port()) for r in runtimes}
        self.services: dict[str, Child] = {}
        self._previous_handlers: dict[int, Any] = {}

    # -- addresses ---------------------------------------------------------------------------

    @property
    def storage_connection_string(self) -> str:
        return azurite_connection_string(self.table_port)

    @property
    def service_bus_connection_string(self) -> str:
        return services.service_bus_connection_string(self.broker_port)

    @property
    def simulator_url(self) -> str:
        return f"http://{LOOPBACK}:{self.simulator_port}"

    @property
    def trace_query_url(self) -> str:
        """`GET {trace_query_url}/{traceId}`: the spans the runtimes exported."""
        return services.trace_query_url(self.otlp_port)

    @property
    def broker_control_url(self) -> str:
        return f"http://{LOOPBACK}:{self.control_port}"

    def api(self, name: str = "a") -> str:
        return self.runtimes[name].api

    def instance_id(self, name: str = "a") -> str:
        """WEBSITE_INSTANCE_ID of the runtime's current incarnation (who holds a lock)."""
        return f"{self.name}-{name}{self.runtimes[name].incarnation}"

    def settings(self, runtime: str = "a") -> dict[str, str]:
        """The runtime's app settings: this stack's addresses, then the overrides."""
        return {
            Setting.STORAGE: self.storage_connection_string,
            Setting.SERVICE_BUS: self.service_bus_connection_string,
            Setting.STATE_TABLE: self.table_name,
            Setting.REPLY_TO_ALLOW_LIST: Queue.ORDER_STATUS,
            **{
                spec.service_url_setting: f"{self.simulator_url}/{name}"
                for name, spec in load(catalogue_file()).agents.items()
            },
            Setting.INSTANCE_ID: self.instance_id(runtime),
            **services.telemetry_env(self.otlp_port),
            **self.overrides,
            **self.runtime_settings.get(runtime, {}),
        }

    def app(self, session: aiohttp.ClientSession, name: str = "a") -> AppClient:
        return AppClient(session, self.api(name))

    def simulator(self, session: aiohttp.ClientSession) -> SimulatorControl:
        return SimulatorControl(session, self.simulator_url)

    def broker(self, session: aiohttp.ClientSession) -> BrokerControl:
        return BrokerControl(session, self.broker_control_url)

    def pids(self) -> dict[str, int]:
        """Live processes by role, for reading their CPU from the OS."""
        found = {name: child.pid for name, child in self.services.items() if child.alive()}
        for runtime in self.runtimes.values():
            if runtime.child is not None and runtime.child.alive():
                key = "runtime" if len(self.runtimes) == 1 else f"runtime {runtime.name}"
                found[key] = runtime.child.pid
        return found

    def runtime_logs(self) -> list[Path]:
        return [path for runtime in self.runtimes.values() for path in runtime.logs]

    def describe(self) -> str:
        """One line for the console: where each part listens and where the logs go."""
        ports = ", ".join(f"{r.name} :{r.port}" for r in self.runtimes.values())
        return (
            f"stack up: Azurite :{self.table_port}"
            f"{' (on disk, durable)' if self.durable_azurite else ''}, broker :{self.broker_port}, "
            f"simulator :{self.simulator_port}, otlp :{self.otlp_port}, runtime {ports}; "
            f"logs in {self.log_dir}"
        )

    # -- services ----------------------------------------------------------------------------

    def start_services(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._start_azurite()
        self._start_broker()
        self._start_simulator()
        self._start_otlp()

    def _service(self, name: str, command: Sequence[str], **kwargs: Any) -> Child:
        child = Child(name, command, self.log_dir / f"{name}.log", **kwargs)
        self.services[name] = child.start()
        return child

    def _start_azurite(self) -> None:
        location = self.workdir / "azurite" if self.durable_azurite else None
        log = self.log_dir / "azurite.log"
        child = azurite_child(self.table_port, self.workdir, log, location=location)
        self.services["azurite"] = child.start()
        child.wait_ready(ports=[self.table_port], timeout=STARTUP_TIMEOUT)

    def kill_azurite(self) -> int:
        """`kill -9` Azurite (its whole process group); the pid that died. With
        `durable_azurite` every write it answered is kept; in memory, everything is lost."""
        child = self.services.get("azurite")
        if child is None or not child.alive():
            raise StartError("azurite is not running")
        pid = child.pid
        child.kill()
        return pid

    def start_azurite(self) -> None:
        """Start Azurite again on its port (and, durable, its data); blocks until it
        listens, so call it in a thread from async code."""
        child = self.services.get("azurite")
        if child is not None and child.alive():
            raise StartError("azurite is already running")
        self._start_azurite()

    def _start_broker(self) -> None:
        command = services.broker_command(
            port=0,
            control_port=free_port(),
            db=self.workdir / "broker.sqlite3" if self.broker_db else None,
            lock_seconds=self.broker_lock_seconds,
        )
        found = self._service("broker", command).wait_ready(
            line=services.BROKER_READY, timeout=STARTUP_TIMEOUT
        )
        assert found is not None
        self.broker_port, self.control_port = int(found[1]), int(found[2])

    def _start_simulator(self) -> None:
        command = services.simulator_command(port=0, seed=self.seed)
        found = self._service("simulator", command).wait_ready(
            line=services.SIMULATOR_READY, timeout=STARTUP_TIMEOUT
        )
        assert found is not None
        self.simulator_port = int(found[1])

    def _start_otlp(self) -> None:
        command = services.otlp_command(port=0, db=self.workdir / "traces.sqlite")
        found = self._service("otlp", command).wait_ready(
            line=services.OTLP_READY, timeout=STARTUP_TIMEOUT
        )
        assert found is not None
        self.otlp_port = int(found[1])

    # -- runtimes ----------------------------------------------------------------------------

    def start_runtime(self, name: str = "a") -> Child:
        """Start (or start again) a runtime; `wait_healthy` says when it serves."""
        runtime = self.runtimes[name]
        if runtime.child is not None and runtime.child.alive():
            raise StartError(f"runtime {name} is already running")
        runtime.incarnation += 1
        log = self.log_dir / f"runtime-{name}{runtime.incarnation}.log"
        runtime.logs.append(log)
        command = services.runtime_command(
            port=runtime.port,
            state_dir=self.workdir / "devhost",
            module=self.runtime_module,
            extra=self.runtime_extra,
        )
        env = {**self.settings(name), **self.runtime_env}
        runtime.child = Child(f"runtime {self.instance_id(name)}", command, log, env=env)
        return runtime.child.start()

    async def wait_healthy(
        self, session: aiohttp.ClientSession, name: str = "a", timeout: float = HEALTH_TIMEOUT
    ) -> float:
        """Seconds until /api/health answered 200; StartError if the runtime died.

        A free port is only free when it is picked: another process may bind it before
        the runtime does (at its first start, or while it was down after a kill). A
        runtime that died for that reason gets another free port and starts again."""
        runtime = self.runtimes[name]
        for attempt in range(PORT_TRIES):
            child = runtime.child
            if child is None:
                raise StartError(f"runtime {name} is not started")
            try:
                return await self.app(session, name).wait_healthy(timeout, child)
            except StartError:
                if child.alive() or PORT_TAKEN not in child.output(since_start=True):
                    raise
                if attempt == PORT_TRIES - 1:
                    raise
                runtime.port = free_port()
                runtime.child = None
                self.start_runtime(name)
        raise AssertionError("unreachable")

    async def start_runtimes(self, session: aiohttp.ClientSession) -> None:
        for name in self.runtimes:
            self.start_runtime(name)
        for name in self.runtimes:
            await self.wait_healthy(session, name)

    def kill_runtime(self, name: str = "a") -> tuple[str, int]:
        """`kill -9` the runtime; the instance id and pid that died."""
        child = self.runtimes[name].child
        if child is None or not child.alive():
            raise StartError(f"runtime {name} is not running")
        instance, pid = self.instance_id(name), child.pid
        child.kill()
        self.runtimes[name].child = None
        return instance, pid

    def stop_runtime(self, name: str = "a", timeout: float = 10.0) -> None:
        child = self.runtimes[name].child
        if child is not None:
            child.stop(timeout)
            self.runtimes[name].child = None

    def runtime_alive(self, name: str = "a") -> bool:
        child = self.runtimes[name].child
        return child is not None and child.alive()

    async def fresh_table(self) -> float:
        """Move every running runtime to a new, empty table; seconds until all are
        healthy again. Azurite scans a table per query, so a run on a table grown by
        the previous run would be slower for that reason alone."""
        running = [name for name in self.runtimes if self.runtime_alive(name)]
        self.table_name = _table_name(self.name)
        for name in running:
            self.stop_runtime(name)
            self.start_runtime(name)
        begun = time.monotonic()
        async with aiohttp.ClientSession() as session:
            for name in running:
                await self.wait_healthy(session, name)
        return time.monotonic() - begun

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Runtimes first, then the services newest first."""
        try:
            for name in self.runtimes:
                self.stop_runtime(name)
        finally:
            while self.services:
                _, child = self.services.popitem()
                child.stop()

    def __enter__(self) -> Stack:
        try:
            self.start_services()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Stack:
        self._catch_termination()
        try:
            self.start_services()
            async with aiohttp.ClientSession() as session:
                await self.start_runtimes(session)
        except BaseException:
            self.stop()
            self._restore_handlers()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            self._restore_handlers()

    def _catch_termination(self) -> None:
        """SIGTERM and SIGHUP unwind like Ctrl-C, so the children are stopped too."""
        for signum in (signal.SIGTERM, signal.SIGHUP):
            try:
                self._previous_handlers[signum] = signal.signal(signum, _interrupt)
            except ValueError:  # not the main thread: leave the handlers alone
                return

    def _restore_handlers(self) -> None:
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)
        self._previous_handlers.clear()


def azurite_child(
    table_port: int, workdir: Path, log: Path, *, location: Path | None = None
) -> Child:
    """Azurite's table service on `table_port` (not started yet): in memory, or with
    `location` on disk with the durable preload, as `python -m devhost` runs it; a
    StartError with the setup hint when node_modules has no Azurite."""
    command = services.azurite_command(table_port=table_port, location=location)
    if not Path(command[0]).exists():
        raise StartError(services.azurite_missing(Path(command[0])))
    return Child(
        "azurite",
        command,
        log,
        env=services.azurite_env(location=location),
        cwd=workdir,
        closed_marker=services.AZURITE_CLOSED,
    )


@contextlib.contextmanager
def lone_azurite_blob(prefix: str = "azurite-blob-") -> Iterator[int]:
    """A fresh Azurite blob service on a free port (the order archive's tests), in
    memory; yields its port, stops it and removes its directory after."""
    port = free_port()
    command = services.azurite_blob_command(blob_port=port)
    if not Path(command[0]).exists():
        raise StartError(services.azurite_missing(Path(command[0])))
    with tempfile.TemporaryDirectory(prefix=prefix) as workdir:
        log = Path(workdir) / "azurite-blob.log"
        child = Child(
            "azurite-blob", command, log, cwd=Path(workdir), closed_marker=services.AZURITE_CLOSED
        ).start()
        try:
            child.wait_ready(ports=[port], timeout=STARTUP_TIMEOUT)
            yield port
        finally:
            child.stop()


@contextlib.contextmanager
def lone_azurite(prefix: str = "azurite-") -> Iterator[int]:
    """A fresh Azurite table service on a free port, for the test fixtures and the
    in-process benchmarks; yields its port, stops it and removes its directory after."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix=prefix) as workdir:
        child = azurite_child(port, Path(workdir), Path(workdir) / "azurite.log").start()
        try:
            child.wait_ready(ports=[port], timeout=STARTUP_TIMEOUT)
            yield port
        finally:
            child.stop()


def timing_settings(
    *, step_timeout: float, pending_timeout: float, supervisor_period: int, max_failure_count: int
) -> dict[str, str]:
    """The runtime's timing settings for a measured or chaos run: a sweep every
    `supervisor_period` s, and an order out of failures held in Error (not compensated),
    so the bounds of recovery follow from these numbers alone."""
    return {
        Setting.STEP_TIMEOUT_SECONDS: str(step_timeout),
        Setting.PENDING_TIMEOUT_SECONDS: str(pending_timeout),
        Setting.SUPERVISOR_SCHEDULE: f"*/{supervisor_period} * * * * *",
        Setting.MAX_FAILURE_COUNT: str(max_failure_count),
        Setting.EXHAUSTED_POLICY: "hold",
    }


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _table_name(name: str) -> str:
    """A fresh table per stack (and per `fresh_table`): letters and digits, letter first."""
    prefix = re.sub(r"[^A-Za-z0-9]", "", name)[:40] or "stack"
    if not prefix[0].isalpha():
        prefix = f"t{prefix}"
    return f"{prefix}{uuid.uuid4().hex[:10]}"
