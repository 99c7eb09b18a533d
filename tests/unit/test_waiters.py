"""First come, first served hand-offs (the sender pool's slots, the limiter's starts)."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from shared.waiters import fail_all, hand_to_first


async def test_values_go_to_the_waiters_in_the_order_they_came() -> None:
    loop = asyncio.get_running_loop()
    line: deque[asyncio.Future[int]] = deque(loop.create_future() for _ in range(3))
    first, second, third = line
    assert hand_to_first(line, 1) and hand_to_first(line, 2)
    assert (first.result(), second.result(), third.done()) == (1, 2, False)
    assert list(line) == [third]


async def test_a_waiter_that_gave_up_is_skipped_and_an_empty_line_takes_nothing() -> None:
    loop = asyncio.get_running_loop()
    gone, waiting = loop.create_future(), loop.create_future()
    gone.cancel()
    line = deque([gone, waiting])
    assert hand_to_first(line, 7)
    assert waiting.result() == 7
    assert not hand_to_first(line, 8)
    assert not line


async def test_fail_all_fails_every_waiter_still_waiting() -> None:
    loop = asyncio.get_running_loop()
    served, left = loop.create_future(), loop.create_future()
    served.set_result(0)
    line = deque([served, left])
    fail_all(line, TimeoutError("limit store gone"))
    assert not line
    with pytest.raises(TimeoutError, match="limit store gone"):
        left.result()
