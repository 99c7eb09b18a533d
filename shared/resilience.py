"""Retry and circuit breaking for Agents, bounded by the step's complete-by.

The circuit breaker is written here rather than taken from a library: the maintained
Python breakers (pybreaker) are synchronous and read the wall clock, while an Agent
needs an async-friendly breaker that reads the injected clock, so the Supervisor's and
the Agents' timing can be tested with a fake clock. Retry uses tenacity.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from shared.domain.health import BreakerState
from shared.domain.limits import SlotLease
from shared.domain.throttle import AdaptiveRate
from shared.ports import (
    Clock,
    OperationInProgress,
    PermanentRemoteError,
    RateLimited,
    TransientRemoteError,
)

T = TypeVar("T")


class CircuitOpen(TransientRemoteError):
    """The remote service is failing; calls are held back until the breaker half-opens."""

    def __init__(self, service: str, until: datetime) -> None:
        super().__init__("circuit-open", f"{service} circuit open until {until.isoformat()}")
        self.until = until


class DeadlinePassed(Exception):
    """The step's complete-by has passed: the Agent stops and answers nothing."""


class HeldByThrottle(DeadlinePassed):
    """The throttle (the service's `429`s) or the agent's own limits would start the
    next call only at or after the complete-by, even after any hold moved it: the step
    was held back by a quota, not failed by it."""

    def __init__(self, could_start_at: datetime) -> None:
        super().__init__(f"the next call could start at {could_start_at.isoformat()}")
        self.could_start_at = could_start_at


class Gate(Protocol):
    """An agent's fleet-wide limits (usecases.limits.limiter.AgentLimiter)."""

    async def start_at(self) -> datetime: ...

    def on_time(self, start: datetime) -> bool: ...

    async def enter(
        self, lasts: timedelta, waiting: Callable[[datetime], Awaitable[None]]
    ) -> SlotLease | None: ...

    async def leave(self, lease: SlotLease | None) -> None: ...


Held = Callable[[datetime], Awaitable[None]]
"""Told that the next call can start only at the given time, before the wait: may move
the deadline (a step hold, usecases.flow.step_hold) so the wait is not counted against it."""


class CircuitBreaker:
    """Consecutive transient failures open the circuit; one trial call half-opens it."""

    def __init__(
        self,
        service: str,
        clock: Clock,
        failure_threshold: int = 5,
        open_for: timedelta = timedelta(seconds=5),
    ) -> None:
        self.service = service
        self._clock = clock
        self._threshold = failure_threshold
        self._open_for = open_for
        self._failures = 0
        self._opened_at: datetime | None = None
        self._trial_running = False

    @property
    def open_until(self) -> datetime | None:
        return None if self._opened_at is None else self._opened_at + self._open_for

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.CLOSED
        if self._clock.now() >= self._opened_at + self._open_for:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def before_call(self) -> None:
        state = self.state
        if state is BreakerState.OPEN or (state is BreakerState.HALF_OPEN and self._trial_running):
            assert self._opened_at is not None
            raise CircuitOpen(self.service, self._opened_at + self._open_for)
        if state is BreakerState.HALF_OPEN:
            self._trial_running = True

    def record_success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._trial_running = False

    def release_trial(self) -> None:
        """The trial call ended without a verdict (cut by a deadline): allow another."""
        self._trial_running = False

    def record_failure(self) -> None:
        self._trial_running = False
        self._failures += 1
        if self._opened_at is not None or self._failures >= self._threshold:
            self._opened_at = self._clock.now()


@dataclass(frozen=True)
class RetryPolicy:
    initial_backoff: float = 0.2
    max_backoff: float = 5.0
    call_timeout: float = 10.0
    """Upper bound of one call; each call also stops at the deadline."""


_JITTER = random.Random()
"""The back-off jitter of a call given no generator of its own: one for the process,
seeded once, where one made per call took 15 us to seed from the system's entropy, more
than the whole of a first attempt that succeeds."""


