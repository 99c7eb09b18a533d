"""A started child: readiness by log line or ports, clean stop, crash kill, exit reports."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

from devhost.harness.ports import free_port, port_open
from devhost.harness.process import Child, StartError

FAKE_SERVICE = """
import signal, socket, sys, time
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
print("fake listening on", sock.getsockname()[1])
mode = sys.argv[2]
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode == "linger":
    def closed(*_):
        print("fake successfully closed", flush=True)
    signal.signal(signal.SIGTERM, closed)
time.sleep(60)
"""


def fake(tmp_path: Path, port: int = 0, mode: str = "normal", **kwargs: object) -> Child:
    command = [sys.executable, "-c", FAKE_SERVICE, str(port), mode]
    return Child("fake", command, tmp_path / "fake.log", **kwargs)  # type: ignore[arg-type]


def test_ready_line_gives_the_bound_port_and_stop_is_clean(tmp_path: Path) -> None:
    child = fake(tmp_path).start()
    try:
        found = child.wait_ready(line=r"fake listening on (\d+)", timeout=10)
        assert found is not None
        port = int(found[1])
        assert port_open(port) and child.alive()
    finally:
        assert child.stop(timeout=5) is True
    assert not child.alive() and child.returncode is not None
    assert not port_open(port)


def test_ports_are_the_readiness_fallback(tmp_path: Path) -> None:
    port = free_port()
    child = fake(tmp_path, port).start()
    try:
        assert child.wait_ready(line="a banner that never comes", ports=[port], timeout=10) is None
    finally:
        child.stop()


def test_sigterm_ignored_means_sigkill_after_the_timeout(tmp_path: Path) -> None:
    child = fake(tmp_path, mode="ignore-term").start()
    child.wait_ready(line="fake listening", timeout=10)
    assert child.stop(timeout=0.5) is False
    assert child.returncode == -signal.SIGKILL


def test_closed_marker_ends_a_lingering_process(tmp_path: Path) -> None:
    child = fake(tmp_path, mode="linger", closed_marker="successfully closed").start()
    child.wait_ready(line="fake listening", timeout=10)
    assert child.stop(timeout=30) is True
    assert not child.alive()
    assert "successfully closed" in child.output()


def test_kill_is_a_crash_and_the_child_can_start_again(tmp_path: Path) -> None:
    child = fake(tmp_path).start()
    child.wait_ready(line="fake listening", timeout=10)
    first = child.pid
    child.kill()
    assert child.returncode == -signal.SIGKILL
    with pytest.raises(StartError, match="exited with code -9"):
        child.check()
    child.start()
    try:
        assert child.pid != first
        child.wait_ready(line="fake listening", timeout=10)
        assert child.output().count("fake listening") == 2  # the log is appended to
    finally:
        child.stop()


def test_exit_during_startup_reports_the_log_tail(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "import sys; sys.exit('cannot open database: locked')"]
    child = Child("crashy", command, tmp_path / "crashy.log").start()
    with pytest.raises(StartError, match=r"crashy exited with code 1(.|\n)*database: locked"):
        child.wait_ready(line="never", timeout=10)


def test_silence_is_a_start_error(tmp_path: Path) -> None:
    child = Child("mute", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path / "m.log")
    child.start()
    try:
        with pytest.raises(StartError, match="mute not ready within"):
            child.wait_ready(line="never", timeout=0.3)
    finally:
        child.stop()
