"""Waiting for a condition, not for a time.

A test that sleeps a fixed time and then asserts what the sleep was meant to let happen
fails on a loaded machine and wastes time on an idle one. `eventually` polls instead:
it returns as soon as the condition holds, and its deadline is only reached by a system
that is broken, so the deadline is generous and the poll interval short.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

POLL_SECONDS = 0.05


@overload
async def eventually(
    what: str,
    check: Callable[[], Awaitable[T]],
    timeout: float = ...,
    interval: float = ...,
) -> T: ...


@overload
async def eventually(
    what: str, check: Callable[[], T], timeout: float = ..., interval: float = ...
) -> T: ...


async def eventually(
    what: str,
    check: Callable[[], Any],
    timeout: float = 30.0,
    interval: float = POLL_SECONDS,
) -> Any:
    """Call `check` (plain or async) until it answers something true, and return that;
    an AssertionError naming `what` and the last answer once `timeout` seconds passed."""
    deadline = time.monotonic() + timeout
    while True:
        answer = check()
        last = await answer if inspect.isawaitable(answer) else answer
        if last:
            return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s (last: {last!r})")
        await asyncio.sleep(interval)
