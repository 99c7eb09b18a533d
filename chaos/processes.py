"""Child processes the chaos run starts, and therefore always stops.

Each child leads its own session (a terminal Ctrl-C reaches only the chaos command,
which then stops them in order) and writes to its own log file, where the ready line
with its bound port is looked for.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class StartError(RuntimeError):
    """A child exited or stayed silent during startup; the message has its log tail."""


class Child:
    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.log_path = log_path
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as out:
            self.process = subprocess.Popen(
                list(command),
                cwd=ROOT,
                env=child_env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-lines:]) or "(no output)"

    def wait_for_line(self, pattern: str, timeout: float = 60.0) -> re.Match[str]:
        """Block until the log has a line matching `pattern`; raise StartError otherwise."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = regex.search(self.output())
            if found is not None:
                return found
            if not self.alive():
                raise StartError(
                    f"{self.name} exited with {self.process.returncode} during startup "
                    f"(log {self.log_path}):\n{self.tail()}"
                )
            time.sleep(0.1)
        raise StartError(f"{self.name} not ready after {timeout:.0f} s:\n{self.tail()}")

    def kill(self) -> None:
        """SIGKILL the whole process group, as an instance crash would."""
        if self.alive():
            self._signal(signal.SIGKILL)
        self.process.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL whatever is left after `timeout`."""
        if not self.alive():
            return
        self._signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        if self.alive():
            self._signal(signal.SIGKILL)
            self.process.wait()

    def _signal(self, signum: signal.Signals) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            if self.alive():
                self.process.send_signal(signum)


def python(*args: str) -> list[str]:
    return [sys.executable, *args]
