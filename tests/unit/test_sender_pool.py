"""The sender pool's slots under contention: the longest waiting caller is served first.

No broker: the links are stand-ins; what is tested is who gets a slot, and when."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared.adapters.servicebus_bus import _SenderPool


async def _link(queue: str) -> Any:
    return object()


async def test_a_slot_given_back_goes_to_the_caller_waiting_not_to_one_arriving() -> None:
    """A caller that sends again as soon as its send ends must not pass one that waits:
    repeated, that kept a nudge waiting past the send's 10 s under a burst."""
    pool = _SenderPool("scheduler", 1, _link)
    served: list[str] = []

    async def waiter() -> None:
        async with pool.slot():
            served.append("waiter")

    async with pool.slot():
        served.append("busy")
        waiting = asyncio.create_task(waiter())
        await asyncio.sleep(0)  # it finds the only slot taken and waits
    async with pool.slot():  # given back, and asked for again at once
        served.append("busy again")
    await waiting
    assert served == ["busy", "waiter", "busy again"]


async def test_a_cancelled_waiter_leaves_the_line_and_loses_no_slot() -> None:
    pool = _SenderPool("scheduler", 1, _link)
    async with pool.slot():
        gone = asyncio.create_task(pool._acquire())
        await asyncio.sleep(0)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
    async with asyncio.timeout(1), pool.slot() as slot:  # the slot came back
        assert slot == 0


async def test_a_waiter_cancelled_as_the_slot_is_handed_to_it_gives_it_back() -> None:
    pool = _SenderPool("scheduler", 1, _link)
    async with pool.slot():
        late = asyncio.create_task(pool._acquire())
        await asyncio.sleep(0)
    late.cancel()  # handed the slot, not yet resumed
    with pytest.raises(asyncio.CancelledError):
        await late
    async with asyncio.timeout(1), pool.slot() as slot:
        assert slot == 0
