"""bench._activity: an instance's billed time under Flex Consumption's on-demand rule."""

from __future__ import annotations

import pytest

from bench._activity import HTTP_GROUP, GroupClock, billed, scale_group


def test_a_period_is_billed_at_least_a_second_then_in_tenths() -> None:
    assert billed(0.04) == 1.0
    assert billed(1.0) == 1.0
    assert billed(1.01) == pytest.approx(1.1)
    assert billed(2.3) == pytest.approx(2.3)


def test_overlapping_executions_share_one_period() -> None:
    clock = GroupClock()
    clock.begin(10.0)
    clock.begin(10.2)
    clock.end(10.5, started=10.0)
    clock.end(11.5, started=10.2)
    assert (clock.executions, clock.periods, clock.peak) == (2, 1, 2)
    assert clock.active_seconds == pytest.approx(1.5)
    assert clock.billed_seconds == pytest.approx(1.5)
    assert clock.solo_billed_seconds == pytest.approx(1.0 + 1.3)


def test_short_periods_within_a_second_are_billed_once() -> None:
    clock = GroupClock()
    for start in (0.0, 0.3, 0.6):
        clock.begin(start)
        clock.end(start + 0.05, started=start)
    assert clock.periods == 3
    assert clock.billed_seconds == pytest.approx(1.6)  # the windows 0-1, 0.3-1.3, 0.6-1.6


def test_a_trickle_pays_a_second_for_each_short_execution() -> None:
    clock = GroupClock()
    for start in (0.0, 5.0, 10.0):
        clock.begin(start)
        clock.end(start + 0.05, started=start)
    assert clock.billed_seconds == pytest.approx(3.0)
    assert clock.active_seconds == pytest.approx(0.15)


def test_reset_keeps_a_period_under_way() -> None:
    clock = GroupClock()
    clock.begin(0.0)
    clock.reset(5.0)
    clock.end(7.0, started=0.0)
    assert (clock.executions, clock.periods) == (1, 1)
    assert clock.active_seconds == pytest.approx(2.0)


def test_http_functions_scale_as_one_group_and_timers_are_marked() -> None:
    assert scale_group("submit_order_http", "httpTrigger") == HTTP_GROUP
    assert scale_group("get_order", "httpTrigger") == HTTP_GROUP
    assert scale_group("scheduler_reply", "serviceBusTrigger") == "scheduler_reply"
    assert scale_group("supervisor", "timerTrigger") == "supervisor (timer)"
