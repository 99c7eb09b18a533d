"""``python -m devhost``: argument parsing and the real process, end to end."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devhost.__main__ import SUBCOMMANDS, build_parser, demo_target
from devhost.broker import Broker
from devhost.harness.clients import AppClient, SimulatorControl
from devhost.harness.ports import free_port, port_open
from devhost.simulator import SimulatorServer
from shared.contract import Setting
from shared.settings import azurite_connection_string
from tests.waiting import eventually
from tests.workflows import AGENTS

REPO = Path(__file__).resolve().parents[2]

APP = textwrap.dedent(
    """
    import os
    import azure.functions as func

    app = func.FunctionApp(http_auth_level=func.AuthLevel.FUNCTION)

    @app.route(route="hello/{name}", methods=["GET"])
    async def hello(req: func.HttpRequest) -> func.HttpResponse:
        return func.HttpResponse(f"hello {req.route_params['name']} {os.environ['Greeting']}")

    @app.timer_trigger(schedule="%Schedule%", arg_name="timer", run_on_startup=True)
    def sweep(timer: func.TimerRequest) -> None:
        print("sweep ran", flush=True)
    """
)


def test_no_subcommand_means_run() -> None:
    args = build_parser().parse_args(["--fresh", "--port", "0"])
    assert args.command is None
    assert args.fresh and args.port == 0 and not args.no_services


def test_run_subcommand_takes_the_same_options() -> None:
    args = build_parser().parse_args(["run", "--no-services", "--state-dir", "/tmp/x"])
    assert args.command == "run"
    assert args.no_services and args.state_dir == Path("/tmp/x")
    assert not args.fresh and args.port is None
    assert "run" in SUBCOMMANDS


def test_options_before_the_subcommand_are_kept() -> None:
    args = build_parser().parse_args(["--fresh", "--port", "7100", "run", "--no-services"])
    assert (args.fresh, args.port, args.no_services) == (True, 7100, True)


def test_the_demo_starts_its_runtime_on_the_port_and_state_dir_given() -> None:
    args = build_parser().parse_args(["--fresh", "demo", "--port", "7181", "--state-dir", "/t"])
    target = demo_target(args)
    assert (target.port, target.state_dir) == (7181, Path("/t"))
    command = target.command(fresh=True)
    assert command[1:] == ["-m", "devhost", "--fresh", "--port", "7181", "--state-dir", "/t"]
    assert target.log_path == Path("/t/demo-runtime.log")
    default = demo_target(build_parser().parse_args(["demo"]))
    assert default.port == 7071 and "--state-dir" not in default.command(fresh=False)


@pytest.mark.parametrize(
    ("options", "refused"),
    [
        (["--instances", "2"], "--instances"),
        (["--no-services", "--otlp-port", "4400"], "--no-services, --otlp-port"),
        (["--root", "/elsewhere"], "--root"),
        (["--port", "0"], "known --port"),
    ],
)
def test_the_demo_refuses_run_options_it_cannot_honour(options: list[str], refused: str) -> None:
    with pytest.raises(SystemExit, match=refused):
        demo_target(build_parser().parse_args(["demo", *options]))


def make_project(root: Path, values: dict[str, str]) -> None:
    (root / "function_app.py").write_text(APP)
    settings = {"Values": {"Schedule": "0 0 0 1 1 *", "Greeting": "from-file", **values}}
    (root / "local.settings.json").write_text(json.dumps(settings))


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def start_devhost(
    root: Path, processes: list[subprocess.Popen[str]], *extra: str, env: dict[str, str]
) -> tuple[subprocess.Popen[str], str, list[str]]:
    """Start the runtime and return it with its URL once the banner's last line shows."""
    process = subprocess.Popen(
        [sys.executable, "-m", "devhost", "--root", str(root), "--port", "0", *extra],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    processes.append(process)
    assert process.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip())
        found = re.search(r"devhost listening on (http://\S+)", line)
        if found:
            return process, found.group(1), lines
    process.kill()
    pytest.fail("devhost did not start:\n" + "\n".join(lines))


