"""``python -m shared.cli`` as a process: help, and a one-line error with its exit code."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from shared.cli.errors import Exit

ROOT = Path(__file__).resolve().parents[2]


def run(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ORDERS_")}
    return subprocess.run(
        [sys.executable, "-m", "shared.cli", *argv],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_help_lists_the_commands_and_exit_codes() -> None:
    done = run("--help")
    assert done.returncode == 0
    assert "{orders,agents,failures,dlq}" in done.stdout and "exit codes: 0 ok" in done.stdout


def test_an_unreachable_api_is_one_line_on_stderr_and_exit_5() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    done = run("orders", "list", ORDERS_API_URL=url, ORDERS_API_KEY="secret-key-value")
    assert done.returncode == Exit.UNREACHABLE
    assert done.stdout == ""
    assert done.stderr.startswith(f"python -m shared.cli: error: cannot reach the API at {url}")
    assert done.stderr.count("\n") == 1 and "secret-key-value" not in done.stderr


def test_a_bad_state_is_a_usage_error() -> None:
    done = run("orders", "list", "--state", "Done")
    assert done.returncode == Exit.USAGE
    assert "invalid state 'Done'" in done.stderr and done.stderr.count("\n") == 1
