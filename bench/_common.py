"""Shared helpers of the benchmarks: statistics, machine facts, rich output."""

from __future__ import annotations

import math
import os
import platform
import signal
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"

console = Console(width=None if sys.stdout.isatty() else 170)


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


@dataclass(frozen=True)
class LatencySummary:
    count: int
    p50: float
    p95: float
    p99: float
    maximum: float
    mean: float

    @classmethod
    def of(cls, values: Sequence[float]) -> LatencySummary:
        if not values:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(
            len(values),
            percentile(values, 50),
            percentile(values, 95),
            percentile(values, 99),
            max(values),
            sum(values) / len(values),
        )

    def cells(self, unit: float = 1000.0) -> list[str]:
        """p50, p95, p99, max in milliseconds (unit=1000) as table cells."""
        return [fmt(v * unit, 0) for v in (self.p50, self.p95, self.p99, self.maximum)]


def fmt(value: float, digits: int = 1) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def divide(a: float, b: float) -> float:
    """a / b, or NaN where either is missing (NaN) or b is 0."""
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def ratio(a: float, b: float) -> str:
    if b == 0 or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}x"


@dataclass(frozen=True)
class Machine:
    cores: int
    memory_gib: float
    python: str
    load_before: tuple[float, float, float]
    cpu_model: str

    @classmethod
    def now(cls) -> Machine:
        model = platform.processor() or ""
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        load = os.getloadavg()
        return cls(
            cores=os.cpu_count() or 1,
            memory_gib=psutil.virtual_memory().total / 2**30,
            python=sys.version.split()[0],
            load_before=(load[0], load[1], load[2]),
            cpu_model=model,
        )

    def line(self) -> str:
        l1, l5, l15 = self.load_before
        return (
            f"{self.cores} cores ({self.cpu_model or 'unknown cpu'}), "
            f"{self.memory_gib:.0f} GiB, Python {self.python}, "
            f"load average before the run {l1:.2f} / {l5:.2f} / {l15:.2f}"
        )


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def print_machine(title: str) -> Machine:
    """Every benchmark's first line; also makes SIGTERM and SIGHUP unwind like Ctrl-C, so
    the `finally` blocks stop the children (Azurite, broker, simulator, runtime)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    machine = Machine.now()
    console.rule(f"[bold]{title}")
    console.print(f"[dim]machine: {machine.line()}[/]")
    return machine


def table(title: str, columns: Iterable[str], *, right_from: int = 1) -> Table:
    t = Table(title=title, title_justify="left")
    for i, column in enumerate(columns):
        t.add_column(column, justify="right" if i >= right_from else "left")
    return t


# -- CPU accounting per process ------------------------------------------------------------


def _tree_cpu(pid: int, *, tree: bool = True) -> float:
    """User + system CPU seconds of a process and (with `tree`) its live descendants."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)] if tree else [root]
    except psutil.Error:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


class CpuMeter:
    """CPU seconds used by named processes (and the whole machine) over a window."""

    def __init__(self, pids: dict[str, int], self_only: frozenset[int] = frozenset()) -> None:
        """`self_only`: pids whose children are counted elsewhere (the driver's own pid)."""
        self.pids = dict(pids)
        self.self_only = self_only or frozenset({os.getpid()})
        self._start: dict[str, float] = {}
        self._machine_start = psutil.cpu_times()
        self._wall_start = time.monotonic()
        self.used: dict[str, float] = {}
        self.wall = 0.0
        self.machine_busy = 0.0

    def start(self) -> None:
        self._start = {name: self._cpu(pid) for name, pid in self.pids.items()}
        self._machine_start = psutil.cpu_times()
        self._wall_start = time.monotonic()

    def _cpu(self, pid: int) -> float:
        return _tree_cpu(pid, tree=pid not in self.self_only)

    def stop(self) -> None:
        self.wall = time.monotonic() - self._wall_start
        self.used = {
            name: self._cpu(pid) - self._start.get(name, 0.0) for name, pid in self.pids.items()
        }
        end = psutil.cpu_times()
        busy_start = (
            sum(self._machine_start) - self._machine_start.idle - _iowait(self._machine_start)
        )
        busy_end = sum(end) - end.idle - _iowait(end)
        self.machine_busy = busy_end - busy_start

    def rows(self, cores: int) -> list[tuple[str, float, float, float]]:
        """(name, cpu seconds, % of one core, % of the machine) per process, then others."""
        out: list[tuple[str, float, float, float]] = []
        wall = max(self.wall, 1e-9)
        for name, used in self.used.items():
            out.append((name, used, 100 * used / wall, 100 * used / (wall * cores)))
        ours = sum(self.used.values())
        other = max(self.machine_busy - ours, 0.0)
        out.append(
            (
                "everything else on the machine",
                other,
                100 * other / wall,
                100 * other / (wall * cores),
            )
        )
        out.append(
            (
                "machine total",
                self.machine_busy,
                100 * self.machine_busy / wall,
                100 * self.machine_busy / (wall * cores),
            )
        )
        return out


def _iowait(times: object) -> float:
    return float(getattr(times, "iowait", 0.0))


def cpu_table(meter: CpuMeter, title: str) -> Table:
    cores = os.cpu_count() or 1
    t = table(title, ["process", "CPU s", "% of one core", f"% of {cores} cores"])
    for name, used, core, machine in meter.rows(cores):
        t.add_row(name, fmt(used, 1), fmt(core, 0), fmt(machine, 0))
    return t


def deadline_loop(timeout: float) -> Iterable[float]:
    """Yield the remaining seconds until the timeout; a bounded polling loop."""
    end = time.monotonic() + timeout
    while (remaining := end - time.monotonic()) > 0:
        yield remaining