def read_until(
    process: subprocess.Popen[str], lines: list[str], text: str, timeout: float = 30.0
) -> None:
    """Read the runtime's output until a line contains ``text``: the startup timer runs
    on its own task, so a test that needs its output waits for it instead of racing it."""
    assert process.stdout is not None
    # A blocking readline, and a kill at the deadline to end it: select() cannot see
    # lines already read ahead into the pipe's buffer.
    watchdog = threading.Timer(timeout, process.kill)
    watchdog.start()
    try:
        while not any(text in line for line in lines):
            line = process.stdout.readline()
            if not line:
                pytest.fail(f"no line with {text!r} within {timeout:.0f} s:\n" + "\n".join(lines))
            lines.append(line.rstrip())
    finally:
        watchdog.cancel()


def stop_devhost(process: subprocess.Popen[str], lines: list[str]) -> list[str]:
    process.send_signal(signal.SIGTERM)
    output, _ = process.communicate(timeout=15)
    return lines + output.splitlines()


@pytest.mark.e2e
async def test_process_serves_http_and_stops_on_sigterm(
    tmp_path: Path, launch: list[subprocess.Popen[str]]
) -> None:
    make_project(tmp_path, {})
    process, url, lines = start_devhost(
        tmp_path,
        launch,
        "--no-services",
        "--state-dir",
        str(tmp_path / "state"),
        env={"Greeting": "from-env"},
    )
    async with aiohttp.ClientSession() as session, session.get(f"{url}/api/hello/ada") as response:
        assert response.status == 200
        assert await response.text() == "hello ada from-env"
    read_until(process, lines, "sweep ran")
    output = stop_devhost(process, lines)
    assert process.returncode == 0, "\n".join(output)
    text = "\n".join(output)
    assert re.search(r"hello\s+http\s+GET http://127\.0\.0\.1:\d+/api/hello/\{name\}", text)
    assert "0 0 0 1 1 * (runOnStartup)" in text
    assert "sweep ran" in text
    assert re.search(r"^\d\d:\d\d:\d\d INFO +devhost SIGTERM received", text, re.MULTILINE)


@pytest.mark.e2e
async def test_process_starts_and_stops_the_simulator(
    tmp_path: Path, launch: list[subprocess.Popen[str]]
) -> None:
    port = free_port()
    make_project(tmp_path, {"InventoryServiceUrl": f"http://127.0.0.1:{port}/inventory"})
    otlp = free_port()
    process, _, lines = start_devhost(
        tmp_path, launch, "--state-dir", str(tmp_path / "state"), "--otlp-port", str(otlp), env={}
    )
    assert port_open(port), "\n".join(lines)
    assert any(f"http://127.0.0.1:{otlp} (traces" in line for line in lines)
    assert any(f"http://127.0.0.1:{port}  (started)" in line for line in lines)
    output = stop_devhost(process, lines)
    assert process.returncode == 0, "\n".join(output)
    assert not port_open(port) and not port_open(otlp)
    assert (tmp_path / "state" / "simulator.sqlite3").exists()