async def call_until_deadline(
    operation: Callable[[float], Awaitable[T]],
    *,
    deadline: datetime | Callable[[], datetime],
    clock: Clock,
    breaker: CircuitBreaker,
    policy: RetryPolicy,
    rng: random.Random | None = None,
    observe: Callable[[bool, float], None] | None = None,
    call_limit: float | None = None,
    throttle: AdaptiveRate | None = None,
    gate: Gate | None = None,
    held: Held | None = None,
) -> T:
    """Retry transient failures with exponential back-off and full jitter until the
    deadline; raise DeadlinePassed when no attempt fits before it any more.

    A call cut short by the deadline itself does not count against the breaker: the
    remote service may be merely slow, and the step's deadline is not its fault. Nor does
    a key still in progress at the service (`OperationInProgress`): the service answered.
    A service's `retry_after` hint is the least back-off before the next try; when the
    deadline comes first, the retry stops there (DeadlinePassed) instead of trying
    again too soon to be answered.
    `observe(succeeded, seconds)` sees every remote call that ran (for health metrics).

    A `deadline` that step heartbeats move is read as a function. With `call_limit` one
    call may run that long whatever the deadline: the operation itself then stops the
    call at the moving deadline by raising DeadlinePassed (see usecases.flow.step_heartbeat).

    A `429` (`RateLimited`) is the service's quota, not its failure: it leaves the
    breaker as it was (a half-open trial may run again) and, with a `throttle`, slows
    every call of this agent; the throttle then is the only wait before the next try
    (its spacing, and `Retry-After` as a floor), with no back-off on top, and a call it
    would start only at or past the deadline raises HeldByThrottle instead of waiting.

    A `gate` (the agent's own limits) gives each call a rate slot and a concurrency
    slot, waited for like the throttle's. Before any such wait `held` is told when the
    call can start, and may move the deadline so the wait is not counted against it.
    A call that comes to its rate slot too late to start in it (`Gate.on_time`) gives
    both slots back and books again: started late, it would crowd the calls of the
    slots after it, another instance's included, into the provider's second.

    The first attempt runs before tenacity is set up, which happens only once it fails
    with a transient error: nearly every call succeeds at once, and tenacity's
    bookkeeping (its retrying object, attempt state and action chain) cost 40 us a call,
    six times the rest of this function's (bench/README.md, "The app's CPU outside the
    Table path").
    """
    current = deadline if callable(deadline) else lambda: deadline

    def remaining() -> float:
        return (current() - clock.now()).total_seconds()

    def wait(state: RetryCallState) -> float:
        ceiling = min(policy.max_backoff, policy.initial_backoff * 2 ** (state.attempt_number - 1))
        pause = (rng or _JITTER).uniform(0, ceiling)
        exc = state.outcome.exception() if state.outcome else None
        if throttle is not None and isinstance(exc, RateLimited):
            return 0.0
        if isinstance(exc, CircuitOpen):
            pause = max(pause, (exc.until - clock.now()).total_seconds())
        if isinstance(exc, TransientRemoteError) and exc.retry_after is not None:
            pause = max(pause, exc.retry_after)
        return pause

    def stop(state: RetryCallState) -> bool:
        return remaining() - (state.upcoming_sleep or 0.0) <= 0

    async def wait_until(start: datetime) -> None:
        if start > clock.now() and held is not None:
            await held(start)
        if start >= current():
            raise HeldByThrottle(start)
        # Read again: writing the hold took time, which the sleep must not add.
        now = clock.now()
        if start > now:
            await clock.sleep((start - now).total_seconds())

    async def admitted(gate: Gate) -> SlotLease | None:
        lasts = timedelta(seconds=policy.call_timeout if call_limit is None else call_limit)
        while True:
            start = await gate.start_at()
            await wait_until(start)
            lease = await gate.enter(lasts, wait_until)
            if gate.on_time(start):
                return lease
            await gate.leave(lease)

    async def attempt() -> T:
        if throttle is not None:
            await wait_until(throttle.reserve(clock.now()))
        if gate is not None:
            lease = await admitted(gate)
            try:
                return await call()
            finally:
                await gate.leave(lease)
        return await call()

    async def call() -> T:
        budget = remaining()
        if budget <= 0:
            raise DeadlinePassed()
        breaker.before_call()
        started = clock.now()

        def seen(succeeded: bool) -> None:
            if observe is not None:
                observe(succeeded, (clock.now() - started).total_seconds())

        try:
            limit = min(policy.call_timeout, budget) if call_limit is None else call_limit
            result = await operation(limit)
        except DeadlinePassed:
            breaker.release_trial()
            raise
        except RateLimited as exc:
            breaker.release_trial()
            if throttle is not None:
                throttle.limited(clock.now(), exc.retry_after)
            seen(True)
            raise
        except OperationInProgress:
            breaker.record_success()
            _went_through(throttle)
            seen(True)
            raise
        except TransientRemoteError:
            if budget < policy.call_timeout and remaining() <= 0:
                breaker.release_trial()
            else:
                breaker.record_failure()
            seen(False)
            raise
        except PermanentRemoteError:
            breaker.record_success()
            _went_through(throttle)
            seen(True)
            raise
        breaker.record_success()
        _went_through(throttle)
        seen(True)
        return result

    try:
        return await attempt()
    except TransientRemoteError as exc:
        first: TransientRemoteError | None = exc

    async def again() -> T:
        """tenacity's first attempt is the one that just failed, so its back-off and its
        stop see the same failure and attempt numbers as if tenacity had made it."""
        nonlocal first
        if first is not None:
            failed, first = first, None
            raise failed
        return await attempt()

    retrying = AsyncRetrying(
        retry=retry_if_exception_type(TransientRemoteError),
        wait=wait,
        stop=stop,
        sleep=clock.sleep,
        reraise=True,
    )
    try:
        return await retrying(again)
    except TransientRemoteError:
        raise DeadlinePassed() from None


def _went_through(throttle: AdaptiveRate | None) -> None:
    """The service took the call under its quota (whatever it answered): climb back."""
    if throttle is not None:
        throttle.succeeded()
