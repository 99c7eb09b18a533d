"""Orders loaded by id for a caller that goes through many at once: a sample, a bulk
match, the archive's candidates. An order the store cannot read is skipped and named in
the log, so one bad row does not fail them all (it used to answer `POST /api/reconcile`
with a 500); an outage still stops the caller."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime

from shared.domain.model import OrderProcess, ProcessState
from shared.domain.rest_index import RestRange
from shared.ports import OrderRows, OrdersAtRest, UnreadableOrder
from shared.telemetry.logsafe import app_logger

log = app_logger("orders.store")

AT_ONCE = 16


async def readable(store: OrderRows, order_ids: Sequence[str]) -> list[OrderProcess]:
    """The orders that exist and can be read, in the given order, `AT_ONCE` reads at a
    time."""

    async def one(order_id: str) -> OrderProcess | None:
        try:
            return await store.load(order_id)
        except UnreadableOrder as exc:
            log.warning("order skipped, its stored row cannot be read: %s", exc)
            return None

    found: list[OrderProcess | None] = []
    for at in range(0, len(order_ids), AT_ONCE):
        found += await asyncio.gather(*map(one, order_ids[at : at + AT_ONCE]))
    return [p for p in found if p is not None]


async def at_rest_before(
    store: OrdersAtRest, cutoffs: Mapping[ProcessState, datetime], limit: int
) -> tuple[OrderProcess, ...]:
    """The archive's candidates, through the rest index whatever the store: at most
    `limit` orders at rest in each state since before its cutoff, re-read so that one
    which moved on since its entry was written is left out."""
    found: list[str] = []
    for state, cutoff in cutoffs.items():
        room = limit - len(found)
        if room <= 0:
            break
        keys = RestRange(state, created_to=cutoff, changed_before=cutoff)
        page = await store.rest_entries(keys, room, None)
        found += [entry.order_id for entry in page.items]
    loaded = await readable(store, found)
    return tuple(p for p in loaded if p.state.process_state in cutoffs)
