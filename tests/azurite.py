"""Starts the real Azurite table emulator from node_modules on a free port."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AZURITE_TABLE = ROOT / "node_modules" / ".bin" / "azurite-table"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for(port: int, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"azurite exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.1)
    raise RuntimeError(f"azurite did not listen on {port} within {timeout}s")


@contextlib.contextmanager
def running_azurite() -> Iterator[int]:
    """Yield the table port of a fresh in-memory Azurite, stopped afterwards."""
    if not AZURITE_TABLE.exists():
        raise RuntimeError(f"{AZURITE_TABLE} is missing: run `npm ci` first")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="azurite-")
    process = subprocess.Popen(
        [
            str(AZURITE_TABLE),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
            "--inMemoryPersistence",
            "--tableHost",
            "127.0.0.1",
            "--tablePort",
            str(port),
        ],
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(port, process)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(workdir, ignore_errors=True)
