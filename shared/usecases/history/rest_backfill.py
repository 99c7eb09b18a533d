"""Backfill of the rest index: orders stored at rest before it existed have no entry, so
the views of their state do not see them (docs/history.md).

This is the one job that reads every state row (the store's scan, a page at a time): run
once after the deploy that brings the index, beside live traffic. It is safe to repeat
and to stop and start again from its last continuation. Each order at rest gets its entry
written, then its state row is read again: an order an operator moved on meanwhile has
that entry dropped again (only one written for an earlier version, so an entry its next
rest wrote stays), as the unit of work would have.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.catalogue.running import workflow_of
from shared.domain.rest_index import rest_entry
from shared.domain.workflow import Catalogue
from shared.ports import OrdersAtRest


@dataclass(frozen=True)
class Backfilled:
    scanned: int
    written: int
    continuation: str | None
    """Where the next call goes on; None: done."""


async def backfill_page(
    store: OrdersAtRest, catalogue: Catalogue, page_size: int, continuation: str | None
) -> Backfilled:
    page = await store.list_by_state(None, page_size, continuation)
    written = 0
    for state in page.items:
        if state.process_state.is_at_rest:  # in flight: entered when it comes to rest
            written += await backfill_order(store, catalogue, state.order_id)
    return Backfilled(len(page.items), written, page.continuation)


async def backfill_order(
    store: OrdersAtRest, catalogue: Catalogue, order_id: str, tries: int = 3
) -> int:
    """Write the order's entry, then check its row did not move meanwhile; a moved order
    is read again. Returns 1 when its entry was written and stands."""
    for _ in range(tries):
        process = await store.load(order_id)
        if process is None or not process.state.process_state.is_at_rest:
            return 0
        entry = rest_entry(process, workflow_of(catalogue, process.state))
        await store.put_rest(entry)
        found = await store.states([order_id])
        if found and found[0].version == entry.version:
            return 1
        below = found[0].version if found else None
        await store.drop_rest(entry.state, order_id, entry.created_at, below=below)
    return 0
