"""The move of the rest index into its shards: entries written before the index was
sharded sit in one partition per state (shared/adapters/table/rest.py), read beside the
shards and dropped with them until this move has taken each to its shard.

It costs what is left to move, never the table: it pages through the unsharded entries
of each rest state, writes each order's entry again from its row (as the backfill does,
shared/usecases/history/rest_backfill.py: an order an operator moved on meanwhile gets
no stale entry), then deletes the unsharded one. Safe beside live traffic, safe to
repeat, and safe to stop: a stopped run leaves entries in both places, which the reads
count once, and the next run goes on from the start of what is left.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from shared.domain.model import ProcessState
from shared.domain.rest_index import REST_STATES
from shared.domain.workflow import Catalogue
from shared.ports import OrdersAtRest, UnshardedRest
from shared.usecases.history.rest_backfill import backfill_order


class Movable(OrdersAtRest, UnshardedRest, Protocol):
    """The order rows, the rest index and its unsharded entries."""


@dataclass(frozen=True)
class Moved:
    state: ProcessState
    moved: int
    """Unsharded entries read and deleted in this page."""
    filed: int
    """Of those, orders still at rest whose entry now stands in its shard."""
    done: bool
    """No unsharded entry of this state is left."""


class ProgressSink(Protocol):
    """Told after each page: what it moved, and how many in all so far."""

    def __call__(self, moved: Moved, total: int) -> None: ...


async def move_page(store: Movable, catalogue: Catalogue, state: ProcessState, size: int) -> Moved:
    """One page of the state's unsharded entries, from the first left (each is deleted
    once moved, so no cursor needs keeping)."""
    page = await store.unsharded_rest(state, size, None)
    filed = 0
    for entry in page.items:
        filed += await backfill_order(store, catalogue, entry.order_id)
        await store.drop_unsharded_rest(entry)
    return Moved(state, len(page.items), filed, page.continuation is None)


async def move_all(
    store: Movable, catalogue: Catalogue, size: int, progress: ProgressSink | None = None
) -> int:
    """Every rest state's unsharded entries; returns how many were moved."""
    total = 0
    for state in REST_STATES:
        while True:
            moved = await move_page(store, catalogue, state, size)
            total += moved.moved
            if progress is not None:
                progress(moved, total)
            if moved.done:
                break
    return total
