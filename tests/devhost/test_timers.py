"""NCRONTAB parsing and %Setting% resolution for timer schedules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from devhost.host.loader import parse_timespan
from devhost.host.timers import CronSchedule, IntervalSchedule, ScheduleError, parse_schedule
from devhost.settings import SettingsError, resolve, resolve_binding

START = datetime(2024, 1, 1, 0, 0, 0, tzinfo=UTC)  # a Monday


def occurrences(expression: str, count: int, start: datetime = START) -> list[datetime]:
    schedule = parse_schedule(expression)
    found, moment = [], start
    for _ in range(count):
        moment = schedule.next_after(moment)
        found.append(moment)
    return found


def test_six_fields_are_seconds_first() -> None:
    assert occurrences("*/15 * * * * *", 3) == [
        START + timedelta(seconds=15),
        START + timedelta(seconds=30),
        START + timedelta(seconds=45),
    ]


def test_minutes_are_the_second_field() -> None:
    assert occurrences("0 */5 * * * *", 2) == [
        START + timedelta(minutes=5),
        START + timedelta(minutes=10),
    ]


def test_weekday_and_hour_fields() -> None:
    first, second = occurrences("30 0 9 * * Mon-Fri", 2, START + timedelta(hours=10))
    assert first == datetime(2024, 1, 2, 9, 0, 30, tzinfo=UTC)
    assert second == datetime(2024, 1, 3, 9, 0, 30, tzinfo=UTC)


def test_five_fields_are_minute_first() -> None:
    schedule = parse_schedule("*/10 * * * *")
    assert isinstance(schedule, CronSchedule) and not schedule.seconds_first
    assert occurrences("*/10 * * * *", 1) == [START + timedelta(minutes=10)]


def test_timespan_is_an_interval() -> None:
    schedule = parse_schedule("00:00:10")
    assert schedule == IntervalSchedule(timedelta(seconds=10))
    assert parse_timespan("1.02:00:00") == 93600
    assert parse_timespan("00:05:00") == 300


@pytest.mark.parametrize("bad", ["", "* * *", "61 * * * * *", "every minute", "00:00:00"])
def test_invalid_expressions_are_rejected(bad: str) -> None:
    with pytest.raises(ScheduleError):
        parse_schedule(bad)


def test_setting_reference_is_resolved_before_parsing() -> None:
    binding = {"type": "timerTrigger", "name": "timer", "schedule": "%SupervisorSchedule%"}
    resolved = resolve_binding(binding, {"SupervisorSchedule": "*/30 * * * * *"}, where="f")
    assert resolved["schedule"] == "*/30 * * * * *"
    assert occurrences(resolved["schedule"], 1) == [START + timedelta(seconds=30)]


def test_references_inside_longer_values_and_missing_settings() -> None:
    assert resolve("queue-%Env%-in", {"Env": "dev"}) == "queue-dev-in"
    assert resolve("no references", {}) == "no references"
    with pytest.raises(SettingsError, match="SupervisorSchedule"):
        resolve("%SupervisorSchedule%", {}, where="function supervisor")
