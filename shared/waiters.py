"""First come, first served hand-offs to callers waiting on futures.

A waiter that gave up (cancelled, or timed out) stays in its line until it is reached:
it is skipped then, and what it would have been given goes to the next one."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import TypeVar

T = TypeVar("T")


def hand_to_first(waiting: deque[asyncio.Future[T]], value: T) -> bool:
    """Give `value` to the longest waiting caller still waiting; False if there is none."""
    while waiting:
        waiter = waiting.popleft()
        if not waiter.done():
            waiter.set_result(value)
            return True
    return False


def leave(waiting: deque[asyncio.Future[T]], waiter: asyncio.Future[T]) -> None:
    """A cancelled caller leaves the line, unless `hand_to_first` or `fail_all` already
    took it out (they pop a cancelled waiter as they pass it)."""
    with contextlib.suppress(ValueError):
        waiting.remove(waiter)


def fail_all(waiting: deque[asyncio.Future[T]], exc: BaseException) -> None:
    """Every caller still waiting gets `exc`; the line is empty afterwards."""
    while waiting:
        waiter = waiting.popleft()
        if not waiter.done():
            waiter.set_exception(exc)
