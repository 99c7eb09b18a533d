"""Fault injection around the ports, for chaos runs only (setting `ChaosFaultRate`).

Wrapping the state store and the bus reaches every handler at its riskiest points: before
a read, after a write has been stored but before the handler knew it (a crash between
write and send), and before a send. The handler then raises like a process that died,
the host abandons the message, and the pattern has to heal around it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import datetime

from shared.domain.archive import ArchivedMark
from shared.domain.model import HistoryEntry, OrderProcess, Outgoing, ProcessState, StateRecord
from shared.domain.rest_index import RestEntry, RestPage, RestRange
from shared.ports import MessageBus, Page, Poison, StateStore, WatchEntry, WatchPage


class ChaosFault(RuntimeError):
    """An injected crash; never raised unless ChaosFaultRate is set."""


class _Dice:
    def __init__(self, rate: float, seed: int | None) -> None:
        self.rate = rate
        self._rng = random.Random(seed)
        self.injected = 0

    def roll(self, where: str) -> None:
        if self._rng.random() < self.rate:
            self.injected += 1
            raise ChaosFault(f"chaos: injected crash {where}")


class ChaosStateStore:
    def __init__(self, inner: StateStore, rate: float, seed: int | None = None) -> None:
        self._inner = inner
        self.dice = _Dice(rate, seed)

    async def create(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        etag = await self._inner.create(process, history)
        self.dice.roll("after storing a new order")
        return etag

    async def load(self, order_id: str) -> OrderProcess | None:
        self.dice.roll("before reading an order")
        return await self._inner.load(order_id)

    async def archived(self, order_id: str) -> ArchivedMark | None:
        return await self._inner.archived(order_id)

    async def save(self, process: OrderProcess, history: Sequence[HistoryEntry]) -> str:
        etag = await self._inner.save(process, history)
        self.dice.roll("after saving a transition, before its sends")
        return etag

    async def history(self, order_id: str) -> tuple[HistoryEntry, ...]:
        return await self._inner.history(order_id)

    async def list_by_state(
        self, state: ProcessState | None, page_size: int, continuation: str | None
    ) -> Page:
        return await self._inner.list_by_state(state, page_size, continuation)

    async def watch(
        self,
        order_id: str,
        check_at: datetime,
        *,
        replace: bool,
        version: int = 0,
        customer: str = "",
    ) -> bool:
        return await self._inner.watch(
            order_id,
            check_at,
            replace=replace,
            version=version,
            customer=customer,
        )

    async def rewatch(self, order_id: str, check_at: datetime, *, version: int = 0) -> None:
        await self._inner.rewatch(order_id, check_at, version=version)

    async def due(self, now: datetime, limit: int) -> tuple[WatchEntry, ...]:
        return await self._inner.due(now, limit)

    async def reschedule(self, entry: WatchEntry, check_at: datetime) -> None:
        self.dice.roll("before rescheduling a watch entry")
        await self._inner.reschedule(entry, check_at)

    async def unwatch(self, order_id: str, version: int | None = None) -> None:
        self.dice.roll("before unwatching a finished order")
        await self._inner.unwatch(order_id, version)

    async def unwatch_entry(self, entry: WatchEntry) -> None:
        self.dice.roll("before dropping a missing order's watch entry")
        await self._inner.unwatch_entry(entry)

    async def watch_list(self, limit: int, continuation: str | None) -> WatchPage:
        return await self._inner.watch_list(limit, continuation)

    async def states(self, order_ids: Sequence[str]) -> tuple[StateRecord, ...]:
        return await self._inner.states(order_ids)

    async def put_rest(self, entry: RestEntry) -> None:
        self.dice.roll("before writing a rest entry, after the state")
        await self._inner.put_rest(entry)

    async def drop_rest(
        self, state: ProcessState, order_id: str, created_at: datetime, *, below: int | None = None
    ) -> None:
        self.dice.roll("before dropping the rest entry of an order leaving it")
        await self._inner.drop_rest(state, order_id, created_at, below=below)

    async def rest_entries(self, keys: RestRange, limit: int, continuation: str | None) -> RestPage:
        return await self._inner.rest_entries(keys, limit, continuation)

    async def ping(self) -> None:
        await self._inner.ping()

    async def close(self) -> None:
        await _close(self._inner)


class ChaosMessageBus:
    def __init__(self, inner: MessageBus, rate: float, seed: int | None = None) -> None:
        self._inner = inner
        self.dice = _Dice(rate, seed)

    async def send(self, messages: Sequence[Outgoing]) -> None:
        if messages:
            self.dice.roll("before sending")
        await self._inner.send(messages)

    async def park(self, poison: Poison) -> None:
        await self._inner.park(poison)

    async def ping(self) -> None:
        await self._inner.ping()

    async def close(self) -> None:
        await _close(self._inner)


async def _close(inner: object) -> None:
    closer = getattr(inner, "close", None)
    if closer is not None:
        await closer()
