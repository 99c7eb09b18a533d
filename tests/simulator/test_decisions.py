"""Fault decisions in isolation: what makes seeded runs replayable."""

from __future__ import annotations

import random
from typing import Any

from devhost.simulator.faults import FaultSettings, TransientPhase, decide, decide_query


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


def test_apply_then_hang_draw_leaves_earlier_seeded_runs_as_they_were() -> None:
    """The first five draws mean what they meant before the knob existed."""
    settings = _settings(transientErrorRate=0.5, hangRate=0.3, latencyMs=5, latencyJitterMs=20)

    for i in range(100):
        rng = random.Random(f"7:payment:k-{i}:1")
        hang, transient, phase, _status, jitter = (rng.random() for _ in range(5))
        decision = decide(settings, 7, "payment", f"k-{i}", 1)
        assert (decision.hang_seconds is not None) == (hang < 0.3)
        assert (decision.transient is not None) == (transient < 0.5)
        if decision.transient is not None:
            after = decision.transient.phase is TransientPhase.AFTER_APPLY
            assert after == (phase >= 0.5)
        assert decision.delay_seconds == (5 + jitter * 20) / 1000.0
        assert decision.apply_then_hang_seconds is None


def test_hang_wins_over_apply_then_hang_which_wins_over_transient_errors() -> None:
    both = _settings(hangRate=1.0, applyThenHangRate=1.0, hangSeconds=2)
    lost_reply = _settings(applyThenHangRate=1.0, transientErrorRate=1.0, hangSeconds=2)

    for i in range(50):
        hung = decide(both, 1, "payment", f"k-{i}", 1)
        applied = decide(lost_reply, 1, "payment", f"k-{i}", 1)
        assert (hung.hang_seconds, hung.apply_then_hang_seconds) == (2, None)
        assert (applied.apply_then_hang_seconds, applied.transient) == (2, None)


def test_apply_then_hang_rate_is_a_share_of_calls() -> None:
    settings = _settings(applyThenHangRate=0.25)

    lost = sum(
        1
        for i in range(400)
        if decide(settings, 5, "shipping", f"k-{i}", 1).apply_then_hang_seconds is not None
    )

    assert 60 < lost < 140


def test_slow_ms_is_the_same_for_every_call() -> None:
    settings = _settings(slowMs=1500, latencyMs=10)

    assert {decide(settings, 6, "shipping", f"k-{i}", 1).slow_seconds for i in range(20)} == {1.5}


def test_query_decisions_are_seeded_and_only_latency_and_transient() -> None:
    settings = _settings(
        transientErrorRate=0.5, latencyMs=10, latencyJitterMs=10, hangRate=1.0, slowMs=900
    )

    first = [decide_query(settings, 3, "payment", f"k-{i}", 1) for i in range(50)]
    again = [decide_query(settings, 3, "payment", f"k-{i}", 1) for i in range(50)]

    assert first == again
    assert all(0.01 <= d.delay_seconds <= 0.02 for d in first)
    statuses = {d.transient_status for d in first}
    assert None in statuses and statuses - {None} <= {429, 500, 503}
    assert any(decide_query(settings, 3, "payment", f"k-{i}", 2) != first[i] for i in range(50))
