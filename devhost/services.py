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
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from devhost.harness import services as commands
from devhost.harness.ports import LOOPBACK, port_open
from devhost.harness.process import Child, StartError
from shared.catalogue import catalogue_file, load
from shared.catalogue.derive import service_url_settings
from shared.contract import Setting

log = logging.getLogger("devhost.services")

AZURITE_PORTS = {"blob": 10000, "queue": 10001, "table": 10002}
BROKER_DEFAULT_PORT = 5672
BROKER_CONTROL_PORT = 7073
SIMULATOR_DEFAULT_PORT = 7072
OTLP_DEFAULT_PORT = 4318
SERVICE_URL_SETTINGS = service_url_settings(load(catalogue_file()))
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
LOG_LEVEL = "INFO"
"""The services log their lifecycle under .devhost/logs for the developer to read."""


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
    """A regex on the service's output; the open ports are the fallback."""
    missing_hint: str | None = None
    startup_timeout: float = 30.0
    env: Mapping[str, str] = field(default_factory=dict)
    closed_marker: str | None = None
    closed_count: int = 1


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


def otlp_port(settings: Mapping[str, str]) -> int | None:
    """Port of the local receiver if the OTLP endpoint points at this machine."""
    url = urlparse(settings.get(commands.OTLP_ENDPOINT, ""))
    if url.hostname in _LOCAL_HOSTS:
        return url.port or OTLP_DEFAULT_PORT
    return None


def telemetry_settings(
    values: Mapping[str, str], environ: Mapping[str, str], port: int = OTLP_DEFAULT_PORT
) -> dict[str, str]:
    """The telemetry settings of a local run: the user's where set (in the settings file
    or the environment), else every span to the local receiver on ``port``, all sampled,
    and the operator page reading them back from it."""

    def given(name: str) -> str:
        return (values.get(name) or environ.get(name) or "").strip()

    chosen = {
        commands.OTLP_ENDPOINT: given(commands.OTLP_ENDPOINT) or f"http://{LOOPBACK}:{port}",
        commands.OTLP_SAMPLER: given(commands.OTLP_SAMPLER) or commands.ALWAYS_ON,
    }
    receiver = otlp_port(chosen)
    query = given(Setting.TRACE_QUERY_URL)
    if query or receiver is not None:
        chosen[Setting.TRACE_QUERY_URL] = query or commands.trace_query_url(receiver or port)
    return chosen


def plan(
    settings: Mapping[str, str], root: Path, state_dir: Path, python: str = sys.executable
) -> list[ServiceSpec]:
    """Decide from the settings alone which local services the app will talk to."""
    specs: list[ServiceSpec] = []
    if settings.get(Setting.STORAGE, "").strip().lower() == "usedevelopmentstorage=true":
        specs.append(_azurite(root, state_dir))
    amqp_port = broker_port(settings.get(Setting.SERVICE_BUS, ""))
    if amqp_port is not None:
        command = commands.broker_command(
            port=amqp_port,
            control_port=BROKER_CONTROL_PORT,
            db=state_dir / "broker.sqlite3",
            log_level=LOG_LEVEL,
            python=python,
        )
        control = f"http://{LOOPBACK}:{BROKER_CONTROL_PORT}"
        specs.append(
            ServiceSpec(
                name="broker",
                command=tuple(command),
                ports=(amqp_port,),
                endpoint=f"amqp://{LOOPBACK}:{amqp_port} (control {control})",
                ready_line=commands.BROKER_READY,
            )
        )
    http_port = simulator_port(settings)
    if http_port is not None:
        command = commands.simulator_command(
            port=http_port,
            seed=None,
            db=state_dir / "simulator.sqlite3",
            log_level=LOG_LEVEL,
            python=python,
        )
        specs.append(
            ServiceSpec(
                name="simulator",
                command=tuple(command),
                ports=(http_port,),
                endpoint=f"http://{LOOPBACK}:{http_port}",
                ready_line=commands.SIMULATOR_READY,
            )
        )
    receiver_port = otlp_port(settings)
    if receiver_port is not None:
        command = commands.otlp_command(
            port=receiver_port, db=state_dir / "traces.sqlite", log_level=LOG_LEVEL, python=python
        )
        specs.append(
            ServiceSpec(
                name="otlp",
                command=tuple(command),
                ports=(receiver_port,),
                endpoint=f"http://{LOOPBACK}:{receiver_port} (traces: /api/traces/{{traceId}})",
                ready_line=commands.OTLP_READY,
            )
        )
    return specs


def _azurite(root: Path, state_dir: Path) -> ServiceSpec:
    bin_dir = root / "node_modules" / ".bin"
    location = state_dir / "azurite"
    command = commands.azurite_command(
        table_port=AZURITE_PORTS["table"],
        blob_port=AZURITE_PORTS["blob"],
        queue_port=AZURITE_PORTS["queue"],
        location=location,
        bin_dir=bin_dir,
    )
    return ServiceSpec(
        name="azurite",
        command=tuple(command),
        ports=tuple(AZURITE_PORTS.values()),
        endpoint=", ".join(f"{k} {LOOPBACK}:{p}" for k, p in AZURITE_PORTS.items()),
        missing_hint=commands.azurite_missing(Path(command[0]), root),
        env=commands.azurite_env(location=location),
        # Azurite closes all three services on SIGTERM but node never exits.
        closed_marker=commands.AZURITE_CLOSED,
        closed_count=len(AZURITE_PORTS),
    )


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
        self._reported: set[str] = set()

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
        child = Child(
            spec.name,
            spec.command,
            self.state_dir / "logs" / f"{spec.name}.log",
            env=spec.env,
            cwd=self.root,
            closed_marker=spec.closed_marker,
            closed_count=spec.closed_count,
            append=False,
        )
        self.children.append(child.start())
        try:
            child.wait_ready(line=spec.ready_line, ports=spec.ports, timeout=spec.startup_timeout)
        except StartError as exc:
            self._reported.add(child.name)
            child.stop(timeout=2.0)
            raise ServiceStartError(str(exc)) from None
        self.endpoints.append(Endpoint(spec.name, spec.endpoint, "started"))
        log.info("%s started on %s (pid %d)", spec.name, spec.endpoint, child.pid)

    def check(self) -> None:
        """Report (once) a child that died while the host is running."""
        for child in self.children:
            if child.alive() or child.name in self._reported:
                continue
            self._reported.add(child.name)
            log.error(
                "%s exited unexpectedly with code %s (log %s):\n%s",
                child.name,
                child.returncode,
                child.log_path,
                child.tail(20),
            )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop what we started, newest first; services found running are not ours."""
        while self.children:
            child = self.children.pop()
            if child.alive():
                child.stop(timeout)
                log.info("%s stopped", child.name)


# What devhost itself keeps in the state folder. ``--fresh`` removes only these, so a
# mistaken ``--state-dir ~`` cannot wipe a home folder and files other tools keep
# there (the demo's log) survive.
STATE_ENTRIES = ("azurite", "broker.sqlite3*", "simulator.sqlite3*", "traces.sqlite*", "logs")


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
