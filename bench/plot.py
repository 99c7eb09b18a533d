"""Charts of the saved runs: ``python -m bench.plot [FILE ...] [--out DIR]``.

Reads the JSON that ``bench.throughput``, ``bench.peer_dbos`` and ``bench.compare`` save
under ``bench/results/`` (every ``*.json`` there by default; files of other benchmarks are
skipped) and writes three SVG charts per file:

* ``<name>-throughput.svg``: Processed orders per second, ours beside DBOS;
* ``<name>-latency.svg``: intake to Processed at p50, p95 and p99;
* ``<name>-cpu.svg``: CPU milliseconds per Processed order of the system under test, by
  process (the driver, the simulator and the trace receiver left out, as compare does).

Runs of one system, runtime count and fault rate (``compare --rounds 3`` makes three) are
one bar at their median, as compare's own summary does.

The SVG is written by hand rather than with matplotlib: bars, ticks and labels are all
these charts need; the files are text, so a committed chart diffs and renders on GitHub;
and the test that runs this needs nothing beyond the dev requirements (matplotlib brings
numpy, Pillow and fonttools with it).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from bench._common import RESULTS
from bench.compare import OUTSIDE

DEFAULT_OUT = RESULTS / "charts"
PALETTE = ("#2f6fb0", "#e0823d", "#4a9a5b", "#b5485d", "#7b62a8", "#8c8c8c", "#c2a83e")
"""One colour per series, in order: ours and DBOS, or p50/p95/p99, or each process."""


@dataclass(frozen=True)
class Run:
    """One bar group: a system at one fault rate (the median of its rounds)."""

    system: str
    """``ours``, ``ours x2`` (two runtime processes), ``DBOS``."""
    faults: str
    """The transient fault rate, as ``10% faults``."""
    throughput: float
    latency_ms: dict[str, float]
    """p50, p95, p99 of intake to Processed, server clock."""
    cpu_ms_per_order: dict[str, float]
    """CPU milliseconds per Processed order of each measured process."""

    @property
    def label(self) -> str:
        return f"{self.system}, {self.faults}"


def runs_of(document: Any) -> list[Run]:
    """The document's runs, one per (system, runtimes, fault rate), in first-seen order;
    empty when the document is not a throughput-shaped result."""
    raw = document.get("runs") if isinstance(document, dict) else None
    if not isinstance(raw, list) or not all(_is_run(r) for r in raw) or not raw:
        return []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in raw:
        groups.setdefault(_key(run), []).append(run)
    return [_median_run(key, runs) for key, runs in groups.items()]


def _is_run(run: object) -> bool:
    return isinstance(run, dict) and {"system", "throughput", "server", "processed"} <= set(run)


def _key(run: dict[str, Any]) -> tuple[str, str]:
    runtimes = int(run.get("runtimes", 1))
    system = str(run["system"]) if runtimes == 1 else f"{run['system']} x{runtimes}"
    return system, f"{float(run.get('fault_rate', 0.0)):.0%} faults"


def _median_run(key: tuple[str, str], runs: list[dict[str, Any]]) -> Run:
    def median(values: list[float]) -> float:
        finite = [v for v in values if math.isfinite(v)]
        return statistics.median(finite) if finite else math.nan

    latency = {
        p: median([float(r["server"][p]) * 1000 for r in runs]) for p in ("p50", "p95", "p99")
    }
    processes = list(dict.fromkeys(name for r in runs for name in r.get("cpu", {})))
    cpu = {
        name: median(
            [
                1000 * float(r.get("cpu", {}).get(name, 0.0)) / max(int(r["processed"]), 1)
                for r in runs
            ]
        )
        for name in processes
    }
    return Run(*key, median([float(r["throughput"]) for r in runs]), latency, cpu)


# ---------------------------------------------------------------------------
# Bar charts as SVG
# ---------------------------------------------------------------------------

WIDTH, HEIGHT = 760, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 50, 90


def bar_chart(
    title: str,
    unit: str,
    groups: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    *,
    stacked: bool = False,
    subtitle: str = "",
) -> str:
    """Grouped (or stacked) vertical bars: one group per entry of ``groups``, one bar (or
    segment) per series; a legend when there is more than one series."""
    totals = [
        sum(_finite(values[i]) for _, values in series)
        if stacked
        else max((_finite(values[i]) for _, values in series), default=0.0)
        for i in range(len(groups))
    ]
    top = _nice_ceiling(max(totals, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def y(value: float) -> float:
        return TOP + plot_h - plot_h * value / top

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>',
        f'<text x="{LEFT}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>',
        f'<text x="{LEFT}" y="38" fill="#57606a">{escape(subtitle)}</text>',
    ]
    steps = _tick_steps(top)
    for tick in range(steps + 1):
        value = top * tick / steps
        parts.append(
            f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
            f'stroke="#dddddd"/>'
            f'<text x="{LEFT - 6}" y="{y(value) + 4:.1f}" text-anchor="end">{_fmt(value)}</text>'
        )
    parts.append(
        f'<text x="16" y="{TOP + plot_h / 2:.1f}" text-anchor="middle" '
        f'transform="rotate(-90 16 {TOP + plot_h / 2:.1f})">{escape(unit)}</text>'
    )
    slot = plot_w / max(len(groups), 1)
    bars = 1 if stacked else max(len(series), 1)
    bar_w = slot * 0.7 / bars
    for i, group in enumerate(groups):
        x0 = LEFT + slot * i + slot * 0.15
        base = 0.0
        for s, (name, values) in enumerate(series):
            value = _finite(values[i])
            if stacked:
                x, low, high = x0, base, base + value
                base = high
            else:
                x, low, high = x0 + s * bar_w, 0.0, value
            parts.append(
                f'<rect x="{x:.1f}" y="{y(high):.1f}" width="{bar_w:.1f}" '
                f'height="{y(low) - y(high):.1f}" fill="{PALETTE[s % len(PALETTE)]}">'
                f"<title>{escape(group)}: {escape(name)} {_fmt(value)} {escape(unit)}</title>"
                "</rect>"
            )
            if not stacked and value:
                parts.append(
                    f'<text x="{x + bar_w / 2:.1f}" y="{y(high) - 4:.1f}" text-anchor="middle" '
                    f'font-size="10">{_fmt(value)}</text>'
                )
        if stacked and base:
            parts.append(
                f'<text x="{x0 + bar_w / 2:.1f}" y="{y(base) - 4:.1f}" text-anchor="middle" '
                f'font-size="10">{_fmt(base)}</text>'
            )
        parts.append(
            f'<text x="{x0 + slot * 0.35:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">'
            f"{escape(group)}</text>"
        )
    if len(series) > 1:
        for s, (name, _) in enumerate(series):
            x = LEFT + (s % 4) * (plot_w / 4)
            row = TOP + plot_h + 42 + (s // 4) * 18
            parts.append(
                f'<rect x="{x:.1f}" y="{row - 10}" width="12" height="12" '
                f'fill="{PALETTE[s % len(PALETTE)]}"/>'
                f'<text x="{x + 18:.1f}" y="{row}">{escape(name)}</text>'
            )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n at or above ``value`` (1 when it is 0)."""
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    return next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= value)


