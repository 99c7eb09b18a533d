"""Timer triggers with the host's scheduling semantics.

NCRONTAB has six fields with seconds first (five-field expressions are accepted
minute-first, as the host does); a ``hh:mm:ss`` TimeSpan means a fixed interval.
The host holds a singleton lock per timer, so a tick that arrives while the previous
run is still going is skipped instead of overlapping it; the supervisor relies on
that to never sweep twice at once.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from azure.functions.timer import TimerRequest
from croniter import croniter
from opentelemetry.trace import SpanKind

from devhost.host.invoke import invoke, new_invocation_id
from devhost.host.loader import FunctionSpec, parse_timespan
from devhost.host.tracing import invocation_span

log = logging.getLogger("devhost.timer")

_TIMESPAN = re.compile(r"^(\d+\.)?\d{1,2}:\d{2}:\d{2}(\.\d+)?$")
# Waking this much after the scheduled time counts as past due (the host says so
# when it was down or busy at the scheduled time).
PAST_DUE_AFTER = timedelta(seconds=1)
WAKE_MARGIN = 0.002


class ScheduleError(ValueError):
    """The schedule expression cannot be parsed."""


class Schedule(Protocol):
    def next_after(self, moment: datetime) -> datetime: ...


@dataclass(frozen=True)
class CronSchedule:
    expression: str
    seconds_first: bool

    def next_after(self, moment: datetime) -> datetime:
        iterator = croniter(self.expression, moment, second_at_beginning=self.seconds_first)
        result: datetime = iterator.get_next(datetime)
        return result


@dataclass(frozen=True)
class IntervalSchedule:
    interval: timedelta

    def next_after(self, moment: datetime) -> datetime:
        return moment + self.interval


def parse_schedule(expression: str) -> Schedule:
    """Parse an already %Setting%-resolved timer schedule."""
    text = expression.strip()
    if _TIMESPAN.match(text):
        seconds = parse_timespan(text)
        if seconds <= 0:
            raise ScheduleError(f"timer interval must be positive: {expression!r}")
        return IntervalSchedule(timedelta(seconds=seconds))
    fields = text.split()
    if len(fields) not in (5, 6):
        raise ScheduleError(
            f"NCRONTAB needs six fields (second minute hour day month day-of-week): {expression!r}"
        )
    seconds_first = len(fields) == 6
    if not croniter.is_valid(text, second_at_beginning=seconds_first):
        raise ScheduleError(f"invalid NCRONTAB expression: {expression!r}")
    return CronSchedule(text, seconds_first)


def _utcnow() -> datetime:
    return datetime.now(UTC)


class TimerRunner:
    """Fires one timer function on its schedule, never overlapping itself."""

    def __init__(self, spec: FunctionSpec, trigger: Mapping[str, Any]) -> None:
        self.spec = spec
        self.schedule_text = str(trigger["schedule"])
        self.schedule = parse_schedule(self.schedule_text)
        self.run_on_startup = bool(trigger.get("runOnStartup", False))
        self._loop_task: asyncio.Task[None] | None = None
        self._current: asyncio.Task[None] | None = None
        self._last: datetime | None = None
        self.skipped = 0

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._run(), name=f"timer:{self.spec.name}")

    async def stop(self) -> None:
        """Stop scheduling; the running invocation (if any) is left to ``drain``."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
            self._loop_task = None

    def in_flight(self) -> list[asyncio.Task[None]]:
        return [self._current] if self._current is not None and not self._current.done() else []

    async def _run(self) -> None:
        if self.run_on_startup:
            now = _utcnow()
            self._fire(now, now, past_due=False)
        previous = _utcnow()
        while True:
            due = self.schedule.next_after(previous)
            # The next occurrence is computed from `due`, not from the clock, so waking a
            # hair early can never fire the same occurrence twice.
            await asyncio.sleep(max(0.0, (due - _utcnow()).total_seconds()) + WAKE_MARGIN)
            previous = due
            now = _utcnow()
            if self.in_flight():
                self.skipped += 1
                log.info("timer %s: previous run still going, skipping %s", self.spec.name, due)
                continue
            self._fire(due, now, past_due=now - due > PAST_DUE_AFTER)
            if now - due > PAST_DUE_AFTER:
                # Catch up to the present instead of replaying every missed occurrence.
                previous = now

    def _fire(self, due: datetime, now: datetime, *, past_due: bool) -> None:
        status = {
            "Last": (self._last or due).isoformat(),
            "Next": self.schedule.next_after(due).isoformat(),
            "LastUpdated": now.isoformat(),
        }
        self._last = due
        request = TimerRequest(
            past_due=past_due, schedule_status=status, schedule={"AdjustForDST": True}
        )
        self._current = asyncio.create_task(
            self._execute(request), name=f"timer-run:{self.spec.name}"
        )

    async def _execute(self, request: TimerRequest) -> None:
        invocation_id = new_invocation_id()
        log.debug("timer %s fired (past_due=%s)", self.spec.name, request.past_due)
        attributes = {"faas.trigger": "timer", "faas.invocation_id": invocation_id}
        try:
            with invocation_span(self.spec.name, SpanKind.INTERNAL, {}, attributes) as trace:
                await invoke(self.spec, request, invocation_id, trace)
        except Exception:
            log.exception("timer %s failed (invocation %s)", self.spec.name, invocation_id)
