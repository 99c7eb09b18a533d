"""The orders this instance last wrote, with the ETags its writes got back.

The Scheduler writes an order and, a queue hop later, handles the agent's reply to what
it just wrote: reading the order again would only return what it already holds. So it
keeps each order it stored (bounded, least recently used first out) and decides on that
copy. Nothing is trusted on the copy's word: a transition decided on it is saved with
If-Match on the kept ETag, so a copy that someone else has since changed loses the write
and is forgotten, and a copy on which nothing is to be done is checked against a fresh
read before the message is called stale.
"""

from __future__ import annotations

from collections import OrderedDict

from shared.domain.model import OrderProcess

CACHED_ORDERS = 2048
"""Orders kept per instance: far more than the handlers in flight (16 per queue), a few
MB at most; an order that fell out costs one read."""


class ProcessCache:
    def __init__(self, size: int = CACHED_ORDERS) -> None:
        if size < 1:
            raise ValueError("size must be at least 1")
        self._size = size
        self._orders: OrderedDict[str, OrderProcess] = OrderedDict()

    def get(self, order_id: str) -> OrderProcess | None:
        process = self._orders.get(order_id)
        if process is not None:
            self._orders.move_to_end(order_id)
        return process

    def put(self, process: OrderProcess) -> None:
        """Keep an order as stored; one without an ETag cannot guard a write, so it goes."""
        if process.etag is None:
            self.forget(process.order_id)
            return
        self._orders[process.order_id] = process
        self._orders.move_to_end(process.order_id)
        while len(self._orders) > self._size:
            self._orders.popitem(last=False)

    def forget(self, order_id: str) -> None:
        self._orders.pop(order_id, None)

    def __contains__(self, order_id: object) -> bool:
        return order_id in self._orders

    def __len__(self) -> int:
        return len(self._orders)
