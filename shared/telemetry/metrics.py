"""The order process's metrics, exported with the spans (same providers, same export).

Instruments are made on first use, after `setup.configure()` chose the meter provider;
with no provider they are the API's no-ops.
"""

from __future__ import annotations

from functools import cache

from opentelemetry import metrics
from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider

from shared.domain.health import BreakerState

_provider: MeterProvider | None = None

ORDERS_COMPLETED = "orders.completed"
"""Counts orders reaching an end state (Error included), by `OUTCOME`: the Azure Monitor
alert on orders held in Error (infra/app/alerts.bicep) queries it."""
OUTCOME = "order.outcome"
"""The end state an `ORDERS_COMPLETED` order reached (a ProcessState value)."""
SWEEP_DURATION = "orders.supervisor.sweep.duration"
"""One record per Supervisor sweep: the alert on a Supervisor that stopped running counts them."""

BREAKER_LEVEL = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}
"""The breaker gauge's values: 0 closed, 1 half-open (a trial call), 2 open."""


def use_meter_provider(provider: MeterProvider | None) -> None:
    """Tests: record into `provider` (an in-memory reader); None: the global one."""
    global _provider
    _provider = provider
    _instruments.cache_clear()


def _meter() -> Meter:
    return (_provider or metrics.get_meter_provider()).get_meter("orders")


class _Instruments:
    def __init__(self, meter: Meter) -> None:
        self.orders: Counter = meter.create_counter(
            ORDERS_COMPLETED, unit="{order}", description="Orders reaching an end state"
        )
        self.latency: Histogram = meter.create_histogram(
            "orders.duration", unit="s", description="Intake to end state, per order"
        )
        self.step: Histogram = meter.create_histogram(
            "orders.step.duration", unit="s", description="An agent's work on one step"
        )
        self.retries: Counter = meter.create_counter(
            "orders.agent.retries", unit="{call}", description="Remote calls an agent retried"
        )
        self.breaker = meter.create_gauge(
            "orders.agent.breaker", description="Circuit breaker: 0 closed, 1 half-open, 2 open"
        )
        self.recoveries: Counter = meter.create_counter(
            "orders.supervisor.recoveries", unit="{order}", description="Orders recovered"
        )
        self.sweep: Histogram = meter.create_histogram(
            SWEEP_DURATION, unit="s", description="One Supervisor sweep"
        )
        self.queue_lag: Histogram = meter.create_histogram(
            "orders.queue.lag", unit="s", description="Enqueued (or due) to trigger start"
        )


@cache
def _instruments() -> _Instruments:
    return _Instruments(_meter())


def order_finished(outcome: str, seconds: float) -> None:
    _instruments().orders.add(1, {OUTCOME: outcome})
    _instruments().latency.record(seconds, {OUTCOME: outcome})


def step_done(agent: str, step: str, outcome: str, seconds: float) -> None:
    attributes = {"agent": agent, "step.name": step, "outcome": outcome}
    _instruments().step.record(seconds, attributes)


def retried(agent: str) -> None:
    _instruments().retries.add(1, {"agent": agent})


def breaker(agent: str, state: BreakerState) -> None:
    _instruments().breaker.set(BREAKER_LEVEL[state], {"agent": agent})


def swept(seconds: float, recovered: int) -> None:
    _instruments().sweep.record(seconds)
    if recovered:
        _instruments().recoveries.add(recovered)


def queue_lag(queue: str, seconds: float) -> None:
    _instruments().queue_lag.record(max(seconds, 0.0), {"messaging.destination.name": queue})