def _tick_steps(top: float) -> int:
    """Gridlines at round values: 5 steps for a ceiling of 1 or 5 x 10^n, else 4."""
    mantissa = top / 10.0 ** math.floor(math.log10(top))
    return 5 if round(mantissa, 6) in (1.0, 5.0) else 4


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.1f}".rstrip("0").rstrip(".")


# ---------------------------------------------------------------------------
# The three charts of one result
# ---------------------------------------------------------------------------


def charts(runs: Sequence[Run], source: str) -> dict[str, str]:
    """Chart name -> SVG text for one result file's runs."""
    labels = [r.label for r in runs]
    processes = [
        name
        for name in dict.fromkeys(name for r in runs for name in r.cpu_ms_per_order)
        if not name.startswith(OUTSIDE)
    ]
    systems = list(dict.fromkeys(r.system for r in runs))
    faults = list(dict.fromkeys(r.faults for r in runs))
    throughput = {(r.system, r.faults): r.throughput for r in runs}
    return {
        "throughput": bar_chart(
            "Throughput",
            "Processed orders/s",
            faults,
            [
                (system, [throughput.get((system, f), math.nan) for f in faults])
                for system in systems
            ],
            subtitle=source,
        ),
        "latency": bar_chart(
            "Latency, intake to Processed",
            "ms",
            labels,
            [(p, [r.latency_ms[p] for r in runs]) for p in ("p50", "p95", "p99")],
            subtitle=source,
        ),
        "cpu": bar_chart(
            "CPU per Processed order, system under test, by process",
            "CPU ms/order",
            labels,
            [(name, [r.cpu_ms_per_order.get(name, 0.0) for r in runs]) for name in processes],
            stacked=True,
            subtitle=source,
        ),
    }


def describe(path: Path, document: dict[str, Any]) -> str:
    """The charts' subtitle: which file, how many orders, and how busy the machine was
    (a loaded machine slows both systems, not always alike)."""
    parts = [path.stem]
    orders = document.get("args", {}).get("orders")
    if orders:
        parts.append(f"{orders} orders per run")
    machine = document.get("machine", {})
    if machine.get("cores"):
        load = machine.get("load_before") or [math.nan]
        parts.append(f"{machine['cores']} cores, load {float(load[0]):.1f} before")
    return ", ".join(parts)


def plot(files: Sequence[Path], out: Path) -> list[Path]:
    """Write the charts of every throughput-shaped file; returns the files written."""
    written: list[Path] = []
    for path in files:
        document = json.loads(path.read_text(encoding="utf-8"))
        runs = runs_of(document)
        if not runs:
            print(f"skipped {path}: no throughput runs in it")
            continue
        out.mkdir(parents=True, exist_ok=True)
        for name, svg in charts(runs, describe(path, document)).items():
            target = out / f"{path.stem}-{name}.svg"
            target.write_text(svg, encoding="utf-8")
            written.append(target)
            print(f"wrote {target}")
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.plot", description=__doc__)
    parser.add_argument("files", nargs="*", type=Path, help="result files (default: all)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"(default {DEFAULT_OUT})")
    args = parser.parse_args(argv)
    files = args.files or sorted(RESULTS.glob("*.json"))
    if not files:
        parser.error(f"no result files in {RESULTS}: run a benchmark first")
    written = plot(files, args.out)
    return 0 if written else 1


if __name__ == "__main__":
    raise SystemExit(main())
