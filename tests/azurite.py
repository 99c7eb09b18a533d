"""Starts the real Azurite table emulator from node_modules on a free port."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

from devhost.harness.ports import free_port
from devhost.harness.process import Child, StartError
from devhost.harness.services import AZURITE_CLOSED, azurite_command, azurite_missing

__all__ = ["free_port", "running_azurite"]


@contextlib.contextmanager
def running_azurite() -> Iterator[int]:
    """Yield the table port of a fresh in-memory Azurite, stopped afterwards."""
    port = free_port()
    command = azurite_command(table_port=port)
    if not Path(command[0]).exists():
        raise StartError(azurite_missing(Path(command[0])))
    with tempfile.TemporaryDirectory(prefix="azurite-") as workdir:
        log = Path(workdir) / "azurite.log"
        child = Child("azurite", command, log, cwd=Path(workdir), closed_marker=AZURITE_CLOSED)
        child.start()
        try:
            child.wait_ready(ports=[port], timeout=30)
            yield port
        finally:
            child.stop()
