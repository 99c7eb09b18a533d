"""How each service of the system is started, and how it says it is up.

One command builder per service, used by every starter (`python -m devhost`, the test
fixtures, chaos and bench), so a new flag or a renamed binary changes in one place.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from pathlib import Path

from devhost.harness.ports import LOOPBACK
from devhost.harness.process import ROOT
from shared.contract import Setting

NODE_BIN = ROOT / "node_modules" / ".bin"
AZURITE = NODE_BIN / "azurite"
AZURITE_TABLE = NODE_BIN / "azurite-table"
AZURITE_MISSING = "{binary} not found: run npm ci in {root} (bin/setup does it)"
AZURITE_CLOSED = "successfully closed"
"""Azurite prints this once per service on SIGTERM, and then its node process lingers."""
AZURITE_DURABLE = Path(__file__).with_name("azurite_durable.cjs")
"""Preloaded into an Azurite that keeps its data on disk: a table write is answered only
once it is in a journal on disk, so a `kill -9` of Azurite loses no write it acknowledged
(see the file)."""

_HOST = re.escape(LOOPBACK)
BROKER_READY = rf"broker listening on amqp://{_HOST}:(\d+) \(control http://{_HOST}:(\d+)\)"
"""Groups: the AMQP port and the control port (both bound, also when 0 was asked)."""
SIMULATOR_READY = rf"simulator listening on http://{_HOST}:(\d+)"
RUNTIME_READY = rf"devhost listening on http://{_HOST}:(\d+)"
OTLP_READY = rf"otlp receiver listening on http://{_HOST}:(\d+)"
OTLP_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
OTLP_SAMPLER = "OTEL_TRACES_SAMPLER"
ALWAYS_ON = "always_on"
"""Locally every trace is kept: a developer looks at one order, not at a sample."""


def azurite_missing(binary: Path, root: Path = ROOT) -> str:
    return AZURITE_MISSING.format(binary=binary, root=root)


def azurite_command(
    *,
    table_port: int,
    blob_port: int | None = None,
    queue_port: int | None = None,
    location: Path | None = None,
    bin_dir: Path = NODE_BIN,
) -> list[str]:
    """Azurite on loopback: in memory unless `location` is given; the table-only binary
    when only a table port is asked for (it starts faster and takes less memory)."""
    ports = {"blob": blob_port, "queue": queue_port, "table": table_port}
    only_table = blob_port is None and queue_port is None
    binary = bin_dir / ("azurite-table" if only_table else "azurite")
    command = [str(binary), "--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"]
    command += ["--inMemoryPersistence"] if location is None else ["--location", str(location)]
    for kind, port in ports.items():
        if port is not None:
            command += [f"--{kind}Host", LOOPBACK, f"--{kind}Port", str(port)]
    return command


def azurite_blob_command(*, blob_port: int, bin_dir: Path = NODE_BIN) -> list[str]:
    """Azurite's blob service alone, in memory: beside a table-only Azurite where a test
    needs the order archive's blobs."""
    return [
        str(bin_dir / "azurite-blob"),
        *("--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry"),
        "--inMemoryPersistence",
        *("--blobHost", LOOPBACK, "--blobPort", str(blob_port)),
    ]


def azurite_env(*, location: Path | None) -> dict[str, str]:
    """The environment `azurite_command` needs beside the inherited one: with `location`,
    the preload that makes the table service journal each write before answering it."""
    if location is None:
        return {}
    return {"NODE_OPTIONS": f'--require "{AZURITE_DURABLE}"'}


def broker_command(
    *,
    port: int,
    control_port: int,
    db: Path | None,
    lock_seconds: float | None = None,
    log_level: str = "WARNING",
    python: str = sys.executable,
) -> list[str]:
    """The local Service Bus broker; `db=None` keeps messages in memory. A control port
    of 0 would switch the control API off, so callers pass a free port."""
    command = [python, "-m", "devhost.broker", "--port", str(port)]
    command += ["--control-port", str(control_port)]
    if db is not None:
        command += ["--db", str(db)]
    if lock_seconds is not None:
        command += ["--lock-seconds", str(lock_seconds)]
    return [*command, "--log-level", log_level]


def simulator_command(
    *,
    port: int,
    seed: int | None,
    db: Path | None = None,
    log_level: str = "WARNING",
    python: str = sys.executable,
) -> list[str]:
    """The remote-service simulator; port 0 picks a free one (read it from the ready line)."""
    command = [python, "-m", "devhost.simulator", "--port", str(port)]
    if db is not None:
        command += ["--db", str(db)]
    if seed is not None:
        command += ["--seed", str(seed)]
    return [*command, "--log-level", log_level]


def otlp_command(
    *, port: int, db: Path | None, log_level: str = "WARNING", python: str = sys.executable
) -> list[str]:
    """The local OTLP receiver; port 0 picks a free one (read it from the ready line)."""
    command = [python, "-m", "devhost.otlp", "--port", str(port)]
    if db is not None:
        command += ["--db", str(db)]
    return [*command, "--log-level", log_level]


def telemetry_env(otlp_port: int) -> dict[str, str]:
    """What a runtime needs to send every span to the receiver on ``otlp_port`` and to
    let its operator page read them back."""
    return {
        OTLP_ENDPOINT: f"http://{LOOPBACK}:{otlp_port}",
        OTLP_SAMPLER: ALWAYS_ON,
        Setting.TRACE_QUERY_URL: trace_query_url(otlp_port),
    }


def trace_query_url(otlp_port: int) -> str:
    return f"http://{LOOPBACK}:{otlp_port}/api/traces"


def runtime_command(
    *,
    port: int,
    state_dir: Path,
    module: str = "devhost",
    extra: Sequence[str] = (),
    python: str = sys.executable,
) -> list[str]:
    """A local Functions runtime that starts no services: the caller runs them."""
    return [
        *(python, "-m", module, "--no-services"),
        *("--port", str(port), "--state-dir", str(state_dir)),
        *extra,
    ]


def service_bus_connection_string(port: int) -> str:
    """The local broker speaks the Service Bus emulator's connection string."""
    return (
        f"Endpoint=sb://{LOOPBACK}:{port};SharedAccessKeyName=RootManageSharedAccessKey;"
        "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
    )
