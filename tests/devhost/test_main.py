"""``python -m devhost``: argument parsing and the real process, end to end."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from devhost.__main__ import SUBCOMMANDS, build_parser
from devhost.harness.ports import port_open
from tests.devhost.conftest import free_port

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
    process, _, lines = start_devhost(
        tmp_path, launch, "--state-dir", str(tmp_path / "state"), env={}
    )
    assert port_open(port), "\n".join(lines)
    assert any(f"http://127.0.0.1:{port}  (started)" in line for line in lines)
    output = stop_devhost(process, lines)
    assert process.returncode == 0, "\n".join(output)
    assert not port_open(port)
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
