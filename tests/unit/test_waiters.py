"""First come, first served hand-offs (the sender pool's slots, the limiter's starts)."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from shared.waiters import fail_all, hand_to_first, leave


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


async def test_a_cancelled_waiter_leaves_the_line_once_even_when_a_hand_off_passed_it() -> None:
    """A send cancelled while a slot was being handed on: the hand-off pops the cancelled
    waiter as it passes, and the waiter's own cleanup then finds it gone (this raised
    `ValueError: <Future cancelled> is not in deque` under load)."""
    loop = asyncio.get_running_loop()
    gone, waiting = loop.create_future(), loop.create_future()
    line = deque([gone, waiting])
    gone.cancel()
    assert hand_to_first(line, 3)
    leave(line, gone)
    assert not line and waiting.result() == 3
    still = loop.create_future()
    line.append(still)
    leave(line, still)
    assert not line