@pytest.mark.e2e
def test_missing_setting_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "function_app.py").write_text(APP)
    result = subprocess.run(
        [sys.executable, "-m", "devhost", "--root", str(tmp_path), "--no-services", "--port", "0"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 1
    assert "function sweep (schedule) refers to %Schedule%" in result.stderr
    assert "Traceback" not in result.stderr


def real_app_env(
    azurite_port: int, broker: Broker, simulator: SimulatorServer, table: str
) -> dict[str, str]:
    """The settings that run the real app on this test's Azurite, broker and simulator,
    on a table of its own."""
    return {
        Setting.STORAGE: azurite_connection_string(azurite_port),
        Setting.SERVICE_BUS: broker.connection_string,
        Setting.STATE_TABLE: f"{table}{uuid.uuid4().hex[:10]}",
        **{spec.service_url_setting: f"{simulator.url}/{name}" for name, spec in AGENTS.items()},
    }


SHUTDOWN_NOISE = (
    "Unclosed client session",
    "Unclosed connector",
    "Task was destroyed but it is pending",
    "Event loop is closed",
    "Traceback",
)


@pytest.mark.e2e
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
async def test_the_real_app_stops_cleanly_within_10_s(
    tmp_path: Path,
    launch: list[subprocess.Popen[str]],
    azurite_table_port: int,
    signum: signal.Signals,
    busy: bool,
) -> None:
    """The app with its clients in use (an order processed end to end; when busy, an
    agent waiting on a remote call that hangs), then a signal: it exits 0 within 10 s,
    with no unclosed session and no task left pending."""
    with (
        Broker(port=0, control_port=0, lock_seconds=10) as broker,
        SimulatorServer(port=0, seed=3) as simulator,
    ):
        env = {
            **real_app_env(azurite_table_port, broker, simulator, "shutdown"),
            Setting.SUPERVISOR_SCHEDULE: "*/1 * * * * *",
            Setting.STEP_TIMEOUT_SECONDS: "60",
            "PYTHONWARNINGS": "default::ResourceWarning",
        }
        process, url, lines = start_devhost(
            REPO, launch, "--no-services", "--state-dir", str(tmp_path / "state"), env=env
        )
        drained = Drain(process)
        async with aiohttp.ClientSession() as session:
            app = AppClient(session, f"{url}/api")
            await app.submit_order("shutdown-1")
            done = await app.wait_for("shutdown-1", timeout=60)
            assert done["processState"] == "Processed"
            if busy:
                sim = SimulatorControl(session, simulator.url)
                await sim.set_faults("shipping", hangRate=1)
                await app.submit_order("shutdown-2")
                await drained.wait_for("create-shipment to agent-shipping", "shutdown-2")

                async def shipment_hangs() -> bool:
                    return bool((await sim.stats())["shipping"]["hangs"])

                # The agent's call has reached the simulator: the agent waits on it.
                await eventually("the shipment call hangs", shipment_hangs, 30)
        started = time.monotonic()
        process.send_signal(signum)
        returncode = await asyncio.to_thread(process.wait, 60)
        took = time.monotonic() - started
        output = "\n".join(lines + drained.lines())
    assert returncode == 0, output
    assert took < 10, f"stopped after {took:.1f} s\n{output}"
    noise = [line for line in output.splitlines() if any(n in line for n in SHUTDOWN_NOISE)]
    assert noise == [], output


class Drain:
    """Read a child's output on a thread, so a full pipe never blocks its logging."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self._stream = process.stdout
        self._lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._stream:
            self._lines.append(line.rstrip())

    async def wait_for(self, *needles: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(all(n in line for n in needles) for line in list(self._lines)):
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"no log line with {needles}")

    def lines(self) -> list[str]:
        self._thread.join(timeout=5)
        return list(self._lines)


@pytest.mark.e2e
async def test_the_runtime_exports_its_last_telemetry_before_its_receiver_stops(
    tmp_path: Path, launch: list[subprocess.Popen[str]], azurite_table_port: int
) -> None:
    """devhost starts the OTLP receiver and stops it on the way out: the app's spans and
    metrics still batched then must go out first, not be lost with an ERROR per batch."""
    otlp = free_port()
    with (
        Broker(port=0, control_port=0, lock_seconds=10) as broker,
        SimulatorServer(port=0, seed=3) as simulator,
    ):
        env = real_app_env(azurite_table_port, broker, simulator, "exports")
        process, url, lines = start_devhost(
            REPO, launch, "--state-dir", str(tmp_path / "state"), "--otlp-port", str(otlp), env=env
        )
        drained = Drain(process)
        async with aiohttp.ClientSession() as session:
            app = AppClient(session, f"{url}/api")
            await app.submit_order("exports-1")
            assert (await app.wait_for("exports-1", timeout=60))["processState"] == "Processed"
        process.send_signal(signal.SIGTERM)
        returncode = await asyncio.to_thread(process.wait, 60)
        output = "\n".join(lines + drained.lines())
    assert returncode == 0, output
    assert not port_open(otlp), output
    assert "Failed to export" not in output, output
