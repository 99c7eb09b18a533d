"""Fault decisions in isolation: what makes seeded runs replayable."""

from __future__ import annotations

from typing import Any

from devhost.simulator.faults import FaultSettings, TransientPhase, decide


def _settings(**values: Any) -> FaultSettings:
    return FaultSettings.model_validate(values)


def test_decision_depends_only_on_seed_key_and_call_number() -> None:
    settings = _settings(transientErrorRate=0.5, hangRate=0.5, latencyJitterMs=100)

    first = [decide(settings, 9, "payment", f"k-{i}", 1) for i in range(50)]
    reversed_order = [decide(settings, 9, "payment", f"k-{i}", 1) for i in reversed(range(50))]

    assert first == list(reversed(reversed_order))
    # A retry (next call number) gets a fresh draw, so retries can succeed.
    assert any(decide(settings, 9, "payment", f"k-{i}", 2) != first[i] for i in range(50))


def test_rates_zero_and_one_are_absolute() -> None:
    never = _settings()
    always = _settings(transientErrorRate=1.0, hangRate=1.0, hangSeconds=3)

    quiet = [decide(never, 1, "inventory", f"k-{i}", 1) for i in range(200)]
    loud = [decide(always, 1, "inventory", f"k-{i}", 1) for i in range(200)]

    assert all(d.transient is None and d.hang_seconds is None for d in quiet)
    assert all(d.transient is not None and d.hang_seconds == 3 for d in loud)


def test_transient_errors_split_before_and_after_apply() -> None:
    settings = _settings(transientErrorRate=1.0)

    phases = [decide(settings, 3, "shipping", f"k-{i}", 1).transient for i in range(400)]

    after = sum(1 for fault in phases if fault and fault.phase is TransientPhase.AFTER_APPLY)
    assert 150 < after < 250
    assert {fault.status for fault in phases if fault} == {429, 500, 503}


def test_latency_with_jitter_stays_in_range() -> None:
    settings = _settings(latencyMs=100, latencyJitterMs=50)

    delays = [decide(settings, 4, "payment", f"k-{i}", 1).delay_seconds for i in range(100)]

    assert all(0.1 <= delay <= 0.15 for delay in delays)
    assert len(set(delays)) > 1


def test_changing_one_knob_keeps_the_other_decisions() -> None:
    transient_only = _settings(transientErrorRate=0.5)
    with_latency = _settings(transientErrorRate=0.5, latencyMs=10, hangRate=0.0)

    for i in range(50):
        a = decide(transient_only, 2, "payment", f"k-{i}", 1)
        b = decide(with_latency, 2, "payment", f"k-{i}", 1)
        assert a.transient == b.transient
