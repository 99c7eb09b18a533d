"""Reconciliation's sample of orders recently come to rest, finished or held in Error or
Suspended (shared/domain/reconcile.py `CHECKED`), from the rest index of those states
(shared/domain/rest_index.py), for both adapters.

Per state and per day the window can have created orders in (from `LOOKBACK`
before it to `AHEAD` after its start), the entries past the random start are read, then,
if the sample is still short, those before it: the random start spreads the runs over
each day's order ids, and `UpdatedAt` is filtered server-side inside the partition. So
a run reads at most 2 x states x days ranges of `limit` entries, never every order at
rest. An order created more than `LOOKBACK` before the window and come to rest within it
is not sampled: a sample spread over the recent key space, not a census."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Final

from shared.adapters.readable import readable
from shared.domain.model import OrderProcess
from shared.domain.reconcile import CHECKED
from shared.domain.rest_index import SEP, RestEntry, RestRange, day_of
from shared.ports import OrdersAtRest

LOOKBACK: Final = timedelta(days=1)
AHEAD: Final = timedelta(days=2)
"""Past the default window (24 h) and a day boundary."""


async def finished_sample(
    store: OrdersAtRest, since: datetime, start: str, limit: int
) -> tuple[OrderProcess, ...]:
    if limit <= 0:
        return ()
    days = _days(since - LOOKBACK, since + AHEAD)
    ranges = [
        (RestRange(s, created_from=day, created_to=day, changed_since=since), day)
        for s in CHECKED
        for day in days
    ]

    async def read(keys: RestRange, cursor: str | None) -> list[RestEntry]:
        return list((await store.rest_entries(keys, limit, cursor)).items)

    pivots = [f"{day_of(day)}{SEP}{start}" for _, day in ranges]
    found = await asyncio.gather(*(read(k, p) for (k, _), p in zip(ranges, pivots, strict=True)))
    chosen = sorted((e for f in found for e in f), key=_rotated(start))[:limit]
    if len(chosen) < limit:
        behind = await asyncio.gather(*(read(k, None) for k, _ in ranges))
        early = (e for b, p in zip(behind, pivots, strict=True) for e in b if e.key <= p)
        chosen += sorted(early, key=_rotated(start))[: limit - len(chosen)]
    loaded = await readable(store, [e.order_id for e in chosen])
    return tuple(p for p in loaded if p.state.process_state in CHECKED)


def _days(first: datetime, last: datetime) -> list[datetime]:
    days, day = [], first
    while day_of(day) <= day_of(last):
        days.append(day)
        day += timedelta(days=1)
    return days


def _rotated(start: str) -> Callable[[RestEntry], tuple[bool, str]]:
    """Order ids from `start` on, then those before it: the wrap."""
    return lambda e: (e.order_id < start, e.order_id)
