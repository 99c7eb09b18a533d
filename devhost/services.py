"""Start the emulators the settings point at, unless something already answers.

Core Tools leaves Azurite and the Service Bus emulator to the developer; here the
runtime starts them itself because neither Docker nor Core Tools is available. A
service that already answers on its port (another devhost, a test fixture, a
developer's own Azurite) is used as is and never stopped by us. Children run in
their own session so a terminal Ctrl-C reaches only devhost, which drains in-flight
messages through the broker before stopping it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from shared.contract import Setting
from shared.domain.workflow import AGENTS

log = logging.getLogger("devhost.services")

LOOPBACK = "127.0.0.1"
AZURITE_PORTS = {"blob": 10000, "queue": 10001, "table": 10002}
BROKER_DEFAULT_PORT = 5672
BROKER_CONTROL_PORT = 7073
SIMULATOR_DEFAULT_PORT = 7072
SERVICE_URL_SETTINGS = tuple(spec.service_url_setting for spec in AGENTS.values())
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class ServiceStartError(Exception):
    """A service we had to start did not come up."""


@dataclass(frozen=True)
class ServiceSpec:
    """How to start one service and how to tell that it is up."""

    name: str
    command: tuple[str, ...]
    ports: tuple[int, ...]
    endpoint: str
    ready_line: str | None = None
    missing_hint: str | None = None
    startup_timeout: float = 30.0
    env: Mapping[str, str] = field(default_factory=dict)
    # Output that proves a clean shutdown finished, for processes that then linger.
    closed_marker: str | None = None
    closed_count: int = 1


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.25) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _connection_fields(connection_string: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for part in connection_string.split(";"):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip().lower()] = value.strip()
    return fields


def broker_port(connection_string: str) -> int | None:
    """Port of the local broker if the connection string targets the emulator."""
    fields = _connection_fields(connection_string)
    if fields.get("usedevelopmentemulator", "").lower() != "true":
        return None
    endpoint = urlparse(fields.get("endpoint", ""))
    return endpoint.port or BROKER_DEFAULT_PORT


def simulator_port(settings: Mapping[str, str]) -> int | None:
    """Port of the simulator if any remote-service URL points at this machine."""
    for name in SERVICE_URL_SETTINGS:
        url = urlparse(settings.get(name, ""))
        if url.hostname in _LOCAL_HOSTS:
            return url.port or SIMULATOR_DEFAULT_PORT
    return None


def plan(
    settings: Mapping[str, str], root: Path, state_dir: Path, python: str = sys.executable
) -> list[ServiceSpec]:
    """Decide from the settings alone which local services the app will talk to."""
    specs: list[ServiceSpec] = []
    if settings.get(Setting.STORAGE, "").strip().lower() == "usedevelopmentstorage=true":
        azurite = root / "node_modules" / ".bin" / "azurite"
        command = [
            str(azurite),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            "--location",
            str(state_dir / "azurite"),
        ]
        for kind, port in AZURITE_PORTS.items():
            command += [f"--{kind}Host", LOOPBACK, f"--{kind}Port", str(port)]
        specs.append(
            ServiceSpec(
                name="azurite",
                command=tuple(command),
                ports=tuple(AZURITE_PORTS.values()),
                endpoint=", ".join(f"{k} {LOOPBACK}:{p}" for k, p in AZURITE_PORTS.items()),
                missing_hint=f"{azurite} not found: run npm ci in {root}",
                # Azurite closes all three services on SIGTERM but node never exits.
                closed_marker="successfully closed",
                closed_count=len(AZURITE_PORTS),
            )
        )
    amqp_port = broker_port(settings.get(Setting.SERVICE_BUS, ""))
    if amqp_port is not None:
        db = str(state_dir / "broker.sqlite3")
        specs.append(
            ServiceSpec(
                name="broker",
                command=(
                    *(python, "-m", "devhost.broker", "--port", str(amqp_port), "--db", db),
                    *("--control-port", str(BROKER_CONTROL_PORT)),
                ),
                ports=(amqp_port,),
                endpoint=f"amqp://{LOOPBACK}:{amqp_port} (control http://{LOOPBACK}:{BROKER_CONTROL_PORT})",
                ready_line="broker listening on",
            )
        )
    http_port = simulator_port(settings)
    if http_port is not None:
        db = str(state_dir / "simulator.sqlite3")
        specs.append(
            ServiceSpec(
                name="simulator",
                command=(python, "-m", "devhost.simulator", "--port", str(http_port), "--db", db),
                ports=(http_port,),
                endpoint=f"http://{LOOPBACK}:{http_port}",
                ready_line="simulator listening on",
            )
        )
    return specs


@dataclass
class Child:
    """A process we started and therefore must stop."""

    spec: ServiceSpec
    process: subprocess.Popen[bytes]
    log_path: Path
    reported_exit: bool = False

    def output(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def closed_cleanly(self) -> bool:
        marker = self.spec.closed_marker
        return marker is not None and self.output().count(marker) >= self.spec.closed_count

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"(no output: {exc})"
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"


@dataclass(frozen=True)
class Endpoint:
    name: str
    endpoint: str
    status: str


class Services:
    """The services of one devhost run: those we started and those we found running."""

    def __init__(self, root: Path, state_dir: Path) -> None:
        self.root = root
        self.state_dir = state_dir
        self.children: list[Child] = []
        self.endpoints: list[Endpoint] = []

    def ensure_all(self, specs: Sequence[ServiceSpec]) -> None:
        for spec in specs:
            self.ensure(spec)

    def ensure(self, spec: ServiceSpec) -> None:
        answering = [port for port in spec.ports if port_open(port)]
        if answering:
            if len(answering) < len(spec.ports):
                log.warning("%s: only ports %s answer; using what is there", spec.name, answering)
            self.endpoints.append(Endpoint(spec.name, spec.endpoint, "already running"))
            log.info("%s already running on %s: leaving it alone", spec.name, spec.endpoint)
            return
        executable = Path(spec.command[0])
        if executable.is_absolute() and not executable.exists():
            raise ServiceStartError(spec.missing_hint or f"{executable} not found")
        child = self._spawn(spec)
        self.children.append(child)
        self._wait_ready(child)
        self.endpoints.append(Endpoint(spec.name, spec.endpoint, "started"))
        log.info("%s started on %s (pid %d)", spec.name, spec.endpoint, child.process.pid)

    def _spawn(self, spec: ServiceSpec) -> Child:
        logs = self.state_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{spec.name}.log"
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.root), env.get("PYTHONPATH")]))
        env.update(spec.env)
        with log_path.open("wb") as output:
            process = subprocess.Popen(
                spec.command,
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return Child(spec, process, log_path)

    def _wait_ready(self, child: Child) -> None:
        spec = child.spec
        deadline = time.monotonic() + spec.startup_timeout
        while time.monotonic() < deadline:
            code = child.process.poll()
            if code is not None:
                child.reported_exit = True
                raise ServiceStartError(
                    f"{spec.name} exited with code {code} during startup "
                    f"(log {child.log_path}):\n{child.tail()}"
                )
            if self._is_ready(child):
                return
            time.sleep(0.1)
        self._terminate(child, timeout=2.0)
        raise ServiceStartError(
            f"{spec.name} did not become ready within {spec.startup_timeout:.0f} s "
            f"(log {child.log_path}):\n{child.tail()}"
        )

    @staticmethod
    def _is_ready(child: Child) -> bool:
        # The ready line is the precise signal; open ports are the fallback so a
        # reworded banner cannot make startup hang until the timeout.
        if child.spec.ready_line is not None and child.spec.ready_line in child.output():
            return True
        return all(port_open(port) for port in child.spec.ports)

    def check(self) -> None:
        """Report (once) a child that died while the host is running."""
        for child in self.children:
            code = child.process.poll()
            if code is not None and not child.reported_exit:
                child.reported_exit = True
                log.error(
                    "%s exited unexpectedly with code %d (log %s):\n%s",
                    child.spec.name,
                    code,
                    child.log_path,
                    child.tail(),
                )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop what we started, newest first; services found running are not ours."""
        while self.children:
            child = self.children.pop()
            self._terminate(child, timeout)

    @staticmethod
    def _terminate(child: Child, timeout: float) -> None:
        process = child.process
        if process.poll() is not None:
            return
        _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                log.info("%s stopped", child.spec.name)
                return
            if child.closed_cleanly():
                _signal_group(process, signal.SIGKILL)
                process.wait()
                log.info("%s stopped", child.spec.name)
                return
            time.sleep(0.05)
        log.warning("%s did not stop within %.0f s: killing it", child.spec.name, timeout)
        _signal_group(process, signal.SIGKILL)
        process.wait()


def _signal_group(process: subprocess.Popen[bytes], signum: signal.Signals) -> None:
    # The child leads its own session, so signalling the group also reaches anything
    # it spawned (Azurite's node workers).
    try:
        os.killpg(process.pid, signum)
    except ProcessLookupError:
        return
    except PermissionError as exc:
        log.warning("cannot signal process group %d (%s); signalling the child", process.pid, exc)
        process.send_signal(signum)


# What devhost itself keeps in the state folder. ``--fresh`` removes only these, so a
# mistaken ``--state-dir ~`` cannot wipe a home folder and files other tools keep
# there (the demo's log) survive.
STATE_ENTRIES = ("azurite", "broker.sqlite3*", "simulator.sqlite3*", "logs")


def wipe_state(state_dir: Path) -> None:
    """``--fresh``: forget every emulator's data from previous runs."""
    removed: list[str] = []
    for pattern in STATE_ENTRIES:
        for path in sorted(state_dir.glob(pattern)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            removed.append(path.name)
    if removed:
        log.info("--fresh: removed %s from %s", ", ".join(removed), state_dir)
