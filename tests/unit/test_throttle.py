"""The adaptive rate (AIMD) an agent learns from its service's 429s: pure, given the time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

from shared.domain.throttle import AdaptiveRate

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_unthrottled_it_lets_every_call_start_at_once() -> None:
    rate = AdaptiveRate()

    assert [rate.reserve(T0) for _ in range(50)] == [T0] * 50
    assert rate.view().rate is None


def test_the_first_429_halves_the_rate_it_saw() -> None:
    rate = AdaptiveRate()
    for _ in range(20):
        rate.reserve(at(0.5))

    rate.limited(at(0.6), retry_after=None)

    assert rate.rate == 10.0
    view = rate.view()
    assert (view.throttled, view.last_limited_at) == (1, at(0.6))


def test_429s_of_one_burst_halve_it_once() -> None:
    """The calls in flight when the first 429 came back are refused too: one event."""
    rate = AdaptiveRate(ceiling=8)
    for offset in (0.0, 0.01, 0.02, 0.5):
        rate.limited(at(offset), retry_after=None)
    assert rate.rate == 4.0
    assert rate.view().throttled == 4

    rate.limited(at(1.01), retry_after=None)

    assert rate.rate == 2.0


def test_calls_are_spaced_a_little_wider_than_the_rate() -> None:
    rate = AdaptiveRate(ceiling=5, margin=0.05)

    starts = [rate.reserve(T0) for _ in range(6)]

    gaps = {round((b - a).total_seconds(), 6) for a, b in pairwise(starts)}
    assert gaps == {0.21}
    # Six calls never fall in one second: the sixth starts 1.05 s after the first.
    assert starts[5] - starts[0] == timedelta(seconds=1.05)


def test_retry_after_is_a_floor_on_the_next_start() -> None:
    rate = AdaptiveRate(ceiling=100)

    rate.limited(T0, retry_after=2.0)

    assert rate.reserve(at(0.1)) == at(2.0)
    assert rate.reserve(at(3.0)) == at(3.0)


def test_success_climbs_back_additively_up_to_the_ceiling() -> None:
    rate = AdaptiveRate(ceiling=4, increase=0.5)
    rate.limited(T0, retry_after=None)
    assert rate.rate == 2.0

    climbed = []
    for _ in range(5):
        rate.succeeded()
        climbed.append(rate.rate)

    assert climbed == [2.5, 3.0, 3.5, 4.0, 4.0]


def test_it_never_drops_below_its_floor() -> None:
    rate = AdaptiveRate(ceiling=1, floor=0.5)
    for second in range(5):
        rate.limited(at(second * 2), retry_after=None)

    assert rate.rate == 0.5


def test_success_while_unthrottled_changes_nothing() -> None:
    rate = AdaptiveRate()
    rate.succeeded()

    assert rate.view().rate is None
