"""The system under test as separate processes on free loopback ports.

Azurite (table service only), the local broker, the simulator and the local runtime each
run as their own process, as they do under ``python -m devhost``; that way the CPU each
one takes can be read from the OS, and the broker's reactor thread does not share a GIL
with the runtime. Every child leads its own session and is killed (group-wide) on exit,
also on Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

import aiohttp

from bench._common import LOOPBACK, RESULTS, ROOT, free_port
from shared.contract import Queue, Setting
from shared.domain.workflow import AGENTS
from shared.settings import azurite_connection_string

AZURITE_TABLE = ROOT / "node_modules" / ".bin" / "azurite-table"
STARTUP_TIMEOUT = 60.0


class StackError(RuntimeError):
    """A service did not come up; the message carries the tail of its log."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class Child:
    name: str
    command: Sequence[str]
    log_path: Path
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path = ROOT
    process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} not started"
        return self.process.pid

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(
                list(self.command),
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise StackError(
                f"{self.name} exited with {self.process.returncode} "
                f"(log {self.log_path}):\n{_tail(self.log_path)}"
            )

    def signal(self, signum: signal.Signals) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def stop(self, timeout: float = 10.0) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                process.wait(5)
        self.process = None

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing gets to clean up."""
        process = self.process
        if process is None:
            return
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        self.process = None


def wait_for_port(child: Child, port: int, timeout: float = STARTUP_TIMEOUT) -> None:
    import socket  # noqa: PLC0415 - only here

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        child.check()
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.2):
            return
        time.sleep(0.1)
    raise StackError(f"{child.name} did not listen on {port} within {timeout:.0f} s")


async def wait_healthy(
    url: str, child: Child | None = None, timeout: float = STARTUP_TIMEOUT
) -> float:
    """Wait for a 200 from ``url``; returns the seconds it took."""
    started = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - started < timeout:
            if child is not None:
                child.check()
            with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as r:
                    if r.status == 200:
                        return time.monotonic() - started
            await asyncio.sleep(0.1)
    raise StackError(f"{url} did not answer 200 within {timeout:.0f} s")


@dataclass(frozen=True)
class Timings:
    """The runtime's timing settings; the bounds of recovery follow from them."""

    step_timeout: float = 30.0
    pending_timeout: float = 60.0
    supervisor_period: int = 5
    max_failure_count: int = 3

    @property
    def schedule(self) -> str:
        return f"*/{self.supervisor_period} * * * * *"


class Stack:
    """Azurite, broker, simulator and the runtime; ``with Stack(...) as s`` starts them."""

    def __init__(
        self,
        name: str,
        *,
        timings: Timings = Timings(),
        broker_db: bool = True,
        broker_lock_seconds: float | None = None,
        seed: int = 7,
        runtime_env: Mapping[str, str] | None = None,
        start_runtime: bool = True,
        instrument: bool = False,
    ) -> None:
        self.name = name
        self.timings = timings
        self.run_dir = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        self.table_port = free_port()
        self.broker_port = free_port()
        self.control_port = free_port()
        self.simulator_port = free_port()
        self.http_port = free_port()
        self.table_name = f"bench{uuid.uuid4().hex[:10]}"
        self.children: dict[str, Child] = {}
        self._start_runtime = start_runtime
        self._runtime_env = dict(runtime_env or {})
        self.instrument = instrument
        self.stats_file = self.run_dir / "runtime-stats.json"
        logs = self.run_dir / "logs"
        self.azurite = Child(
            "azurite",
            azurite_command(self.table_port),
            logs / "azurite.log",
            cwd=self.work,
        )
        broker_cmd = [
            sys.executable,
            "-m",
            "devhost.broker",
            "--port",
            str(self.broker_port),
            "--control-port",
            str(self.control_port),
            "--log-level",
            "WARNING",
        ]
        if broker_db:
            broker_cmd += ["--db", str(self.work / "broker.sqlite3")]
        if broker_lock_seconds is not None:
            broker_cmd += ["--lock-seconds", str(broker_lock_seconds)]
        self.broker = Child("broker", broker_cmd, logs / "broker.log")
        self.simulator = Child(
            "simulator",
            [
                sys.executable,
                "-m",
                "devhost.simulator",
                "--port",
                str(self.simulator_port),
                "--seed",
                str(seed),
                "--log-level",
                "WARNING",
            ],
            logs / "simulator.log",
        )
        entry = (
            ["bench.instrumented_runtime", "--stats-file", str(self.stats_file)]
            if instrument
            else ["devhost"]
        )
        self.runtime = Child(
            "runtime",
            [
                sys.executable,
                "-m",
                *entry,
                "--no-services",
                "--port",
                str(self.http_port),
                "--state-dir",
                str(self.work / "devhost"),
            ],
            logs / "runtime.log",
            env={**self.settings(), **self._runtime_env},
        )
        self._previous_handlers: dict[int, Any] = {}

    # -- addresses ------------------------------------------------------------------------

    @property
    def connection_string(self) -> str:
        return (
            f"Endpoint=sb://{LOOPBACK}:{self.broker_port};"
            "SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )

    @property
    def storage_connection_string(self) -> str:
        return azurite_connection_string(self.table_port)

    @property
    def simulator_url(self) -> str:
        return f"http://{LOOPBACK}:{self.simulator_port}"

    @property
    def broker_control_url(self) -> str:
        return f"http://{LOOPBACK}:{self.control_port}"

    @property
    def api(self) -> str:
        return f"http://{LOOPBACK}:{self.http_port}/api"

    def settings(self) -> dict[str, str]:
        t = self.timings
        return {
            Setting.STORAGE: self.storage_connection_string,
            Setting.SERVICE_BUS: self.connection_string,
            Setting.STATE_TABLE: self.table_name,
            Setting.SUPERVISOR_SCHEDULE: t.schedule,
            Setting.STEP_TIMEOUT_SECONDS: str(t.step_timeout),
            Setting.PENDING_TIMEOUT_SECONDS: str(t.pending_timeout),
            Setting.MAX_FAILURE_COUNT: str(t.max_failure_count),
            Setting.EXHAUSTED_POLICY: "hold",
            Setting.REPLY_TO_ALLOW_LIST: Queue.ORDER_STATUS,
            **{
                spec.service_url_setting: f"{self.simulator_url}/{name.value}"
                for name, spec in AGENTS.items()
            },
            Setting.INSTANCE_ID: f"bench-{self.name}",
        }

    def describe(self) -> str:
        """One line for the console: where each part listens and where the logs go."""
        return (
            f"stack up: Azurite :{self.table_port}, broker :{self.broker_port}, "
            f"simulator :{self.simulator_port}, runtime :{self.http_port}; "
            f"logs in {self.run_dir}"
        )

    def pids(self) -> dict[str, int]:
        return {name: child.pid for name, child in self.children.items() if child.alive()}

    # -- lifecycle ------------------------------------------------------------------------

    def start_services(self) -> None:
        for child, port in (
            (self.azurite, self.table_port),
            (self.broker, self.broker_port),
            (self.simulator, self.simulator_port),
        ):
            child.start()
            self.children[child.name] = child
            wait_for_port(child, port)

    async def start_runtime(self) -> float:
        """Start (or restart) the runtime; returns the seconds until /api/health said 200."""
        self.runtime.start()
        self.children["runtime"] = self.runtime
        return await wait_healthy(f"{self.api}/health", self.runtime)

    async def runtime_stats(self, *, reset: bool = False) -> dict[str, Any]:
        """The instrumented runtime's counters (SIGUSR1 writes them; SIGUSR2 also resets)."""
        if not self.instrument:
            raise StackError("the runtime is not instrumented (Stack(instrument=True))")
        before = self.stats_file.stat().st_mtime_ns if self.stats_file.exists() else 0
        if not self.runtime.alive():
            raise StackError("the runtime is not running")
        os.kill(self.runtime.pid, signal.SIGUSR2 if reset else signal.SIGUSR1)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if self.stats_file.exists() and self.stats_file.stat().st_mtime_ns != before:
                with contextlib.suppress(ValueError):
                    data: dict[str, Any] = json.loads(self.stats_file.read_text())
                    return data
        raise StackError(f"the runtime did not write {self.stats_file}")

    async def fresh_table(self) -> float:
        """Restart the runtime on a new, empty table (Azurite scans a table per query, so
        a run on a table grown by the previous run would be slower for that reason)."""
        self.table_name = f"bench{uuid.uuid4().hex[:10]}"
        self.runtime.stop()
        self.runtime.env = {**self.settings(), **self._runtime_env}
        return await self.start_runtime()

    def stop(self) -> None:
        for child in reversed(list(self.children.values())):
            child.stop()
        self.children.clear()
        shutil.rmtree(self.work, ignore_errors=True)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    async def __aenter__(self) -> Stack:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._previous_handlers[signum] = signal.signal(signum, self._on_signal)
        try:
            self.start_services()
            if self._start_runtime:
                await self.start_runtime()
        except BaseException:
            self.stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        for signum, handler in self._previous_handlers.items():
            signal.signal(signum, handler)


def azurite_command(port: int) -> list[str]:
    """Azurite's table service, in memory, on one loopback port."""
    return [
        str(AZURITE_TABLE),
        "--silent",
        "--skipApiVersionCheck",
        "--loose",
        "--inMemoryPersistence",
        "--tableHost",
        LOOPBACK,
        "--tablePort",
        str(port),
    ]


@contextlib.contextmanager
def azurite_only(name: str) -> Iterator[tuple[Child, int]]:
    """A fresh in-memory Azurite table service, for the in-process benchmarks."""
    work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    port = free_port()
    child = Child(
        "azurite",
        azurite_command(port),
        work / "azurite.log",
        cwd=work,
    )
    if not AZURITE_TABLE.exists():
        raise StackError(f"{AZURITE_TABLE} is missing: run bin/setup (npm ci) first")
    child.start()
    try:
        wait_for_port(child, port)
        yield child, port
    finally:
        child.stop()
        shutil.rmtree(work, ignore_errors=True)


async def put_json(session: aiohttp.ClientSession, url: str, body: Any) -> None:
    async with session.put(url, json=body) as r:
        if r.status >= 300:
            raise StackError(f"PUT {url}: {r.status} {await r.text()}")


async def get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as r:
        if r.status >= 300:
            raise StackError(f"GET {url}: {r.status} {await r.text()}")
        return await r.json()


async def set_faults(
    session: aiohttp.ClientSession,
    simulator_url: str,
    transient_rate: float,
    latency_ms: int,
    jitter_ms: int = 0,
    **extra: Any,
) -> None:
    """The same faults at all three services (what the peer sees too)."""
    for service in ("inventory", "payment", "shipping"):
        await put_json(
            session,
            f"{simulator_url}/_sim/faults/{service}",
            {
                "transientErrorRate": transient_rate,
                "latencyMs": latency_ms,
                "latencyJitterMs": jitter_ms,
                **extra,
            },
        )
