"""The orders a bulk job works through, a page at a time, from where the views read them
(shared/usecases/operations/order_views.py): a rest state's entries, narrowed by customer and
created day server-side, or the watch list for an in-flight state. Whole orders are
loaded (point reads, all at once), since the preview needs the steps; one whose row says
it has moved on is left out, as a page may be short."""

from __future__ import annotations

from typing import Final

from shared.adapters.readable import readable
from shared.domain.bulk_request import BulkFilter
from shared.domain.model import Order, OrderProcess, Priority, ProcessState
from shared.domain.rest_index import RestEntry, RestRange
from shared.ports import OrderPage, StateStore

TOKEN: Final = "i:"
"""Marks a cursor of this scan: one a job stored before it (the service's token of a
filtered scan) is refused, and the job skips that state rather than misread it."""


async def orders(
    store: StateStore,
    state: ProcessState,
    page_size: int,
    continuation: str | None,
    flt: BulkFilter | None = None,
    *,
    whole: bool = True,
) -> OrderPage:
    """`whole=False`: an order at rest as its entry shows it, its state without steps or
    items (domain.bulk.needs_steps), and no order read."""
    if continuation is not None and not continuation.startswith(TOKEN):
        raise ValueError("invalid continuation token")
    cursor = continuation[len(TOKEN) :] if continuation else None
    if state.is_at_rest:
        narrowed = flt or BulkFilter()
        keys = RestRange(state, narrowed.customer_id, narrowed.created_from, narrowed.created_to)
        rest = await store.rest_entries(keys, page_size, cursor)
        if not whole:
            shown = tuple(map(_as_shown, rest.items))
            return OrderPage(shown, TOKEN + rest.continuation if rest.continuation else None)
        ids, token = [e.order_id for e in rest.items], rest.continuation
    else:
        watched = await store.watch_list(page_size, cursor)
        ids, token = [e.order_id for e in watched.items], watched.continuation
    found = await readable(store, ids)
    items = tuple(p for p in found if p.state.process_state is state)
    return OrderPage(items, TOKEN + token if token else None)


def _as_shown(entry: RestEntry) -> OrderProcess:
    order = Order(
        entry.order_id, entry.customer_id, (), Priority.NORMAL, None, "", entry.created_at
    )
    return OrderProcess(order, entry.state_record(), ())
