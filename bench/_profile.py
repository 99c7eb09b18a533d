"""Sampling profiles of the benchmark's processes with py-spy, summed up by component."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from bench._common import fmt, table

PY_SPY = Path(sys.executable).parent / "py-spy"

# First match wins; checked against the frame's file path (and function for builtins).
CATEGORIES: tuple[tuple[str, str], ...] = (
    ("Service Bus SDK: pure-Python AMQP (_pyamqp)", r"servicebus/_pyamqp/"),
    ("Service Bus SDK: receiver, sender, lock renewal", r"servicebus/"),
    ("Tables SDK (azure.data.tables)", r"^(azure/)?tables/|data/tables/"),
    ("azure-core: multipart batch (email parser)", r"^email/|core/utils/_pipeline_transport_rest"),
    ("azure-core pipeline (policies, transport)", r"^(azure/)?core/"),
    ("aiohttp (HTTP server and client)", r"^aiohttp/"),
    ("yarl / multidict (URLs, headers)", r"^(yarl|multidict)/"),
    ("pydantic validation", r"^pydantic"),
    ("json encode/decode", r"^json/"),
    ("logging", r"^logging/"),
    ("the app: shared/ (use cases, state machine, adapters)", r"^shared/"),
    ("devhost runtime (triggers, invoke, HTTP front)", r"^devhost/host/|^devhost/__main__"),
    ("the broker: devhost/broker", r"^devhost/broker/"),
    ("qpid-proton (broker AMQP engine)", r"proton"),
    ("sqlite3", r"sqlite"),
    ("the simulator", r"^devhost/simulator/"),
    ("bench/: the driver, or the counting wrappers (--instrument)", r"^bench/"),
    ("dbos", r"^dbos/"),
    ("sqlalchemy", r"^sqlalchemy/"),
    ("tenacity", r"^tenacity/"),
    ("socket writes and reads (kernel time)", r"selector_events.py|socket.py"),
    ("waiting in epoll (not idle to py-spy)", r"^selectors.py"),
    ("asyncio event loop", r"^asyncio/"),
)

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def category(frame: str) -> str | None:
    match = _FRAME.match(frame.strip())
    where = match.group("file") if match else frame
    for name, pattern in CATEGORIES:
        if re.search(pattern, where):
            return name
    return None


@dataclass
class Profile:
    name: str
    samples: int
    inclusive: Counter[str]
    leaf: Counter[str]
    path: Path

    def table(self, top: int = 12) -> Table:
        t = table(
            f"where {self.name}'s CPU goes (py-spy, {self.samples:,} samples of non-idle threads)",
            ["component", "% of samples (inclusive)", "% in the component itself (leaf)"],
        )
        total = max(self.samples, 1)
        names = sorted(set(self.inclusive) | set(self.leaf), key=lambda n: -self.inclusive[n])
        for name in names[:top]:
            t.add_row(
                name,
                fmt(100 * self.inclusive[name] / total, 1),
                fmt(100 * self.leaf[name] / total, 1),
            )
        return t

    def to_json(self) -> dict[str, object]:
        total = max(self.samples, 1)
        return {
            "samples": self.samples,
            "inclusivePercent": {k: round(100 * v / total, 1) for k, v in self.inclusive.items()},
            "leafPercent": {k: round(100 * v / total, 1) for k, v in self.leaf.items()},
            "raw": str(self.path),
        }


def parse_collapsed(name: str, path: Path) -> Profile:
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    samples = 0
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    for line in lines:
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        samples += count
        seen = {c for f in frames if (c := category(f)) is not None}
        for c in seen:
            inclusive[c] += count
        leaf_category = next(
            (c for f in reversed(frames) if (c := category(f)) is not None), "other"
        )
        leaf[leaf_category] += count
    return Profile(name, samples, inclusive, leaf, path)


class Recorder:
    """``py-spy record --nonblocking`` on a pid for a bounded time, raw (collapsed) output."""

    def __init__(self, name: str, pid: int, out: Path, duration: int, rate: int = 50) -> None:
        self.name = name
        self.out = out
        self.process: subprocess.Popen[bytes] | None = None
        if not PY_SPY.exists() and shutil.which("py-spy") is None:
            return
        exe = str(PY_SPY) if PY_SPY.exists() else "py-spy"
        out.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                exe,
                "record",
                "--pid",
                str(pid),
                "--nonblocking",
                "--threads",
                "--rate",
                str(rate),
                "--duration",
                str(max(duration, 1)),
                "--format",
                "raw",
                "--output",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def finish(self) -> Profile | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(2)  # SIGINT: py-spy writes what it has and exits
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        return parse_collapsed(self.name, self.out)
