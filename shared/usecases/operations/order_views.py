"""Where the operator's views of orders in one state read, so each costs what it shows
and never the size of the table (docs/history.md).

* An order at rest (Processed, Cancelled, Compensated, Error, Suspended) has one rest
  entry, which holds what a listing shows: a page of a rest state is one range read of
  its partition, and no order row is read.
* An order in flight (Pending, Processing, Compensating) is on the Supervisor's watch
  list, which holds in-flight orders only; its state is read from the order's state row
  (a point read each), because most state changes (the claim, a step done) do not write
  the watch entry, so a state kept there would be stale or cost a write per change. A
  row found at rest is left out: its rest entry shows it.

An entry trails its order by one write at most, and the Supervisor heals it
(docs/history.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from shared.domain.model import ProcessState, StateRecord
from shared.domain.rest_index import RestRange
from shared.ports import Page, StateStore, WatchedOrders

IN_FLIGHT: Final = tuple(s for s in ProcessState if not s.is_at_rest)


@dataclass(frozen=True)
class InFlight:
    """The in-flight orders found on the first `limit` watch entries."""

    states: tuple[StateRecord, ...]
    truncated: bool
    """More entries were on the watch list: a count of these is a lower bound."""


async def in_flight(store: WatchedOrders, limit: int) -> InFlight:
    page = await store.watch_list(limit, None)
    states = await store.states([e.order_id for e in page.items])
    moving = tuple(s for s in states if not s.process_state.is_at_rest)
    return InFlight(moving, page.continuation is not None)


async def orders_in(
    store: StateStore, state: ProcessState | None, page_size: int, continuation: str | None
) -> Page:
    """A page of the orders in `state`; a page may be short (even empty) and still hand
    out a continuation. Without a state it is the store's scan of every order."""
    if state is None:
        return await store.list_by_state(None, page_size, continuation)
    if state.is_at_rest:
        rest = await store.rest_entries(RestRange(state), page_size, continuation)
        return Page(tuple(e.state_record() for e in rest.items), rest.continuation)
    watched = await store.watch_list(page_size, continuation)
    states = await store.states([e.order_id for e in watched.items])
    return Page(tuple(s for s in states if s.process_state is state), watched.continuation)
