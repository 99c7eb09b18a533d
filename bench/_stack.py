"""What the benchmarks add to the harness's Stack: timing settings, a results directory
per run, the instrumented runtime and the same faults at every service."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._common import RESULTS
from devhost.harness.clients import SimulatorControl
from devhost.harness.process import StartError
from devhost.harness.stack import Stack, timing_settings

INSTRUMENTED_RUNTIME = "bench.instrumented_runtime"


@dataclass(frozen=True)
class Timings:
    """The runtime's timing settings; the bounds of recovery follow from them."""

    step_timeout: float = 30.0
    pending_timeout: float = 60.0
    supervisor_period: int = 5
    max_failure_count: int = 3

    def settings(self) -> dict[str, str]:
        return timing_settings(
            step_timeout=self.step_timeout,
            pending_timeout=self.pending_timeout,
            supervisor_period=self.supervisor_period,
            max_failure_count=self.max_failure_count,
        )


class BenchStack(Stack):
    """The harness's Stack with its state in a temporary directory (removed on stop) and
    its logs, profiles and counters under ``bench/results/<name>-<time>``."""

    def __init__(
        self,
        name: str,
        timings: Timings = Timings(),
        *,
        instrument: bool = False,
        settings: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        self.run_dir = RESULTS / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.stats_file = self.run_dir / "runtime-stats.json"
        if instrument:
            kwargs["runtime_module"] = INSTRUMENTED_RUNTIME
            extra = kwargs.get("runtime_extra", ())
            kwargs["runtime_extra"] = (*extra, "--stats-file", str(self.stats_file))
        work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
        overrides = {**timings.settings(), **(settings or {})}
        super().__init__(name, work, settings=overrides, log_dir=self.run_dir / "logs", **kwargs)
        self.timings = timings
        self.instrument = instrument

    async def __aenter__(self) -> BenchStack:
        await super().__aenter__()
        return self

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

    async def runtime_stats(self, *, reset: bool = False) -> dict[str, Any]:
        """The instrumented runtime's counters (SIGUSR1 writes them; SIGUSR2 also resets)."""
        if not self.instrument:
            raise StartError("the runtime is not instrumented (BenchStack(instrument=True))")
        pid = self.pids().get("runtime")
        if pid is None:
            raise StartError("the runtime is not running")
        before = self.stats_file.stat().st_mtime_ns if self.stats_file.exists() else 0
        os.kill(pid, signal.SIGUSR2 if reset else signal.SIGUSR1)
        for _ in range(100):
            await asyncio.sleep(0.05)
            if self.stats_file.exists() and self.stats_file.stat().st_mtime_ns != before:
                with contextlib.suppress(ValueError):
                    data: dict[str, Any] = json.loads(self.stats_file.read_text())
                    return data
        raise StartError(f"the runtime did not write {self.stats_file}")


async def set_faults(
    simulator: SimulatorControl,
    transient_rate: float,
    latency_ms: int,
    jitter_ms: int = 0,
    **extra: Any,
) -> None:
    """The same faults at all three services (what the peer sees too)."""
    for service in ("inventory", "payment", "shipping"):
        await simulator.set_faults(
            service,
            transientErrorRate=transient_rate,
            latencyMs=latency_ms,
            latencyJitterMs=jitter_ms,
            **extra,
        )


async def set_latency(simulator: SimulatorControl, latency_ms: int, jitter_ms: int) -> None:
    """No faults and the same latency at every service, the secondary provider included:
    routing may move charge-payment there, and a faster provider would be a free lane."""
    await set_faults(simulator, 0.0, latency_ms, jitter_ms)
    await simulator.set_faults(
        "payment-secondary", transientErrorRate=0.0, latencyMs=latency_ms, latencyJitterMs=jitter_ms
    )
