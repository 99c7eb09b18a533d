"""``python -m devhost.broker``: the ready line, the control API and a clean stop on SIGTERM."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from azure.servicebus import ServiceBusClient, ServiceBusMessage

from devhost.harness.ports import free_port

pytestmark = pytest.mark.broker

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(
    r"^broker listening on amqp://127\.0\.0\.1:(\d+) \(control http://127\.0\.0\.1:(\d+)\)$"
)


def test_cli_prints_ready_line_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    amqp_port, control_port = free_port(), free_port()
    command = [
        sys.executable, "-m", "devhost.broker",
        "--port", str(amqp_port),
        "--control-port", str(control_port),
        "--db", str(tmp_path / "cli.db"),
        "--queue", "cli-extra",
        "--faults", '{"duplicateRate": 1, "queues": ["cli-extra"]}',
        "--lock-seconds", "5",
        "--max-delivery", "3",
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        match = READY.match(line)
        assert match, line
        assert (int(match[1]), int(match[2])) == (amqp_port, control_port)
        connection = (
            f"Endpoint=sb://127.0.0.1:{amqp_port};SharedAccessKeyName=RootManageSharedAccessKey;"
            "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
        )
        with (
            ServiceBusClient.from_connection_string(connection) as client,
            client.get_queue_sender("cli-extra") as sender,
        ):
            sender.send_messages(ServiceBusMessage("x"))
        url = f"http://127.0.0.1:{control_port}/_broker/stats"
        with urllib.request.urlopen(url, timeout=5) as response:
            stats = json.load(response)
        assert (stats["cli-extra"]["active"], stats["cli-extra"]["duplicated"]) == (2, 1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
