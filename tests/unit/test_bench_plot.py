"""`python -m bench.plot`: a saved compare result becomes three SVG charts."""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from bench.plot import main, runs_of

ROOT = Path(__file__).resolve().parents[2]
SVG = "{http://www.w3.org/2000/svg}"


def _run(
    system: str, fault_rate: float, throughput: float, p99: float, **kw: Any
) -> dict[str, Any]:
    """One run as bench.throughput's save() writes it (RunSummary, asdict)."""
    processed = kw.get("processed", 100)
    return {
        "system": system,
        "fault_rate": fault_rate,
        "load": "concurrency 64",
        "orders": processed,
        "processed": processed,
        "unfinished": 0,
        "seconds": processed / throughput,
        "throughput": throughput,
        "submit_rate": throughput,
        "server": {
            "count": processed,
            "p50": p99 / 3,
            "p95": p99 / 1.5,
            "p99": p99,
            "maximum": p99 * 1.2,
            "mean": p99 / 2.5,
        },
        "client": {
            "count": processed,
            "p50": 0.1,
            "p95": 0.2,
            "p99": 0.3,
            "maximum": 0.4,
            "mean": 0.15,
        },
        "cpu": kw.get("cpu", {}),
        "runtimes": kw.get("runtimes", 1),
    }


FIXTURE = {
    "machine": {
        "cores": 2,
        "memory_gib": 8.0,
        "python": "3.11",
        "load_before": [0.5, 0.4, 0.3],
        "cpu_model": "test",
    },
    "args": {"orders": 100, "rounds": 2},
    "runs": [
        _run(
            "ours",
            0.0,
            40.0,
            2.0,
            cpu={"runtime": 2.0, "broker": 0.5, "azurite": 0.7, "simulator": 0.1},
        ),
        _run("DBOS", 0.0, 60.0, 3.0, cpu={"DBOS peer": 1.4}),
        _run("ours", 0.0, 44.0, 1.8, cpu={"runtime": 2.2, "broker": 0.5, "azurite": 0.7}),
        _run("DBOS", 0.0, 58.0, 3.2, cpu={"DBOS peer": 1.5}),
        _run("ours", 0.1, 35.0, 2.5, cpu={"runtime": 2.4, "broker": 0.6, "azurite": 0.8}),
        _run("DBOS", 0.1, 52.0, 3.5, cpu={"DBOS peer": 1.6}),
    ],
}


@pytest.fixture
def result(tmp_path: Path) -> Path:
    path = tmp_path / "compare-20261129-020000.json"
    path.write_text(json.dumps(FIXTURE), encoding="utf-8")
    return path


def _bars(svg: Path) -> dict[str, float]:
    """Bar tooltip ("group: series value unit") -> bar height, from the written SVG."""
    root = ET.parse(svg).getroot()
    bars: dict[str, float] = {}
    for rect in root.iter(f"{SVG}rect"):
        title = rect.find(f"{SVG}title")
        if title is not None and title.text:
            bars[title.text] = float(rect.attrib["height"])
    return bars


def test_the_module_writes_three_charts_per_result(result: Path, tmp_path: Path) -> None:
    out = tmp_path / "charts"
    done = subprocess.run(
        [sys.executable, "-m", "bench.plot", str(result), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    written = sorted(p.name for p in out.iterdir())
    assert written == [
        f"{result.stem}-cpu.svg",
        f"{result.stem}-latency.svg",
        f"{result.stem}-throughput.svg",
    ]
    for name in written:
        root = ET.parse(out / name).getroot()
        assert root.tag == f"{SVG}svg", f"{name} is not SVG"
        texts = [t.text for t in root.iter(f"{SVG}text")]
        assert f"{result.stem}, 100 orders per run, 2 cores, load 0.5 before" in texts


def test_throughput_sets_ours_beside_dbos_at_the_median_of_the_rounds(
    result: Path, tmp_path: Path
) -> None:
    assert main([str(result), "--out", str(tmp_path)]) == 0
    bars = _bars(tmp_path / f"{result.stem}-throughput.svg")
    ours = bars["0% faults: ours 42 Processed orders/s"]  # median of 40 and 44
    dbos = bars["0% faults: DBOS 59 Processed orders/s"]
    assert ours / dbos == pytest.approx(42 / 59, rel=0.01)
    assert "10% faults: ours 35 Processed orders/s" in bars


def test_cpu_per_order_is_stacked_by_process(result: Path, tmp_path: Path) -> None:
    assert main([str(result), "--out", str(tmp_path)]) == 0
    bars = _bars(tmp_path / f"{result.stem}-cpu.svg")
    runtime = bars["ours, 0% faults: runtime 21 CPU ms/order"]  # 2.0 s and 2.2 s / 100 orders
    broker = bars["ours, 0% faults: broker 5 CPU ms/order"]
    assert runtime / broker == pytest.approx(21 / 5, rel=0.01)
    assert "DBOS, 10% faults: DBOS peer 16 CPU ms/order" in bars
    assert not any("simulator" in key for key in bars), "the load's own processes are left out"


def test_latency_shows_three_percentiles_per_run(result: Path, tmp_path: Path) -> None:
    assert main([str(result), "--out", str(tmp_path)]) == 0
    bars = _bars(tmp_path / f"{result.stem}-latency.svg")
    assert {key.split(": ")[1].split()[0] for key in bars} == {"p50", "p95", "p99"}
    assert "DBOS, 10% faults: p99 3,500 ms" in bars


def test_results_of_other_benchmarks_are_skipped(tmp_path: Path) -> None:
    other = tmp_path / "supervisor_scaling-20261129.json"
    other.write_text(json.dumps({"machine": {}, "sweeps": [{"seconds": 1.0}]}), encoding="utf-8")
    assert runs_of(json.loads(other.read_text())) == []
    assert main([str(other), "--out", str(tmp_path / "charts")]) == 1
    assert not (tmp_path / "charts").exists()
