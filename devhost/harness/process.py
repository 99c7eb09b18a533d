"""A child process we started and therefore stop.

Each child leads its own session, so a terminal Ctrl-C reaches only the parent (which then
stops its children in order) and a signal to the group also reaches what the child
spawned (Azurite's node workers). Its output goes to its own log file, where the ready
line with its bound port is looked for.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from devhost.harness.ports import port_open

ROOT = Path(__file__).resolve().parents[2]
POLL_SECONDS = 0.05

log = logging.getLogger("devhost.harness")


class StartError(RuntimeError):
    """A child exited or stayed silent during startup; the message has its log tail."""


class Child:
    """One process: started once or again (a restart after a kill), stopped group-wide."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path = ROOT,
        closed_marker: str | None = None,
        closed_count: int = 1,
        append: bool = True,
    ) -> None:
        self.name = name
        self.command = tuple(command)
        self.log_path = log_path
        self.env = dict(env or {})
        self.cwd = cwd
        # Output that proves a clean shutdown finished, for processes that then linger.
        self.closed_marker = closed_marker
        self.closed_count = closed_count
        self.append = append
        self.process: subprocess.Popen[bytes] | None = None
        self._log_offset = 0

    def start(self) -> Child:
        if self.alive():
            raise StartError(f"{self.name} is already running (pid {self.pid})")
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab" if self.append else "wb") as out:
            self._log_offset = out.tell()
            self.process = subprocess.Popen(
                self.command,
                cwd=self.cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    @property
    def pid(self) -> int:
        if self.process is None:
            raise StartError(f"{self.name} was never started")
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self, *, since_start: bool = False) -> str:
        """The log; with `since_start`, only what this incarnation wrote."""
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(self._log_offset if since_start else 0)
                return log_file.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.output().splitlines()[-lines:]) or "(no output)"

    def check(self) -> None:
        """Raise StartError if the child has exited (or never started)."""
        if self.process is None:
            raise StartError(f"{self.name} was never started")
        code = self.process.poll()
        if code is not None:
            raise StartError(
                f"{self.name} exited with code {code} (log {self.log_path}):\n{self.tail()}"
            )

    def wait_ready(
        self, *, line: str | None = None, ports: Sequence[int] = (), timeout: float = 60.0
    ) -> re.Match[str] | None:
        """Block until the log matches `line` (its match is returned) or every port in
        `ports` answers (None). The ready line is the precise signal; open ports are the
        fallback, so a reworded banner cannot make startup hang until the timeout."""
        if line is None and not ports:
            raise ValueError("wait_ready needs a ready line or ports")
        regex = re.compile(line) if line is not None else None
        deadline = time.monotonic() + timeout
        while True:
            self.check()
            found = regex.search(self.output(since_start=True)) if regex is not None else None
            if found is not None:
                return found
            if ports and all(port_open(port) for port in ports):
                return None
            if time.monotonic() >= deadline:
                raise StartError(
                    f"{self.name} not ready within {timeout:.0f} s "
                    f"(log {self.log_path}):\n{self.tail()}"
                )
            time.sleep(POLL_SECONDS * 2)

    def stop(self, timeout: float = 10.0) -> bool:
        """SIGTERM the group; SIGKILL once the closed marker shows or after `timeout`.
        True when it went by itself (or closed cleanly), False when it had to be killed."""
        process = self.process
        if process is None or process.poll() is not None:
            return True
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                return True
            if self._closed_cleanly():
                self._kill_group(process)
                return True
            time.sleep(POLL_SECONDS)
        log.warning("%s did not stop within %.0f s: killing it", self.name, timeout)
        self._kill_group(process)
        return False

    def kill(self) -> None:
        """SIGKILL the whole group, as a crash: nothing gets to clean up."""
        process = self.process
        if process is not None and process.poll() is None:
            self._kill_group(process)

    def signal(self, signum: signal.Signals) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        try:
            os.killpg(process.pid, signum)
        except ProcessLookupError:
            return
        except PermissionError:
            process.send_signal(signum)

    def _kill_group(self, process: subprocess.Popen[bytes]) -> None:
        self.signal(signal.SIGKILL)
        process.wait()

    def _closed_cleanly(self) -> bool:
        marker = self.closed_marker
        return (
            marker is not None and self.output(since_start=True).count(marker) >= self.closed_count
        )
