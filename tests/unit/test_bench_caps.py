"""`bench.compare`'s caps: what one interpreter and the machine's cores allow."""

from __future__ import annotations

import pytest

from bench._common import LatencySummary
from bench.compare import cap
from bench.throughput import RunSummary


def run(system: str, cpu: dict[str, float], machine_busy: float, throughput: float) -> RunSummary:
    latency = LatencySummary.of([1.0])
    return RunSummary(
        system, 0.0, "closed loop", 1000, 1000, 0, 20.0, throughput, throughput,
        latency, latency, cpu=cpu, machine_busy=machine_busy,
    )  # fmt: skip


def test_the_busiest_process_and_the_machine_bound_throughput() -> None:
    ours = run(
        "ours",
        {"runtime": 19.0, "broker": 3.5, "azurite": 6.0, "simulator": 1.5, "driver (x)": 1.4},
        machine_busy=33.0,
        throughput=49.0,
    )
    found = cap(ours, run("DBOS", {"dbos peer": 14.0}, 17.0, 62.5), cores=2)
    assert found.busiest == "runtime"
    assert found.busiest_ms == pytest.approx(19.0)
    assert found.busiest_cap == pytest.approx(1000 / 19)
    assert found.machine_ms == pytest.approx(33.0)
    assert found.machine_cap == pytest.approx(2000 / 33)
    assert found.cores_at_peer_rate == pytest.approx(62.5 * 0.033)


def test_the_simulator_and_the_driver_are_never_the_busiest() -> None:
    ours = run("ours", {"runtime a": 5.0, "simulator": 9.0, "driver (x)": 9.0}, 20.0, 50.0)
    assert cap(ours, run("DBOS", {}, 0.0, 60.0), cores=2).busiest == "runtime a"
