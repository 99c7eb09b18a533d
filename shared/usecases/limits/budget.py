"""Answering in time whatever the store and the bus do: the store gets a bounded wait,
and what is sent once a change is stored gets a shorter one, then goes on without the
caller. Used by callers that must answer soon (HTTP intake and operator actions); the
Scheduler and the Supervisor wait in full, so that a failed send retries their message."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from shared.ports import BusUnavailable, StoreUnavailable
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.budget")
T = TypeVar("T")


@dataclass(frozen=True)
class Budget:
    """How long a caller that must answer soon waits, in seconds.

    `store`: for the store's reads and writes; past it the call fails with
    StoreUnavailable (the change may or may not be stored: asking again is safe).
    `nudge`: for the sends once the change is stored; past it the call returns and the
    sends go on in the background. The change keeps its messages in the state's outbox
    and the order on the Supervisor's watch list, so if the sends fail too the
    Supervisor sends them again.
    """

    store: float
    nudge: float


HTTP_BUDGET = Budget(store=2.0, nudge=0.5)
"""An HTTP route that answers within 3 s (the rest is parsing and the host): a store
that has not answered in 2 s gets a 503 with Retry-After, and a stored change is
answered after at most half a second of its sends."""


async def within_store_budget(work: Awaitable[T], budget: Budget | None) -> T:
    """The store's part of a call; StoreUnavailable once `budget.store` has passed."""
    wait = budget.store if budget is not None else None
    try:
        async with asyncio.timeout(wait) as deadline:
            return await work
    except TimeoutError:
        if not deadline.expired():
            raise
        raise StoreUnavailable(f"no answer within {wait:g} s") from None


_sending: set[asyncio.Task[None]] = set()
"""Sends still going after their caller stopped waiting, referenced until done."""


async def send_within_budget(
    work: Awaitable[None],
    budget: Budget | None,
    order_id: str,
    *,
    tolerate_bus_failure: bool = True,
) -> None:
    """What a stored change sends (`work`). With a budget the caller waits `budget.nudge`
    and no longer: the send goes on without it (a link that takes long to open is not
    opened twice) and a failure, late or not, is only logged, since the change is stored.
    Without one it waits in full, and a BusUnavailable is raised unless
    `tolerate_bus_failure`."""
    if budget is None:
        try:
            await work
        except BusUnavailable as exc:
            if not tolerate_bus_failure:
                raise
            _log_unsent(order_id, exc)
        return
    task = asyncio.ensure_future(work)
    _sending.add(task)
    task.add_done_callback(lambda done: _settled(done, order_id))
    with contextlib.suppress(Exception):  # late: it goes on; failed: _settled logs it
        await asyncio.wait_for(asyncio.shield(task), budget.nudge)


def _settled(task: asyncio.Task[None], order_id: str) -> None:
    _sending.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if isinstance(exc, BusUnavailable):
        _log_unsent(order_id, exc)
    elif exc is not None:
        log.error("order %s: what it sends failed", order_id, exc_info=exc)


def _log_unsent(order_id: str, exc: BusUnavailable) -> None:
    log.warning(
        "order %s stored but what it sends did not go out (%s); the Supervisor's next check sends it again",
        order_id,
        exc,
    )
